"""The monitor's subscription: every watched kind's events, per object, to ``report``.

One subscription rather than one per kind: each partition then costs one durable consumer
and one pull loop instead of seven. Objects of different kinds sharing a name share a queue;
``report`` keeps the latest event of each kind in a batch apart.

``ownership`` follows the partitions rather than messages: each claim resyncs the Clusters
of the claimed partitions in the background, so the consumer's lease loop never waits on it,
and each lost partition's resync is cancelled (``Resyncs``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.monitor import handlers, logic
from shared import subjects
from shared.consumer import Batch, Ownership, Subscription
from shared.locks import KeyedLocks
from shared.messages import ResourceChanged
from shared.resources import CLUSTER

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
    once, whatever happens to the others. The partitions of one claim share one list of
    Clusters (``_Clusters``).
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
        clusters = _Clusters(self.deps.kube)
        for partition in sorted(claims):
            task = asyncio.create_task(self._resync(partition, clusters))
            self._tasks[partition] = task
            task.add_done_callback(functools.partial(self._done, partition))

    def _done(self, partition: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(partition) is task:
            del self._tasks[partition]

    async def _resync(self, partition: int, clusters: _Clusters) -> None:
        deps = self.deps
        try:
            await handlers.resync_partitions(
                claimed=frozenset({partition}),
                clusters=await clusters.get(),
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


class _Clusters:
    """One list of Clusters for the partitions of a claim; whoever asks first lists them. A
    lister cancelled midway (its partition lost) leaves the list to the next one."""

    def __init__(self, kube: handlers.ClusterApi) -> None:
        self.kube = kube
        self._lock = asyncio.Lock()
        self._clusters: list[dict[str, Any]] | None = None

    async def get(self) -> list[dict[str, Any]]:
        async with self._lock:
            if self._clusters is None:
                self._clusters, _ = await self.kube.list(CLUSTER)
            return self._clusters
