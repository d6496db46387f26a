"""metal-stack end to end: real API servers (management and workload), NATS, Redis, capibus's
watcher, writer and metal-stack provider as processes, the metal-api stand-in as a process
(HMAC on, a node registrar writing Nodes into the workload API server), and the Cluster API
stand-in in this process, confined to the test's namespace.

One module-wide set of processes serves every test (each test has its own namespace and
clusters), so the expensive start happens once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE_DEPLOYMENT,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    NODE,
)
from standins.base import run_all
from standins.capi import CapiKnobs, controllers
from testenv.examples import metalstack_cluster, metalstack_kind
from testenv.harness import LocalStack
from tests.integration.support import ROOT, ServiceProcess, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
HMAC = "capibus-test-hmac"
KINDS = (
    '["metalstackcluster","metalstackmachine","metalstackfirewall","capicluster",'
    '"machine","secret"]'
)
SEEDED_NETWORKS = ["internet-vagrant-lab", "tenant-super-network-vagrant"]


@dataclass
class MetalApi:
    url: str
    proc: subprocess.Popen[bytes]

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            return (await client.get(path)).json()

    async def state(self) -> Json:
        found: Json = await self.get("/_standin/state")
        return found

    async def fault(self, route: str, status: int, count: int) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            fault = {"route": route, "status": status, "count": count}
            (await client.post("/_standin/faults", json=fault)).raise_for_status()


@dataclass
class Metal:
    stack: LocalStack
    api: MetalApi
    workload: Path
    provider: list[ServiceProcess]
    log_dir: Path

    def start_provider(self, replica: str | None = None) -> ServiceProcess:
        proc = ServiceProcess(
            "metalstack",
            {
                **self.stack.env(),
                **_settings(),
                "METALCTL_URL": self.api.url,
                "METALCTL_HMAC": HMAC,
            },
            self.log_dir,
            replica or uuid.uuid4().hex[:6],
            "services.baremetal.metalstack",
        ).start()
        self.provider.append(proc)
        return proc


def _settings() -> dict[str, str]:
    return {
        "CAPIBUS_LEASE_TTL": "2",
        "CAPIBUS_CONSUMER__ACK_WAIT": "5",
        "CAPIBUS_METRICS_PORT": "0",
    }


@pytest.fixture(scope="module")
def metal(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Metal]:
    log_dir = tmp_path_factory.mktemp("metalstack")
    workload = stack.workload()
    url_file = log_dir / "metal-api.url"
    env = {
        **os.environ,
        "STANDIN_METALAPI_HMAC": HMAC,
        "STANDIN_METALAPI_URL_FILE": str(url_file),
        "STANDIN_METALAPI_PROVISIONING_DELAY": "0.3",
        "STANDIN_METALAPI_REBOOT_DELAY": "0.3",
        "STANDIN_METALAPI_POOL_SIZE": "40",
    }
    with (log_dir / "metal-api.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "standins.metalapi", "--workload-kubeconfig", str(workload)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    services = [
        ServiceProcess(
            name,
            {**stack.env(), **_settings(), **extra},
            log_dir,
            uuid.uuid4().hex[:6],
        ).start()
        for name, extra in (("watcher", {"CAPIBUS_WATCHER__KINDS": KINDS}), ("writer", {}))
    ]
    world = Metal(stack, MetalApi("", proc), workload, [], log_dir)
    try:
        deadline = time.monotonic() + 20
        while not (url_file.exists() and url_file.read_text().strip()):
            assert proc.poll() is None, (log_dir / "metal-api.log").read_text()
            assert time.monotonic() < deadline, "the metal-api stand-in did not start"
            time.sleep(0.1)
        world.api.url = url_file.read_text().strip()
        world.start_provider()
        yield world
    finally:
        for service in [*services, *world.provider]:
            service.stop()
        proc.terminate()
        proc.wait(10)


@pytest.fixture
async def workload_kube(metal: Metal) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(metal.workload), qps=None)
    yield client
    await client.aclose()


@pytest.fixture
async def capi(kube: KubeClient, namespace: str, metal: Metal) -> AsyncIterator[None]:
    """The Cluster API stand-in for this namespace; the kubeconfig it writes is the workload's."""
    stop = asyncio.Event()
    knobs = CapiKnobs(kubeconfig_path=str(metal.workload))
    task = asyncio.create_task(run_all(controllers(kube, namespace=namespace, knobs=knobs), stop))
    yield
    stop.set()
    await asyncio.wait_for(task, 30)


def drained(state: Json) -> bool:
    """Every machine of the metal API back in the pool."""
    return not state["machines"]["allocated"] and not state["machines"]["rebooting"]


