"""The receiver check (promesa_receiver.check) against real receivers on 127.0.0.1, through the API
and through the ``promesa-receiver check`` command, and judge() on the edge cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from promesa_receiver import (
    SignatureMismatch,
    TimestampOutsideTolerance,
    verify,
    verify_standard,
)
from promesa_receiver.check import (
    ALL_RULES,
    CHECK_HEADER,
    CREDENTIALS_RULE,
    EVENT_TYPE,
    NOT_JUDGED_DEPENDENT,
    RULES,
    STEPS,
    Answer,
    build,
    failed,
    judge,
    plan,
    report,
    run_check,
    urllib_send,
)
from promesa_receiver.signing import new_secret

from .conftest import CASES, REFUSAL_BODY, SLOW_SECONDS, WrongSecretReceiver

SDK = Path(__file__).resolve().parents[2] / "sdk"


def by_rule(results: list[dict]) -> dict[str, dict]:
    assert [r["rule"] for r in results] == list(RULES)
    for r in results:
        assert set(r) == {"rule", "passed", "detail", "advice", "status", "excerpt"}
        assert r["detail"]
        assert bool(r["advice"]) == (r["passed"] is False), r  # advice exactly where something failed
    return {r["rule"]: r for r in results}


def outcome(results: list[dict]) -> tuple[set, set]:
    """(failed rules, rules not judged)."""
    return set(failed(results)), {r["rule"] for r in results if r["passed"] is None}


# -- real receivers, through the API --------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["promesa", "standard-webhooks"])
def test_the_example_receiver_passes_every_rule(example, secret, scheme):
    url = example.start(secret, scheme=scheme)
    check_id, results = run_check(url, [secret], scheme, allow_private=True)
    rules = by_rule(results)
    assert outcome(results) == (set(), {"https"})
    assert "loopback" in rules["https"]["detail"]
    # Only the signed event got in (twice: the duplicate re-enqueues a job not done yet); nothing forged did.
    assert example.queued_event_ids() == [f"evt_{check_id}_signed"] * 2


def test_the_example_receiver_passes_while_a_secret_rotates(example):
    old, new = new_secret(), new_secret()
    url = example.start(old)  # the receiver has not picked up the new secret yet
    _, results = run_check(url, [new, old], "promesa", allow_private=True)  # signed with both, as Promesa signs during a grace
    assert outcome(results) == (set(), {"https"})


@pytest.mark.parametrize("case", CASES)
def test_a_bad_receiver_fails_exactly_its_rules(case_url, bad_receiver, secret, case):
    must_fail, not_judged = CASES[case]
    _, results = run_check(case_url, [secret], "promesa", allow_private=True)
    rules = by_rule(results)
    assert outcome(results) == (must_fail, not_judged)
    if case == "redirect":
        assert f"register {bad_receiver.url}/final " in rules["no_redirect"]["advice"]
    if case == "slow":
        assert rules["fast_answer"]["detail"].startswith(f"answered in {SLOW_SECONDS}.")
    if case == "error":
        for rule in ("forged_rejected", "stale_rejected", "tampered_rejected"):
            assert rules[rule]["detail"] == NOT_JUDGED_DEPENDENT
        assert "500" in rules["signed_accepted"]["advice"]
    if case == "careless":
        assert rules["forged_rejected"]["advice"].startswith(
            "your endpoint accepted a request signed with the wrong secret: verify X-Signature over the raw body")


def test_a_receiver_holding_the_wrong_secret_fails_the_signature_rule_not_deduplication(wrong_secret_receiver, secret):
    """Every request is refused 401: the signature rule fails with the secret's advice, and the rules that need
    an accepted signed event (the duplicate and the three rejections) are not judged, saying why."""
    _, results = run_check(wrong_secret_receiver.url, secret, allow_private=True)
    rules = by_rule(results)
    assert outcome(results) == ({"signed_accepted"}, {"duplicate_accepted", "forged_rejected", "stale_rejected",
                                                      "tampered_rejected", "https"})
    assert "current secret" in rules["signed_accepted"]["advice"]
    for rule in ("duplicate_accepted", "forged_rejected", "stale_rejected", "tampered_rejected"):
        assert rules[rule]["detail"] == NOT_JUDGED_DEPENDENT
    # Each rule beside the answer it was judged on: its status and the start of the body, as received.
    for rule in ("signed_accepted", "fast_answer", "duplicate_accepted", "forged_rejected", "tampered_rejected"):
        assert (rules[rule]["status"], rules[rule]["excerpt"]) == (401, REFUSAL_BODY)
    assert (rules["https"]["status"], rules["https"]["excerpt"]) == (None, None)  # judged on no answer
    assert f"body: {REFUSAL_BODY}" in report(wrong_secret_receiver.url, "chk_1", results)


def test_the_requests_on_the_wire_are_what_each_rule_says(bad_receiver, secret):
    """The careless receiver records the five requests as they arrived; each is checked with the SDK."""
    check_id, _ = run_check(bad_receiver.url + "/ok", [secret], "promesa")
    seen = {r.headers["X-Event-Id"]: r for r in bad_receiver.requests}
    assert bad_receiver.count() == len(STEPS)
    for r in bad_receiver.requests:
        assert r.headers[CHECK_HEADER] == check_id
        assert r.headers["X-Event-Type"] == EVENT_TYPE
        event = json.loads(r.body)
        assert event["type"] == EVENT_TYPE and event["data"]["resource_id"] == check_id
    signed, duplicate, forged, stale, tampered = bad_receiver.requests
    assert signed.body == duplicate.body and signed.headers["X-Event-Id"] == duplicate.headers["X-Event-Id"]
    assert len(seen) == 4  # the duplicate repeats the signed id; the others are events of their own
    verify(signed.body, signed.headers["X-Signature"], secret)
    verify(duplicate.body, duplicate.headers["X-Signature"], secret)
    with pytest.raises(SignatureMismatch):
        verify(forged.body, forged.headers["X-Signature"], secret)
    with pytest.raises(TimestampOutsideTolerance):
        verify(stale.body, stale.headers["X-Signature"], secret)
    verify(stale.body, stale.headers["X-Signature"], secret, tolerance=660)  # stale, yet correctly signed
    with pytest.raises(SignatureMismatch):
        verify(tampered.body, tampered.headers["X-Signature"], secret)


# -- real receivers, through the command ----------------------------------------------------------
def command(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "promesa_receiver", "check", url, *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def marks(stdout: str) -> dict[str, str]:
    """rule -> PASS / FAIL / N/A, from the report's rule lines."""
    found = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("PASS", "FAIL", "N/A") and words[1] in RULES:
            found[words[1]] = words[0]
    assert set(found) == set(RULES), stdout
    return found


