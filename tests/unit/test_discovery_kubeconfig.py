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


def ca_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tenant-ca")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def kubeconfig(**cluster: str) -> str:
    return yaml.safe_dump(
        {
            "clusters": [
                {"name": "t", "cluster": {"server": "https://tenant.test:6443/", **cluster}}
            ],
            "users": [{"name": "admin", "user": {"token": "secret-token"}}],
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


@pytest.mark.parametrize(
    "text",
    ["not: [a kubeconfig", "{}", kubeconfig(**{"certificate-authority-data": "bm90IGEgY2VydA=="})],
)
def test_an_unusable_kubeconfig_is_permanent(text: str) -> None:
    with pytest.raises(PermanentError):
        kubeconfig_client(text)
