"""The MetalStackCluster: a private network, the control-plane IP, the firewall object.

Upstream's order (``controllers/metalstackcluster_controller.go``), each step converging from
what exists rather than from what this process remembers:

1. wait for Cluster API to set the owner ``Cluster`` (its event wakes us); a missing owner is
   ``InvalidConfiguration`` / "Unable to get OwnerCluster"; a paused Cluster or object waits;
2. the finalizer, before anything is allocated;
3. the private network, found by its labels before one is allocated, its id written to
   ``spec.privateNetworkID``; never allocated again once set;
4. the control-plane IP in the public network (the preset ``controlPlaneEndpoint.host`` if
   any), found by its tags first, written to ``spec.controlPlaneEndpoint.host``. Unlike
   upstream it is allocated *static*: metal-api releases an ephemeral IP with the last
   machine that used it, so upstream's API address vanished with its control-plane machine
   while ``controlPlaneIPAllocated`` still said true; a static one lives until the cluster
   frees it on deletion;
5. the MetalStackFirewall named like the cluster, created once, owned by this object (upstream
   left it unowned: a deleted cluster could orphan it); then ``ready``, without waiting for
   the firewall, as upstream.

Deletion takes the successor provider's fixes: the cluster's Machines are deleted and the
deletion *waits* until no MetalStackMachine and no firewall is left (their DELETED events
wake it), then frees the control-plane IP and the network, then lets go. Each wait and each
metal-api refusal is a condition; temporary metal-api errors are retried by the consumer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable

from services.baremetal.metalstack import logic
from services.baremetal.metalstack.logic import ClusterPlace, condition
from services.baremetal.metalstack.ports import (
    Deps,
    Json,
    minding_metal_api,
)
from shared.errors import KubeConflict, KubeNotFound, TemporaryError
from shared.kube import ResourceKind
from shared.messages import Message
from shared.metalapi import MetalApiNotFound, MetalApiRefused, MetalApiUnprocessable
from shared.owned import add_finalizer, remove_finalizer, set_spec
from shared.reconcile import Target, get_or_none, report
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    owner_reference,
)

log = logging.getLogger(__name__)

KIND = METALSTACK_CLUSTER


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    msc = await get_or_none(deps.kube, KIND, target.namespace, target.name)
    if msc is None:
        return []
    return await minding_metal_api(deps, KIND, msc, cause, _converge(msc, target, cause, deps))


async def _converge(msc: Json, target: Target, cause: Message, deps: Deps) -> list[Target]:
    owner = logic.owner_name(msc, "Cluster")
    cluster = await _owner(msc, owner, cause, deps)
    if logic.deleting(msc):
        await _delete(msc, owner, cause, deps)
        return []
    if cluster is None or logic.paused(cluster, msc):
        return []
    msc = await add_finalizer(deps.kube, KIND, msc, logic.CLUSTER_FINALIZER)
    msc = await _network(msc, cause, deps)
    msc = await _control_plane_ip(msc, cause, deps)
    await _firewall(msc, owner or target.name, deps)
    if not _reported_ready(msc):
        await report(
            deps, KIND, msc, cause, conditions=READY, ready=True, controlPlaneIPAllocated=True
        )
    return await _dependents(msc, owner or target.name, deps)


READY = (
    condition("NetworkEnsured", True, "Allocated"),
    condition("ControlPlaneIPEnsured", True, "Allocated"),
    condition("FirewallEnsured", True, "Created"),
)


def _reported_ready(msc: Json) -> bool:
    status = logic.status(msc)
    return bool(status.get("ready") and status.get("controlPlaneIPAllocated")) and not (
        status.get("failureReason") or status.get("failureMessage")
    )


async def _owner(msc: Json, owner: str | None, cause: Message, deps: Deps) -> Json | None:
    if owner is None:
        log.debug("%s: waiting for Cluster API to set the owner Cluster", logic.object_key(msc))
        return None
    try:
        cluster = await deps.kube.get(CAPI_CLUSTER, msc["metadata"]["namespace"], owner)
    except KubeNotFound:
        if not logic.deleting(msc):
            await report(
                deps,
                KIND,
                msc,
                cause,
                failureReason="InvalidConfiguration",
                failureMessage="Unable to get OwnerCluster",
            )
        return None
    if logic.status(msc).get("failureReason") == "InvalidConfiguration":
        await report(deps, KIND, msc, cause, failureReason=None, failureMessage=None)
    return cluster


# --- provisioning ---------------------------------------------------------------------------


async def _network(msc: Json, cause: Message, deps: Deps) -> Json:
    if logic.spec(msc).get("privateNetworkID"):
        return msc
    place = ClusterPlace.of(msc)
    found = await deps.metal.find_networks(
        project_id=place.project, partition_id=place.partition, labels=place.network_labels
    )
    if found:
        network = found[0]
    else:
        network = await _refusable(
            deps,
            msc,
            cause,
            "NetworkAllocated",
            deps.metal.allocate_network(
                name=place.partition,  # upstream's quirk, kept: metal-stack shows it as the name
                description=place.name,
                partition_id=place.partition,
                project_id=place.project,
                labels=place.network_labels,
            ),
        )
    return await set_spec(deps.kube, KIND, msc, {"privateNetworkID": network["id"]})


async def _control_plane_ip(msc: Json, cause: Message, deps: Deps) -> Json:
    endpoint = logic.spec(msc).get("controlPlaneEndpoint") or {}
    if logic.status(msc).get("controlPlaneIPAllocated") and endpoint.get("host"):
        return msc
    place = ClusterPlace.of(msc)
    found = await deps.metal.find_ips(project_id=place.project, tags=place.ip_tags)
    if found:
        ip = found[0]
    else:
        ip = await _refusable(
            deps,
            msc,
            cause,
            "ControlPlaneIPAllocated",
            deps.metal.allocate_ip(
                network_id=place.public_network,
                project_id=place.project,
                name=f"{place.name}-api-server-IP",
                description=f"control-plane address of {logic.object_key(msc)}",
                tags=place.ip_tags,
                ip=endpoint.get("host") or None,
                static=True,
            ),
        )
    return await set_spec(deps.kube, KIND, msc, {"controlPlaneEndpoint": {"host": ip["ipaddress"]}})


async def _firewall(msc: Json, cluster: str, deps: Deps) -> None:
    namespace, name = msc["metadata"]["namespace"], msc["metadata"]["name"]
    if await get_or_none(deps.kube, METALSTACK_FIREWALL, namespace, name) is not None:
        return
    firewall = {
        "apiVersion": METALSTACK_FIREWALL.api_version,
        "kind": METALSTACK_FIREWALL.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {logic.CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [owner_reference(KIND, msc, controller=True)],
        },
        "spec": logic.spec(msc).get("firewallSpec") or {},
    }
    # 409 on create: it exists already (another run created it meanwhile).
    with contextlib.suppress(KubeConflict):
        await deps.kube.create(METALSTACK_FIREWALL, firewall)


async def _dependents(msc: Json, cluster: str, deps: Deps) -> list[Target]:
    """A cluster that changed wakes its machines still waiting for an allocation (those with
    one wait for their Node, not for the cluster), and its firewall."""
    namespace = msc["metadata"]["namespace"]
    selector = f"{logic.CLUSTER_NAME_LABEL}={cluster}"
    machines, _ = await deps.kube.list(
        METALSTACK_MACHINE, namespace=namespace, label_selector=selector
    )
    waiting = [
        Target(METALSTACK_MACHINE, namespace, m["metadata"]["name"])
        for m in machines
        if logic.awaiting_allocation(m) and not logic.deleting(m)
    ]
    return [*waiting, Target(METALSTACK_FIREWALL, namespace, msc["metadata"]["name"])]


# --- deletion -------------------------------------------------------------------------------


async def _delete(msc: Json, cluster: str | None, cause: Message, deps: Deps) -> None:
    if not logic.has_finalizer(msc, logic.CLUSTER_FINALIZER):
        return
    namespace, name = msc["metadata"]["namespace"], msc["metadata"]["name"]
    cluster = cluster or logic.cluster_label(msc) or name
    if await _machines_left(namespace, cluster, deps):
        await _deleting(deps, msc, cause, "WaitingForMachines", "machines are being deleted")
        return
    firewall = await get_or_none(deps.kube, METALSTACK_FIREWALL, namespace, name)
    if firewall is not None:
        if not logic.deleting(firewall):
            await _delete_quietly(deps, METALSTACK_FIREWALL, namespace, name)
        await _deleting(deps, msc, cause, "WaitingForFirewall", "the firewall is being deleted")
        return
    await _free_control_plane_ip(msc, deps)
    await _free_network(msc, cause, deps)
    await remove_finalizer(deps.kube, KIND, msc, logic.CLUSTER_FINALIZER)
    log.info("%s: freed its network and control-plane IP", logic.object_key(msc))


async def _machines_left(namespace: str, cluster: str, deps: Deps) -> bool:
    """Delete the cluster's Machines (upstream) and say whether any MetalStackMachine is left
    (the successor's wait: the network cannot be freed while machines hold its IPs)."""
    selector = f"{logic.CLUSTER_NAME_LABEL}={cluster}"
    machines, _ = await deps.kube.list(MACHINE, namespace=namespace, label_selector=selector)
    for machine in machines:
        if not logic.deleting(machine):
            await _delete_quietly(deps, MACHINE, namespace, machine["metadata"]["name"])
    left, _ = await deps.kube.list(
        METALSTACK_MACHINE, namespace=namespace, label_selector=selector, limit=1
    )
    return bool(left or machines)


async def _free_control_plane_ip(msc: Json, deps: Deps) -> None:
    place = ClusterPlace.of(msc)
    for ip in await deps.metal.find_ips(project_id=place.project, tags=place.ip_tags):
        with contextlib.suppress(MetalApiNotFound):
            await deps.metal.free_ip(ip["ipaddress"])


async def _free_network(msc: Json, cause: Message, deps: Deps) -> None:
    place = ClusterPlace.of(msc)
    network = logic.spec(msc).get("privateNetworkID")
    # Upstream searched without an id when none was set (and then dereferenced nil); the
    # labels find a network allocated by a run that died before recording it.
    found = await deps.metal.find_networks(
        project_id=place.project, partition_id=place.partition, labels=place.network_labels
    )
    ids = {n["id"] for n in found} | ({network} if network else set())
    for network_id in sorted(ids):
        try:
            await deps.metal.free_network(network_id)
        except MetalApiNotFound:
            continue
        except MetalApiUnprocessable as exc:
            # IPs of the network still in use (a machine being freed): waiting heals it.
            await _deleting(deps, msc, cause, "NetworkInUse", exc.message)
            raise TemporaryError(
                f"{logic.object_key(msc)}: network {network_id} still in use"
            ) from exc


async def _delete_quietly(deps: Deps, kind: ResourceKind, namespace: str, name: str) -> None:
    with contextlib.suppress(KubeNotFound):
        await deps.kube.delete(kind, namespace, name)


# --- status ---------------------------------------------------------------------------------


async def _refusable(
    deps: Deps, msc: Json, cause: Message, step: str, call: Awaitable[Json]
) -> Json:
    """``call``'s result; a refusal by metal-api (bad input: an unknown partition, network or
    project) is the cluster's failure, shown on it, and a dead letter for the event."""
    try:
        return await call
    except MetalApiRefused as exc:
        await report(
            deps,
            KIND,
            msc,
            cause,
            failureReason="InvalidConfiguration",
            failureMessage=exc.message,
            conditions=[condition(step, False, "MetalApiRefused", exc.message)],
        )
        raise


async def _deleting(deps: Deps, msc: Json, cause: Message, reason: str, message: str) -> None:
    await report(deps, KIND, msc, cause, conditions=[condition("Deleting", True, reason, message)])
