"""The writer's subscriptions: status patches and metadata commands, per Cluster, in order.

``ownership`` is the consumer's ownership listener: each new claim seeds the status cache and
arms the claimed Clusters' timeouts. It runs beside the messages, not before them: a Cluster
written before its seed arrives just costs the GET it would have cost anyway, and the seed
never overwrites that newer write. A seed that meets a ``TemporaryError`` is retried with
backoff while the claim lasts; losing every partition cancels it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.writer import handlers
from services.writer.logic import StatusCache
from shared import subjects
from shared.consumer import Batch, Ownership, Subscription, backoff
from shared.errors import TemporaryError
from shared.messages import PatchMetadata, PatchStatus


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
    retry_base: float = 0.5
    retry_max: float = 60.0


log = logging.getLogger(__name__)


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def on_status_patches(batch: Batch[PatchStatus]) -> None:
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

    async def on_metadata_commands(batch: Batch[PatchMetadata]) -> None:
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
            filters=lambda p: [subjects.status_patches_in_partition(p)],
            model=PatchStatus,
            handle=on_status_patches,
            coalesce_seconds=deps.coalesce_seconds,
        ),
        Subscription(
            name="meta",
            stream=subjects.STATUS,
            filters=lambda p: [subjects.metadata_patches_in_partition(p)],
            model=PatchMetadata,
            handle=on_metadata_commands,
        ),
    ]


def ownership(deps: Deps) -> Callable[[Ownership], Awaitable[None]]:
    return Seeder(deps)


class Seeder:
    """Seeds each new claim, in a task, so the consumer's lease loop never waits on the list."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._seen: dict[int, int] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def __call__(self, owned: Ownership) -> None:
        claims = {p: t for p, t in owned.tokens.items() if self._seen.get(p) != t}
        self._seen = dict(owned.tokens)
        if not owned:
            for task in self._running:
                task.cancel()
        elif claims:
            task = asyncio.create_task(self._seed(claims))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _current(self, claims: dict[int, int]) -> dict[int, int]:
        return {p: t for p, t in claims.items() if self._seen.get(p) == t}

    async def _seed(self, claims: dict[int, int]) -> None:
        # Retried until it succeeds or the claims are gone: besides the cache, the seed arms
        # the timeouts of Clusters another replica wrote last, and nothing else would.
        deps = self.deps
        for attempt in itertools.count(1):
            claims = self._current(claims)
            if not claims:
                return
            try:
                count = await handlers.seed_cache(
                    claims=claims,
                    kube=deps.kube,
                    cache=deps.cache,
                    partitions=deps.partitions,
                    deadlines=deps.deadlines,
                )
            except TemporaryError as exc:
                delay = backoff(attempt, base=deps.retry_base, cap=deps.retry_max, hint=exc.delay)
                log.warning(
                    "cannot seed partitions %s, retrying in %.1fs: %s", sorted(claims), delay, exc
                )
                await asyncio.sleep(delay)
                continue
            except Exception:
                log.exception("seeding the status cache for partitions %s failed", sorted(claims))
                return
            log.info(
                "status cache seeded with %d Cluster(s) of partitions %s", count, sorted(claims)
            )
            return
