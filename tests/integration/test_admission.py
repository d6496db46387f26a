"""The admission webhooks, registered with the real API server and served by a real process.

The API server calls ``python -m services.admission`` over HTTPS, verifying its certificate
against the ``caBundle`` of the webhook configuration, and every refusal is read the way a
client reads it: as the error of a create, update or delete.

The API server is shared by every test of the session, so the configuration registered here
(the production manifest of ``deploy/webhooks``, pointed at a local URL) only ever sees this
module's objects: the Cluster webhook is limited to this module's namespace, the
ClusterTemplate webhook to templates carrying this module's label, and the configuration is
deleted whatever happens.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import ssl
import string
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.admission.bootstrap import connect
from services.admission.settings import AdmissionSettings
from shared.errors import CapibusError, KubeInvalid, KubeNotFound
from shared.kube import MERGE_PATCH, KubeClient, ResourceKind
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, NAMESPACE, SECRET
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack, free_ports
from tests.integration.support import ROOT, ServiceProcess, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
MANIFEST = ROOT / "deploy" / "webhooks" / "validating-webhook-configuration.yaml"
WEBHOOKS = ResourceKind(
    "validatingwebhookconfiguration",
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)
TEST_LABEL = "capibus.test/admission"
HOLD = "capibus.test/hold"
TEMPLATE_LABEL = "azimuth.stackhpc.com/cluster-template"
PATHS = {
    "validate-cluster.azimuth.stackhpc.com": "/validate-cluster",
    "validate-cluster-template.azimuth.stackhpc.com": "/validate-cluster-template",
}


# --- certificates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    ca_pem: bytes
    cert_file: Path
    key_file: Path

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_pem).decode()


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_tls(directory: Path, ip: str = "127.0.0.1") -> Tls:
    """A fresh CA, and a serving certificate for ``ip`` that it signed."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"capibus-test-ca-{now}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ip)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(_pem(cert))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Tls(_pem(ca), cert_file, key_file)


# --- the webhook configuration ----------------------------------------------------------------


def configuration(name: str, url: str, ca_bundle: str, *, namespace: str, tag: str) -> Json:
    """The production manifest, pointed at ``url`` and confined to this module's objects."""
    text = string.Template(MANIFEST.read_text()).substitute(NAMESPACE="unused", CA_BUNDLE="")
    config: Json = yaml.safe_load(text)
    config["metadata"] = {"name": name}
    for webhook in config["webhooks"]:
        webhook["clientConfig"] = {"url": url + PATHS[webhook["name"]], "caBundle": ca_bundle}
        if webhook["rules"][0]["resources"] == ["clusters"]:
            webhook["namespaceSelector"] = {
                "matchLabels": {"kubernetes.io/metadata.name": namespace}
            }
        else:
            webhook["objectSelector"] = {"matchLabels": {TEST_LABEL: tag}}
    return config


@contextlib.asynccontextmanager
async def registered(kube: KubeClient, config: Json) -> AsyncIterator[None]:
    await kube.create(WEBHOOKS, config)
    try:
        yield
    finally:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(WEBHOOKS, None, config["metadata"]["name"])


# --- helpers ----------------------------------------------------------------------------------


async def outcome(call: Awaitable[Any]) -> str:
    """The error the client got, or "ok"."""
    try:
        await call
    except CapibusError as exc:
        return str(exc)
    return "ok"


async def refused(call: Awaitable[Any], reason: str) -> None:
    with pytest.raises(KubeInvalid) as caught:
        await call
    message = str(caught.value)
    assert "denied the request" in message, message
    assert reason in message, message


@dataclass
class Env:
    kube: KubeClient
    namespace: str
    tag: str
    url: str
    tls: Tls
    process: ServiceProcess
    templates: list[str] = field(default_factory=list)

    def name(self, suffix: str) -> str:
        return f"ta{self.tag}-{suffix}"

    async def template(self, suffix: str, version: str, *, deprecated: bool = False) -> str:
        name = self.name(suffix)
        await self.kube.create(
            CLUSTER_TEMPLATE, template_manifest(name, version, self.tag, deprecated)
        )
        self.templates.append(name)
        return name

    async def secret(self, name: str) -> None:
        body = {"metadata": {"name": name, "namespace": self.namespace}, "data": {"x": "eA=="}}
        await self.kube.create(SECRET, body)

    def cluster(self, name: str, template: str, **extra: Any) -> Json:
        body = cluster_manifest(self.namespace, name, templateName=template)
        body["metadata"].update(extra)
        return body

    async def update_spec(self, name: str, **spec: Any) -> Json:
        return await self.kube.patch_merge(CLUSTER, self.namespace, name, {"spec": spec})

    async def update_meta(self, name: str, **meta: Any) -> Json:
        return await self.kube.patch_merge(CLUSTER, self.namespace, name, {"metadata": meta})