@pytest.fixture
async def pool_left_empty(
    kube: KubeClient, namespace: str, metal: Metal, capi: None
) -> AsyncIterator[None]:
    """The metal API serves the whole module, so a test that fails halfway (and leaves machines
    allocated) would fail the next one too: its Clusters are deleted and the pool drained
    before the Cluster API stand-in stops."""
    yield
    state = await metal.api.state()
    if drained(state):
        return
    clusters, _ = await kube.list(CAPI_CLUSTER, namespace=namespace)
    for cluster in clusters:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(CAPI_CLUSTER, namespace, cluster["metadata"]["name"])
    await eventually(
        metal.api.state,
        drained,
        timeout=120,
        what="the pool drained after the test",
    )


# --- reading the world ------------------------------------------------------------------------


async def items(kube: KubeClient, kind: ResourceKind, namespace: str, cluster: str) -> list[Json]:
    found, _ = await kube.list(
        kind, namespace=namespace, label_selector=f"cluster.x-k8s.io/cluster-name={cluster}"
    )
    return found


async def create(kube: KubeClient, namespace: str, name: str, *, workers: int) -> None:
    for manifest in metalstack_cluster(namespace, name, workers=workers):
        await kube.create(metalstack_kind(manifest), manifest)


async def ready_machines(kube: KubeClient, namespace: str, cluster: str) -> list[Json]:
    return [
        m
        for m in await items(kube, METALSTACK_MACHINE, namespace, cluster)
        if (m.get("status") or {}).get("ready")
    ]


async def wait_ready(kube: KubeClient, namespace: str, cluster: str, machines: int) -> list[Json]:
    async def probe() -> tuple[list[Json], list[Json]]:
        return (
            await ready_machines(kube, namespace, cluster),
            await items(kube, METALSTACK_MACHINE, namespace, cluster),
        )

    ready, _ = await eventually(
        probe,
        lambda found: len(found[0]) == machines == len(found[1]),
        timeout=90,
        interval=0.5,
        what=f"{machines} ready MetalStackMachines of {cluster}",
    )
    return ready


async def gone(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> bool:
    try:
        await kube.get(kind, namespace, name)
    except KubeNotFound:
        return True
    return False


def allocated_for(state: Json, hostnames: set[str]) -> list[Json]:
    return [m for m in state["machines"]["allocated"] if m["hostname"] in hostnames]


async def scale(kube: KubeClient, namespace: str, cluster: str, workers: int) -> None:
    await kube.patch_merge(
        MACHINE_DEPLOYMENT, namespace, f"{cluster}-md-0", {"spec": {"replicas": workers}}
    )


# --- the tests --------------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_a_cluster_comes_up_scales_and_goes_leaving_nothing_allocated(
    kube: KubeClient, namespace: str, metal: Metal, pool_left_empty: None, workload_kube: KubeClient
) -> None:
    await create(kube, namespace, "ms1", workers=2)

    ready = await wait_ready(kube, namespace, "ms1", 3)
    msc = await kube.get(METALSTACK_CLUSTER, namespace, "ms1")
    assert msc["status"]["ready"] is True
    assert msc["spec"]["privateNetworkID"]
    host = msc["spec"]["controlPlaneEndpoint"]["host"]
    assert host
    nodes, _ = await workload_kube.list(NODE)
    by_name = {n["metadata"]["name"]: n for n in nodes}
    for machine in ready:
        provider = machine["spec"]["providerID"]
        node = by_name[machine["metadata"]["name"]]
        assert node["spec"]["providerID"] == provider
        assert node["status"]["nodeInfo"]["systemUUID"] == provider.removeprefix("metalstack://")
    firewall = await eventually(
        lambda: kube.get(METALSTACK_FIREWALL, namespace, "ms1"),
        lambda f: bool((f.get("status") or {}).get("ready")),
        timeout=60,
        what="the firewall to run",
    )
    assert firewall["spec"]["providerID"].startswith("metalstack://")

    for workers in (4, 1):
        await scale(kube, namespace, "ms1", workers)
        ready = await wait_ready(kube, namespace, "ms1", 1 + workers)
    hostnames = {m["metadata"]["name"] for m in ready} | {"ms1-firewall"}
    state = await metal.api.state()
    assert len(allocated_for(state, hostnames)) == 3  # one control plane, one worker, the firewall
    assert len(state["machines"]["allocated"]) == 3

    await kube.delete(CAPI_CLUSTER, namespace, "ms1")
    await eventually(
        lambda: gone(kube, METALSTACK_CLUSTER, namespace, "ms1"),
        bool,
        timeout=120,
        interval=0.5,
        what="the MetalStackCluster to go",
    )
    assert await gone(kube, METALSTACK_FIREWALL, namespace, "ms1")
    assert await items(kube, METALSTACK_MACHINE, namespace, "ms1") == []
    state = await eventually(
        metal.api.state,
        drained,
        timeout=30,
        what="every machine back in the pool",
    )
    assert state["ips"] == []
    assert sorted(n["id"] for n in state["networks"]) == SEEDED_NETWORKS


