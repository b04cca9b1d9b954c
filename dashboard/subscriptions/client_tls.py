"""A client certificate for mutual TLS on a subscription (issue 39): `{"client_certificate": PEM, "client_key":
PEM, "ca_certificates"?: PEM}`, for a receiver whose gateway asks every caller for a certificate.

Checked on input with `cryptography`: the certificate (possibly followed by its chain) and the key parse, the key
is the certificate's, the certificate is in date by the app's clock, an extra CA bundle parses; an encrypted key
is refused (Promesa has nowhere to keep a passphrase). Stored encrypted as the signing secret is
(`Subscription.tls_ciphertext`: Fernet of a JSON object, the PEM normalised), with what may be shown of the
certificate in clear beside it (`tls_subject`, `tls_issuer`, `tls_expires_at`). Reads, pages, the audit log and
the contract show the subject, issuer and expiry, and whether a CA bundle is set: never the key.

Sending it is dashboard.delivery.tls's job; from EXPIRY_WARNING before the certificate ends, the subscription
page warns and the incident rule `certificate_expiring` (dashboard.operations.incidents) fires.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from sqlalchemy import select

from dashboard.core import crypto
from dashboard.core.clock import iso
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.delivery import tls
from dashboard.models import Subscription

EXPIRY_WARNING = dt.timedelta(days=14)
NAME_LENGTH = 500  # tls_subject and tls_issuer
_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class ClientTls:
    """A checked TLS setting: the PEM as stored, and what may be shown of the certificate."""
    client_certificate: str
    client_key: str
    ca_certificates: str | None
    subject: str
    issuer: str
    expires_at: dt.datetime  # naive UTC, as every time in the database

    def stored(self) -> dict:
        return {"client_certificate": self.client_certificate, "client_key": self.client_key,
                "ca_certificates": self.ca_certificates}

    def view(self) -> dict:
        return shown(self.subject, self.issuer, self.expires_at, self.ca_certificates is not None)


def shown(subject: str, issuer: str, expires_at: dt.datetime, ca: bool) -> dict:
    """What reads, pages and the audit log show of a client certificate (never the key)."""
    return {"subject": subject, "issuer": issuer, "expires_at": iso(expires_at), "ca_certificates": ca}


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def _certificates(pem: str, field: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem.encode("utf-8", "replace"))
    except ValueError:
        found = []
    if not found:
        raise ApiError(422, f"tls.{field}: no PEM certificate could be read (expected -----BEGIN CERTIFICATE----- "
                            "blocks)")
    return found


def _key(pem: str):
    try:
        return serialization.load_pem_private_key(pem.encode("utf-8", "replace"), password=None)
    except TypeError:  # cryptography's word for a key that needs a password
        raise ApiError(422, "tls.client_key: the key is encrypted with a passphrase, which Promesa cannot keep: "
                            "give it unencrypted (e.g. openssl pkey -in key.pem -out plain-key.pem); it is "
                            "stored encrypted and never shown again") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ApiError(422, "tls.client_key: no PEM private key could be read (expected a -----BEGIN PRIVATE "
                            "KEY----- block, or an RSA or EC one)") from None


def _pem(certificates: list[x509.Certificate]) -> str:
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in certificates)


def checked(given: dict, now: dt.datetime) -> ClientTls:
    """The API's `tls` object checked, or a 422 naming what is wrong: a certificate or key that cannot be read, an
    encrypted key, a key that is not the certificate's, a certificate out of date at `now` (naive UTC), a CA
    bundle that cannot be read."""
    chain = _certificates(given["client_certificate"], "client_certificate")
    key = _key(given["client_key"])
    leaf = chain[0]
    if key.public_key().public_bytes(*_SPKI) != leaf.public_key().public_bytes(*_SPKI):
        raise ApiError(422, "tls.client_key: the key is not the certificate's (its public key differs from the "
                            "one the first certificate of client_certificate carries)")
    starts, ends = _utc(leaf.not_valid_before_utc), _utc(leaf.not_valid_after_utc)
    dates = f"valid from {iso(starts)} to {iso(ends)}"
    if now < starts:
        raise ApiError(422, f"tls.client_certificate: the certificate is not valid yet ({dates}; now is {iso(now)})")
    if now >= ends:
        raise ApiError(422, f"tls.client_certificate: the certificate has expired ({dates}; now is {iso(now)})")
    ca = given.get("ca_certificates")
    ca_pem = _pem(_certificates(ca, "ca_certificates")) if ca is not None else None
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode("ascii")
    setting = ClientTls(_pem(chain), key_pem, ca_pem, leaf.subject.rfc4514_string()[:NAME_LENGTH],
                        leaf.issuer.rfc4514_string()[:NAME_LENGTH], ends)
    try:  # what cryptography reads, the ssl module may still refuse (a key type it cannot sign with)
        tls.context(setting.stored())
    except ssl.SSLError as exc:
        raise ApiError(422, f"tls: the certificate and key cannot be used for TLS here ({exc.reason or exc})") from None
    return setting


def stored(sub: Subscription) -> dict | None:
    """The subscription's TLS setting, in clear (the stored JSON object): for sending only. None: none."""
    return json.loads(crypto.decrypt(sub.tls_ciphertext)) if sub.tls_ciphertext else None


