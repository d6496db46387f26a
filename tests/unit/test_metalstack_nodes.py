"""Watching a workload cluster's Nodes only while a machine waits for one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from services.baremetal.metalstack.nodes import NodeWatches
from services.baremetal.metalstack.ports import Workload
from shared import subjects
from shared.kube import ResourceKind, WatchEvent
from shared.messages import ObjectRef, RecheckObject
from tests.fakes import FakeBus

Json = dict[str, Any]
CLUSTER = Workload(namespace="ns", name="c1", version="1", kubeconfig="kc")
REF = ObjectRef(
    api_version="infrastructure.cluster.x-k8s.io/v1alpha4",
    kind="MetalStackMachine",
    namespace="ns",
    name="w-0",
    uid="msm-uid",
)


def node(name: str, machine: str) -> Json:
    return {
        "metadata": {"name": name, "uid": f"node-{name}", "resourceVersion": "5"},
        "status": {"nodeInfo": {"systemUUID": machine}},
    }


class Workloads:
    """One fake workload API: a list, then a watch fed by ``events``."""

    def __init__(self) -> None:
        self.nodes: list[Json] = []
        self.events: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self.lists = 0
        self.watching = 0
        self.closed = 0

    async def list(self, kind: ResourceKind, **_: Any) -> tuple[list[Json], str]:
        self.lists += 1
        return list(self.nodes), "10"

    async def watch(self, kind: ResourceKind, **_: Any) -> AsyncIterator[WatchEvent]:
        self.watching += 1
        try:
            while True:
                yield await self.events.get()
        finally:
            self.watching -= 1

    async def patch_merge(self, *args: Any, **kwargs: Any) -> Json:
        return {}

    async def aclose(self) -> None:
        self.closed += 1


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_waiting_machine_is_rechecked_when_its_node_appears_and_the_watch_stops() -> None:
    api, bus = Workloads(), FakeBus()
    watches = NodeWatches(connect=lambda _: api, bus=bus, service="metalstack", source="m/1")
    watches.wait_for(CLUSTER, "m-1", REF, 3)
    await settle()
    assert (api.lists, api.watching) == (1, 1)

    await api.events.put(WatchEvent("ADDED", node("other", "m-9")))
    await api.events.put(WatchEvent("MODIFIED", node("w-0", "m-1")))
    await settle()
    (recheck,) = bus.of(RecheckObject)
    assert recheck.ref == REF
    assert recheck.reason == "NodeRegistered"
    assert bus.published[0][0] == subjects.recheck("metalstack", 3, "ns", "w-0")

    watches.forget("m-1")
    await settle()
    assert api.watching == 0
    assert watches.waiting() == {}
    await watches.close()
    assert api.closed == 1


async def test_a_node_already_there_is_announced_from_the_list() -> None:
    api, bus = Workloads(), FakeBus()
    api.nodes = [node("w-0", "m-1")]
    watches = NodeWatches(connect=lambda _: api, bus=bus, service="metalstack", source="m/1")
    assert await watches.node_for(CLUSTER, "m-1") == api.nodes[0]
    watches.wait_for(CLUSTER, "m-1", REF, 3)
    await settle()
    assert len(bus.of(RecheckObject)) == 1
    await watches.close()


async def test_losing_a_partition_drops_its_waits_and_a_rotated_kubeconfig_reconnects() -> None:
    clients: list[Workloads] = []

    def connect(kubeconfig: str) -> Workloads:
        clients.append(Workloads())
        return clients[-1]

    watches = NodeWatches(connect=connect, bus=FakeBus(), service="metalstack", source="m/1")
    watches.wait_for(CLUSTER, "m-1", REF, 3)
    rotated = Workload(namespace="ns", name="c1", version="2", kubeconfig="kc2")
    watches.wait_for(rotated, "m-2", REF, 4)
    await settle()
    assert len(clients) == 2
    assert clients[0].closed == 1
    assert watches.waiting() == {"ns/c1": ["m-1", "m-2"]}
    watches.drop({3})
    assert watches.waiting() == {"ns/c1": ["m-2"]}
    watches.drop({4})
    await settle()
    assert clients[1].watching == 0
    await watches.close()
