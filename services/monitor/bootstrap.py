"""Composition root of the monitor: concrete clients in production, anything alike in tests."""

from __future__ import annotations

import asyncio

from services.monitor import handlers
from services.monitor.app import Deps, ownership, subscriptions
from services.monitor.logic import ClusterViews
from services.monitor.settings import MonitorSettings
from shared.bus import Bus
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.runtime import Infrastructure, run_consumer

SERVICE = "monitor"


def build(
    settings: MonitorSettings,
    *,
    bus: Bus,
    leases: PartitionLeases,
    kube: handlers.ClusterApi,
    publisher: handlers.Publisher | None = None,
) -> Consumer:
    tuning = settings.monitor
    deps = Deps(
        kube=kube,
        bus=publisher or bus,
        views=ClusterViews(
            size=tuning.cache_size, ttl=tuning.view_seconds, replay=tuning.replay_seconds
        ),
        partitions=settings.partitions,
        source=f"{SERVICE}/{settings.replica}",
        coalesce_seconds=tuning.coalesce_seconds,
        oidc_enabled=settings.azimuth.oidc_enabled,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(deps),
        settings=settings.consumer.build(),
        objects=kube,
        on_ownership=ownership(deps) if tuning.resync else None,
    )


async def run(settings: MonitorSettings, stop: asyncio.Event) -> None:
    def real(infra: Infrastructure) -> Consumer:
        leases = infra.leases(settings, service=SERVICE)
        return build(settings, bus=infra.bus, leases=leases, kube=infra.kube)

    await run_consumer(settings, stop, service=SERVICE, build=real)
