"""The exceptions a receiver catches. Every verification failure is a ``VerificationError``
(a ``ValueError``), so one ``except VerificationError`` answers 400/401 for all of them;
the subclass and the message say which check failed. Messages never contain a secret or
an expected signature."""

from __future__ import annotations


class VerificationError(ValueError):
    """A webhook request failed verification. Answer it 4xx and do not process it."""


class MissingSignature(VerificationError):
    """The signature header (or one of the Standard Webhooks headers) is absent or empty."""


class MalformedSignature(VerificationError):
    """A signature header is present but cannot be parsed (garbled items, a non-integer
    timestamp, no ``v1`` signature, a ``v1`` value of the wrong shape)."""


class TimestampOutsideTolerance(VerificationError):
    """The signed timestamp is too far in the past (a replay) or in the future (clock skew)."""


class SignatureMismatch(VerificationError):
    """No ``v1`` signature in the header matches any of the configured secrets
    (wrong secret, tampered body, or a body that was re-serialised before verifying)."""


class InvalidEvent(ValueError):
    """An event body handed to the ordering helper lacks a field it needs, or has one of the
    wrong type. Not a ``VerificationError``: verify the signature first, then order."""