def test_the_command_passes_the_example_receiver(example, secret):
    url = example.start(secret, scheme="standard-webhooks")
    done = command(url, "--secret", secret, "--scheme", "standard")
    assert done.returncode == 0, done.stdout + done.stderr
    assert marks(done.stdout) == {**{rule: "PASS" for rule in RULES}, "https": "N/A"}
    assert done.stdout.rstrip().endswith("7 passed, 0 failed, 1 not judged")


@pytest.mark.parametrize("case", CASES)
def test_the_command_fails_a_bad_receiver_on_exactly_its_rules(case_url, bad_receiver, secret, case):
    must_fail, not_judged = CASES[case]
    done = command(case_url, "--secret", secret)
    assert done.returncode == 1, done.stdout + done.stderr
    found = marks(done.stdout)
    assert {rule for rule, mark in found.items() if mark == "FAIL"} == must_fail
    assert {rule for rule, mark in found.items() if mark == "N/A"} == not_judged
    if case == "redirect":
        assert f"register {bad_receiver.url}/final " in done.stdout


def test_the_command_prints_json_on_request(bad_receiver, secret):
    done = command(bad_receiver.url + "/ok", "--secret", secret, "--json")
    assert done.returncode == 1, done.stderr
    printed = json.loads(done.stdout)
    assert printed["id"].startswith("chk_")
    assert set(failed(printed["results"])) == {"forged_rejected", "stale_rejected", "tampered_rejected"}


