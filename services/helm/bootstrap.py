"""Composition root of the helm service: real helm, kube, bus and registrar, or fakes."""

from __future__ import annotations

import asyncio
import logging

from services.helm import handlers, logic
from services.helm.app import subscriptions
from services.helm.handlers import Context
from services.helm.ports import Bus, HelmDriver, Kube, Registrar
from services.helm.settings import HelmSettings
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.helm import Helm
from shared.runtime import Infrastructure
from shared.zenith import Registrar as ZenithRegistrar

SERVICE = "helm"
log = logging.getLogger(__name__)


def context(
    settings: HelmSettings,
    *,
    kube: Kube,
    helm: HelmDriver,
    bus: Bus,
    registrar: Registrar | None = None,
) -> Context:
    return Context(
        kube=kube,
        helm=helm,
        bus=bus,
        tuning=settings.helm,
        chart=logic.chart_ref(settings.helm.chart),
        source=f"{SERVICE}/{settings.replica}",
        partitions=settings.partitions,
        oidc_enabled=settings.azimuth.oidc_enabled,
        registrar=registrar if settings.azimuth.zenith_enabled else None,
    )


def build(settings: HelmSettings, *, bus: Bus, leases: PartitionLeases, ctx: Context) -> Consumer:
    return Consumer(
        bus=bus,  # type: ignore[arg-type]
        leases=leases,
        service=SERVICE,
        subscriptions=subscriptions(ctx),
        settings=settings.consumer.build(),
        objects=ctx.kube,
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


async def run(settings: HelmSettings, stop: asyncio.Event) -> None:
    infra = await Infrastructure.connect(settings, service=SERVICE)
    zenith = settings.helm.zenith
    registrar = (
        ZenithRegistrar(zenith.admin_url, timeout=zenith.timeout_seconds)
        if zenith.configured
        else None
    )
    try:
        ctx = context(
            settings,
            kube=infra.kube,
            helm=helm_driver(settings),
            bus=infra.bus,
            registrar=registrar,
        )
        await handlers.arm_pending_deadlines(ctx)
        consumer = build(
            settings, bus=infra.bus, leases=infra.leases(settings, service=SERVICE), ctx=ctx
        )
        await consumer.run(stop)
    finally:
        if registrar is not None:
            await registrar.aclose()
        await infra.aclose()
