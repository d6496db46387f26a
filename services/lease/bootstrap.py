"""Composition root of the lease service: real clients in production, anything alike in tests.

``dependencies`` builds the handlers' ``Deps`` once (tests hand it fakes and call the
handlers through ``ROUTES``); ``build`` binds them into the consumer.
"""

from __future__ import annotations

import asyncio

from services.lease import handlers
from services.lease.app import ROUTES
from services.lease.settings import LeaseSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.runtime import Infrastructure, run_consumer
from shared.status import StatusReporter

SERVICE = ROUTES.service


def dependencies(
    settings: LeaseSettings, *, bus: handlers.Bus, kube: handlers.KubeApi
) -> handlers.Deps:
    source = f"{SERVICE}/{settings.replica}"
    return handlers.Deps(
        kube=kube,
        bus=bus,
        reporter=StatusReporter(bus, partitions=settings.partitions, source=source),
        finalizer=settings.lease.finalizer,
    )


def build(
    settings: LeaseSettings, deps: handlers.Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=settings.lease.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=deps.kube,
    )


async def run(
    settings: LeaseSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    def real(clients: Infrastructure) -> Consumer:
        deps = dependencies(settings, bus=clients.bus, kube=clients.kube)
        leases = clients.leases(settings, service=SERVICE)
        return build(settings, deps, bus=clients.bus, leases=leases)

    await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
