"""The identity service's subscriptions: thin translators from messages to handlers.

- ``resources``: Cluster, OIDCClient and Platform events of the partition. All of them hash to
  the Cluster's partition (a Cluster's objects by their controller ownerReference, an app
  Platform by its ``addons.stackhpc.com/cluster`` label), so one replica sees them all; each
  message names the Cluster to converge. An app Platform (controlled by its HelmRelease) names
  its app instead. A Cluster that appears (``ADDED``) also has its apps looked at: an app made
  before its Cluster waited for it.
- ``kubeconfigs``: Secret events of the partition; only a Cluster's admin or user kubeconfig
  counts, told apart by name and label without an API call.
- ``apps``: addon HelmRelease events; only app releases (``apps.app_cluster``) count. The
  addon provider's ``addons.stackhpc.com/cluster`` label puts them in their Cluster's partition.
- ``realms``: Realm events. A Realm belongs to a namespace, not a Cluster, so it lands in a
  partition of its own; its handler only fans out ``ReconcileCluster`` nudges.
- ``reconciles``: those nudges (from any service), in the Clusters' partitions: the Cluster,
  its user kubeconfig and its apps are looked at again.

The switches decide what runs: OIDC on, everything; OIDC off but Zenith on, only the
Platforms (cluster and app); both off, nothing. The same consumers run and ack regardless, so
switching on later starts from current events rather than a backlog.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.identity import apps, handlers, kubeconfig, logic
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.locks import KeyedLocks
from shared.messages import Message, ReconcileCluster, ResourceChanged
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET


@dataclass(frozen=True)
class Deps:
    kube: handlers.KubeApi
    bus: handlers.Publisher
    config: handlers.Config
    #: Whether Platforms are kept at all (OIDC or Zenith on); ``config.oidc_enabled`` says
    #: whether the rest of identity is.
    active: bool
    locks: KeyedLocks
    coalesce_seconds: float = 0.05


class _Routes:
    """Each subscription's handler, translated to ``handlers`` calls (module docstring)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.oidc = deps.active and deps.config.oidc_enabled

    async def reconcile(self, namespace: str, name: str, cause: Message) -> None:
        d = self.deps
        await handlers.reconcile_cluster(
            namespace=namespace,
            name=name,
            cause=cause,
            kube=d.kube,
            bus=d.bus,
            locks=d.locks,
            config=d.config,
        )

    async def user_kubeconfigs(self, touched: list[tuple[str, str]]) -> None:
        d = self.deps
        for namespace, name in touched if self.oidc else []:
            await handlers.reconcile_user_kubeconfig(
                namespace=namespace, name=name, kube=d.kube, locks=d.locks, config=d.config
            )

    async def cluster_apps(self, namespace: str, name: str) -> None:
        d = self.deps
        await handlers.reconcile_cluster_apps(
            namespace=namespace, name=name, kube=d.kube, locks=d.locks, config=d.config
        )

    async def app_platforms(self, messages: tuple[ResourceChanged, ...]) -> None:
        d = self.deps
        for namespace, name in apps.releases_touched(messages) if d.active else []:
            await handlers.reconcile_app(
                namespace=namespace, name=name, kube=d.kube, locks=d.locks, config=d.config
            )

    async def on_resources(self, batch: Batch[ResourceChanged]) -> None:
        if self.deps.active:
            for namespace, name in logic.clusters_touched(batch.messages):
                await self.reconcile(namespace, name, batch.latest)
            for namespace, name in logic.clusters_appeared(batch.messages):
                await self.cluster_apps(namespace, name)
        await self.user_kubeconfigs(kubeconfig.clusters_touched(batch.messages))
        await self.app_platforms(batch.messages)

    async def on_secrets(self, batch: Batch[ResourceChanged]) -> None:
        await self.user_kubeconfigs(kubeconfig.clusters_touched(batch.messages))

    async def on_apps(self, batch: Batch[ResourceChanged]) -> None:
        await self.app_platforms(batch.messages)

    async def on_realm(self, batch: Batch[ResourceChanged]) -> None:
        d = self.deps
        if d.active:
            await handlers.nudge_realm_users(
                realm=batch.latest, kube=d.kube, bus=d.bus, config=d.config
            )

    async def on_nudge(self, batch: Batch[ReconcileCluster]) -> None:
        d, ref = self.deps, batch.latest.ref
        if not (d.active and ref.namespace):
            return
        await self.reconcile(ref.namespace, ref.name, batch.latest)
        await self.user_kubeconfigs([(ref.namespace, ref.name)])
        await self.cluster_apps(ref.namespace, ref.name)


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    routes = _Routes(deps)

    def on_events(
        name: str, kinds: list[str], handle: Callable[[Batch[ResourceChanged]], Awaitable[None]]
    ) -> Subscription[ResourceChanged]:
        return Subscription(
            name=name,
            stream=subjects.EVENTS,
            filters=lambda p: [subjects.resource_events_in_partition(k, p) for k in kinds],
            model=ResourceChanged,
            handle=handle,
            coalesce_seconds=deps.coalesce_seconds,
        )

    return [
        on_events(
            "resources", [CLUSTER.token, OIDC_CLIENT.token, PLATFORM.token], routes.on_resources
        ),
        on_events("kubeconfigs", [SECRET.token], routes.on_secrets),
        on_events("apps", [HELM_RELEASE.token], routes.on_apps),
        on_events("realms", [REALM.token], routes.on_realm),
        Subscription(
            name="reconciles",
            stream=subjects.LIFECYCLE,
            filters=lambda p: [subjects.reconciles_in_partition(p)],
            model=ReconcileCluster,
            handle=routes.on_nudge,
            coalesce_seconds=deps.coalesce_seconds,
        ),
    ]
