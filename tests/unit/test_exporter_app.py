"""The exporter's wiring against a fake event feed (no network)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from services.exporter.app import filters
from services.exporter.bootstrap import build
from services.exporter.settings import ExporterSettings
from shared import subjects
from shared.messages import ResourceChanged
from shared.resources import CLUSTER
from tests.unit.test_exporter_logic import CLUSTER_OBJ, event


class FakeFeed:
    """Yields the given events, reports caught up, then waits like a quiet stream."""

    def __init__(self, *events: ResourceChanged) -> None:
        self.events = events
        self.asked: tuple[str, list[str]] | None = None
        self.closed = False

    async def follow(
        self,
        stream: str,
        filter_subjects: Sequence[str],
        model: type[ResourceChanged],
        *,
        caught_up: Callable[[], None] = lambda: None,
        batch: int = 500,
        idle_seconds: float = 5.0,
    ) -> AsyncIterator[ResourceChanged]:
        self.asked = (stream, list(filter_subjects))
        try:
            for change in self.events:
                yield change
            caught_up()
            await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_follows_the_four_kinds_and_is_ready_once_caught_up() -> None:
    feed = FakeFeed(event(CLUSTER, CLUSTER_OBJ))
    exporter = build(ExporterSettings(), feed=feed)
    stop = asyncio.Event()
    task = asyncio.create_task(exporter.run(stop))
    for _ in range(100):
        if exporter.ready():
            break
        await asyncio.sleep(0.01)
    assert exporter.ready()
    assert feed.asked == (subjects.EVENTS.name, filters())
    assert filters() == [
        "capibus.evt.clustertemplate.*.*.*",
        "capibus.evt.apptemplate.*.*.*",
        "capibus.evt.cluster.*.*.*",
        "capibus.evt.helmrelease.*.*.*",
    ]
    phases = next(f for f in exporter.families() if f.name == "azimuth_kube_cluster_phase")
    assert [labels["phase"] for labels, _ in phases.samples] == ["Ready"]
    stop.set()
    await asyncio.wait_for(task, 5)
    assert feed.closed


async def test_not_ready_before_the_first_read_completes() -> None:
    exporter = build(ExporterSettings(), feed=FakeFeed())
    assert not exporter.ready()