def test_the_urllib_transport_tells_a_timeout_from_a_refusal(bad_receiver):
    slow = urllib_send(bad_receiver.url + "/slow/2", b"{}", {"Content-Type": "application/json"}, 0.5)
    assert (slow.status, slow.timed_out) == (None, True) and 0.5 <= slow.elapsed < 2
    refused = urllib_send("http://127.0.0.1:9/h", b"{}", {}, 0.5)
    assert (refused.status, refused.timed_out) == (None, False) and "refused" in refused.error
    moved = urllib_send(bad_receiver.url + "/moved", b"{}", {}, 5)
    assert (moved.status, moved.location) == (301, bad_receiver.url + "/final")
    assert bad_receiver.count("/final") == 0  # never followed
    answered = urllib_send(bad_receiver.url + "/status/503", b"{}", {}, 5)
    assert answered.status == 503 and answered.error is None


def test_the_command_sends_the_endpoints_own_headers_and_judges_credentials_required(secret):
    with WrongSecretReceiver(secret, api_key="key-7f3a9c") as gateway:
        done = command(gateway.url, "--secret", secret, "--header", "X-Api-Key: key-7f3a9c", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        results = {r["rule"]: r for r in json.loads(done.stdout)["results"]}
        assert list(results) == list(ALL_RULES)  # credentials_required is judged: a header was given
        assert results["signed_accepted"]["passed"] and results[CREDENTIALS_RULE]["passed"]
        assert results[CREDENTIALS_RULE]["status"] == 401
        without = command(gateway.url, "--secret", secret)  # the gateway refuses everything: said as a failure
        assert without.returncode == 1 and marks(without.stdout)["signed_accepted"] == "FAIL"
    with WrongSecretReceiver(secret) as careless:  # accepts a request without the key: credentials_required fails
        done = command(careless.url, "--secret", secret, "--header", "X-Api-Key: key-7f3a9c")
        assert done.returncode == 1 and f"FAIL  {CREDENTIALS_RULE}" in done.stdout, done.stdout
        assert "key-7f3a9c" not in done.stdout + done.stderr  # the report names headers, never their values


@pytest.mark.parametrize("argument, words", [
    ("X-Api-Key key-7f3a9c", "without a colon"), ("X Api: key-7f3a9c", "whose name is not a token"),
    ("X-Api-Key:", "X-Api-Key: the value must be printable ASCII"),
    ("X-Api-Key: key-7f3a9c\u00e9", "X-Api-Key: the value must be printable ASCII"),
])
def test_the_command_refuses_a_bad_header_without_echoing_its_value(argument, words):
    done = command("http://127.0.0.1:9/x", "--secret", new_secret(), "--header", argument)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "key-7f3a9c" not in done.stderr


def test_the_command_refuses_bad_input_with_a_usage_error():
    done = command("ftp://example.test/x", "--secret", new_secret())
    assert done.returncode == 2 and "URL must start with http:// or https://" in done.stderr
    done = command("http://127.0.0.1:9/x", "--secret", "not base64!", "--scheme", "standard")
    assert done.returncode == 2 and "not a whsec_<base64> secret" in done.stderr
    assert "not base64!" not in done.stderr  # the secret itself is never echoed
    done = command("http://127.0.0.1:9/x")
    assert done.returncode == 2 and "--secret" in done.stderr


# Nothing listens on port 9: check's signed_accepted fails; listen cannot reach Promesa to make its session.
@pytest.mark.parametrize("argv, said", [
    (["check", "http://127.0.0.1:9/h", "--secret", "whsec_c2VjcmV0"], "FAIL  signed_accepted"),
    (["listen", "--forward-to", "http://127.0.0.1:9/h", "--token", "pk_x", "--url", "http://127.0.0.1:9"],
     "could not reach Promesa at http://127.0.0.1:9"),
])
def test_the_command_needs_only_the_standard_library(tmp_path, argv, said):
    code = (
        "import sys\n"
        "for name in ('flask', 'werkzeug', 'sqlalchemy', 'redis', 'aiohttp', 'requests', 'dashboard'):\n"
        "    sys.modules[name] = None  # any import of them raises ImportError\n"
        "from promesa_receiver.cli import main\n"
        f"sys.exit(main({argv!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(SDK)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and said in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Connection refused" in done.stdout + done.stderr


def test_the_console_script_is_the_command():
    scripts = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["promesa-receiver"].partition(":")
    from importlib import import_module

    from promesa_receiver.cli import main

    assert getattr(import_module(module), function) is main


# -- judge(), on its own ---------------------------------------------------------------------------
URL = "http://127.0.0.1:8000/hook"


def answers(**overrides) -> dict[str, Answer]:
    """A perfect receiver's answers, with some replaced (None: that step was not sent)."""
    good = {"signed": Answer(200, 0.1), "duplicate": Answer(200, 0.1), "forged": Answer(401, 0.1),
            "stale": Answer(400, 0.1), "tampered": Answer(403, 0.1)}
    good.update(overrides)
    return {step: a for step, a in good.items() if a is not None}


def test_judge_passes_a_perfect_receiver_and_judges_https_by_the_target():
    assert outcome(judge(URL, "promesa", answers(), allow_private=True)) == (set(), {"https"})
    assert outcome(judge(URL, "promesa", answers(), allow_private=False)) == ({"https"}, set())
    assert outcome(judge("http://[::1]:8000/h", "promesa", answers(), allow_private=True)) == (set(), {"https"})
    assert outcome(judge("http://localhost/h", "promesa", answers(), allow_private=True)) == (set(), {"https"})
    # Private targets allowed, but not loopback: plain http is still judged.
    assert outcome(judge("http://10.0.0.5/h", "promesa", answers(), allow_private=True)) == ({"https"}, set())
    assert outcome(judge("https://hooks.example.test/h", "promesa", answers())) == (set(), set())


@pytest.mark.parametrize("status", [400, 401, 403])
def test_judge_takes_400_401_and_403_as_a_rejection(status):
    rules = by_rule(judge(URL, "promesa", answers(forged=Answer(status, 0.1)), allow_private=True))
    assert rules["forged_rejected"]["passed"] is True


def test_judge_fails_an_accepted_forgery_with_the_schemes_own_words():
    promesa = by_rule(judge(URL, "promesa", answers(forged=Answer(200, 0.1)), contract_url="https://p.test/c/1"))
    advice = promesa["forged_rejected"]["advice"]
    assert "X-Signature" in advice and "promesa_receiver.verify(" in advice and "verifyPromesaSignature" in advice
    assert "https://p.test/c/1" in advice
    standard = by_rule(judge(URL, "standard", answers(forged=Answer(204, 0.1))))
    advice = standard["forged_rejected"]["advice"]
    assert "webhook-signature" in advice and "X-Signature" not in advice
    assert "promesa_receiver.verify_standard(" in advice and "verifyStandardWebhook" in advice


def test_judge_fails_a_5xx_rejection_with_its_own_advice():
    accepted = by_rule(judge(URL, "promesa", answers(stale=Answer(200, 0.1))))["stale_rejected"]
    crashed = by_rule(judge(URL, "promesa", answers(stale=Answer(502, 0.1))))["stale_rejected"]
    assert crashed["passed"] is False and accepted["passed"] is False
    assert "failed (502)" in crashed["advice"] and crashed["advice"] != accepted["advice"]
    other = by_rule(judge(URL, "promesa", answers(tampered=Answer(404, 0.1))))["tampered_rejected"]
    assert other["passed"] is False and "answer 400, 401 or 403" in other["advice"]


def test_judge_leaves_the_dependents_null_when_the_signed_event_was_not_accepted():
    for signed in (Answer(401, 0.1), Answer(503, 0.1), Answer(302, 0.1, location="/x"),
                   Answer(None, 10.0, error="timeout", timed_out=True)):
        rules = by_rule(judge(URL, "promesa", answers(signed=signed, forged=Answer(200, 0.1))))
        assert rules["signed_accepted"]["passed"] is False
        for rule in ("duplicate_accepted", "forged_rejected", "stale_rejected", "tampered_rejected"):
            assert (rules[rule]["passed"], rules[rule]["detail"], rules[rule]["advice"]) == (
                None, NOT_JUDGED_DEPENDENT, "")
    rejected = by_rule(judge(URL, "promesa", answers(signed=Answer(401, 0.1))))["signed_accepted"]
    assert "current secret" in rejected["advice"] and "raw body" in rejected["advice"]


def test_judge_times_the_signed_answer_against_5_seconds():
    assert by_rule(judge(URL, "promesa", answers(signed=Answer(200, 5.0))))["fast_answer"]["passed"] is True
    slow = by_rule(judge(URL, "promesa", answers(signed=Answer(200, 5.01))))["fast_answer"]
    assert slow["passed"] is False and "5.01 s" in slow["detail"] and "work later" in slow["advice"]
    # A slow 500 is still slow; a timeout fails both; a refused connection cannot be timed.
    assert by_rule(judge(URL, "promesa", answers(signed=Answer(500, 7.0))))["fast_answer"]["passed"] is False
    timeout = by_rule(judge(URL, "promesa", answers(signed=Answer(None, 10.0, error="timed out", timed_out=True),
                                                    duplicate=None, forged=None, stale=None, tampered=None)))
    assert (timeout["signed_accepted"]["passed"], timeout["fast_answer"]["passed"]) == (False, False)
    assert timeout["duplicate_accepted"]["passed"] is None and timeout["no_redirect"]["passed"] is None
    refused = by_rule(judge(URL, "promesa", answers(signed=Answer(None, 0.0, error="refused"), duplicate=None)))
    assert refused["fast_answer"]["passed"] is None and "refused" in refused["fast_answer"]["detail"]


def test_judge_fails_a_duplicate_that_is_not_answered_2xx():
    dup = by_rule(judge(URL, "promesa", answers(duplicate=Answer(409, 0.1))))["duplicate_accepted"]
    assert dup["passed"] is False and "a duplicate is not an error" in dup["advice"]


def test_judge_names_the_location_to_register_resolving_a_relative_one():
    rules = by_rule(judge(URL, "promesa", answers(signed=Answer(301, 0.1, location="/v2/hook"))))
    assert rules["no_redirect"]["passed"] is False
    assert "register http://127.0.0.1:8000/v2/hook (the final URL) instead of " + URL in rules["no_redirect"]["advice"]
    # A redirect on any request counts, not only the signed one.
    late = by_rule(judge(URL, "promesa", answers(tampered=Answer(308, 0.1, location="https://x.test/h"))))
    assert late["no_redirect"]["passed"] is False and "the tampered request" in late["no_redirect"]["detail"]
    none = by_rule(judge(URL, "promesa", answers(signed=Answer(302, 0.1))))["no_redirect"]
    assert none["passed"] is False and "(none)" in none["detail"]


def test_judge_escapes_what_the_receiver_wrote():
    rules = by_rule(judge(URL, "promesa", answers(signed=Answer(302, 0.1, location="/a\x1b[31mred\nX: y"))))
    text = rules["no_redirect"]["detail"] + rules["no_redirect"]["advice"]
    assert "\x1b" not in text and "\n" not in text and "\\x1b" in text


def test_judge_refuses_unknown_steps_and_schemes():
    with pytest.raises(ValueError, match="unknown step"):
        judge(URL, "promesa", {"signd": Answer(200, 0.1)})
    with pytest.raises(ValueError, match="unknown signature scheme"):
        judge(URL, "hmac", answers())


# -- plan() and run_check() with an injected transport -------------------------------------------
def test_plan_signs_every_request_with_every_current_secret():
    old, new = new_secret(), new_secret()
    requests = {r.step: r for r in plan("chk_1", [new, old], "standard", now=1_800_000_000)}
    assert list(requests) == list(STEPS)
    for step in ("signed", "duplicate", "stale", "tampered"):
        assert len(requests[step].headers["webhook-signature"].split()) == 2
    for secret in (old, new):
        assert verify_standard(requests["signed"].body, requests["signed"].headers, [secret], now=1_800_000_000)
    with pytest.raises(SignatureMismatch):
        verify_standard(requests["forged"].body, requests["forged"].headers, [old, new], now=1_800_000_000)
    assert requests["stale"].headers["webhook-timestamp"] == str(1_800_000_000 - 600)
    tampered = build("tampered", "chk_1", new, "standard", now=5)
    signed_body = tampered.body.replace(b'"resource_version":2', b'"resource_version":1')
    assert sum(a != b for a, b in zip(signed_body, tampered.body)) == 1 and len(signed_body) == len(tampered.body)
    assert verify_standard(signed_body, tampered.headers, new, now=5) == 5  # the body as it was signed
    with pytest.raises(SignatureMismatch):
        verify_standard(tampered.body, tampered.headers, new, now=5)
    json.loads(tampered.body)  # still JSON: rejecting it takes the signature, not a parser


def test_run_check_signs_each_request_when_it_goes_and_uses_the_given_transport():
    sent, bodies = [], []
    clock = iter(range(1_799_999_990, 1_800_000_100, 10))  # one tick for the event's own time, one a request

    def send(url, body, headers, timeout):
        sent.append((url, headers, timeout))
        bodies.append(body)
        return Answer(401 if headers["X-Event-Id"].endswith(("forged", "stale", "tampered")) else 200, 0.01)

    secret = new_secret()
    check_id, results = run_check("https://r.test/h", secret, send=send, clock=lambda: next(clock), timeout=3.0)
    assert outcome(results) == (set(), set())
    assert [h["X-Signature"].split(",")[0] for _, h, _ in sent] == [
        "t=1800000000", "t=1800000010", "t=1800000020", f"t={1_800_000_030 - 600}", "t=1800000040"]
    assert {(u, t) for u, _, t in sent} == {("https://r.test/h", 3.0)}
    assert all(h[CHECK_HEADER] == check_id for _, h, _ in sent)
    assert bodies[0] == bodies[1]  # the duplicate, signed 10 s later, is the same body
    assert json.loads(bodies[0])["timestamp"] == "2027-01-15T07:59:50.000Z"  # when the check started


def test_run_check_stops_when_the_signed_event_gets_no_answer():
    sent = []

    def send(url, body, headers, timeout):
        sent.append(headers["X-Event-Id"])
        return Answer(None, timeout, error="TimeoutError: timed out", timed_out=True)

    check_id, results = run_check("http://127.0.0.1:1/h", new_secret(), send=send)
    assert sent == [f"evt_{check_id}_signed"]
    assert outcome(results) == ({"signed_accepted", "fast_answer", "https"},  # loopback, private not allowed
                                {"duplicate_accepted", "forged_rejected", "stale_rejected", "tampered_rejected",
                                 "no_redirect"})


def test_the_report_has_a_line_a_rule_and_the_advice_under_a_failure():
    results = judge(URL, "promesa", answers(forged=Answer(200, 0.1)), allow_private=True)
    text = report(URL, "chk_1", results)
    assert marks(text)["forged_rejected"] == "FAIL" and marks(text)["https"] == "N/A"
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  forged_rejected"))
    assert lines[at + 1].strip().startswith("-> your endpoint accepted a request signed with the wrong secret")
    assert lines[-1] == "6 passed, 1 failed, 1 not judged"
