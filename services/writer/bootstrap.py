"""Composition root of the writer: concrete clients in production, anything alike in tests."""

from __future__ import annotations

import asyncio

from services.writer import handlers
from services.writer.app import ROUTES, Seeding
from services.writer.deadlines import DeadlineTimers
from services.writer.logic import StatusCache
from services.writer.rules import rules
from services.writer.settings import WriterSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.ports import Publisher
from shared.runtime import Infrastructure, provided
from shared.status import StatusReporter
from shared.timers import Timers

SERVICE = "writer"


def build(
    settings: WriterSettings,
    *,
    bus: ConsumerBus,
    leases: Leases,
    kube: handlers.StatusApi,
    journal: Publisher | None = None,
    timers: Timers | None = None,
) -> Consumer:
    tuning = settings.writer
    deadlines = None
    if timers is not None:
        source = f"{SERVICE}/{settings.replica}"
        reporter = StatusReporter(bus, partitions=settings.partitions, source=source)
        deadlines = DeadlineTimers(timers=timers, reporter=reporter)
    deps = handlers.Deps(
        kube=kube,
        journal=journal or bus,
        cache=StatusCache(tuning.cache_size),
        rules=rules(cluster_timeout_seconds=tuning.cluster_timeout_seconds),
        writer=settings.replica,
        deadlines=deadlines,
        conflict_retries=tuning.conflict_retries,
        partitions=settings.partitions,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=tuning.coalesce_seconds),
        settings=settings.consumer.build(),
        claims=Seeding(deps, timers),
    )


async def run(
    settings: WriterSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    async with provided(infra, settings, service=SERVICE) as clients:
        timers = Timers(clients.bus, retry_max=settings.consumer.backoff_max)
        try:
            consumer = build(
                settings,
                bus=clients.bus,
                leases=clients.leases(settings, service=SERVICE),
                kube=clients.kube,
                timers=timers,
            )
            await consumer.run(stop)
        finally:
            timers.cancel_all()
