"""Mutual TLS on 127.0.0.1 for the tests: a certificate authority made with `cryptography` (EC keys: fast), the
certificates it issues (a server's for 127.0.0.1 and localhost, clients' by common name), and an HTTPS receiver
that requires a client certificate from that authority (ssl.CERT_REQUIRED) and records who connected."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.receiver import Receiver


def key_pem(key, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()


def cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class Issued:
    name: str  # the common name
    certificate: str  # PEM
    key: str  # PEM, unencrypted
    key_object: object
    not_after: dt.datetime  # naive UTC

    def tls(self, ca: CertificateAuthority | None = None) -> dict:
        """As the API's `tls` takes it, trusting `ca` for the receiver's certificate."""
        return {"client_certificate": self.certificate, "client_key": self.key,
                **({"ca_certificates": ca.pem} if ca else {})}


class CertificateAuthority:
    """A certificate authority of the test's own."""

    def __init__(self, name: str = "Promesa Test CA"):
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(self.key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=30))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256()))
        self.pem = cert_pem(self.certificate)

    def issue(self, name: str, *, days: tuple[float, float] = (-1, 365), server: bool = False) -> Issued:
        """A certificate for `name` valid from days[0] to days[1] from now: a server's for 127.0.0.1 and localhost,
        or a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        not_after = now + dt.timedelta(days=days[1])
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                                                              x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tests")]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now + dt.timedelta(days=days[0]))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                  else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(name, cert_pem(cert), key_pem(key), key, not_after.replace(tzinfo=None))


def _common_name(peer: dict | None) -> str | None:
    for rdn in (peer or {}).get("subject", ()):
        for attribute, value in rdn:
            if attribute == "commonName":
                return value
    return None


class MtlsReceiver(Receiver):
    """The test receiver over HTTPS with `server`'s certificate, requiring a client certificate `ca` issued:
    a handshake without one (or with another authority's) is refused. `subjects` lists (path, the client
    certificate's common name) per request and `connections` counts handshakes; under /as/<name> it answers
    403 to a client certificate of any other name (a gateway that admits one subscriber), else as Receiver."""

    def __init__(self, tmp_path: Path, ca: CertificateAuthority, server: Issued):
        super().__init__()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=ca.pem)
        chain = tmp_path / f"server-{server.name}.pem"
        chain.write_text(server.certificate + server.key)
        context.load_cert_chain(chain)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = self.url.replace("http://", "https://", 1)
        self.subjects: list[tuple[str, str | None]] = []
        self.connections = 0
        receiver, finish = self, self.server.finish_request

        def finish_request(request, client_address):  # one thread per connection: its peer for its requests
            with receiver.lock:
                receiver.connections += 1
            receiver.asking.peer = _common_name(request.getpeercert())
            finish(request, client_address)

        self.server.finish_request = finish_request

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        peer = self.asking.peer
        with self.lock:
            self.subjects.append((path, peer))
        parts = path.strip("/").split("/")
        if parts[0] == "as":
            return (200, {}) if parts[1] == peer else (403, {})
        return super().behaviour(path, n)
