"""The exporter's wiring against a fake event feed and a fake Kubernetes list (no network but
the loopback scrape of its /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

from services.exporter.app import Exporter, filters
from services.exporter.bootstrap import build
from services.exporter.settings import ExporterSettings
from shared import subjects
from shared.errors import KubeNotFound, KubeUnavailable
from shared.kube import ResourceKind
from shared.messages import ResourceChanged
from shared.metrics import REGISTRY, MetricsServer, register_families
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, HELM_RELEASE
from tests.unit.test_exporter_logic import (
    APP_OBJ,
    CLUSTER_OBJ,
    CLUSTER_TEMPLATE_OBJ,
    cluster,
    event,
)

Json = dict[str, Any]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


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


class FakeLister:
    """The API server's lists, by kind; ``failures`` lists fail first (temporarily)."""

    def __init__(self, lists: dict[ResourceKind, tuple[list[Json], str]], failures: int = 0):
        self.lists = lists
        self.failures = failures
        self.calls: list[ResourceKind] = []

    async def list(
        self, kind: ResourceKind, *, namespace: str | None = None
    ) -> tuple[list[Json], str]:
        self.calls.append(kind)
        if self.failures:
            self.failures -= 1
            raise KubeUnavailable("connection refused")
        if kind not in self.lists:
            raise KubeNotFound(f"{kind.plural}: the server could not find the requested resource")
        return self.lists[kind]


def empty_lists() -> FakeLister:
    return FakeLister({kind: ([], "0") for kind in (CLUSTER_TEMPLATE, CLUSTER, HELM_RELEASE)})


def samples(exporter: Exporter, name: str) -> list[tuple[dict[str, str], float]]:
    family = next(f for f in exporter.families() if f.name == name)
    return [(dict(labels), value) for labels, value in family.samples]


@contextlib.asynccontextmanager
async def running(exporter: Exporter) -> AsyncIterator[None]:
    """The exporter running and ready; stopped on the way out, whatever the test did."""
    stop = asyncio.Event()
    task = asyncio.create_task(exporter.run(stop))
    try:
        for _ in range(200):
            if exporter.ready():
                break
            await asyncio.sleep(0.01)
        assert exporter.ready()
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_lists_then_follows_the_four_kinds_and_is_ready_once_caught_up() -> None:
    feed = FakeFeed(event(CLUSTER, CLUSTER_OBJ))
    lister = empty_lists()
    exporter = build(ExporterSettings(), feed=feed, lister=lister)
    async with running(exporter):
        assert feed.asked == (subjects.EVENTS.name, filters())
        assert filters() == [
            "capibus.evt.clustertemplate.*.*.*",
            "capibus.evt.apptemplate.*.*.*",
            "capibus.evt.cluster.*.*.*",
            "capibus.evt.helmrelease.*.*.*",
        ]
        assert [
            labels["phase"] for labels, _ in samples(exporter, "azimuth_kube_cluster_phase")
        ] == ["Ready"]
    assert feed.closed


async def test_not_ready_before_the_list_and_the_first_read() -> None:
    exporter = build(ExporterSettings(), feed=FakeFeed(), lister=empty_lists())
    assert not exporter.ready()
    assert samples(exporter, "capibus_exporter_caught_up") == [({}, 0.0)]


async def test_a_restart_rebuilds_from_the_list_and_the_events_after_it() -> None:
    # The ClusterTemplate has been quiet for longer than the stream keeps events: only the
    # list knows it. The Cluster's replayed event is older than the list.
    app = {**APP_OBJ, "metadata": {**APP_OBJ["metadata"], "resourceVersion": "170"}}
    template = {**CLUSTER_TEMPLATE_OBJ, "metadata": {"name": "kube-1-31", "resourceVersion": "5"}}
    lister = FakeLister(
        {
            CLUSTER_TEMPLATE: ([template], "200"),
            CLUSTER: ([cluster("Ready", "150")], "200"),
            HELM_RELEASE: ([app], "200"),
        }
    )
    feed = FakeFeed(
        event(CLUSTER, cluster("Pending", "120"), "MODIFIED", "120"),
        event(HELM_RELEASE, app, "DELETED", "250"),
        event(CLUSTER, cluster("Pending", "260", "new"), "ADDED", "260"),
    )
    exporter = build(ExporterSettings(), feed=feed, lister=lister)
    async with running(exporter):
        phases = samples(exporter, "azimuth_kube_cluster_phase")
        assert sorted((labels["cluster_name"], labels["phase"]) for labels, _ in phases) == [
            ("demo", "Ready"),
            ("new", "Pending"),
        ]
        assert samples(exporter, "azimuth_kube_clustertemplate_deprecated") == [
            ({"template_name": "kube-1-31"}, 1.0)
        ]
        assert samples(exporter, "azimuth_kube_app_phase") == []
        # One list per kind (AppTemplates are not served by this fake), never again.
        for _ in range(3):
            exporter.families()
        assert len(lister.calls) == 4


