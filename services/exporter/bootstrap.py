"""Composition root of the exporter: a bus connection and the metrics endpoint, nothing else.

The exporter holds no Kubernetes client and no Redis client on purpose: everything it exports
comes from the events the watcher already published.
"""

from __future__ import annotations

import asyncio

from services.exporter.app import EventFeed, Exporter
from services.exporter.settings import ExporterSettings
from shared.bus import Bus
from shared.metrics import register_families, serve_metrics

SERVICE = "exporter"


def build(settings: ExporterSettings, *, feed: EventFeed) -> Exporter:
    return Exporter(
        feed=feed,
        batch=settings.exporter.fetch_batch,
        idle_seconds=settings.exporter.idle_seconds,
    )


async def run(settings: ExporterSettings, stop: asyncio.Event) -> None:
    bus = await Bus.connect(settings.nats_url, name=f"{SERVICE}/{settings.replica}")
    try:
        await bus.ensure_streams(settings.retention.build())
        exporter = build(settings, feed=bus)
        unregister = register_families(exporter.families)
        server = await serve_metrics(ready=exporter.ready)
        try:
            await exporter.run(stop)
        finally:
            if server is not None:
                await server.stop()
            unregister()
    finally:
        await bus.close()
