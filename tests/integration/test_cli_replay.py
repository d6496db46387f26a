"""``capibus replay`` on the session's stack: a Cluster gets a real history (the watcher, the
writer and the helm service installing the stand-in chart with the real helm binary), the
services stop, and the replay of that history through the helm service's handlers prints the
install decision while the API server and the streams stay exactly as they were.

The command runs in-process (``main`` in a thread); the helm service's settings reach it as
they reach the service, through ``CAPIBUS_HELM__*`` variables.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from cli.story import object_filters
from shared.bus import Bus
from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, CONFIG_MAP, SECRET
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack
from tests.integration.support import ROOT, ServiceProcess, eventually, read_stream

pytestmark = pytest.mark.integration

CHART = ROOT / "standins" / "charts" / "openstack-cluster"
CLOUDS_YAML = "clouds:\n  openstack:\n    auth:\n      project_id: tenancy-1234\n"
WATCHED: tuple[ResourceKind, ...] = (CLUSTER, SECRET, CONFIG_MAP, CAPI_CLUSTER)


def helm_env(tools_bin: Path | None) -> dict[str, str]:
    return {
        "CAPIBUS_HELM__EXECUTABLE": str(tools_bin / "helm") if tools_bin else "helm",
        "CAPIBUS_HELM__CHART": json.dumps({"name": str(CHART)}),
        "CAPIBUS_HELM__TIMEOUT": "30s",
    }


async def history(kube: KubeClient, namespace: str, name: str, template: str) -> None:
    """The portal's objects: a template, cloud credentials, the Cluster."""
    await kube.create(
        CLUSTER_TEMPLATE,
        {
            "apiVersion": CLUSTER_TEMPLATE.api_version,
            "kind": CLUSTER_TEMPLATE.kind,
            "metadata": {"name": template},
            "spec": {
                "label": "t",
                "description": "stand-in template",
                "values": {"kubernetesVersion": "1.34.2", "machineImageId": "image-1234"},
            },
        },
    )
    secret = {
        "metadata": {"name": f"{name}-creds", "namespace": namespace},
        "data": {"clouds.yaml": base64.b64encode(CLOUDS_YAML.encode()).decode()},
    }
    await kube.create(SECRET, secret)
    manifest = cluster_manifest(
        namespace, name, templateName=template, cloudCredentialsSecretName=f"{name}-creds"
    )
    await kube.create(CLUSTER, manifest)


def deployed(cluster: dict[str, Any]) -> bool:
    conditions = (cluster.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Reconciled" and c["reason"] == "Deployed" for c in conditions)


async def versions(kube: KubeClient, namespace: str) -> dict[tuple[str, str], str]:
    """Every watched object of the namespace by kind and name, with its resourceVersion."""
    out = {}
    for kind in WATCHED:
        items, _ = await kube.list(kind, namespace=namespace)
        for item in items:
            meta = item["metadata"]
            out[(kind.kind, meta["name"])] = meta["resourceVersion"]
    return out


async def stored(bus: Bus, namespace: str, name: str) -> list[int]:
    """How many messages about the object each stream holds."""
    counts = []
    for stream, filters in object_filters(namespace, name).items():
        counts.append(sum([len(await read_stream(bus, stream, f)) for f in filters]))
    return counts


class Capibus:
    """``capibus`` in-process against the stack, with the helm service's settings in the
    environment as the service has them: exit code, stdout, stderr."""

    def __init__(
        self, stack: LocalStack, capsys: pytest.CaptureFixture[str], env: dict[str, str]
    ) -> None:
        self.url = stack.endpoints.nats_url
        self.capsys = capsys
        self.env = env

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, ["--nats-url", self.url, *args])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def capibus(
    stack: LocalStack,
    tools_bin: Path | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Capibus:
    env = helm_env(tools_bin)
    for key, value in {**stack.env(), **env}.items():
        monkeypatch.setenv(key, value)
    return Capibus(stack, capsys, env)


async def test_replay_prints_the_install_decision_and_changes_nothing(
    kube: KubeClient,
    bus: Bus,
    namespace: str,
    service: Callable[..., ServiceProcess],
    capibus: Capibus,
) -> None:
    processes = [service(name, **capibus.env) for name in ("watcher", "writer", "helm")]
    name, template = "replayed", f"tpl-{uuid.uuid4().hex[:6]}"
    try:
        await history(kube, namespace, name, template)
        await eventually(
            lambda: kube.get(CLUSTER, namespace, name), deployed, timeout=90, what="deployed"
        )
        for proc in processes:
            proc.stop()
        before = await versions(kube, namespace)
        counts = await stored(bus, namespace, name)

        replay = ["replay", f"{namespace}/{name}", "--service", "helm"]
        code, out, err = await capibus(*replay, "--json")
        assert code == 0, err
        *steps, totals = [json.loads(line) for line in out.splitlines()]

        decisions = [d for s in steps for d in s["decisions"]]
        installs = [d for d in decisions if (d["port"], d["verb"]) == ("helm", "install")]
        assert installs, decisions
        assert installs[0]["target"] == f"release {namespace}/{name}"
        assert "revision 1 is deployed with this chart and values: no change" in installs[0]["text"]
        assert {s["subscription"] for s in steps} <= {"clusters", "capiclusters", "nudges"}
        assert totals["service"] == "helm"
        assert totals["replayed"] == len(steps)
        assert any(d["mark"] == "same" for d in decisions), decisions

        assert await versions(kube, namespace) == before  # nothing written
        assert await stored(bus, namespace, name) == counts  # nothing published

        code, out, _ = await capibus(*replay)
        assert code == 0
        assert f"helm  install  release {namespace}/{name}" in out
        assert out.splitlines()[-1].startswith(f"helm: {len(steps)} message(s) replayed")
    finally:
        await forget(kube, namespace, name, template)


async def forget(kube: KubeClient, namespace: str, name: str, template: str) -> None:
    """The Cluster without our finalizer (no helm service is left to remove it), so the
    namespace can go and no later module's services find it being deleted."""
    with contextlib.suppress(KubeNotFound):
        await kube.patch_merge(CLUSTER, namespace, name, {"metadata": {"finalizers": None}})
        await kube.delete(CLUSTER, namespace, name)
    with contextlib.suppress(KubeNotFound):
        await kube.delete(CLUSTER_TEMPLATE, None, template)
