"""Composition root of the catalog: real clients in production, anything alike in tests.

``dependencies`` builds the handlers' ``Deps`` once (tests hand it fakes and call the
handlers through ``ROUTES``); ``build`` binds them into the consumer, with ``SyncClaims`` as
the work that follows the partitions held.
"""

from __future__ import annotations

import asyncio

from services.catalog import handlers
from services.catalog.app import ROUTES, SyncClaims
from services.catalog.settings import CatalogSettings
from services.catalog.timers import SyncTimers
from shared.charts import ChartRepositories
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.ports import KubeReader, Publisher
from shared.runtime import Infrastructure, provided
from shared.status import StatusReporter
from shared.timers import Timers

SERVICE = ROUTES.service


def dependencies(
    settings: CatalogSettings,
    *,
    bus: Publisher,
    kube: KubeReader,
    charts: handlers.ChartSource,
    clock: handlers.Clock = handlers.utcnow,
) -> handlers.Deps:
    source = f"{SERVICE}/{settings.replica}"
    tuning = settings.catalog
    return handlers.Deps(
        kube=kube,
        charts=charts,
        timers=SyncTimers(Timers(bus, clock=clock), source=source, clock=clock),
        reporter=StatusReporter(bus, partitions=settings.partitions, source=source),
        config=handlers.Config(
            partitions=settings.partitions,
            retry_first_seconds=tuning.retry_unreachable_first_seconds,
            retry_max_seconds=tuning.retry_unreachable_seconds,
            max_status_schema_bytes=tuning.max_status_schema_bytes,
        ),
        clock=clock,
    )


def build(
    settings: CatalogSettings, deps: handlers.Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=settings.catalog.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=deps.kube,
        claims=SyncClaims(deps),
    )


async def run(
    settings: CatalogSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    async with provided(infra, settings, service=SERVICE) as clients:
        tuning = settings.catalog
        charts = ChartRepositories(
            timeout=tuning.http_timeout_seconds,
            max_index_bytes=tuning.max_index_bytes,
            max_chart_bytes=tuning.max_chart_bytes,
            max_schema_bytes=tuning.max_schema_bytes,
        )
        deps = dependencies(settings, bus=clients.bus, kube=clients.kube, charts=charts)
        try:
            leases = clients.leases(settings, service=SERVICE)
            await build(settings, deps, bus=clients.bus, leases=leases).run(stop)
        finally:
            deps.timers.cancel_all()
            await charts.aclose()
