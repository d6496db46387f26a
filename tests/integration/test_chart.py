"""The chart installed by the real helm into the real API server, then uninstalled.

No kubelet or scheduler runs here, so no pod ever starts (the image does not matter): what this
proves is that the API server's validation accepts every object the chart renders, and keeps
every field of it. Helm 4 applies server-side, so an invalid object fails the install; a field
the server does not know would be dropped silently, so each live object is compared with its
rendered manifest: every key the chart wrote must still be there. Uninstalling must then remove
everything, the cluster-scoped objects (webhook configuration, ClusterRoles) included.
The self-contained install runs twice, with and without TLS to its NATS and Redis: the
certificates the chart generates (webhook, NATS, Redis) must each survive an upgrade.

The session's API server is shared, so each release has its own name (hence its own
cluster-scoped names) and its own namespace, and the webhook configuration only ever sees
objects carrying a label of this test's: its Service has no running pod, and with
``failurePolicy: Fail`` it would refuse every other test's Clusters and ClusterTemplates.
The CRDs are already installed by the session; helm leaves existing CRDs alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from testenv.harness import LocalStack, ensure_binaries
from tests.integration.support import ROOT

pytestmark = pytest.mark.integration

Json = dict[str, Any]
Helm = Callable[..., Awaitable[str]]
CHART = ROOT / "deploy" / "chart" / "capibus"
KINDS = {
    kind: ResourceKind(kind.lower(), group, version, kind, plural, namespaced)
    for kind, group, version, plural, namespaced in (
        ("ServiceAccount", "", "v1", "serviceaccounts", True),
        ("Service", "", "v1", "services", True),
        ("Secret", "", "v1", "secrets", True),
        ("ConfigMap", "", "v1", "configmaps", True),
        ("Deployment", "apps", "v1", "deployments", True),
        ("StatefulSet", "apps", "v1", "statefulsets", True),
        ("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", True),
        ("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies", True),
        ("ClusterRole", "rbac.authorization.k8s.io", "v1", "clusterroles", False),
        ("ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", "clusterrolebindings", False),
        (
            "ValidatingWebhookConfiguration",
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            False,
        ),
    )
}
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "ScheduleAnyway",
}
ALL_SERVICES = {
    name: {"enabled": True}
    for name in yaml.safe_load((CHART / "files" / "services.yaml").read_text())
}


@pytest.fixture
def helm(stack: LocalStack, tools_bin: Path | None, tmp_path: Path) -> Helm:
    """``await helm(*args)``: the pinned helm against the stack as its admin; stdout."""
    binary = (tools_bin or ensure_binaries()) / "helm"
    env = {
        f"HELM_{d.upper()}_HOME": str(tmp_path / "helm" / d) for d in ("cache", "config", "data")
    }
    kubeconfig = str(stack.endpoints.kubeconfig)

    async def run(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            *args,
            "--kubeconfig",
            kubeconfig,
            # HOME too: without it helm keeps its discovery cache in ./.kube of the checkout.
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, f"helm {' '.join(args[:2])}: {err.decode()}"
        return out.decode()

    return run


def _values(tmp_path: Path, namespace: str, release: str, **values: Any) -> str:
    """A values file confining the webhooks to objects labelled for this release only."""
    only_ours = {"matchLabels": {"capibus.test/chart": release}}
    webhook = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    path = tmp_path / f"{release}.yaml"
    path.write_text(yaml.safe_dump({"webhook": {**webhook, "objectSelector": only_ours}, **values}))
    return str(path)


async def _manifest(helm: Helm, release: str, namespace: str) -> list[Json]:
    text = await helm("get", "manifest", release, "-n", namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _dropped(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Paths of ``sent`` (a rendered manifest) that ``kept`` (the live object) lacks."""
    if isinstance(sent, dict):
        if not isinstance(kept, dict):
            return [path]
        pairs = [(value, kept.get(key, _MISSING), f"{path}.{key}") for key, value in sent.items()]
    elif isinstance(sent, list):
        if not isinstance(kept, list) or len(kept) != len(sent):
            return [path]
        pairs = [(item, kept[i], f"{path}[{i}]") for i, item in enumerate(sent)]
    else:
        return []
    return [
        lost
        for value, live, where in pairs
        for lost in ([where] if live is _MISSING else _dropped(value, live, where))
    ]


_MISSING = object()