def view_of(sub: Subscription) -> dict | None:
    """What reads show of its client certificate (None: none set)."""
    if not sub.tls_ciphertext:
        return None
    return shown(sub.tls_subject, sub.tls_issuer, sub.tls_expires_at, stored(sub)["ca_certificates"] is not None)


def apply(sub: Subscription, setting: ClientTls | None) -> None:
    """Store a checked setting on the subscription (None: remove it)."""
    sub.tls_ciphertext = crypto.encrypt(json.dumps(setting.stored(), separators=(",", ":"))) if setting else None
    sub.tls_subject = setting.subject if setting else None
    sub.tls_issuer = setting.issuer if setting else None
    sub.tls_expires_at = setting.expires_at if setting else None


def edited(sub: Subscription, given: dict | None, now: dt.datetime) -> tuple[dict | None, dict | None] | None:
    """An edit's `tls` (None: remove) applied to the subscription: (before, after) as the audit log keeps them,
    or None when nothing changed (the same PEM given again, or nothing to remove)."""
    setting = checked(given, now) if given is not None else None
    if (setting.stored() if setting else None) == stored(sub):
        return None
    before = view_of(sub)
    apply(sub, setting)
    return before, setting.view() if setting else None


def expiry_warning(sub: Subscription, now: dt.datetime) -> str | None:
    """From EXPIRY_WARNING before its client certificate ends: when, in words (None: no warning)."""
    if sub.tls_expires_at is None or sub.tls_expires_at - now > EXPIRY_WARNING:
        return None
    if sub.tls_expires_at <= now:
        return f"The client certificate expired on {iso(sub.tls_expires_at)}: receivers that ask for it refuse " \
               "every delivery. Give the subscription a renewed certificate."
    days = (sub.tls_expires_at - now).days
    left = "less than a day" if days == 0 else f"{days} day{'s' if days != 1 else ''}"
    return f"The client certificate expires on {iso(sub.tls_expires_at)}, in {left}: give the subscription a " \
           "renewed certificate before then."


@dataclass(frozen=True)
class Expiring:
    subscription_id: str
    team_id: int
    subject: str
    expires_at: dt.datetime


def expiring(now: dt.datetime) -> list[Expiring]:
    """Subscriptions (not deleted) whose client certificate ends within EXPIRY_WARNING of `now`, or has ended."""
    rows = db.session.execute(
        select(Subscription.id, Subscription.team_id, Subscription.tls_subject, Subscription.tls_expires_at)
        .where(Subscription.tls_expires_at.is_not(None), Subscription.tls_expires_at <= now + EXPIRY_WARNING,
               Subscription.deleted_at.is_(None)))
    return [Expiring(*row) for row in rows]


def contract_terms(sub: Subscription) -> dict:
    """What the published contract says of the client certificate a receiver should expect (never the key)."""
    if sub.tls_ciphertext is None:
        return {"subject": None, "issuer": None, "expires_at": None,
                "text": "None: Promesa presents no client certificate to this endpoint."}
    return {"subject": sub.tls_subject, "issuer": sub.tls_issuer, "expires_at": iso(sub.tls_expires_at),
            "text": f"Every HTTPS delivery, test event and receiver check presents a client certificate with subject "
                    f"{sub.tls_subject}, issued by {sub.tls_issuer}, valid until {iso(sub.tls_expires_at)}. Your "
                    "gateway may require it: admit this subject from this issuer, not merely any certificate of "
                    "the authority. It proves who connects, not what was sent: verify the signature as well."}
