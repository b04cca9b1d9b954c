"""Subscription secrets at rest: encrypted with PROMESA_ENCRYPTION_KEY (Fernet), never stored in clear."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken
from flask import current_app


def _fernet() -> Fernet:
    return Fernet(current_app.config["PROMESA_ENCRYPTION_KEY"])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(ciphertext: str) -> str:
    try:
        return _fernet().decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except InvalidToken as exc:  # a changed key must fail loudly, not sign with garbage
        raise RuntimeError("cannot decrypt a subscription secret: PROMESA_ENCRYPTION_KEY changed?") from exc
