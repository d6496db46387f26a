"""Composition root of discovery: concrete clients in production, anything alike in tests."""

from __future__ import annotations

import asyncio
import logging

from services.discovery import handlers
from services.discovery.app import Deps, subscriptions
from services.discovery.settings import DiscoverySettings
from services.discovery.tenant import TenantDeps, TenantWatch
from services.discovery.watches import Watches
from shared.bus import Bus
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.kube import kubeconfig_client
from shared.runtime import Infrastructure, run_consumer

SERVICE = "discovery"

log = logging.getLogger(__name__)


def tenant_connector(settings: DiscoverySettings) -> handlers.Connect:
    qps = settings.discovery.tenant_qps

    def connect(kubeconfig: str) -> handlers.TenantApi:
        return kubeconfig_client(
            kubeconfig, qps=qps, burst=max(1, int(qps * 2)), user_agent=f"capibus-{SERVICE}"
        )

    return connect


def build(
    settings: DiscoverySettings,
    *,
    bus: Bus,
    leases: PartitionLeases,
    kube: handlers.ManagementApi,
    connect: handlers.Connect | None = None,
    publisher: handlers.Publisher | None = None,
) -> Consumer:
    if not settings.azimuth.zenith_enabled:
        log.info("Zenith is disabled: discovery holds its partitions and does nothing")
        return Consumer(bus=bus, leases=leases, service=SERVICE, subscriptions=[])
    tuning = settings.discovery
    tenant = TenantDeps(
        kube=kube,
        bus=publisher or bus,
        connect=connect or tenant_connector(settings),
        tuning=tuning,
        partitions=settings.partitions,
        source=f"{SERVICE}/{settings.replica}",
    )
    watches = Watches(
        kube=kube,
        spawn=lambda target, kubeconfig: TenantWatch(target, kubeconfig, tenant).start(),
        partitions=settings.partitions,
        retry_max_seconds=tuning.retry_max_seconds,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(Deps(tracker=watches)),
        settings=settings.consumer.build(),
        objects=kube,
        on_ownership=watches.follow_ownership,
    )


async def run(settings: DiscoverySettings, stop: asyncio.Event) -> None:
    def real(infra: Infrastructure) -> Consumer:
        leases = infra.leases(settings, service=SERVICE)
        return build(settings, bus=infra.bus, leases=leases, kube=infra.kube)

    await run_consumer(settings, stop, service=SERVICE, build=real)
