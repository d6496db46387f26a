"""The writer's subscriptions: status patches and metadata commands, per Cluster, in order.

``ownership`` is the consumer's ownership listener: each new claim seeds the status cache.
It runs beside the messages, not before them: a Cluster written before its seed arrives just
costs the GET it would have cost anyway, and the seed never overwrites that newer write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.writer import handlers
from services.writer.logic import StatusCache
from shared import subjects
from shared.consumer import Batch, Ownership, Subscription
from shared.messages import PatchClusterMetadata, PatchClusterStatus


@dataclass(frozen=True)
class Deps:
    kube: handlers.StatusApi
    journal: handlers.Journal
    cache: StatusCache
    writer: str
    derive: handlers.DeriveStatus
    deadlines: handlers.Deadlines | None = None
    conflict_retries: int = 3
    coalesce_seconds: float = 0.02
    partitions: int = 1


log = logging.getLogger(__name__)


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def on_status_patches(batch: Batch[PatchClusterStatus]) -> None:
        await handlers.write_status(
            batch=batch,
            kube=deps.kube,
            journal=deps.journal,
            cache=deps.cache,
            writer=deps.writer,
            derive=deps.derive,
            deadlines=deps.deadlines,
            conflict_retries=deps.conflict_retries,
        )

    async def on_metadata_commands(batch: Batch[PatchClusterMetadata]) -> None:
        await handlers.write_metadata(
            batch=batch,
            kube=deps.kube,
            journal=deps.journal,
            writer=deps.writer,
            cache=deps.cache,
            conflict_retries=deps.conflict_retries,
        )

    return [
        Subscription(
            name="status",
            stream=subjects.STATUS,
            filters=lambda p: [subjects.cluster_status_in_partition(p)],
            model=PatchClusterStatus,
            handle=on_status_patches,
            coalesce_seconds=deps.coalesce_seconds,
        ),
        Subscription(
            name="meta",
            stream=subjects.STATUS,
            filters=lambda p: [subjects.cluster_metadata_in_partition(p)],
            model=PatchClusterMetadata,
            handle=on_metadata_commands,
        ),
    ]


def ownership(deps: Deps) -> Callable[[Ownership], Awaitable[None]]:
    seen: dict[int, int] = {}
    running: set[asyncio.Task[None]] = set()

    async def seed(claims: dict[int, int]) -> None:
        try:
            count = await handlers.seed_cache(
                claims=claims, kube=deps.kube, cache=deps.cache, partitions=deps.partitions
            )
            log.info(
                "status cache seeded with %d Cluster(s) of partitions %s", count, sorted(claims)
            )
        except Exception:
            # An optimisation only: without the seed the first write to a Cluster reads it.
            log.exception("seeding the status cache for partitions %s failed", sorted(claims))

    async def on_ownership(owned: Ownership) -> None:
        claims = {p: t for p, t in owned.tokens.items() if seen.get(p) != t}
        seen.clear()
        seen.update(owned.tokens)
        if claims:
            task = asyncio.create_task(seed(claims))
            running.add(task)
            task.add_done_callback(running.discard)

    return on_ownership
