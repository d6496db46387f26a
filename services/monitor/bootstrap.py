"""Composition root of the monitor: concrete clients in production, anything alike in tests.

``dependencies`` builds the handlers' ``Deps`` once (tests hand it fakes and call the
handlers through ``ROUTES``); ``build`` binds them into the consumer, with ``Resyncs`` as the
work that follows the partitions held unless ``tuning.resync`` switches it off.
"""

from __future__ import annotations

import asyncio

from services.monitor import handlers
from services.monitor.app import ROUTES, Resyncs
from services.monitor.logic import ClusterViews
from services.monitor.settings import MonitorSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.freshness import Versions
from shared.ports import Publisher
from shared.runtime import Infrastructure, run_consumer
from shared.status import StatusReporter

SERVICE = ROUTES.service


def dependencies(
    settings: MonitorSettings, *, bus: Publisher, kube: handlers.ClusterApi
) -> handlers.Deps:
    tuning = settings.monitor
    return handlers.Deps(
        kube=kube,
        reporter=StatusReporter(
            bus, partitions=settings.partitions, source=f"{SERVICE}/{settings.replica}"
        ),
        views=ClusterViews(
            size=tuning.cache_size, ttl=tuning.view_seconds, replay=tuning.replay_seconds
        ),
        oidc_enabled=settings.azimuth.oidc_enabled,
        versions=Versions(size=tuning.versions_size),
    )


def build(
    settings: MonitorSettings, deps: handlers.Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    tuning = settings.monitor
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=tuning.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=deps.kube,
        claims=Resyncs(deps) if tuning.resync else None,
    )


async def run(
    settings: MonitorSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    def real(clients: Infrastructure) -> Consumer:
        deps = dependencies(settings, bus=clients.bus, kube=clients.kube)
        leases = clients.leases(settings, service=SERVICE)
        return build(settings, deps, bus=clients.bus, leases=leases)

    await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
