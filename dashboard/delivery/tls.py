"""Sending with a subscription's client certificate (mutual TLS, issue 39; the setting is checked and stored by
dashboard.subscriptions.client_tls).

A TLS setting becomes one `ssl.SSLContext`: the system's default trust plus the setting's CA bundle, and the
client certificate with its key. It is passed per request (aiohttp's `ssl=`), never set on the session.

Why one subscription's certificate is never presented on a connection another subscription uses: aiohttp pools
connections by `ConnectionKey` (aiohttp/client_reqrep.py: host, port, is_ssl, **ssl**, proxy, ...), and the `ssl`
member is the request's SSLContext object itself, compared by identity. A request with another context (another
subscription's, or aiohttp's default for a subscription without one) never takes a pooled connection made with
this one, and the in-flight bound per host applies per key as well. Contexts are cached per ciphertext (`Contexts`),
so deliveries of one subscription share their connections, and an edit (a new ciphertext) starts fresh ones.
A plain-http endpoint makes no handshake: the context is carried but unused.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import tempfile
from collections import OrderedDict
from collections.abc import Callable

from dashboard.core import crypto

# A TLS alert the receiver ended the handshake with, as OpenSSL words it: "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED]
# tlsv13 alert certificate required (_ssl.c:2580)".
_ALERT = re.compile(r"\[SSL: (?:TLSV13|TLSV1|SSLV3)_ALERT_(\w+)\] ([^(\]]*)")
# The alerts a server sends about the client's certificate (or its absence; TLS 1.2 says handshake failure).
CLIENT_CERTIFICATE_ALERTS = frozenset({"CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "CERTIFICATE_UNKNOWN",
                                       "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED", "UNSUPPORTED_CERTIFICATE",
                                       "ACCESS_DENIED", "HANDSHAKE_FAILURE"})
# How aiohttp words a connection closed under a request being written (the alert itself is lost then).
_CLOSED_AT_ONCE = ("Cannot write to closing transport", "Server disconnected")
MAX_CONTEXTS = 1000  # per engine or check: a worker serving more TLS settings builds the oldest again


def context(setting: dict) -> ssl.SSLContext:
    """An SSLContext for a stored TLS setting ({"client_certificate", "client_key", "ca_certificates"})."""
    made = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if setting.get("ca_certificates"):
        made.load_verify_locations(cadata=setting["ca_certificates"])
    _load_chain(made, setting["client_certificate"] + setting["client_key"])
    return made


def _load_chain(made: ssl.SSLContext, pem: str) -> None:
    """ssl reads a certificate and key from a file only: an anonymous memory file where the system has them (never
    on a disk), else a file readable by this user alone in a private directory, removed at once."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("promesa-client-tls", os.MFD_CLOEXEC)
        try:
            with open(fd, "wb", closefd=False) as file:
                file.write(pem.encode("ascii"))
            made.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="promesa-tls-") as private:  # mkdtemp: mode 0700
        path = os.path.join(private, "client.pem")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
            file.write(pem)
        try:
            made.load_cert_chain(path)
        finally:
            os.unlink(path)


def context_of(ciphertext: str | None) -> ssl.SSLContext | None:
    """The context for a subscription's `tls_ciphertext` (None: none set); inside an app context."""
    return context(json.loads(crypto.decrypt(ciphertext))) if ciphertext else None


class Contexts:
    """One SSLContext per TLS setting, kept per ciphertext (the most recently used MAX_CONTEXTS)."""

    def __init__(self, decrypt: Callable[[str], str]):
        self._decrypt = decrypt  # the engine's, which caches and holds an app context
        self._made: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    def get(self, ciphertext: str | None) -> ssl.SSLContext | None:
        if not ciphertext:
            return None
        made = self._made.get(ciphertext)
        if made is None:
            made = self._made[ciphertext] = context(json.loads(self._decrypt(ciphertext)))
            if len(self._made) > MAX_CONTEXTS:
                self._made.popitem(last=False)
        else:
            self._made.move_to_end(ciphertext)
        return made


def handshake_refusal(exc: BaseException, https: bool) -> str | None:
    """What an attempt's error says of a TLS connection the receiver ended before answering (None: it was not
    that): a refused or missing client certificate says so, for the attempt and the diagnosis. Under TLS 1.3 the
    receiver judges the client certificate after the client's handshake is done, so its alert can come as the
    request is written, when aiohttp reports only that the transport was closing."""
    found, seen, chain = None, exc, []
    while found is None and seen is not None:  # aiohttp re-raises an OSError as ClientOSError "from" it
        chain.append(str(seen))
        found, seen = _ALERT.search(chain[-1]), seen.__cause__ or seen.__context__
    if found is not None:
        alert, words = found.group(1), found.group(2).strip()
        if alert in CLIENT_CERTIFICATE_ALERTS:
            return f"the receiver refused the client certificate, or its absence ({words})"
        return f"the receiver ended the handshake ({words})"
    if https and any(closed in text for text in chain for closed in _CLOSED_AT_ONCE):
        return ("the receiver closed the connection before answering, as one that requires a client certificate "
                "does when it finds none or refuses the one presented")
    return None
