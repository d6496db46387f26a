"""Composition root of the lease service: real clients in production, anything alike in tests.

Tests hand ``build`` in-memory fakes of the bus, the leases and the API server (unit) or the
real clients (integration) and drive the returned consumer's subscriptions.
"""

from __future__ import annotations

import asyncio

from services.lease import handlers
from services.lease.app import Deps, subscriptions
from services.lease.settings import LeaseSettings
from shared.bus import Bus
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.locks import KeyedLocks
from shared.runtime import Infrastructure, run_consumer

SERVICE = "lease"


def build(
    settings: LeaseSettings,
    *,
    bus: Bus,
    leases: PartitionLeases,
    kube: handlers.KubeApi,
) -> Consumer:
    deps = Deps(
        kube=kube,
        bus=bus,
        locks=KeyedLocks(),
        config=handlers.Config(
            source=f"{SERVICE}/{settings.replica}",
            partitions=settings.partitions,
            finalizer=settings.lease.finalizer,
        ),
        coalesce_seconds=settings.lease.coalesce_seconds,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(deps),
        settings=settings.consumer.build(),
        objects=kube,
    )


async def run(settings: LeaseSettings, stop: asyncio.Event) -> None:
    def real(infra: Infrastructure) -> Consumer:
        leases = infra.leases(settings, service=SERVICE)
        return build(settings, bus=infra.bus, leases=leases, kube=infra.kube)

    await run_consumer(settings, stop, service=SERVICE, build=real)
