"""SSH key pairs for ``POST /ns/{ns}/resources/sshKey``.

A CSP generates the key pair and hands the private key out once; Tumblebug v0.7.0 stores it
and returns it on every ``GET`` too (``TbSshKeyInfo.privateKey``), which is what CB-Ladybug
relies on. The stand-in generates a real RSA-2048 pair in the PEM form AWS returns
(``BEGIN RSA PRIVATE KEY``), so the private key opens the VM's real sshd; the public half is
the OpenSSH line the node farm authorises.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class KeyPair:
    private_key: str
    public_key: str
    fingerprint: str


def generate() -> KeyPair:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return KeyPair(private, public, fingerprint(public))


def fingerprint(public_line: str) -> str:
    """OpenSSH's ``SHA256:`` fingerprint of a public key line."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