def template_manifest(name: str, version: str, tag: str, deprecated: bool = False) -> Json:
    return {
        "apiVersion": CLUSTER_TEMPLATE.api_version,
        "kind": CLUSTER_TEMPLATE.kind,
        "metadata": {"name": name, "labels": {TEST_LABEL: tag}},
        "spec": {
            "label": name,
            "description": "admission test template",
            "deprecated": deprecated,
            "values": {"kubernetesVersion": version, "machineImageId": "image"},
        },
    }


async def dry_run(kube: KubeClient, kind: ResourceKind, obj: Json) -> Json:
    """Create ``obj`` without storing it: admission runs, nothing is left to clean up."""
    path = kind.path(obj["metadata"].get("namespace"))
    return await kube.request("POST", path, params={"dryRun": "All"}, body=json.dumps(obj).encode())


async def wait_until_enforced(env: Env) -> None:
    """The API server picks up new webhook configurations asynchronously."""
    cluster = env.cluster("probe", "no-such-template")
    cluster["spec"]["cloudCredentialsSecretName"] = "absent"
    template = template_manifest(env.name("probe"), "latest", env.tag)
    await eventually(
        lambda: outcome(dry_run(env.kube, CLUSTER, cluster)),
        lambda text: "specified cloud credentials secret does not exist" in text,
        timeout=60,
        what="the Cluster webhook to be enforced",
    )
    await eventually(
        lambda: outcome(dry_run(env.kube, CLUSTER_TEMPLATE, template)),
        lambda text: "SemVer" in text,
        timeout=60,
        what="the ClusterTemplate webhook to be enforced",
    )


async def healthz(url: str, tls: Tls) -> str:
    context = ssl.create_default_context(cadata=tls.ca_pem.decode())
    try:
        async with httpx.AsyncClient(verify=context, timeout=5) as client:
            return (await client.get(url + "/healthz")).text
    except httpx.HTTPError as exc:
        return repr(exc)