async def _live(kube: KubeClient, obj: Json) -> Json:
    meta = obj["metadata"]
    return await kube.get(KINDS[obj["kind"]], meta.get("namespace"), meta["name"])


async def _assert_accepted_whole(kube: KubeClient, objects: list[Json]) -> None:
    for obj in objects:
        live = await _live(kube, obj)
        lost = _dropped(obj, live)
        assert not lost, f"{obj['kind']} {obj['metadata']['name']}: the server dropped {lost}"


async def _assert_gone(kube: KubeClient, objects: list[Json]) -> None:
    for obj in objects:
        with pytest.raises(KubeNotFound):
            await _live(kube, obj)


def _annotations(workload: Json) -> dict[str, str]:
    annotations: dict[str, str] = workload["spec"]["template"]["metadata"]["annotations"]
    return annotations


def _kinds(objects: list[Json]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for obj in objects:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    return counts


@pytest.mark.timeout(180)
async def test_split_install_with_every_service_is_accepted(
    helm: Helm, kube: KubeClient, namespace: str, stack: LocalStack, tmp_path: Path
) -> None:
    release = f"cb-{uuid.uuid4().hex[:6]}"
    values = _values(
        tmp_path,
        namespace,
        release,
        mode="split",
        services=ALL_SERVICES,
        nats={"url": stack.endpoints.nats_url},
        redis={"url": stack.endpoints.redis_url},
        podDisruptionBudget={"enabled": True},
        networkPolicy={"enabled": True},
        topologySpreadConstraints=[SPREAD],
    )
    await helm("install", release, str(CHART), "-n", namespace, "-f", values)
    objects = await _manifest(helm, release, namespace)
    kinds = _kinds(objects)
    assert kinds["Deployment"] == len(ALL_SERVICES)
    assert kinds["ServiceAccount"] == len(ALL_SERVICES)
    assert kinds["PodDisruptionBudget"] == len(ALL_SERVICES)
    assert kinds["NetworkPolicy"] == len(ALL_SERVICES)
    assert kinds["ValidatingWebhookConfiguration"] == 1
    if (CHART / "templates" / "rbac.yaml").exists():
        assert kinds["ClusterRole"] == kinds["ClusterRoleBinding"] == len(ALL_SERVICES)
    await _assert_accepted_whole(kube, objects)

    await helm("uninstall", release, "-n", namespace, "--wait")
    await _assert_gone(kube, objects)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_self_contained_install_keeps_its_certificates_across_upgrades(
    helm: Helm, kube: KubeClient, namespace: str, tmp_path: Path, tls: bool
) -> None:
    release = f"cb-{uuid.uuid4().hex[:6]}"
    values = _values(
        tmp_path,
        namespace,
        release,
        nats={"deploy": True, "replicas": 3, "tls": {"enabled": tls}},
        redis={"deploy": True, "tls": {"enabled": tls}},
        podDisruptionBudget={"enabled": True},
        networkPolicy={"enabled": True},
    )
    await helm("install", release, str(CHART), "-n", namespace, "-f", values)
    objects = await _manifest(helm, release, namespace)
    assert _kinds(objects)["StatefulSet"] == 1
    await _assert_accepted_whole(kube, objects)
    secrets = [o for o in objects if o["kind"] == "Secret"]
    assert len(secrets) == (3 if tls else 1)  # the webhook's, and NATS's and Redis's with TLS
    first = {s["metadata"]["name"]: (await _live(kube, s))["data"] for s in secrets}

    await helm("upgrade", release, str(CHART), "-n", namespace, "-f", values, "--set=mode=split")
    upgraded = await _manifest(helm, release, namespace)
    await _assert_accepted_whole(kube, upgraded)
    for secret in secrets:
        assert (await _live(kube, secret))["data"] == first[secret["metadata"]["name"]]
    # The same certificates, hence the same checksums: an upgrade alone restarts no server.
    assert [_annotations(o) for o in upgraded if o["kind"] == "StatefulSet"] == [
        _annotations(o) for o in objects if o["kind"] == "StatefulSet"
    ]
    webhook_ca = first[f"{release}-capibus-admission-tls"]["ca.crt"]
    webhooks = next(o for o in upgraded if o["kind"] == "ValidatingWebhookConfiguration")
    live = await _live(kube, webhooks)
    assert {w["clientConfig"]["caBundle"] for w in live["webhooks"]} == {webhook_ca}

    await helm("uninstall", release, "-n", namespace, "--wait")
    await _assert_gone(kube, upgraded)
