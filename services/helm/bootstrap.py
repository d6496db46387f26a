"""Composition root of the helm service: real helm, kube, bus and registrar, or fakes.

``dependencies`` builds the handlers' ``Deps`` once (unit tests hand it fakes and call the
handlers with it); ``build`` binds them into the consumer through ``ROUTES``, with
``DeadlineClaims`` as the work that follows the partitions held.
"""

from __future__ import annotations

import asyncio

from services.helm import logic
from services.helm.app import ROUTES, DeadlineClaims
from services.helm.ports import Bus, Deps, HelmDriver, Kube, Registrar
from services.helm.settings import HelmSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.helm import Helm
from shared.runtime import Infrastructure, provided
from shared.status import StatusReporter
from shared.timers import Timers
from shared.zenith import Registrar as ZenithRegistrar

SERVICE = ROUTES.service


def dependencies(
    settings: HelmSettings,
    *,
    kube: Kube,
    helm: HelmDriver,
    bus: Bus,
    registrar: Registrar | None = None,
) -> Deps:
    return Deps(
        kube=kube,
        helm=helm,
        bus=bus,
        reporter=StatusReporter(
            bus, partitions=settings.partitions, source=f"{SERVICE}/{settings.replica}"
        ),
        timers=Timers(bus),
        tuning=settings.helm,
        chart=logic.chart_ref(settings.helm.chart),
        partitions=settings.partitions,
        oidc_enabled=settings.azimuth.oidc_enabled,
        registrar=registrar if settings.azimuth.zenith_enabled else None,
    )


def build(settings: HelmSettings, deps: Deps, *, bus: ConsumerBus, leases: Leases) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=settings.helm.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=deps.kube,
        claims=DeadlineClaims(deps),
    )


def helm_driver(settings: HelmSettings) -> Helm:
    tuning = settings.helm
    return Helm(
        executable=tuning.executable,
        kubeconfig=settings.kubeconfig,
        history_max=tuning.history_max,
        timeout=tuning.timeout,
        max_concurrent=tuning.max_concurrent,
    )


async def run(
    settings: HelmSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    async with provided(infra, settings, service=SERVICE) as clients:
        zenith = settings.helm.zenith
        registrar = (
            ZenithRegistrar(zenith.admin_url, timeout=zenith.timeout_seconds)
            if zenith.configured
            else None
        )
        deps = dependencies(
            settings,
            kube=clients.kube,
            helm=helm_driver(settings),
            bus=clients.bus,
            registrar=registrar,
        )
        try:
            leases = clients.leases(settings, service=SERVICE)
            await build(settings, deps, bus=clients.bus, leases=leases).run(stop)
        finally:
            deps.timers.cancel_all()
            if registrar is not None:
                await registrar.aclose()
