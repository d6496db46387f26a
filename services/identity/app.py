"""The identity service's subscriptions: thin translators from messages to handlers.

- ``resources``: Cluster, OIDCClient and Platform events of the partition. The last two hash
  to their Cluster's partition through the controller ownerReference, so one replica sees all
  three; each message names the Cluster to converge.
- ``realms``: Realm events. A Realm belongs to a namespace, not a Cluster, so it lands in a
  partition of its own; its handler only fans out ``ReconcileCluster`` nudges.
- ``reconciles``: those nudges (from any service), in the Clusters' partitions.

With OIDC disabled the same consumers run and ack without acting, so switching it on later
starts from current events rather than a backlog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.identity import handlers, logic
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.locks import KeyedLocks
from shared.messages import Message, ReconcileCluster, ResourceChanged
from shared.resources import CLUSTER, OIDC_CLIENT, PLATFORM, REALM


@dataclass(frozen=True)
class Deps:
    kube: handlers.KubeApi
    bus: handlers.Publisher
    config: handlers.Config
    enabled: bool
    locks: KeyedLocks
    coalesce_seconds: float = 0.05


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def reconcile(namespace: str, name: str, cause: Message) -> None:
        await handlers.reconcile_cluster(
            namespace=namespace,
            name=name,
            cause=cause,
            kube=deps.kube,
            bus=deps.bus,
            locks=deps.locks,
            config=deps.config,
        )

    async def on_resources(batch: Batch[ResourceChanged]) -> None:
        if deps.enabled:
            for namespace, name in logic.clusters_touched(batch.messages):
                await reconcile(namespace, name, batch.latest)

    async def on_realm(batch: Batch[ResourceChanged]) -> None:
        if deps.enabled:
            await handlers.nudge_realm_users(
                realm=batch.latest, kube=deps.kube, bus=deps.bus, config=deps.config
            )

    async def on_nudge(batch: Batch[ReconcileCluster]) -> None:
        ref = batch.latest.ref
        if deps.enabled and ref.namespace:
            await reconcile(ref.namespace, ref.name, batch.latest)

    def events(*kinds: str) -> Callable[[int], list[str]]:
        return lambda p: [subjects.resource_events_in_partition(k, p) for k in kinds]

    return [
        Subscription(
            name="resources",
            stream=subjects.EVENTS,
            filters=events(CLUSTER.token, OIDC_CLIENT.token, PLATFORM.token),
            model=ResourceChanged,
            handle=on_resources,
            coalesce_seconds=deps.coalesce_seconds,
        ),
        Subscription(
            name="realms",
            stream=subjects.EVENTS,
            filters=events(REALM.token),
            model=ResourceChanged,
            handle=on_realm,
            coalesce_seconds=deps.coalesce_seconds,
        ),
        Subscription(
            name="reconciles",
            stream=subjects.LIFECYCLE,
            filters=lambda p: [subjects.reconciles_in_partition(p)],
            model=ReconcileCluster,
            handle=on_nudge,
            coalesce_seconds=deps.coalesce_seconds,
        ),
    ]
