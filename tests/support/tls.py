"""A TLS receiver on 127.0.0.1 whose certificate is wrong in one way: self-signed, expired, or for
another host name (the last two signed by a certificate authority the client may be told to trust)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.receiver import Receiver

KINDS = ("self_signed", "expired", "wrong_name")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject_key, subject: str, issuer_key, issuer: str, *, days: tuple[int, int], hosts: list[str],
                 ca: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    names = [x509.IPAddress(ipaddress.ip_address(h)) if h[0].isdigit() else x509.DNSName(h) for h in hosts]
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(subject_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now + dt.timedelta(days=days[0])).not_valid_after(now + dt.timedelta(days=days[1]))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, cert: x509.Certificate, key=None) -> Path:
    data = cert.public_bytes(serialization.Encoding.PEM)
    if key is not None:
        data += key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    path.write_bytes(data)
    return path


class TlsReceiver(Receiver):
    """The test receiver over TLS, with a certificate of the given kind; `ca_file` is the authority to
    trust (it vouches for nothing of the self-signed kind)."""

    def __init__(self, tmp_path: Path, kind: str):
        assert kind in KINDS
        super().__init__()
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = _certificate(ca_key, "Test CA", ca_key, "Test CA", days=(-30, 30), hosts=[], ca=True)
        if kind == "self_signed":
            cert = _certificate(key, "127.0.0.1", key, "127.0.0.1", days=(-1, 30), hosts=["127.0.0.1"])
        elif kind == "expired":
            cert = _certificate(key, "127.0.0.1", ca_key, "Test CA", days=(-10, -1), hosts=["127.0.0.1"])
        else:
            cert = _certificate(key, "elsewhere.example", ca_key, "Test CA", days=(-1, 30), hosts=["elsewhere.example"])
        self.ca_file = _pem(tmp_path / f"ca-{kind}.pem", ca)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(_pem(tmp_path / f"server-{kind}.pem", cert, key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = self.url.replace("http://", "https://", 1)
