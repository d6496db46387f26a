"""The catalog's subscriptions, and what it does when the partitions it holds change.

- ``apptemplate``: AppTemplate events from the watcher, in the template's partition.
- ``sync``: ``SyncAppTemplate`` commands from the timers, in the same partition.

Both run under one lock per template (``KeyedLocks`` in the handlers), since each has its own
per-object queue. ``OwnershipFollower`` is the consumer's ``on_ownership`` listener: it drops
the timers of partitions given up and re-arms those of the partitions held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from services.catalog import handlers
from services.catalog.timers import SyncTimers
from shared import subjects
from shared.consumer import Batch, Subscription, retry_until_done
from shared.messages import ResourceChanged, SyncAppTemplate
from shared.resources import APP_TEMPLATE

log = logging.getLogger(__name__)


def subscriptions(deps: handlers.Deps, *, coalesce_seconds: float) -> list[Subscription[Any]]:
    async def on_template(batch: Batch[ResourceChanged]) -> None:
        await handlers.on_template_event(event=batch.latest, deps=deps)

    async def on_sync(batch: Batch[SyncAppTemplate]) -> None:
        await handlers.on_sync_command(command=batch.latest, deps=deps)

    return [
        Subscription(
            name=APP_TEMPLATE.token,
            stream=subjects.EVENTS,
            filters=lambda p: [subjects.resource_events_in_partition(APP_TEMPLATE.token, p)],
            model=ResourceChanged,
            handle=on_template,
            coalesce_seconds=coalesce_seconds,
        ),
        Subscription(
            name="sync",
            stream=subjects.LIFECYCLE,
            filters=lambda p: [subjects.app_template_syncs_in_partition(p)],
            model=SyncAppTemplate,
            handle=on_sync,
        ),
    ]


class OwnershipFollower:
    """Keeps the timers in step with the partitions held.

    The consumer awaits this inside its lease loop, so the list runs as a task: a slow or
    failing API server must not delay lease renewal. A failed list is retried with backoff
    (nothing else would bring the timers back) until it succeeds or ownership changes again.
    """

    def __init__(self, deps: handlers.Deps, timers: SyncTimers, *, retry_max: float) -> None:
        self.deps = deps
        self.timers = timers
        self.retry_max = retry_max
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, owned: frozenset[int]) -> None:
        self.timers.retain(owned)
        await self.aclose()
        if owned:
            self._task = asyncio.create_task(self._rearm(owned))

    async def _rearm(self, owned: frozenset[int]) -> None:
        armed = await retry_until_done(
            lambda: handlers.rearm(owned, deps=self.deps),
            what="list AppTemplates",
            cap=self.retry_max,
        )
        log.info("armed the sync timers of %d AppTemplate(s)", armed)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
