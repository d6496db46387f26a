"""Composition root of the control-plane provider: real clients in production, fakes in tests.

``dependencies`` builds the handlers' ``Deps`` (tests hand it a fake Kubernetes API and bus,
and may fix how replica names are drawn); ``build`` binds them into the consumer. Every wait of
this provider ends with an event of the management cluster, so nothing has to be picked up
when a partition is claimed; the one claim follower (``shared.seen.Forgetting``) only makes
the replica forget what it remembered when partitions move.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.baremetal.assisted_controlplane import logic
from services.baremetal.assisted_controlplane.app import ROUTES, SERVICE
from services.baremetal.assisted_controlplane.ports import Deps, Json, KubeApi
from services.baremetal.assisted_controlplane.settings import AssistedControlPlaneSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.locks import KeyedLocks
from shared.ports import Publisher
from shared.runtime import Infrastructure, run_consumer
from shared.seen import Forgetting
from shared.status import StatusReporter


def dependencies(
    settings: AssistedControlPlaneSettings,
    *,
    bus: Publisher,
    kube: KubeApi,
    names: Callable[[Json], str] | None = None,
) -> Deps:
    source = f"{SERVICE}/{settings.replica}"
    return Deps(
        kube=kube,
        reporter=StatusReporter(bus, partitions=settings.partitions, source=source),
        partitions=settings.partitions,
        locks=KeyedLocks(),
        names=names or logic.new_name,
    )


def build(
    settings: AssistedControlPlaneSettings, deps: Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(
            deps, coalesce_seconds=settings.assistedcontrolplane.coalesce_seconds
        ),
        settings=settings.consumer.build(),
        objects=deps.kube,
        claims=Forgetting(deps.seen),
    )


async def run(
    settings: AssistedControlPlaneSettings,
    stop: asyncio.Event,
    *,
    infra: Infrastructure | None = None,
) -> None:
    def real(clients: Infrastructure) -> Consumer:
        deps = dependencies(settings, bus=clients.bus, kube=clients.kube)
        return build(
            settings, deps, bus=clients.bus, leases=clients.leases(settings, service=SERVICE)
        )

    await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
