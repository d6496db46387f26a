"""Composition root of the writer: concrete clients in production, anything alike in tests."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from services.writer import handlers
from services.writer.app import Deps, ownership, subscriptions
from services.writer.deadlines import DeadlineTimers
from services.writer.logic import StatusCache
from services.writer.settings import WriterSettings
from shared import phase
from shared.bus import Bus
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.resources import CLUSTER
from shared.runtime import Infrastructure

SERVICE = "writer"


def build(
    settings: WriterSettings,
    *,
    bus: Bus,
    leases: PartitionLeases,
    kube: handlers.StatusApi,
    journal: handlers.Journal | None = None,
    deadlines: handlers.Deadlines | None = None,
) -> Consumer:
    timeout = settings.writer.cluster_timeout_seconds

    def derive(
        status: dict[str, Any], lease_name: str | None, deleting: bool, now: datetime
    ) -> dict[str, Any]:
        return phase.derive(
            status, lease_name=lease_name, now=now, timeout_seconds=timeout, deleting=deleting
        )

    deps = Deps(
        kube=kube,
        derive=derive,
        deadlines=deadlines,
        journal=journal or bus,
        cache=StatusCache(settings.writer.cache_size),
        writer=settings.replica,
        conflict_retries=settings.writer.conflict_retries,
        coalesce_seconds=settings.writer.coalesce_seconds,
        partitions=settings.partitions,
        retry_base=settings.consumer.backoff_base,
        retry_max=settings.consumer.backoff_max,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(deps),
        settings=settings.consumer.build(),
        on_ownership=ownership(deps),
    )


async def run(settings: WriterSettings, stop: asyncio.Event) -> None:
    infra = await Infrastructure.connect(settings, service=SERVICE)
    deadlines = DeadlineTimers(
        publish=infra.bus.publish,
        timeout_seconds=settings.writer.cluster_timeout_seconds,
        partitions=settings.partitions,
        source=f"{SERVICE}/{settings.replica}",
    )
    try:
        clusters, _ = await infra.kube.list(CLUSTER)
        deadlines.arm_existing(clusters)
        consumer = build(
            settings,
            bus=infra.bus,
            leases=infra.leases(settings, service=SERVICE),
            kube=infra.kube,
            deadlines=deadlines,
        )
        await consumer.run(stop)
    finally:
        deadlines.cancel_all()
        await infra.aclose()
