"""Composition root of the metal-stack provider: real clients in production, fakes in tests.

``dependencies`` builds the handlers' ``Deps`` (tests hand it a fake Kubernetes API, metal-api
and workload connector); ``build`` binds them into the consumer with the claim follower
``Claims``, which picks up, on every partition claimed, what a previous holder may have been
waiting for outside the Kubernetes API: machines waiting for their Node, firewalls not yet
running.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from services.baremetal.metalstack import logic
from services.baremetal.metalstack.app import ROUTES, SERVICE
from services.baremetal.metalstack.nodes import Connect, NodeWatches, WorkloadApi
from services.baremetal.metalstack.ports import Deps, KubeApi, partition
from services.baremetal.metalstack.rechecks import TimedRechecks
from services.baremetal.metalstack.settings import MetalStackSettings
from shared import subjects
from shared.claims import Claim
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.errors import KubeNotFound
from shared.kube import ResourceKind, kubeconfig_client
from shared.locks import KeyedLocks
from shared.messages import RecheckObject, stable_id
from shared.metalapi import MetalApi, MetalApiClient, MetalApiConfig
from shared.ports import Publisher
from shared.resources import METALSTACK_FIREWALL, METALSTACK_MACHINE, ref_to
from shared.runtime import Infrastructure, run_consumer
from shared.status import StatusReporter, story_of
from shared.timers import Timers

log = logging.getLogger(__name__)


def workload_connector(settings: MetalStackSettings) -> Connect:
    qps = settings.metalstack.workload_qps

    def connect(kubeconfig: str) -> WorkloadApi:
        return kubeconfig_client(
            kubeconfig, qps=qps, burst=max(1, int(qps * 2)), user_agent=f"capibus-{SERVICE}"
        )

    return connect


def metal_api(settings: MetalStackSettings) -> MetalApiClient:
    tuning = settings.metalstack
    return MetalApiClient(
        MetalApiConfig(
            url=tuning.url,
            hmac=tuning.hmac.get_secret_value() if tuning.hmac else None,
            token=tuning.token.get_secret_value() if tuning.token else None,
            timeout=tuning.request_timeout_seconds,
        )
    )


def dependencies(
    settings: MetalStackSettings,
    *,
    bus: Publisher,
    kube: KubeApi,
    metal: MetalApi,
    connect: Connect | None = None,
) -> Deps:
    tuning = settings.metalstack
    source = f"{SERVICE}/{settings.replica}"
    nodes = NodeWatches(
        connect=connect or workload_connector(settings),
        bus=bus,
        service=SERVICE,
        source=source,
        watch_seconds=tuning.node_watch_seconds,
    )
    rechecks = TimedRechecks(
        Timers(bus),
        service=SERVICE,
        source=source,
        base_seconds=tuning.firewall_recheck_seconds,
        max_seconds=tuning.firewall_recheck_max_seconds,
    )
    return Deps(
        kube=kube,
        metal=metal,
        reporter=StatusReporter(bus, partitions=settings.partitions, source=source),
        nodes=nodes,
        rechecks=rechecks,
        partitions=settings.partitions,
        locks=KeyedLocks(),
    )


class Claims:
    """On a claim: a ``RecheckObject`` for every machine and firewall of the partition that
    has its metal-api machine but is not ready yet; on a loss: their waits and timers go."""

    def __init__(self, deps: Deps, bus: Publisher) -> None:
        self.deps = deps
        self.bus = bus

    async def claimed(self, claim: Claim) -> None:
        for kind in (METALSTACK_MACHINE, METALSTACK_FIREWALL):
            try:
                items, _ = await claim.round.once(
                    kind.token, functools.partial(self.deps.kube.list, kind)
                )
            except KubeNotFound:
                continue  # the CRDs are not installed
            for obj in items:
                if self._waiting(obj) and partition(self.deps, kind, obj) == claim.partition:
                    await self._recheck(kind, obj, claim)

    async def lost(self, partitions: frozenset[int]) -> None:
        nodes, rechecks = self.deps.nodes, self.deps.rechecks
        self.deps.kubeconfigs.drop()
        if isinstance(nodes, NodeWatches):
            nodes.drop(partitions)
        if isinstance(rechecks, TimedRechecks):
            rechecks.timers.drop(partitions)

    @staticmethod
    def _waiting(obj: logic.Json) -> bool:
        return bool(
            logic.machine_id(logic.spec(obj).get("providerID"))
            and not logic.status(obj).get("ready")
            and not logic.deleting(obj)
        )

    async def _recheck(self, kind: ResourceKind, obj: logic.Json, claim: Claim) -> None:
        ref = ref_to(kind, obj)
        message = RecheckObject(
            id=stable_id("claimed", str(ref.uid), str(claim.token)),
            source=self.deps.reporter.source,
            correlation_id=story_of(ref),
            ref=ref,
            reason="Claimed",
        )
        subject = subjects.recheck(SERVICE, claim.partition, ref.namespace, ref.name)
        await self.bus.publish(subject, message)


def build(
    settings: MetalStackSettings, deps: Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=settings.metalstack.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=deps.kube,
        claims=Claims(deps, bus),
    )


async def run(
    settings: MetalStackSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    metal = metal_api(settings)
    built: list[Deps] = []

    def real(clients: Infrastructure) -> Consumer:
        deps = dependencies(settings, bus=clients.bus, kube=clients.kube, metal=metal)
        built.append(deps)
        return build(
            settings, deps, bus=clients.bus, leases=clients.leases(settings, service=SERVICE)
        )

    try:
        await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
    finally:
        for deps in built:
            if isinstance(deps.nodes, NodeWatches):
                await deps.nodes.close()
        await metal.aclose()
