"""Composition root of the bootstrap provider: real clients in production, fakes in tests.

``dependencies`` builds the handlers' ``Deps`` (tests hand it a fake Kubernetes API and bus);
``build`` binds them into the consumer. Every wait of a config or an Agent is an event kept in
the stream, so a replica that takes a partition over finds the events it must act on waiting
for it; the one claim follower (``shared.seen.Forgetting``) only makes the replica forget
what it remembered when partitions move.
"""

from __future__ import annotations

import asyncio

from services.baremetal.assisted_bootstrap.app import ROUTES, SERVICE
from services.baremetal.assisted_bootstrap.ports import Deps, ImageService, KubeApi
from services.baremetal.assisted_bootstrap.settings import AssistedBootstrapSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.locks import KeyedLocks
from shared.ports import Publisher
from shared.runtime import Infrastructure, run_consumer
from shared.seen import Forgetting
from shared.status import StatusReporter


def dependencies(settings: AssistedBootstrapSettings, *, bus: Publisher, kube: KubeApi) -> Deps:
    tuning = settings.assistedbootstrap
    return Deps(
        kube=kube,
        reporter=StatusReporter(
            bus, partitions=settings.partitions, source=f"{SERVICE}/{settings.replica}"
        ),
        locks=KeyedLocks(),
        images=ImageService(
            internal=bool(tuning.use_internal_image_url),
            name=tuning.image_service_name,
            namespace=tuning.image_service_namespace,
        ),
    )


def build(
    settings: AssistedBootstrapSettings, deps: Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(
            deps, coalesce_seconds=settings.assistedbootstrap.coalesce_seconds
        ),
        settings=settings.consumer.build(),
        objects=deps.kube,
        claims=Forgetting(deps.seen),
    )


async def run(
    settings: AssistedBootstrapSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    def real(clients: Infrastructure) -> Consumer:
        deps = dependencies(settings, bus=clients.bus, kube=clients.kube)
        return build(
            settings, deps, bus=clients.bus, leases=clients.leases(settings, service=SERVICE)
        )

    await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
