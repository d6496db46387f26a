"""The exporter's wiring: one list per kind at start-up, then one follow of the EVENTS stream.

Every replica follows every event of the four kinds (the exporter is not partitioned: a
scrape must see all objects). The stream alone cannot rebuild the state after a restart: it
keeps events for a limited time (7 days by default), so a ClusterTemplate or Cluster that has
been quiet longer has no event left and would vanish from the series. So a start lists the four
kinds once, from the Kubernetes API, and then follows the stream from the newest event of each
object, applying only what is newer than the list (``logic.Series``). Nothing is listed again,
whatever happens later, and a scrape lists nothing.

``ready`` turns true once the list is taken and the first read of the stream is complete;
until then ``/readyz`` answers 503 and a scrape would show a partial view. A list that fails is
retried with backoff: a replica that cannot see the API server at start has nothing
trustworthy to export.

The exporter's own view is exported next to upstream's series: events applied (a counter in
``handlers``), the time of the last one applied, and whether the follow is caught up, which
the stream reader confirms after every batch it empties and every quiet ``idle_seconds`` in
which its consumer answered. Without a confirmation for ``caught_up_window_seconds`` the
replica reads as behind or cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.exporter import handlers
from services.exporter.logic import KINDS, Series
from shared import subjects
from shared.messages import ResourceChanged
from shared.metrics import Family
from shared.retry import retry_until_done

log = logging.getLogger(__name__)


class EventFeed(Protocol):
    def follow(
        self,
        stream: str,
        filter_subjects: Sequence[str],
        model: type[ResourceChanged],
        *,
        caught_up: Callable[[], None] = ...,
        batch: int = ...,
        idle_seconds: float = ...,
    ) -> AsyncIterator[ResourceChanged]: ...


def filters() -> list[str]:
    return [subjects.resource_events_of_kind(kind.token) for kind in KINDS]


@dataclass
class Exporter:
    feed: EventFeed
    lister: handlers.Lister
    batch: int = 500
    idle_seconds: float = 5.0
    list_retry_max_seconds: float = 30.0
    caught_up_window_seconds: float = 60.0
    clock: Callable[[], float] = time.monotonic
    series: Series = field(default_factory=Series)
    listed: bool = False
    #: ``clock()`` when the reader last said it had everything; None before the first time
    caught_up_at: float | None = None
    #: unix time of the last event applied (its envelope's ``time``); 0 before the first
    last_event_time: float = 0.0

    def families(self) -> list[Family]:
        return [*self.series.families(), *self.own_families()]

    def own_families(self) -> list[Family]:
        return [
            Family(
                "capibus_exporter_last_event_timestamp_seconds",
                "Unix time of the last event the exporter applied (0 before the first)",
                [({}, self.last_event_time)],
            ),
            Family(
                "capibus_exporter_caught_up",
                "1 while the exporter has read everything the event stream holds, else 0",
                [({}, 1.0 if self.current() else 0.0)],
            ),
        ]

    def ready(self) -> bool:
        return self.listed and self.caught_up_at is not None

    def current(self) -> bool:
        """Listed, and the reader confirmed recently that nothing is pending."""
        if not self.ready() or self.caught_up_at is None:
            return False
        return self.clock() - self.caught_up_at <= self.caught_up_window_seconds

    def _on_caught_up(self) -> None:
        if self.caught_up_at is None:
            log.info("caught up with the event stream: %d objects exported", len(self.series))
        self.caught_up_at = self.clock()

    def _on_applied(self, change: ResourceChanged) -> None:
        self.last_event_time = change.time.timestamp()

    async def run(self, stop: asyncio.Event) -> None:
        """List, then follow the events until ``stop``; an unexpected failure propagates."""
        working = asyncio.create_task(self._work())
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({working, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            working.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await working

    async def _work(self) -> None:
        await self._take_baseline()
        events = self.feed.follow(
            subjects.EVENTS.name,
            filters(),
            ResourceChanged,
            caught_up=self._on_caught_up,
            batch=self.batch,
            idle_seconds=self.idle_seconds,
        )
        await handlers.keep_current(
            events=events,
            series=self.series,
            lister=self.lister,
            applied=self._on_applied,
            retry_max_seconds=self.list_retry_max_seconds,
        )

    async def _take_baseline(self) -> None:
        listed = await retry_until_done(
            lambda: handlers.take_baseline(lister=self.lister, series=self.series),
            what="list the exported kinds",
            cap=self.list_retry_max_seconds,
        )
        log.info("listed %d objects as the starting state", listed)
        self.listed = True
