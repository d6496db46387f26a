"""The monitor's subscription: every watched kind's events, per object, to ``report``.

One subscription rather than one per kind: each partition then costs one durable consumer
and one pull loop instead of seven. Objects of different kinds sharing a name share a queue;
``report`` keeps the latest event of each kind in a batch apart.

``ownership`` follows the partitions rather than messages: each claim resyncs the Clusters
of the claimed partitions in the background, so the consumer's lease loop never waits on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.monitor import handlers, logic
from shared import subjects
from shared.consumer import Batch, Subscription
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
    kinds: handlers.KindCache = field(default_factory=dict)


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


def ownership(deps: Deps) -> Callable[[frozenset[int]], Awaitable[None]]:
    held: set[int] = set()
    running: set[asyncio.Task[None]] = set()

    async def resync(claimed: frozenset[int]) -> None:
        try:
            await handlers.resync_partitions(
                claimed=claimed,
                kube=deps.kube,
                bus=deps.bus,
                views=deps.views,
                locks=deps.locks,
                partitions=deps.partitions,
                source=deps.source,
            )
        except Exception:
            # A safety net, not a step of any flow: events keep the status right meanwhile.
            log.exception("resync of partitions %s failed", sorted(claimed))

    async def on_ownership(owned: frozenset[int]) -> None:
        claimed = frozenset(owned - held)
        held.clear()
        held.update(owned)
        if not owned:
            for task in running:
                task.cancel()
        elif claimed:
            task = asyncio.create_task(resync(claimed))
            running.add(task)
            task.add_done_callback(running.discard)

    return on_ownership
