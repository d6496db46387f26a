"""The lease service's subscriptions: thin translators from messages to handlers.

- ``cluster``: Azimuth Cluster events; the Cluster is the one to converge.
- ``lease``: Lease events. An owned Lease hashes to its Cluster's partition through the
  ownerReference the portal sets; an ownerless one only nudges the Clusters naming it.
- ``capicluster``: Cluster API cluster events (same namespace and name as the Azimuth
  Cluster, so the same partition); its deletion is what a Lease release waits for.
- ``reconcile``: ``ReconcileCluster`` nudges from any service, in the Clusters' partitions.

Each runs one handler at a time per object; ``KeyedLocks`` in the handlers makes that one at
a time per Cluster across all four.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.lease import handlers
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import ReconcileCluster, ResourceChanged
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE


@dataclass(frozen=True)
class Deps:
    kube: handlers.KubeApi
    bus: handlers.Publisher
    locks: KeyedLocks
    config: handlers.Config
    coalesce_seconds: float = 0.05


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def on_cluster(batch: Batch[ResourceChanged]) -> None:
        await handlers.on_cluster_event(
            event=batch.latest, kube=deps.kube, bus=deps.bus, locks=deps.locks, config=deps.config
        )

    async def on_lease(batch: Batch[ResourceChanged]) -> None:
        await handlers.on_lease_event(
            event=batch.latest, kube=deps.kube, bus=deps.bus, locks=deps.locks, config=deps.config
        )

    async def on_capi_cluster(batch: Batch[ResourceChanged]) -> None:
        await handlers.on_capi_cluster_event(
            event=batch.latest, kube=deps.kube, bus=deps.bus, locks=deps.locks, config=deps.config
        )

    async def on_nudge(batch: Batch[ReconcileCluster]) -> None:
        await handlers.on_reconcile(
            command=batch.latest, kube=deps.kube, bus=deps.bus, locks=deps.locks, config=deps.config
        )

    def events(
        kind: ResourceKind, handle: Callable[[Batch[ResourceChanged]], Awaitable[None]]
    ) -> Subscription[ResourceChanged]:
        return Subscription(
            name=kind.token,
            stream=subjects.EVENTS,
            filters=lambda p: [subjects.resource_events_in_partition(kind.token, p)],
            model=ResourceChanged,
            handle=handle,
            coalesce_seconds=deps.coalesce_seconds,
        )

    return [
        events(CLUSTER, on_cluster),
        events(LEASE, on_lease),
        events(CAPI_CLUSTER, on_capi_cluster),
        Subscription(
            name="reconcile",
            stream=subjects.LIFECYCLE,
            filters=lambda p: [subjects.reconciles_in_partition(p)],
            model=ReconcileCluster,
            handle=on_nudge,
            coalesce_seconds=deps.coalesce_seconds,
        ),
    ]
