"""The exporter's wiring: one follow of the EVENTS stream feeding ``Series``.

Every replica follows every event of the four kinds (the exporter is not partitioned: a
scrape must see all objects), starting from the newest event of each object, so a start
costs one read of the stream and no Kubernetes list. ``ready`` turns true once that first
read is complete; until then ``/readyz`` answers 503 and a scrape would show a partial view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.exporter import handlers
from services.exporter.logic import KINDS, Series
from shared import subjects
from shared.messages import ResourceChanged
from shared.metrics import Family

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
    batch: int = 500
    idle_seconds: float = 5.0
    series: Series = field(default_factory=Series)
    caught_up: bool = False

    def families(self) -> list[Family]:
        return self.series.families()

    def ready(self) -> bool:
        return self.caught_up

    def _on_caught_up(self) -> None:
        if not self.caught_up:
            log.info("caught up with the event stream: %d objects exported", len(self.series))
        self.caught_up = True

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the events until ``stop``; an unexpected failure of the follow propagates."""
        events = self.feed.follow(
            subjects.EVENTS.name,
            filters(),
            ResourceChanged,
            caught_up=self._on_caught_up,
            batch=self.batch,
            idle_seconds=self.idle_seconds,
        )
        following = asyncio.create_task(handlers.keep_current(events=events, series=self.series))
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({following, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
