"""The rule every new password meets, wherever it is set (the CLI, the Users page, the change-password page):
at least PROMESA_PASSWORD_MIN_LENGTH characters, and not one of the passwords guessers try first.

Length is what makes a password hard to guess (NIST SP 800-63B): there are no composition rules. What is refused
beside short ones: a well-known password, a common word padded with digits or symbols ("Summer2026!!"), one
character or one chunk repeated, a run along the keyboard, the alphabet or the digits, and the user's own name.
"""

from __future__ import annotations

import string

from flask import current_app

MAX_LENGTH = 256  # bounds the hashing work one request can ask for

# Whole passwords from the top of the published breach lists that are long enough to pass the length rule.
COMMON_PASSWORDS = frozenset("""
123456789012 1234567890123 12345678901234 123456789123 1234567891011 123123123123 123321123321 121212121212
112233445566 111222333444 147258369147 159753159753 987654321098 098765432109 000000000000 111111111111
qwertyuiop12 qwertyuiop123 qwertyuiopasdf qwertyuiopasdfgh 1q2w3e4r5t6y 1q2w3e4r5t6y7u 1qaz2wsx3edc 1qaz2wsx3edc4rfv
qazwsxedcrfv qazwsxedcrfvtgb zaq12wsxcde3 zaq1zaq1zaq1 q1w2e3r4t5y6 q1w2e3r4t5y6u7 asdfghjkl123 asdfghjkl;' zxcvbnm12345
abcdefghijkl abcd1234abcd abc123abc123 a1b2c3d4e5f6 passwordpassword password1234 password12345 password123456
password123! password1234! passw0rd1234 p@ssw0rd1234 p@ssword1234 iloveyou1234 iloveyouiloveyou letmein12345
welcome12345 welcome123456 changeme1234 changemenow! administrator administrator1 admin1234567 adminadmin123
trustno1trustno1 correcthorsebatterystaple thequickbrownfox thequickbrownfoxjumps
football1234 baseball1234 basketball12 superman1234 batman123456 princess1234 sunshine1234 starwars1234
michael12345 jennifer1234 charlie12345 whatever1234 computer1234 internet1234 1234qwerasdf qwer1234asdf
1234567890qwerty qwerty123456 qwerty1234567 qwertyqwerty qwerty12345! 1234abcd1234 abcdefg12345 monkey123456
dragon123456 master123456 shadow123456 letmeinletmein blink182blink182 liverpool1234 chelsea12345 arsenal12345
""".split())

# Words that stay easy to guess with digits or symbols around them.
COMMON_WORDS = frozenset("""
password passw0rd p@ssword p@ssw0rd pass passwd secret qwerty qwertyuiop qwertz azerty asdf asdfgh asdfghjkl zxcvbnm
letmein welcome admin administrator root login iloveyou dragon monkey football baseball basketball soccer hockey
sunshine princess master shadow superman batman starwars trustno changeme default summer winter spring autumn
hello freedom whatever computer internet michael jennifer jordan charlie thomas daniel abc abcdef qazwsx promesa
webhook webhooks dashboard
""".split())

_SEQUENCES = ("0123456789" * 3, "abcdefghijklmnopqrstuvwxyz" * 2, "qwertyuiopasdfghjklzxcvbnm" * 2,
              "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9ol0p" * 2, "qazwsxedcrfvtgbyhnujmikolp" * 2)
_PADDING = string.digits + string.punctuation + string.whitespace


def min_length() -> int:
    return int(current_app.config["PROMESA_PASSWORD_MIN_LENGTH"])


def password_problem(password: str, email: str | None = None) -> str | None:
    """What is wrong with `password` as a new password for `email`, in words; None when it is fine."""
    shortest = min_length()
    if len(password) < shortest:
        return f"a password is at least {shortest} characters (a few unrelated words make a good one)"
    if len(password) > MAX_LENGTH:
        return f"a password is at most {MAX_LENGTH} characters"
    if "\x00" in password:
        return "a password must not contain NUL characters"
    lowered = password.lower()
    if (lowered in COMMON_PASSWORDS or lowered.strip(_PADDING) in COMMON_WORDS or _repeats(lowered)
            or any(lowered in run or lowered in run[::-1] for run in _SEQUENCES)):
        return "this password is one of the first that guessers try; choose another (a few unrelated words)"
    name = (email or "").split("@")[0].lower()
    if len(name) >= 3 and name in lowered:
        return "a password must not contain your own name"
    return None


def _repeats(text: str) -> bool:
    """One chunk repeated ("aaaaaaaaaaaa", "abcabcabcabc"), or too few different characters to be guessed slowly."""
    if len(set(text)) < 4:
        return True
    return any(len(text) % size == 0 and text == text[:size] * (len(text) // size)
               for size in range(1, len(text) // 2 + 1))
