"""Composition root of the identity service: real clients in production, anything alike in tests.

``dependencies`` builds the service's ``Deps`` once; unit tests call it with in-memory fakes
and drive the handlers through ``app.ROUTES``, integration tests run the real process.
"""

from __future__ import annotations

import asyncio
import logging

from services.identity import handlers
from services.identity.app import ROUTES
from services.identity.settings import IdentitySettings
from shared.bus import Bus
from shared.consumer import Consumer, Leases
from shared.locks import KeyedLocks
from shared.runtime import Infrastructure, run_consumer
from shared.status import StatusReporter

SERVICE = "identity"

log = logging.getLogger(__name__)


def dependencies(
    settings: IdentitySettings, *, bus: handlers.Prerequisites, kube: handlers.KubeApi
) -> handlers.Deps:
    tuning = settings.identity
    oidc, zenith = settings.azimuth.oidc_enabled, settings.azimuth.zenith_enabled
    if not (oidc or zenith):
        log.info("OIDC and Zenith are disabled (CAPIBUS_AZIMUTH__*): acking events, doing nothing")
    elif not oidc:
        log.info("OIDC is disabled: keeping Platforms for Zenith only, no OIDC clients")
    source = f"{SERVICE}/{settings.replica}"
    return handlers.Deps(
        kube=kube,
        prerequisites=bus,
        reporter=StatusReporter(bus, partitions=settings.partitions, source=source),
        config=handlers.Config(
            field_manager=tuning.field_manager,
            oidc_client_name_template=tuning.oidc_client_name_template,
            platform_name_template=tuning.platform_name_template,
            app_platform_name_template=tuning.app_platform_name_template,
            oidc_enabled=oidc,
        ),
        active=oidc or zenith,
        locks=KeyedLocks(),
    )


def build(
    settings: IdentitySettings, *, bus: Bus, leases: Leases, kube: handlers.KubeApi
) -> Consumer:
    deps = dependencies(settings, bus=bus, kube=kube)
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=settings.identity.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=kube,
    )


async def run(
    settings: IdentitySettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    def real(clients: Infrastructure) -> Consumer:
        leases = clients.leases(settings, service=SERVICE)
        return build(settings, bus=clients.bus, leases=leases, kube=clients.kube)

    await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
