"""A private CA and a server certificate it signed, for TLS on loopback.

The local stack serves NATS and Redis over TLS with these when asked (``LocalStack(tls=True)``),
and tests that need a TLS server of their own use them too. Elliptic-curve keys (P-256):
making a pair takes microseconds, where a 2048-bit RSA key takes tens of milliseconds, and
every TLS library here speaks ECDSA. The extensions are the ones strict verifiers demand (key
identifiers, key usage), so the same files pass Python's ``VERIFY_X509_STRICT``, nats-server's
Go verifier and OpenSSL in redis-server. The certificates live for a day: a stack is gone long
before, and a certificate that outlived its stack would be a bug worth seeing.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LIFETIME = datetime.timedelta(days=1)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA clients trust, and the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path


def issue(directory: Path, *, hosts: tuple[str, ...] = ("127.0.0.1",)) -> TlsFiles:
    """A new CA in ``directory`` and a server certificate it signed for ``hosts`` (IP
    addresses or DNS names)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _signed(
        x509.CertificateBuilder()
        .subject_name(_name("capibus local CA"))
        .issuer_name(_name("capibus local CA"))
        .public_key(ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
        ca_key,
        now,
    )
    cert = _signed(
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        ),
        ca_key,
        now,
    )
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files.key.chmod(0o600)
    return files


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _signed(
    builder: x509.CertificateBuilder, key: ec.EllipticCurvePrivateKey, now: datetime.datetime
) -> x509.Certificate:
    valid = builder.not_valid_before(now - datetime.timedelta(minutes=1))
    valid = valid.not_valid_after(now + LIFETIME)
    return valid.serial_number(x509.random_serial_number()).sign(key, hashes.SHA256())
