"""Workload clusters' Nodes: found when asked, watched only while a machine waits for one.

Upstream looked for a machine's Node by listing every Node of the workload cluster, and when
none matched asked again 15 s later, for as long as it took. Here a machine that finds no Node
*waits* for it: ``wait_for`` registers the machine and starts (once per workload cluster) a
list-then-watch of that cluster's Nodes; the moment a Node with the machine's ``systemUUID``
appears, the watch publishes a ``RecheckObject`` for the MetalStackMachine into its partition,
and the machine's own reconcile (in its queue, with its retries) patches the Node. When no
machine of a cluster waits any more, its watch stops: a cluster whose machines are all ready
costs no request at all.

A watch belongs to the replica holding the cluster's partition. When the partition is lost
the waits are dropped (``drop``), and the next holder's claim sends every machine still not
ready a ``RecheckObject`` (``bootstrap.Claims``), which registers its wait again. The kubeconfig
is that of the ``<cluster>-kubeconfig`` Secret at the version the machine read; a rotated
Secret starts a new client and watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.baremetal.metalstack import logic
from services.baremetal.metalstack.ports import Workload
from shared import subjects
from shared.errors import TemporaryError
from shared.kube import WatchExpired
from shared.messages import ObjectRef, RecheckObject, stable_id
from shared.ports import KubeMergePatcher, KubeWatcher, Publisher
from shared.resources import NODE
from shared.retry import backoff, retry_until_done
from shared.status import story_of

log = logging.getLogger(__name__)

Json = dict[str, Any]


class WorkloadApi(KubeWatcher, KubeMergePatcher, Protocol):
    async def aclose(self) -> None: ...


Connect = Callable[[str], WorkloadApi]


@dataclass(frozen=True)
class Waiter:
    ref: ObjectRef
    partition: int


@dataclass
class _Cluster:
    version: str
    api: WorkloadApi
    waiting: dict[str, Waiter] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class NodeWatches:
    """The ``Nodes`` of ``ports``: a client per workload cluster, a watch while machines wait."""

    def __init__(
        self,
        *,
        connect: Connect,
        bus: Publisher,
        service: str,
        source: str,
        watch_seconds: int = 300,
        retry_max_seconds: float = 30.0,
    ) -> None:
        self.connect = connect
        self.bus = bus
        self.service = service
        self.source = source
        self.watch_seconds = watch_seconds
        self.retry_max_seconds = retry_max_seconds
        self._clusters: dict[str, _Cluster] = {}
        self._closing: set[asyncio.Task[None]] = set()

    # --- what a machine asks ------------------------------------------------------------------

    async def node_for(self, cluster: Workload, machine: str) -> Json | None:
        nodes, _ = await self._api(cluster).list(NODE)
        return logic.node_for(nodes, machine)

    async def set_provider_id(self, cluster: Workload, node: Json, provider_id: str) -> None:
        name = node["metadata"]["name"]
        await self._api(cluster).patch_merge(
            NODE, None, name, {"spec": {"providerID": provider_id}}
        )
        log.info("%s: Node %s has providerID %s", cluster.key, name, provider_id)

    def wait_for(self, cluster: Workload, machine: str, ref: ObjectRef, partition: int) -> None:
        self._api(cluster)
        state = self._clusters[cluster.key]
        state.waiting[machine] = Waiter(ref, partition)
        if state.task is None or state.task.done():
            state.task = asyncio.create_task(self._follow(cluster.key, state))

    def forget(self, machine: str) -> None:
        for key, state in list(self._clusters.items()):
            if state.waiting.pop(machine, None) is not None and not state.waiting:
                self._stop(key)

    def drop(self, partitions: Collection[int]) -> None:
        """Forget the waits of ``partitions`` (lost: their next holder asks again)."""
        for key, state in list(self._clusters.items()):
            for machine, waiter in list(state.waiting.items()):
                if waiter.partition in partitions:
                    del state.waiting[machine]
            if not state.waiting:
                self._stop(key)

    def waiting(self) -> dict[str, list[str]]:
        """Machines waiting for their Node, per workload cluster (for logs and tests)."""
        return {
            key: sorted(state.waiting) for key, state in self._clusters.items() if state.waiting
        }

    async def close(self) -> None:
        if self.waiting():
            log.info("stopping; machines still waiting for their Node: %s", self.waiting())
        tasks = [state.task for state in self._clusters.values() if state.task is not None]
        for key in list(self._clusters):
            self._stop(key)
        await asyncio.gather(*tasks, return_exceptions=True)
        clients = [state.api for state in self._clusters.values()]
        self._clusters.clear()
        for api in clients:
            await api.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # --- inside -------------------------------------------------------------------------------

    def _api(self, cluster: Workload) -> WorkloadApi:
        state = self._clusters.get(cluster.key)
        if state is None or state.version != cluster.version:
            if state is not None:
                self._stop(cluster.key)
                self._retire(state.api)
            waiting = state.waiting if state is not None else {}
            state = _Cluster(cluster.version, self.connect(cluster.kubeconfig), dict(waiting))
            self._clusters[cluster.key] = state
        return state.api

    def _retire(self, api: WorkloadApi) -> None:
        """Close a client whose kubeconfig was rotated, without holding up the caller."""
        task = asyncio.create_task(api.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _stop(self, key: str) -> None:
        state = self._clusters.get(key)
        if state is not None and state.task is not None:
            state.task.cancel()
            state.task = None

    async def _follow(self, key: str, state: _Cluster) -> None:
        failures = 0
        while state.waiting:
            try:
                nodes, version = await state.api.list(NODE)
                await self._announce(state, nodes)
                async for event in state.api.watch(
                    NODE, resource_version=version, timeout_seconds=self.watch_seconds
                ):
                    if event.type in ("ADDED", "MODIFIED"):
                        await self._announce(state, [event.object])
                failures = 0
            except WatchExpired:
                continue
            except TemporaryError as exc:
                failures += 1
                delay = backoff(failures, base=0.5, cap=self.retry_max_seconds)
                log.warning("%s: Nodes unavailable (%s), again in %.1fs", key, exc, delay)
                await asyncio.sleep(delay)  # a retry delay, not a poll

    async def _announce(self, state: _Cluster, nodes: list[Json]) -> None:
        for node in nodes:
            machine = (logic.status(node).get("nodeInfo") or {}).get("systemUUID")
            waiter = state.waiting.get(machine or "")
            if waiter is not None:
                await self._recheck(waiter, node)

    async def _recheck(self, waiter: Waiter, node: Json) -> None:
        ref = waiter.ref
        message = RecheckObject(
            id=stable_id("node", node["metadata"]["uid"], str(ref.uid)),
            source=self.source,
            correlation_id=story_of(ref),
            ref=ref,
            reason="NodeRegistered",
        )
        subject = subjects.recheck(self.service, waiter.partition, ref.namespace, ref.name)
        await retry_until_done(
            lambda: self.bus.publish(subject, message),
            what=f"recheck {ref.key}",
            cap=self.retry_max_seconds,
        )
