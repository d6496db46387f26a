"""The monitor's subscription: every watched kind's events, per object, to ``report``.

One subscription rather than one per kind: each partition then costs one durable consumer
and one pull loop instead of seven. Objects of different kinds sharing a name share a queue;
``report`` keeps the latest event of each kind in a batch apart.

``ownership`` follows the partitions rather than messages: each claim resyncs the Clusters
of the claimed partitions in the background, so the consumer's lease loop never waits on it,
and each lost partition's resync is cancelled (``Resyncs``). A claim costs one snapshot
(7 lists) plus the exact path of the few Clusters it makes suspect (``handlers``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.monitor import handlers, logic, resync
from shared import subjects
from shared.consumer import Batch, Ownership, Subscription
from shared.locks import KeyedLocks
from shared.messages import ResourceChanged

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deps:
    kube: handlers.ClusterApi
    bus: handlers.Publisher
    views: logic.ClusterViews
    partitions: int
    source: str
    coalesce_seconds: float = 0.05
    oidc_enabled: bool = False
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    kinds: handlers.KindCache = field(default_factory=handlers.KindCache)


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def on_changes(batch: Batch[ResourceChanged]) -> None:
        await handlers.report(
            batch=batch,
            kube=deps.kube,
            bus=deps.bus,
            views=deps.views,
            locks=deps.locks,
            kinds=deps.kinds,
            partitions=deps.partitions,
            source=deps.source,
            oidc_enabled=deps.oidc_enabled,
        )

    return [
        Subscription(
            name="changes",
            stream=subjects.EVENTS,
            filters=lambda p: [
                subjects.resource_events_in_partition(kind.token, p) for kind in logic.WATCHED
            ],
            model=ResourceChanged,
            handle=on_changes,
            coalesce_seconds=deps.coalesce_seconds,
        )
    ]


def ownership(deps: Deps) -> Callable[[Ownership], Awaitable[None]]:
    return Resyncs(deps)


class Resyncs:
    """One resync task per claimed partition, cancelled as soon as that partition is lost.

    A resync lists a Cluster's objects, then publishes what they no longer back. Once the
    partition has moved, the new owner may have reported a node added after that listing,
    and a removal published now would land after it: so a lost partition's resync stops at
    once, whatever happens to the others. The partitions of one claim share one snapshot (the
    list of Clusters and one list per backing kind, ``_Snapshot``); only the exact path of a
    suspect Cluster runs per partition, so that is what a lost partition cancels.
    """

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._seen: dict[int, int] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def __call__(self, owned: Ownership) -> None:
        claims = {p for p, t in owned.tokens.items() if self._seen.get(p) != t}
        self._seen = dict(owned.tokens)
        for partition in [p for p in self._tasks if p not in owned or p in claims]:
            self._tasks.pop(partition).cancel()
        snapshot = _Snapshot(self.deps.kube)
        for partition in sorted(claims):
            task = asyncio.create_task(self._resync(partition, snapshot))
            self._tasks[partition] = task
            task.add_done_callback(functools.partial(self._done, partition))

    def _done(self, partition: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(partition) is task:
            del self._tasks[partition]

    async def _resync(self, partition: int, snapshot: _Snapshot) -> None:
        deps = self.deps
        try:
            await handlers.resync_partitions(
                claimed=frozenset({partition}),
                snapshot=await snapshot.get(),
                kube=deps.kube,
                bus=deps.bus,
                views=deps.views,
                locks=deps.locks,
                partitions=deps.partitions,
                source=deps.source,
                oidc_enabled=deps.oidc_enabled,
            )
        except Exception:
            # A safety net, not a step of any flow: events keep the status right meanwhile.
            log.exception("resync of partition %d failed", partition)


class _Snapshot:
    """One snapshot for the partitions of a claim; whoever asks first takes it. A taker
    cancelled midway (its partition lost) leaves it to the next one."""

    def __init__(self, kube: handlers.ClusterApi) -> None:
        self.kube = kube
        self._lock = asyncio.Lock()
        self._snapshot: resync.Snapshot | None = None

    async def get(self) -> resync.Snapshot:
        async with self._lock:
            if self._snapshot is None:
                self._snapshot = await handlers.resync_snapshot(kube=self.kube)
            return self._snapshot
