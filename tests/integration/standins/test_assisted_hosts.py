"""The metal3 host stand-in (``standins.assisted.hosts``) against the real API server.

Its controllers run in this process, confined to the test's namespace. Everything it reacts
to that other programs would write (the Machine's bootstrap data name, the InfraEnv's ISO URL,
the Metal3Machine's image, the Agent's install state) is written here by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.resources import (
    AGENT,
    BARE_METAL_HOST,
    INFRA_ENV,
    MACHINE,
    METAL3_CLUSTER,
    METAL3_MACHINE,
)
from standins.assisted import hosts
from standins.assisted.knobs import AssistedKnobs
from standins.base import run_all
from testenv.examples import assisted_kind, bare_metal_hosts
from tests.integration.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

Json = dict[str, Any]
ISO = "https://image-service.sim/images/0b6e3c1e?arch=x86_64&type=full-iso"
INFRAENV = "hc-md-0"


# --- fixtures ------------------------------------------------------------------------------


@dataclass
class Stand:
    """The host stand-in, started and stopped (a restart is both)."""

    kube: KubeClient
    namespace: str
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = field(default_factory=list)

    def start(self) -> None:
        knobs = AssistedKnobs(step_delay=0.02)
        stop = asyncio.Event()
        found = hosts.controllers(self.kube, knobs=knobs, namespace=self.namespace)
        self.running.append((stop, asyncio.create_task(run_all(found, stop))))

    async def stop(self) -> None:
        while self.running:
            stop, task = self.running.pop()
            stop.set()
            await asyncio.wait_for(task, 15)


@pytest.fixture
async def stand(kube: KubeClient, namespace: str) -> AsyncIterator[Stand]:
    """Stopped after the test; finalizers a failed test left dropped."""
    found = Stand(kube, namespace)
    yield found
    await found.stop()
    items, _ = await kube.list(METAL3_MACHINE, namespace=namespace)
    for item in items:
        with contextlib.suppress(KubeNotFound):
            patch = {"metadata": {"finalizers": None}}
            await kube.patch_merge(METAL3_MACHINE, namespace, item["metadata"]["name"], patch)


async def _seed(kube: KubeClient, namespace: str, count: int, **fault: str) -> list[Json]:
    made = []
    for manifest in bare_metal_hosts(namespace, count):
        if manifest["kind"] == BARE_METAL_HOST.kind and fault:
            manifest["metadata"]["annotations"] = fault
        made.append(await kube.create(assisted_kind(manifest), manifest))
    return [m for m in made if m["kind"] == BARE_METAL_HOST.kind]


async def _infraenv(kube: KubeClient, namespace: str) -> Json:
    obj = {
        "apiVersion": INFRA_ENV.api_version,
        "kind": INFRA_ENV.kind,
        "metadata": {"name": INFRAENV, "namespace": namespace},
        "spec": {
            "clusterRef": {"name": "hc-control-plane", "namespace": namespace},
            "pullSecretRef": {"name": "hc-pull-secret"},
        },
    }
    await kube.create(INFRA_ENV, obj)
    status = {"status": {"isoDownloadURL": ISO}}
    return await kube.patch_merge(INFRA_ENV, namespace, INFRAENV, status, subresource="status")


async def _machine(kube: KubeClient, namespace: str, name: str, *, named: bool) -> Json:
    """A Machine (bootstrap data named or not) and its Metal3Machine booting the ISO."""
    bootstrap = {"dataSecretName": name} if named else {}
    machine = await kube.create(
        MACHINE,
        {
            "apiVersion": MACHINE.api_version,
            "kind": MACHINE.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "clusterName": "hc",
                "bootstrap": bootstrap,
                "infrastructureRef": {
                    "apiVersion": METAL3_MACHINE.api_version,
                    "kind": METAL3_MACHINE.kind,
                    "name": name,
                },
            },
        },
    )
    owner = {
        "apiVersion": MACHINE.api_version,
        "kind": MACHINE.kind,
        "name": name,
        "uid": machine["metadata"]["uid"],
    }
    await kube.create(
        METAL3_MACHINE,
        {
            "apiVersion": METAL3_MACHINE.api_version,
            "kind": METAL3_MACHINE.kind,
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]},
            "spec": {"image": {"url": ISO, "format": "live-iso"}},
        },
    )
    return machine


async def _items(kube: KubeClient, kind: Any, namespace: str) -> list[Json]:
    found, _ = await kube.list(kind, namespace=namespace)
    return found


def _host(m3m: Json) -> str:
    return str((m3m["metadata"].get("annotations") or {}).get(hosts.HOST_ANNOTATION, ""))


async def _set_state(kube: KubeClient, namespace: str, agent: Json, state: str) -> None:
    patch = {"status": {"debugInfo": {"state": state}}}
    await kube.patch_merge(AGENT, namespace, agent["metadata"]["name"], patch, subresource="status")


# --- tests ---------------------------------------------------------------------------------


async def test_host_claimed_booted_ready_released(
    kube: KubeClient, namespace: str, stand: Stand
) -> None:
    seeded = await _seed(kube, namespace, 2)
    macs = {h["metadata"]["name"]: h["spec"]["bootMACAddress"] for h in seeded}
    assert len(set(macs.values())) == 2
    await _infraenv(kube, namespace)
    await _machine(kube, namespace, "hc-m1", named=False)
    stand.start()

    # New hosts are inspected (available); nothing is claimed before bootstrap data is named.
    await eventually(
        lambda: _items(kube, BARE_METAL_HOST, namespace),
        lambda hs: all(h.get("status", {}).get("provisioning", {}).get("state") for h in hs),
        what="hosts available",
    )
    await asyncio.sleep(0.3)
    assert not _host(await kube.get(METAL3_MACHINE, namespace, "hc-m1"))
    assert not await _items(kube, AGENT, namespace)

    patch = {"spec": {"bootstrap": {"dataSecretName": "hc-m1"}}}
    await kube.patch_merge(MACHINE, namespace, "hc-m1", patch)
    m3m = await eventually(
        lambda: kube.get(METAL3_MACHINE, namespace, "hc-m1"),
        lambda m: bool(_host(m)),
        what="the host recorded on the Metal3Machine",
    )
    assert hosts.M3M_FINALIZER in m3m["metadata"]["finalizers"]
    host_ns, _, host_name = _host(m3m).partition("/")
    assert host_ns == namespace
    host = await kube.get(BARE_METAL_HOST, namespace, host_name)
    assert host["spec"]["consumerRef"] == {
        "apiVersion": METAL3_MACHINE.api_version,
        "kind": "Metal3Machine",
        "name": "hc-m1",
        "namespace": namespace,
    }
    assert host["spec"]["image"] == {"url": ISO, "format": "live-iso"}
    assert [(r["kind"], r["uid"]) for r in host["metadata"]["ownerReferences"]] == [
        ("Metal3Machine", m3m["metadata"]["uid"])
    ]
    assert host["status"]["provisioning"]["state"] == "provisioned"

    # The host boots as exactly one Agent.
    agents = await eventually(
        lambda: _items(kube, AGENT, namespace),
        lambda a: bool(a and a[0].get("status")),
        what="an Agent with status",
    )
    assert len(agents) == 1
    agent = agents[0]
    assert agent["metadata"]["labels"] == {hosts.INFRAENV_LABEL: INFRAENV}
    assert agent["spec"] == {
        "approved": False,
        "role": "",
        "clusterDeploymentName": {"name": "hc-control-plane", "namespace": namespace},
    }
    inventory = agent["status"]["inventory"]
    assert inventory["hostname"] == host_name
    assert [i["macAddress"] for i in inventory["interfaces"]] == [macs[host_name]]
    assert agent["status"]["debugInfo"]["state"] == "known"

    # A restarted stand-in finds that Agent: still one.
    await stand.stop()
    stand.start()
    await asyncio.sleep(0.5)
    assert [a["metadata"]["name"] for a in await _items(kube, AGENT, namespace)] == [
        agent["metadata"]["name"]
    ]
    m3m = await kube.get(METAL3_MACHINE, namespace, "hc-m1")
    assert not m3m.get("status", {}).get("ready")

    # Installed: the Metal3Machine is ready, with CAPM3's providerID.
    await _set_state(kube, namespace, agent, "installed")
    m3m = await eventually(
        lambda: kube.get(METAL3_MACHINE, namespace, "hc-m1"),
        lambda m: bool(m.get("status", {}).get("ready")),
        what="Metal3Machine ready",
    )
    assert m3m["spec"]["providerID"] == f"metal3://{namespace}/{host_name}/hc-m1"
    assert [a["type"] for a in m3m["status"]["addresses"]] == ["InternalIP", "Hostname"]

    # Deletion: the host is free again, the Agent gone, then the Metal3Machine.
    await kube.delete(METAL3_MACHINE, namespace, "hc-m1")
    await eventually(
        lambda: _items(kube, METAL3_MACHINE, namespace), lambda m: not m, what="M3M gone"
    )
    host = await kube.get(BARE_METAL_HOST, namespace, host_name)
    assert "consumerRef" not in host["spec"]
    assert "image" not in host["spec"]
    assert not host["metadata"].get("ownerReferences")
    assert host["status"]["provisioning"]["state"] == "available"
    assert not await _items(kube, AGENT, namespace)


async def test_claims_share_hosts_and_wait_for_a_free_one(
    kube: KubeClient, namespace: str, stand: Stand
) -> None:
    await _seed(kube, namespace, 3)
    await _infraenv(kube, namespace)
    stand.start()
    names = [f"hc-w{i}" for i in range(4)]
    for name in names:
        await _machine(kube, namespace, name, named=True)

    def claimed(m3ms: list[Json]) -> list[Json]:
        return [m for m in m3ms if _host(m)]

    m3ms = await eventually(
        lambda: _items(kube, METAL3_MACHINE, namespace),
        lambda ms: len(claimed(ms)) == 3,
        what="three hosts claimed",
    )
    await asyncio.sleep(0.3)
    m3ms = await _items(kube, METAL3_MACHINE, namespace)
    assert len(claimed(m3ms)) == 3
    assert len({_host(m) for m in claimed(m3ms)}) == 3
    agents = await eventually(
        lambda: _items(kube, AGENT, namespace), lambda a: len(a) == 3, what="three Agents"
    )
    assert len({a["metadata"]["name"] for a in agents}) == 3

    # The fourth waits; a host freed by a deletion is its.
    waiting = next(m["metadata"]["name"] for m in m3ms if not _host(m))
    freed = claimed(m3ms)[0]
    await kube.delete(METAL3_MACHINE, namespace, freed["metadata"]["name"])
    m3m = await eventually(
        lambda: kube.get(METAL3_MACHINE, namespace, waiting),
        lambda m: bool(_host(m)),
        what="the waiting Metal3Machine claims the freed host",
    )
    assert _host(m3m) == _host(freed)
    await eventually(
        lambda: _items(kube, AGENT, namespace), lambda a: len(a) == 3, what="three Agents again"
    )


async def test_mac_mismatch_and_metal3_cluster(
    kube: KubeClient, namespace: str, stand: Stand
) -> None:
    seeded = await _seed(kube, namespace, 1, **{"standins.capibus.dev/fault": "mac-mismatch"})
    await _infraenv(kube, namespace)
    cluster = {
        "apiVersion": METAL3_CLUSTER.api_version,
        "kind": METAL3_CLUSTER.kind,
        "metadata": {"name": "hc", "namespace": namespace},
        "spec": {"controlPlaneEndpoint": {"host": "", "port": 6443}},
    }
    await kube.create(METAL3_CLUSTER, cluster)
    await _machine(kube, namespace, "hc-m1", named=True)
    stand.start()

    agents = await eventually(
        lambda: _items(kube, AGENT, namespace),
        lambda a: bool(a and a[0].get("status")),
        what="an Agent with status",
    )
    reported = agents[0]["status"]["inventory"]["interfaces"][0]["macAddress"]
    assert reported != seeded[0]["spec"]["bootMACAddress"]
    assert reported.startswith("06:")

    # The Metal3Cluster is ready once its endpoint host is set, not before.
    assert not (await kube.get(METAL3_CLUSTER, namespace, "hc")).get("status", {}).get("ready")
    patch = {"spec": {"controlPlaneEndpoint": {"host": "api.hc.example.test", "port": 6443}}}
    await kube.patch_merge(METAL3_CLUSTER, namespace, "hc", patch)
    await eventually(
        lambda: kube.get(METAL3_CLUSTER, namespace, "hc"),
        lambda c: bool(c.get("status", {}).get("ready")),
        what="Metal3Cluster ready",
    )
