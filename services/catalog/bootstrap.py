"""Composition root of the catalog: real clients in production, anything alike in tests.

Tests hand ``build`` in-memory fakes (unit) or the real clients (integration) and drive the
returned consumer's subscriptions and ``on_ownership`` listener.
"""

from __future__ import annotations

import asyncio

from services.catalog import handlers
from services.catalog.app import OwnershipFollower, subscriptions
from services.catalog.settings import CatalogSettings
from services.catalog.timers import SyncTimers
from shared.bus import Bus
from shared.charts import ChartRepositories
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.locks import KeyedLocks
from shared.runtime import Infrastructure

SERVICE = "catalog"


def build(
    settings: CatalogSettings,
    *,
    bus: Bus,
    leases: PartitionLeases,
    kube: handlers.TemplateApi,
    charts: handlers.ChartSource,
    timers: SyncTimers | None = None,
    clock: handlers.Clock = handlers.utcnow,
) -> Consumer:
    source = f"{SERVICE}/{settings.replica}"
    timers = timers or SyncTimers(publish=bus.publish, source=source, clock=clock)
    tuning = settings.catalog
    deps = handlers.Deps(
        kube=kube,
        charts=charts,
        timers=timers,
        locks=KeyedLocks(),
        config=handlers.Config(
            partitions=settings.partitions,
            retry_first_seconds=tuning.retry_unreachable_first_seconds,
            retry_max_seconds=tuning.retry_unreachable_seconds,
            max_status_schema_bytes=tuning.max_status_schema_bytes,
        ),
        clock=clock,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(deps, coalesce_seconds=tuning.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=kube,
        on_ownership=OwnershipFollower(deps, timers, retry_max=tuning.rearm_retry_max_seconds),
    )


async def run(settings: CatalogSettings, stop: asyncio.Event) -> None:
    infra = await Infrastructure.connect(settings, service=SERVICE)
    tuning = settings.catalog
    charts = ChartRepositories(
        timeout=tuning.http_timeout_seconds,
        max_index_bytes=tuning.max_index_bytes,
        max_chart_bytes=tuning.max_chart_bytes,
        max_schema_bytes=tuning.max_schema_bytes,
    )
    timers = SyncTimers(publish=infra.bus.publish, source=f"{SERVICE}/{settings.replica}")
    try:
        consumer = build(
            settings,
            bus=infra.bus,
            leases=infra.leases(settings, service=SERVICE),
            kube=infra.kube,
            charts=charts,
            timers=timers,
        )
        await consumer.run(stop)
    finally:
        timers.cancel_all()
        await charts.aclose()
        await infra.aclose()