@pytest.mark.timeout(420)
async def test_twenty_machines_on_two_replicas_survive_kills_and_metal_api_errors(
    kube: KubeClient, namespace: str, metal: Metal, pool_left_empty: None
) -> None:
    """Two provider replicas share the partitions; one is SIGKILLed mid-provisioning and one
    mid-deletion, metal-api answers 500 to allocations for a while. Afterwards every
    MetalStackMachine has exactly one metal machine, none failed, and deleting the clusters
    leaves nothing allocated."""
    extra = [metal.start_provider()]
    try:
        await metal.api.fault("machine-allocate", 500, 3)
        clusters = {"ms2": 9, "ms3": 9}  # and one control plane each: 20 machines
        for name, workers in clusters.items():
            await create(kube, namespace, name, workers=workers)
        await eventually(
            lambda: allocated_machines(metal),
            lambda count: count >= 4,
            timeout=60,
            what="provisioning under way",
        )
        extra[0].kill()
        extra.append(metal.start_provider())
        for name, workers in clusters.items():
            await wait_ready(kube, namespace, name, 1 + workers)
        await assert_one_machine_each(kube, namespace, metal, clusters, 20)

        for name in clusters:
            await kube.delete(CAPI_CLUSTER, namespace, name)
        await eventually(
            lambda: allocated_machines(metal),
            lambda count: count < 18,
            timeout=60,
            what="deletion under way",
        )
        extra[1].kill()
        extra.append(metal.start_provider())
        await assert_all_freed(kube, namespace, metal, clusters)
    finally:
        for proc in extra:
            proc.stop()


@pytest.mark.timeout(300)
async def test_a_cluster_converges_through_nats_and_redis_restarts(
    kube: KubeClient, namespace: str, metal: Metal, pool_left_empty: None, stack: LocalStack
) -> None:
    """NATS and Redis restart while a cluster is being provisioned, and again while it is
    being deleted; it converges each time, one machine each, nothing left behind."""
    if not stack.managed:
        pytest.skip("needs a stack the harness can restart")
    await create(kube, namespace, "ms4", workers=3)
    await eventually(
        lambda: allocated_machines(metal),
        lambda count: count >= 1,
        timeout=60,
        what="provisioning under way",
    )
    stack.restart("nats")
    stack.restart("redis")
    await wait_ready(kube, namespace, "ms4", 4)
    await assert_one_machine_each(kube, namespace, metal, {"ms4": 3}, 4)

    await kube.delete(CAPI_CLUSTER, namespace, "ms4")
    await eventually(
        lambda: allocated_machines(metal),
        lambda count: count < 4,
        timeout=60,
        what="deletion under way",
    )
    stack.restart("redis")
    stack.restart("nats")
    await assert_all_freed(kube, namespace, metal, {"ms4": 3})


async def assert_one_machine_each(
    kube: KubeClient, namespace: str, metal: Metal, clusters: dict[str, int], total: int
) -> None:
    hostnames: list[str] = []
    for name in clusters:
        for machine in await items(kube, METALSTACK_MACHINE, namespace, name):
            assert not (machine.get("status") or {}).get("failureReason"), machine
            hostnames.append(machine["metadata"]["name"])
    state = await metal.api.state()
    allocated = [m["hostname"] for m in state["machines"]["allocated"] if not m["firewall"]]
    assert sorted(allocated) == sorted(hostnames)  # exactly one machine each
    assert len(hostnames) == total


async def assert_all_freed(
    kube: KubeClient, namespace: str, metal: Metal, clusters: dict[str, int]
) -> None:
    for name in clusters:
        await eventually(
            lambda name=name: gone(kube, METALSTACK_CLUSTER, namespace, name),  # type: ignore[misc]
            bool,
            timeout=120,
            interval=0.5,
            what=f"{name} to go",
        )
    state = await eventually(
        metal.api.state,
        drained,
        timeout=30,
        what="every machine back in the pool",
    )
    assert state["ips"] == []
    assert sorted(n["id"] for n in state["networks"]) == SEEDED_NETWORKS


async def allocated_machines(metal: Metal) -> int:
    return len((await metal.api.state())["machines"]["allocated"])
