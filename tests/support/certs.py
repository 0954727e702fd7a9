"""Certificates for the TLS tests, made with ``cryptography``: a throwaway CA, a
server certificate for 127.0.0.1/localhost and a client certificate, as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
           *, ca: bool = False, hosts: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject)).issuer_name(_name(issuer)).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certs(folder: str) -> Certs:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("conveyor test CA", ca_key, "conveyor test CA", ca_key, ca=True)
    files: dict[str, bytes] = {"ca.pem": ca.public_bytes(serialization.Encoding.PEM)}
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"conveyor test {who}", key, "conveyor test CA", ca_key, hosts=who == "server")
        files[f"{who}.pem"] = cert.public_bytes(serialization.Encoding.PEM)
        files[f"{who}.key"] = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption())
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    p = lambda name: os.path.join(folder, name)  # noqa: E731
    return Certs(p("ca.pem"), p("server.pem"), p("server.key"), p("client.pem"), p("client.key"))
