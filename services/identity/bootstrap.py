"""Composition root of the identity service: real clients in production, anything alike in tests.

Tests hand ``build`` in-memory fakes of the bus, the leases and the API server (unit) or the
real clients (integration) and drive the returned consumer's subscriptions.
"""

from __future__ import annotations

import asyncio
import logging

from services.identity import handlers
from services.identity.app import Deps, subscriptions
from services.identity.settings import IdentitySettings
from shared.bus import Bus
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.locks import KeyedLocks
from shared.runtime import Infrastructure, run_consumer

SERVICE = "identity"

log = logging.getLogger(__name__)


def build(
    settings: IdentitySettings,
    *,
    bus: Bus,
    leases: PartitionLeases,
    kube: handlers.KubeApi,
) -> Consumer:
    tuning = settings.identity
    oidc, zenith = settings.azimuth.oidc_enabled, settings.azimuth.zenith_enabled
    if not (oidc or zenith):
        log.info("OIDC and Zenith are disabled (CAPIBUS_AZIMUTH__*): acking events, doing nothing")
    elif not oidc:
        log.info("OIDC is disabled: keeping Platforms for Zenith only, no OIDC clients")
    deps = Deps(
        kube=kube,
        bus=bus,
        config=handlers.Config(
            source=f"{SERVICE}/{settings.replica}",
            partitions=settings.partitions,
            field_manager=tuning.field_manager,
            oidc_client_name_template=tuning.oidc_client_name_template,
            platform_name_template=tuning.platform_name_template,
            app_platform_name_template=tuning.app_platform_name_template,
            oidc_enabled=oidc,
        ),
        active=oidc or zenith,
        locks=KeyedLocks(),
        coalesce_seconds=tuning.coalesce_seconds,
    )
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(deps),
        settings=settings.consumer.build(),
        objects=kube,
    )


async def run(settings: IdentitySettings, stop: asyncio.Event) -> None:
    def real(infra: Infrastructure) -> Consumer:
        leases = infra.leases(settings, service=SERVICE)
        return build(settings, bus=infra.bus, leases=leases, kube=infra.kube)

    await run_consumer(settings, stop, service=SERVICE, build=real)
