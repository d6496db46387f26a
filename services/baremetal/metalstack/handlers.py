"""From an event to the objects it concerns, and one reconcile of each at a time.

Upstream runs three controllers, each woken by its own kind and by a mapping from another
(a CAPI ``Cluster`` to its MetalStackCluster, a ``Machine`` to its MetalStackMachine). Here
they are one service with one subscription, because everything they decide on belongs to one
cluster and so to one partition: a replica that holds a cluster's partition sees all of its
events in order, the three reconcilers share the cluster's reads and its metal-api client, and
they scale together. ``on_changes`` maps each event to *targets* (the provider objects it
concerns) and reconciles each under a per-object lock, since two events of different objects
(a Machine and its MetalStackMachine) may concern the same target at once.

What each target waits for is an event of some object of its cluster, so every wait here is a
subscription: the owner reference and ``infrastructureReady`` arrive as events of the object or
its CAPI Cluster, the bootstrap data and the kubeconfig as Secret events, a machine's Node as a
``RecheckObject`` from the workload cluster's watch (``nodes``), and a firewall that has not
phoned home yet as a ``RecheckObject`` from a timer (metal-api pushes nothing).
"""

from __future__ import annotations

import logging
from typing import Any

from services.baremetal.metalstack import clusters, firewalls, logic, machines
from services.baremetal.metalstack.ports import Deps
from shared import reconcile
from shared.consumer import Batch
from shared.kube import ResourceKind
from shared.messages import Message, RecheckObject, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Mapper, Reconciler, Target, gather, reconciled_kind
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
)

log = logging.getLogger(__name__)

Json = dict[str, Any]


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Reconcile every target the batch's events concern, each once; a kubeconfig Secret's
    event first makes the next reader of it read it again."""
    for message in batch.messages:
        if (cluster := _kubeconfig_of(message)) is not None:
            deps.kubeconfigs.forget(f"{message.ref.namespace}/{cluster}")
    await run(await gather(batch.messages, deps.kube, _MAPPERS), deps)


def _kubeconfig_of(message: ResourceChanged) -> str | None:
    """The cluster whose ``<cluster>-kubeconfig`` Secret ``message`` is about, if it is one."""
    cluster = logic.cluster_label(message.object)
    if cluster is None or message.ref.kind != SECRET.kind:
        return None
    return cluster if message.ref.name == f"{cluster}-kubeconfig" else None


async def on_recheck(batch: Batch[RecheckObject], deps: Deps) -> None:
    ref = batch.latest.ref
    kind = reconciled_kind(RECONCILED, ref.kind)
    if kind is None or ref.namespace is None:
        log.warning("recheck of %s %s: not a kind this service reconciles", ref.kind, ref.key)
        return
    await run({Target(kind, ref.namespace, ref.name): batch.latest}, deps)


async def run(targets: dict[Target, Message], deps: Deps) -> None:
    await reconcile.run(targets, deps, reconcilers=RECONCILERS, locks=deps.locks)


# --- which targets an event concerns --------------------------------------------------------


async def targets_of(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return await reconcile.targets_of(message, kube, _MAPPERS)


async def _own_cluster(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return [Target(METALSTACK_CLUSTER, message.ref.namespace or "", message.ref.name)]


async def _own_machine(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    """The machine; once it is gone, also its cluster (whose deletion may wait for it)."""
    namespace = message.ref.namespace or ""
    found = [Target(METALSTACK_MACHINE, namespace, message.ref.name)]
    if message.event == "DELETED":
        found += await clusters_of(kube, namespace, logic.cluster_label(message.object))
    return found


async def _own_firewall(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    """The firewall; once it is gone, also its cluster (whose deletion may wait for it)."""
    namespace, name = message.ref.namespace or "", message.ref.name
    found = [Target(METALSTACK_FIREWALL, namespace, name)]
    if message.event == "DELETED":
        owner = logic.owner_name(message.object, "MetalStackCluster", METALSTACK_CLUSTER.group)
        found.append(Target(METALSTACK_CLUSTER, namespace, owner or name))
    return found


async def _capi_cluster(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    infra = logic.infrastructure_name(message.object, METALSTACK_CLUSTER.kind)
    return [Target(METALSTACK_CLUSTER, message.ref.namespace or "", infra)] if infra else []


async def _machine(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    infra = logic.infrastructure_name(message.object, METALSTACK_MACHINE.kind)
    return [Target(METALSTACK_MACHINE, message.ref.namespace or "", infra)] if infra else []


async def _secret(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    cluster = logic.cluster_label(message.object)
    return await _secret_targets(kube, message.ref.namespace or "", message.ref.name, cluster)


async def _secret_targets(
    kube: KubeReader, namespace: str, name: str, cluster: str | None
) -> list[Target]:
    """A cluster's bootstrap data wakes its machines waiting for an allocation; its
    kubeconfig wakes every machine and firewall not ready yet (they need it next)."""
    if cluster is None:
        return []
    kubeconfig = name == f"{cluster}-kubeconfig"
    waits = logic.awaiting_readiness if kubeconfig else logic.awaiting_allocation
    selector = f"{logic.CLUSTER_NAME_LABEL}={cluster}"
    machines, _ = await kube.list(METALSTACK_MACHINE, namespace=namespace, label_selector=selector)
    found = [
        Target(METALSTACK_MACHINE, namespace, m["metadata"]["name"]) for m in machines if waits(m)
    ]
    if kubeconfig:
        firewalls, _ = await kube.list(
            METALSTACK_FIREWALL, namespace=namespace, label_selector=selector
        )
        found += [
            Target(METALSTACK_FIREWALL, namespace, f["metadata"]["name"])
            for f in firewalls
            if logic.awaiting_readiness(f)
        ]
    return found


async def clusters_of(kube: KubeReader, namespace: str, cluster: str | None) -> list[Target]:
    """The MetalStackClusters of the CAPI Cluster named ``cluster`` (by owner or label)."""
    if cluster is None:
        return []
    items, _ = await kube.list(METALSTACK_CLUSTER, namespace=namespace)
    return [
        Target(METALSTACK_CLUSTER, namespace, item["metadata"]["name"])
        for item in items
        if cluster in (logic.owner_name(item, "Cluster"), logic.cluster_label(item))
    ]


RECONCILED = (METALSTACK_CLUSTER, METALSTACK_MACHINE, METALSTACK_FIREWALL)
RECONCILERS: dict[ResourceKind, Reconciler[Deps]] = {
    METALSTACK_CLUSTER: clusters.reconcile,
    METALSTACK_MACHINE: machines.reconcile,
    METALSTACK_FIREWALL: firewalls.reconcile,
}

_MAPPERS: dict[ResourceKind, Mapper] = {
    METALSTACK_CLUSTER: _own_cluster,
    METALSTACK_MACHINE: _own_machine,
    METALSTACK_FIREWALL: _own_firewall,
    CAPI_CLUSTER: _capi_cluster,
    MACHINE: _machine,
    SECRET: _secret,
}
