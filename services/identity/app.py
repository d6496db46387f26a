"""The identity service's subscriptions, and the two that dispatch to several handlers.

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
  partition of its own; its handler only nudges the Clusters that use it.
- ``reconciles``: those nudges (from any service), in the Clusters' partitions: the Cluster,
  its user kubeconfig and its apps are looked at again.

The switches decide what runs (``handlers.Deps.active`` and ``oidc``): OIDC on, everything;
OIDC off but Zenith on, only the Platforms (cluster and app); both off, nothing. The same
consumers run and ack regardless, so switching on later starts from current events rather
than a backlog.
"""

from __future__ import annotations

from services.identity import handlers, logic
from services.identity.handlers import Deps
from shared import subjects
from shared.consumer import Batch
from shared.messages import ReconcileCluster, ResourceChanged
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET
from shared.wiring import Routes, events, messages


async def on_resources(batch: Batch[ResourceChanged], deps: Deps) -> None:
    if deps.active:
        for namespace, name in logic.clusters_touched(batch.messages):
            await handlers.reconcile_cluster(namespace, name, cause=batch.latest, deps=deps)
        for namespace, name in logic.clusters_appeared(batch.messages):
            await handlers.reconcile_cluster_apps(namespace, name, deps)
    await handlers.user_kubeconfigs(batch, deps)
    await handlers.app_platforms(batch, deps)


async def on_nudge(batch: Batch[ReconcileCluster], deps: Deps) -> None:
    ref = batch.latest.ref
    if not (deps.active and ref.namespace):
        return
    await handlers.reconcile_cluster(ref.namespace, ref.name, cause=batch.latest, deps=deps)
    await handlers.reconcile_user_kubeconfig(ref.namespace, ref.name, deps)
    await handlers.reconcile_cluster_apps(ref.namespace, ref.name, deps)


ROUTES: Routes[Deps] = Routes(
    "identity",
    events("resources", CLUSTER, OIDC_CLIENT, PLATFORM, handle=on_resources),
    events("kubeconfigs", SECRET, handle=handlers.user_kubeconfigs),
    events("apps", HELM_RELEASE, handle=handlers.app_platforms),
    events("realms", REALM, handle=handlers.nudge_realm_users),
    messages(
        "reconciles",
        ReconcileCluster,
        subjects.LIFECYCLE,
        subjects.reconciles_in_partition,
        handle=on_nudge,
    ),
)
