"""Composition root of discovery: concrete clients in production, anything alike in tests."""

from __future__ import annotations

import asyncio
import logging

from services.discovery import handlers
from services.discovery.app import ROUTES
from services.discovery.settings import DiscoverySettings
from services.discovery.tenant import TenantDeps, TenantWatch
from services.discovery.watches import Watches
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.kube import kubeconfig_client
from shared.runtime import Infrastructure, run_consumer
from shared.status import StatusReporter

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
    bus: ConsumerBus,
    leases: Leases,
    kube: handlers.ManagementApi,
    connect: handlers.Connect | None = None,
) -> Consumer:
    if not settings.azimuth.zenith_enabled:
        log.info("Zenith is disabled: discovery holds its partitions and does nothing")
        return Consumer(bus=bus, leases=leases, service=SERVICE, subscriptions=[])
    tuning = settings.discovery
    source = f"{SERVICE}/{settings.replica}"
    tenant = TenantDeps(
        kube=kube,
        reporter=StatusReporter(bus, partitions=settings.partitions, source=source),
        connect=connect or tenant_connector(settings),
        tuning=tuning,
    )
    watches = Watches(
        kube=kube,
        spawn=lambda target, kubeconfig: TenantWatch(target, kubeconfig, tenant).start(),
        partitions=settings.partitions,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(
            handlers.Deps(tracker=watches), coalesce_seconds=tuning.coalesce_seconds
        ),
        settings=settings.consumer.build(),
        objects=kube,
        claims=watches,
    )


async def run(
    settings: DiscoverySettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    def real(clients: Infrastructure) -> Consumer:
        leases = clients.leases(settings, service=SERVICE)
        return build(settings, bus=clients.bus, leases=leases, kube=clients.kube)

    await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
