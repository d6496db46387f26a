"""Composition root of the exporter: a bus connection, a Kubernetes client for the start-up
list, and the metrics endpoint.

The exporter holds no Redis client: it is not partitioned. Its Kubernetes client serves one
list per kind when the process starts (``app.Exporter``) and nothing after; everything later
comes from the events the watcher already published.

Run beside other services (``infra`` given), it uses their bus and Kubernetes client and the
process's one ``/metrics`` endpoint, whose ``/readyz`` then waits for the exporter too.
"""

from __future__ import annotations

import asyncio
import contextlib

from services.exporter.app import EventFeed, Exporter
from services.exporter.handlers import Lister
from services.exporter.settings import ExporterSettings
from shared.bus import Bus
from shared.metrics import register_families, serve_metrics
from shared.runtime import Infrastructure, kube_client

SERVICE = "exporter"


def build(settings: ExporterSettings, *, feed: EventFeed, lister: Lister) -> Exporter:
    tuning = settings.exporter
    return Exporter(
        feed=feed,
        lister=lister,
        batch=tuning.fetch_batch,
        idle_seconds=tuning.idle_seconds,
        list_retry_max_seconds=tuning.list_retry_max_seconds,
        caught_up_window_seconds=tuning.caught_up_window_seconds,
    )


async def run(
    settings: ExporterSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    async with contextlib.AsyncExitStack() as cleanup:
        if infra is None:
            exporter = await _standalone(settings, cleanup)
        else:
            exporter = build(settings, feed=infra.bus, lister=infra.kube)
            if infra.metrics is not None:
                infra.metrics.ready = exporter.ready
        cleanup.callback(register_families(exporter.families))
        await exporter.run(stop)


async def _standalone(settings: ExporterSettings, cleanup: contextlib.AsyncExitStack) -> Exporter:
    """The exporter with its own bus, Kubernetes client and endpoint, closed by ``cleanup``."""
    kube = kube_client(settings, service=SERVICE)
    cleanup.push_async_callback(kube.aclose)
    bus = await Bus.connect(
        settings.nats_url,
        name=f"{SERVICE}/{settings.replica}",
        login=settings.credentials.login(SERVICE, "nats"),
        tls=settings.tls.context(settings.nats_url),
    )
    cleanup.push_async_callback(bus.close)
    await bus.ensure_streams(settings.retention.build())
    exporter = build(settings, feed=bus, lister=kube)
    server = await serve_metrics(ready=exporter.ready)
    if server is not None:
        cleanup.push_async_callback(server.stop)
    return exporter
