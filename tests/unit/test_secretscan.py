"""The secret scanner (``testenv/secretscan.py``): each kind of credential is found where it is
planted, in every form it travels in, and a report never shows more than its first
characters; ordinary bus traffic and log lines are clean."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import pytest
import yaml

from shared.messages import ObjectRef, PatchStatus, encode
from testenv.secretscan import MIN_KNOWN_LENGTH, SHOWN, Scanner

#: a made-up key: the scanner only reads the header, and no real key may be in the repository
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAnotarealkeynotarealkeynotarealkey\n"
    "-----END RSA PRIVATE KEY-----\n"
)
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlc2lnbmF0dXJl"
CLOUDS_YAML = """clouds:
  openstack:
    auth:
      auth_url: https://keystone.example.test/v3
      application_credential_id: app-cred-id
      application_credential_secret: s3cr3t-app-credential
"""


def kubeconfig(token: str, key: str = "") -> str:
    user = {"token": token} | ({"client-key-data": key} if key else {})
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
            "users": [{"name": "u", "user": user}],
        }
    )


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def whats(scanner: Scanner, data: str | bytes) -> set[str]:
    raw = data.encode() if isinstance(data, str) else data
    return {finding.what for finding in scanner.scan(raw, "here")}


def json_message(**patch: object) -> bytes:
    ref = ObjectRef(api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", name="c")
    return encode(PatchStatus(source="t", correlation_id="c", ref=ref, patch=patch))


@pytest.mark.parametrize(
    ("planted", "what"),
    [
        (PEM, "a PEM private key"),
        (json.dumps({"key": PEM}), "a PEM private key"),
        (b64(PEM), "a base64 PEM private key"),
        (JWT, "a JSON web token"),
        (f"Authorization: Bearer {secrets.token_urlsafe(24)}", "a bearer token"),
        (kubeconfig("x" * 40), "a kubeconfig token"),
        (json.dumps({"users": [{"user": {"token": "y" * 40}}]}), "a kubeconfig token"),
        (kubeconfig("z" * 40, key=b64(PEM)), "a kubeconfig client key"),
        (CLOUDS_YAML, "an OpenStack application credential secret"),
        (
            json.dumps({"application_credential_secret": "abc"}),
            "an OpenStack application credential secret",
        ),
        ("connecting with password=hunter2hunter2", "a password"),
        (json.dumps({"password": "hunter2"}), "a password"),
    ],
)
def test_each_shape_of_credential_is_found(planted: str, what: str) -> None:
    assert what in whats(Scanner(), f"before {planted} after")


def test_a_known_value_is_found_raw_escaped_in_base64_and_leaf_by_leaf() -> None:
    scanner = Scanner()
    scanner.register(CLOUDS_YAML, "clouds.yaml")
    token = secrets.token_urlsafe(32)
    scanner.register(kubeconfig(token), "a kubeconfig")
    assert "clouds.yaml" in whats(scanner, CLOUDS_YAML)
    assert "clouds.yaml, escaped" in whats(scanner, json.dumps({"v": CLOUDS_YAML}))
    assert "clouds.yaml, base64" in whats(scanner, b64(CLOUDS_YAML))
    leaf = "clouds.yaml, its application_credential_secret"
    assert leaf in whats(scanner, "error: auth failed for s3cr3t-app-credential")
    assert f"{leaf} in base64" in whats(scanner, b64("s3cr3t-app-credential"))
    assert "a kubeconfig, its token" in whats(scanner, f"GET /api?access_token={token}")


def test_a_private_key_in_a_kubeconfig_is_known_decoded_too() -> None:
    scanner = Scanner()
    scanner.register(kubeconfig("t" * 20, key=b64(PEM)), "a kubeconfig")
    assert "a kubeconfig, its client-key-data" in whats(scanner, f"key: {PEM}")


def test_a_secrets_data_is_registered_except_public_material_and_short_values() -> None:
    password = secrets.token_hex(16)
    secret = {
        "metadata": {"namespace": "ns", "name": "creds"},
        "data": {
            "password": b64(password),
            "namespace": b64("a-long-namespace-name"),
            "format": b64("cloud-config"),  # a Cluster API bootstrap Secret's, named in logs
            "ca.crt": b64("-----BEGIN CERTIFICATE-----\nMIIBcertificatecertificate\n"),
            "short": b64("x" * (MIN_KNOWN_LENGTH - 1)),
            "broken": "not base64!",
        },
    }
    scanner = Scanner()
    scanner.register_secret(secret)
    assert whats(scanner, password) == {"Secret ns/creds key password"}
    assert whats(scanner, "a-long-namespace-name MIIBcertificatecertificate cloud-config") == set()
    assert whats(scanner, "x" * (MIN_KNOWN_LENGTH - 1)) == set()


def test_helm_release_records_are_not_registered() -> None:
    scanner = Scanner()
    release = {"type": "helm.sh/release.v1", "data": {"release": b64("r" * 64)}}
    scanner.register_secret(release)
    assert scanner.known == 0


def test_a_report_shows_the_place_and_at_most_the_first_characters() -> None:
    scanner = Scanner()
    token = secrets.token_urlsafe(40)
    scanner.register(token, "the admin token")
    (finding,) = scanner.scan(f"token={token}".encode(), "CAPIBUS_EVENTS #7 capibus.evt.x")
    assert finding.where == "CAPIBUS_EVENTS #7 capibus.evt.x"
    assert token not in str(finding)
    assert token[: SHOWN + 1] not in str(finding)
    assert str(finding).startswith(
        f"CAPIBUS_EVENTS #7 capibus.evt.x: the admin token ({token[:SHOWN]}"
    )


def test_many_items_are_searched_at_once_and_named_one_by_one() -> None:
    scanner = Scanner()
    token = secrets.token_urlsafe(24)
    scanner.register(token, "a token")
    clean = [(f"#{i}", json_message(i=i)) for i in range(500)]
    items = [*clean[:250], ("#leak", json_message(log=f"got {token}")), *clean[250:]]
    assert [f.where for f in scanner.scan_many(items, chunk=4096)] == ["#leak"]
    assert scanner.scan_many(clean) == []


def test_a_log_is_named_by_file_and_line(tmp_path: Path) -> None:
    log = tmp_path / "helm-r1.log"
    text = f"INFO started\nWARNING bad kubeconfig: {kubeconfig('q' * 30)}INFO done\n"
    log.write_text(text)
    line = next(n for n, t in enumerate(text.splitlines(), start=1) if "token:" in t)
    assert [f.where for f in Scanner().scan_file(log)] == [f"{log}:{line}"]
    assert Scanner().scan_file(tmp_path / "missing.log") == []


@pytest.mark.parametrize(
    "clean",
    [
        json_message(phase="Ready", kubeconfigSecretName="c-kubeconfig", nodeCount=3),
        b"INFO shared.consumer: helm: owns partition 3 (token 17)",
        b"password: ****",
        b'{"password": "********"}',
        b"settings: password=SecretStr('**********')",
        b'{"metadata": {"continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzfQ"}}',
        b"passwordSecretName: tumblebug-auth",
        b'{"tokenSecretRef": {"name": "x"}}',
        b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
        b64("-----BEGIN CERTIFICATE-----\nMIIBcertificatecertificatecertificate").encode(),
    ],
)
def test_ordinary_traffic_is_clean(clean: bytes) -> None:
    assert Scanner().scan(clean, "here") == []