@pytest.fixture(scope="module")
async def env(
    stack: LocalStack, kube: KubeClient, crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    directory = tmp_path_factory.mktemp("admission")
    tls = make_tls(directory / "tls")
    tag = uuid.uuid4().hex[:6]
    namespace = f"ta-{tag}"
    port = free_ports(1)[0]
    url = f"https://127.0.0.1:{port}"
    settings = {
        "CAPIBUS_ADMISSION__HOST": "127.0.0.1",
        "CAPIBUS_ADMISSION__PORT": str(port),
        "CAPIBUS_ADMISSION__CERT_FILE": str(tls.cert_file),
        "CAPIBUS_ADMISSION__KEY_FILE": str(tls.key_file),
    }
    process = ServiceProcess("admission", {**stack.env(), **settings}, directory, tag)
    environment = Env(kube, namespace, tag, url, tls, process)
    config = configuration(
        f"capibus-admission-test-{tag}", url, tls.ca_bundle, namespace=namespace, tag=tag
    )
    try:
        process.start()
        await kube.create(NAMESPACE, {"metadata": {"name": namespace}})
        await eventually(
            lambda: healthz(url, tls), lambda text: text == "ok", timeout=60, what="/healthz"
        )
        async with registered(kube, config):
            await wait_until_enforced(environment)
            await environment.secret("creds")
            yield environment
    finally:
        process.stop()
        await _clean_up(environment)


async def _clean_up(env: Env) -> None:
    with contextlib.suppress(KubeNotFound):
        clusters, _ = await env.kube.list(CLUSTER, namespace=env.namespace)
        for cluster in clusters:
            if cluster["metadata"].get("finalizers"):
                await env.update_meta(cluster["metadata"]["name"], finalizers=None)
        await env.kube.delete(NAMESPACE, None, env.namespace)
    for name in env.templates:
        with contextlib.suppress(KubeNotFound):
            await env.kube.delete(CLUSTER_TEMPLATE, None, name)


# --- tests ------------------------------------------------------------------------------------


async def test_serving_certificate_is_verified(env: Env) -> None:
    """Refusals come from our process, so the API server trusted it through caBundle; with a
    caBundle of another CA the API server refuses to talk to it at all."""
    assert await healthz(env.url, env.tls) == "ok"
    assert "denied the request" in await outcome(
        dry_run(env.kube, CLUSTER, env.cluster("tls", "missing"))
    )
    other = make_tls(Path(env.process.log_path).parent / "other-ca")
    wrong_tag = f"{env.tag}-wrong"
    config = configuration(
        f"capibus-admission-test-{wrong_tag}",
        env.url,
        other.ca_bundle,
        namespace=f"none-{wrong_tag}",
        tag=wrong_tag,
    )
    template = template_manifest(env.name("wrong-ca"), "1.30.0", wrong_tag)
    async with registered(env.kube, config):
        text = await eventually(
            lambda: outcome(dry_run(env.kube, CLUSTER_TEMPLATE, template)),
            lambda text: text != "ok",
            timeout=60,
            what="the wrongly trusted webhook to be called",
        )
    assert "failed calling webhook" in text, text
    assert "x509" in text or "certificate" in text, text


async def test_cluster_needs_its_secret_and_its_template(env: Env) -> None:
    template = await env.template("basic", "1.30.1")
    nosecret = env.cluster("nosecret", template)
    nosecret["spec"]["cloudCredentialsSecretName"] = "absent"
    await refused(
        env.kube.create(CLUSTER, nosecret),
        "specified cloud credentials secret does not exist: 'absent' in namespace "
        f"{env.namespace!r}",
    )
    await refused(
        env.kube.create(CLUSTER, env.cluster("notemplate", env.name("missing"))),
        "specified cluster template does not exist",
    )
    created = await env.kube.create(CLUSTER, env.cluster("fine", template))
    assert created["spec"]["templateName"] == template
    await refused(
        env.update_spec("fine", cloudCredentialsSecretName="other"),
        "specified cloud credentials secret does not exist: 'other'",
    )


async def test_deprecated_template_may_be_kept_but_not_chosen(env: Env) -> None:
    current = await env.template("dep-current", "1.29.3")
    fading = await env.template("dep-fading", "1.30.0")
    await env.kube.create(CLUSTER, env.cluster("keeper", fading))
    await env.kube.create(CLUSTER, env.cluster("mover", current))
    deprecate = {"spec": {"deprecated": True}}
    await env.kube.patch_merge(CLUSTER_TEMPLATE, None, fading, deprecate)
    await refused(
        env.kube.create(CLUSTER, env.cluster("newcomer", fading)),
        f"specified cluster template is deprecated: {fading}",
    )
    await refused(
        env.update_spec("mover", templateName=fading), "specified cluster template is deprecated"
    )
    kept = await env.update_spec("keeper", label="still here")
    assert kept["spec"]["label"] == "still here"


async def test_upgrade_rules(env: Env) -> None:
    names = {
        suffix: await env.template(f"up-{suffix}", version)
        for suffix, version in [
            ("128", "1.28.9"),
            ("129", "1.29.4"),
            ("130", "1.30.2"),
            ("131", "1.31.0"),
            ("200", "2.0.0"),
        ]
    }
    await env.kube.create(CLUSTER, env.cluster("up", names["129"]))
    await refused(
        env.update_spec("up", templateName=names["128"]),
        "specified cluster template would be a downgrade (1.29.4 -> 1.28.9)",
    )
    await refused(
        env.update_spec("up", templateName=names["200"]),
        "upgrading to a new major version is not supported",
    )
    await refused(
        env.update_spec("up", templateName=names["131"]),
        "upgrading by more than one minor version is not supported (1.29.4 -> 1.31.0)",
    )
    # Status writes bypass the webhook (its rules name the main resource only).
    nodes = {"a": {"kubeletVersion": "v1.29.4"}, "b": {"kubeletVersion": "v1.28.7"}}
    await env.kube.patch_merge(
        CLUSTER, env.namespace, "up", {"status": {"nodes": nodes}}, subresource="status"
    )
    await refused(
        env.update_spec("up", templateName=names["130"]),
        "newer than the oldest node is not supported (oldest node 1.28.7, template 1.30.2)",
    )
    nodes["b"]["kubeletVersion"] = "v1.29.4"
    await env.kube.patch_merge(
        CLUSTER, env.namespace, "up", {"status": {"nodes": nodes}}, subresource="status"
    )
    upgraded = await env.update_spec("up", templateName=names["130"])
    assert upgraded["spec"]["templateName"] == names["130"]


async def test_cluster_without_its_secret_can_still_be_deleted(env: Env) -> None:
    await env.secret("short-lived")
    template = await env.template("del", "1.30.1")
    body = env.cluster("leaving", template, finalizers=[HOLD])
    body["spec"]["cloudCredentialsSecretName"] = "short-lived"
    await env.kube.create(CLUSTER, body)
    await env.kube.delete(SECRET, env.namespace, "short-lived")
    await refused(
        env.update_spec("leaving", label="renamed"),
        "specified cloud credentials secret does not exist",
    )
    labelled = await env.update_meta("leaving", labels={"touched": "yes"})
    assert labelled["metadata"]["labels"]["touched"] == "yes"
    await env.kube.delete(CLUSTER, env.namespace, "leaving")
    deleting = await env.update_spec("leaving", label="renamed while deleting")
    assert deleting["metadata"]["deletionTimestamp"]
    await env.update_meta("leaving", finalizers=None)
    await eventually(
        lambda: outcome(env.kube.get(CLUSTER, env.namespace, "leaving")),
        lambda text: "404" in text,
        what="the Cluster to be gone",
    )


async def test_template_in_use_cannot_be_deleted(env: Env) -> None:
    template = await env.template("inuse", "1.30.1")
    body = env.cluster("user", template, labels={TEMPLATE_LABEL: template})
    await env.kube.create(CLUSTER, body)
    await refused(
        env.kube.delete(CLUSTER_TEMPLATE, None, template),
        "template is in use by at least one cluster",
    )
    await env.update_meta("user", labels={TEMPLATE_LABEL: None})
    await env.kube.delete(CLUSTER_TEMPLATE, None, template)
    assert "404" in await outcome(env.kube.get(CLUSTER_TEMPLATE, None, template))


async def test_template_spec_is_validated(env: Env) -> None:
    await refused(
        env.template("latest", "latest"),
        "spec.values.kubernetesVersion: kubernetesVersion must be a SemVer version",
    )
    name = await env.template("semver", "v1.30.1")
    await refused(
        env.kube.patch_merge(
            CLUSTER_TEMPLATE, None, name, {"spec": {"values": {"kubernetesVersion": "1.30"}}}
        ),
        "must be a SemVer version",
    )


async def test_secrets_are_looked_up_by_metadata_only(env: Env, stack: LocalStack) -> None:
    settings = AdmissionSettings(
        KUBECONFIG=str(stack.endpoints.kubeconfig),
        admission={"cert_file": env.tls.cert_file, "key_file": env.tls.key_file},
    )
    lookups = connect(settings)
    try:
        secret = await lookups.kube.get_metadata(SECRET, env.namespace, "creds")
        assert secret["kind"] == "PartialObjectMetadata"
        assert "data" not in secret
        assert await lookups.exists(SECRET, env.namespace, "creds")
        assert not await lookups.exists(SECRET, env.namespace, "absent")
        selector = f"{TEMPLATE_LABEL}={env.name('nobody-uses-this')}"
        assert not await lookups.any_labelled(CLUSTER, selector)
    finally:
        await lookups.aclose()


async def test_webhook_down_never_blocks_metadata_updates_or_deletion(env: Env) -> None:
    """The manifest's matchConditions keep spec-preserving updates away from the webhook, so
    a Cluster can lose its finalizer (and go) while the admission service is unreachable."""
    namespace = f"{env.namespace}-down"
    await env.kube.create(NAMESPACE, {"metadata": {"name": namespace}})
    dead_url = f"https://127.0.0.1:{free_ports(1)[0]}"
    config = configuration(
        f"capibus-admission-test-{env.tag}-down",
        dead_url,
        env.tls.ca_bundle,
        namespace=namespace,
        tag=f"{env.tag}-down",
    )
    body = cluster_manifest(namespace, "orphan", templateName="whatever")
    body["metadata"]["finalizers"] = [HOLD]
    path = CLUSTER.path(namespace, "orphan")
    try:
        await env.kube.create(CLUSTER, body)
        async with registered(env.kube, config):
            spec_change = json.dumps({"spec": {"label": "changed"}}).encode()
            text = await eventually(
                lambda: outcome(
                    env.kube.request(
                        "PATCH",
                        path,
                        params={"dryRun": "All"},
                        body=spec_change,
                        content_type=MERGE_PATCH,
                    )
                ),
                lambda text: text != "ok",
                timeout=60,
                what="the unreachable webhook to be enforced",
            )
            assert "failed calling webhook" in text, text
            await env.kube.delete(CLUSTER, namespace, "orphan")
            meta = {"metadata": {"finalizers": None}}
            released = await env.kube.patch_merge(CLUSTER, namespace, "orphan", meta)
            assert released["metadata"]["deletionTimestamp"]
    finally:
        with contextlib.suppress(KubeNotFound):
            await env.kube.patch_merge(
                CLUSTER, namespace, "orphan", {"metadata": {"finalizers": None}}
            )
        await env.kube.delete(NAMESPACE, None, namespace)