async def test_a_failed_list_is_retried_and_a_kind_not_served_comes_from_events() -> None:
    lister = FakeLister({CLUSTER: ([], "10")}, failures=2)
    feed = FakeFeed(event(HELM_RELEASE, APP_OBJ, version="3"))
    settings = ExporterSettings(exporter={"list_retry_max_seconds": 0.01})
    exporter = build(settings, feed=feed, lister=lister)
    async with running(exporter):
        assert len(lister.calls) == 2 + 4
        assert len(samples(exporter, "azimuth_kube_app_phase")) == 1


async def test_freshness_of_the_exporters_own_view() -> None:
    now = [1000.0]
    published = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    change = event(CLUSTER, CLUSTER_OBJ, version="10").model_copy(update={"time": published})
    old = event(CLUSTER, cluster("Pending", "1"), "MODIFIED", "1")
    lister = FakeLister({CLUSTER: ([], "2")})
    exporter = Exporter(feed=FakeFeed(old, change), lister=lister, clock=lambda: now[0])
    applied = REGISTRY.get_sample_value("capibus_exporter_events_applied_total") or 0.0
    superseded = REGISTRY.get_sample_value("capibus_exporter_events_superseded_total") or 0.0
    async with running(exporter):
        assert samples(exporter, "capibus_exporter_caught_up") == [({}, 1.0)]
        assert samples(exporter, "capibus_exporter_last_event_timestamp_seconds") == [
            ({}, published.timestamp())
        ]
        assert REGISTRY.get_sample_value("capibus_exporter_events_applied_total") == applied + 1
        assert (
            REGISTRY.get_sample_value("capibus_exporter_events_superseded_total") == superseded + 1
        )
        # No word from the stream reader for longer than the window: behind, or cut off.
        now[0] += exporter.caught_up_window_seconds + 1
        assert samples(exporter, "capibus_exporter_caught_up") == [({}, 0.0)]
        assert exporter.ready()  # readiness is about the first read only


def test_the_window_must_span_a_quiet_read() -> None:
    with pytest.raises(ValueError, match="idle_seconds"):
        ExporterSettings(exporter={"idle_seconds": 5, "caught_up_window_seconds": 5})


async def test_metrics_over_http_parse_as_openmetrics() -> None:
    lister = FakeLister({CLUSTER_TEMPLATE: ([CLUSTER_TEMPLATE_OBJ], "9")})
    exporter = build(
        ExporterSettings(),
        feed=FakeFeed(event(CLUSTER, CLUSTER_OBJ), event(HELM_RELEASE, APP_OBJ)),
        lister=lister,
    )
    unregister = register_families(exporter.families)
    server = await MetricsServer(host="127.0.0.1", port=0, ready=exporter.ready).start()
    try:
        async with (
            running(exporter),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client,
        ):
            response = await client.get("/metrics", headers={"Accept": OPENMETRICS})
            ready = await client.get("/readyz")
    finally:
        await server.stop()
        unregister()

    assert ready.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in parse_om(response.text)}
    assert families["capibus_exporter_caught_up"].type == "gauge"
    assert families["capibus_exporter_caught_up"].samples[0].value == 1
    assert families["capibus_exporter_events_applied"].type == "counter"
    assert families["azimuth_kube_app"].type == "info"
    assert families["azimuth_kube_cluster_phase"].samples[0].labels["phase"] == "Ready"
    (deprecated,) = families["azimuth_kube_clustertemplate_deprecated"].samples
    assert deprecated.labels == {"template_name": "kube-1-31"}
