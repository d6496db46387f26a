"""Building a tenant client from kubeconfig text (``shared.kube.kubeconfig_client``)."""

import base64
import datetime as dt
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shared.errors import PermanentError
from shared.kube import kubeconfig_client


def self_signed(*, ca: bool) -> tuple[bytes, bytes]:
    """A certificate and its private key, both PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tenant")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def ca_pem() -> bytes:
    return self_signed(ca=True)[0]


def kubeconfig(user: dict[str, str] | None = None, **cluster: str) -> str:
    return yaml.safe_dump(
        {
            "clusters": [
                {"name": "t", "cluster": {"server": "https://tenant.test:6443/", **cluster}}
            ],
            "users": [{"name": "admin", "user": user or {"token": "secret-token"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "admin"}}],
            "current-context": "t",
        }
    )


async def test_inline_credentials_leave_nothing_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = base64.b64encode(ca_pem()).decode()
    client = kubeconfig_client(kubeconfig(**{"certificate-authority-data": data}), qps=None)
    try:
        assert str(client.http.base_url) == "https://tenant.test:6443"
        assert client.http.headers["Authorization"] == "Bearer secret-token"
    finally:
        await client.aclose()
    assert os.listdir(tmp_path) == []


async def test_an_inline_client_certificate_loads_and_leaves_nothing_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cert, key = self_signed(ca=False)
    user = {
        "client-certificate-data": base64.b64encode(cert).decode(),
        "client-key-data": base64.b64encode(key).decode(),
    }
    client = kubeconfig_client(kubeconfig(user), qps=None)
    await client.aclose()
    assert "Authorization" not in client.http.headers
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "text",
    ["not: [a kubeconfig", "{}", kubeconfig(**{"certificate-authority-data": "bm90IGEgY2VydA=="})],
)
def test_an_unusable_kubeconfig_is_permanent(text: str) -> None:
    with pytest.raises(PermanentError):
        kubeconfig_client(text)
