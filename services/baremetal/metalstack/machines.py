"""The MetalStackMachine: one metal machine, allocated once, ready when its Node carries it.

Upstream (``controllers/metalstackmachine_controller.go``) waits for the owner ``Machine``, the
cluster label, a MetalStackCluster with its network, ``infrastructureReady``, the bootstrap
data and the control-plane IP; so does this reconciler, each wait ended by that object's
event. Then:

- **Allocation, exactly once.** A machine is allocated with a tag naming this object's uid,
  and found by that tag before any allocation, so a replica killed between "allocate" and
  "write ``spec.providerID``" adopts the machine it already has. A pinned ``providerID``
  allocates that very machine; one already allocated in the cluster's project is adopted
  (upstream adopted it whoever held it: here another project's machine is refused).
  metal-api refusing the allocation (no machine available, unknown size or image) is
  upstream's terminal ``CreateError``; an unreachable or failing metal-api is temporary and
  retried, since a 500 says nothing about the input.
- **Ready when the Node is there.** The workload cluster's Node whose ``systemUUID`` *equals*
  the machine id gets ``spec.providerID``; then ``status.ready``. A Node not there yet is
  waited for through ``nodes`` (a watch of that cluster's Nodes that sends a
  ``RecheckObject`` the moment it appears), not upstream's 15 s poll.
- **Deletion** frees every machine carrying this object's tag (and the recorded one if it
  carries the cluster's tag), then lets go; it does not depend on the Machine, the Cluster or
  the MetalStackCluster still existing (upstream's finalizer stuck when they went first).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.baremetal.metalstack import logic
from services.baremetal.metalstack.logic import ClusterPlace, condition
from services.baremetal.metalstack.ports import (
    Deps,
    Json,
    free_machines,
    minding_metal_api,
    partition,
    secret_value,
    workload_of,
)
from shared.errors import CapibusError
from shared.messages import Message
from shared.metalapi import MetalApiNotFound, MetalApiRefused
from shared.owned import add_finalizer, remove_finalizer, set_spec
from shared.reconcile import Target, get_or_none, report
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE,
    ref_to,
)

log = logging.getLogger(__name__)

KIND = METALSTACK_MACHINE
ADDRESSES = "addresses"
READY = "ready"


def _target_key(msm: Json) -> str:
    return Target(KIND, msm["metadata"]["namespace"], msm["metadata"]["name"]).key


@dataclass(frozen=True)
class World:
    """What a machine's allocation depends on, all present and ready."""

    machine: Json
    cluster: Json
    msc: Json

    @property
    def place(self) -> ClusterPlace:
        return ClusterPlace.of(self.msc)


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    if deps.settled.knows(target.key, READY) and not target.named_by(cause):
        # Ready, as this replica reported: another object's change (its Machine's phase)
        # needs nothing from it, and its own deletion arrives as its own event.
        return []
    msm = await get_or_none(deps.kube, KIND, target.namespace, target.name)
    if msm is None:
        return []
    return await minding_metal_api(deps, KIND, msm, cause, _converge(msm, cause, deps))


async def _converge(msm: Json, cause: Message, deps: Deps) -> list[Target]:
    if logic.deleting(msm):
        await _delete(msm, deps)
        return []
    # A failed machine is terminal, as upstream (it is replaced, not retried); a ready one is
    # done: whatever else changes (a Machine's phase) needs nothing from us.
    if not logic.awaiting_readiness(msm) and logic.has_finalizer(msm, logic.MACHINE_FINALIZER):
        return []
    if _recorded(msm, deps):
        # Allocated and recorded: only the Node is left, which needs none of the gates.
        if not logic.paused(msm):
            await _await_node(msm, logic.cluster_label(msm), cause, deps)
        return []
    world = await _world(msm, deps)
    if world is None or logic.paused(world.cluster, msm):
        return []
    msm = await add_finalizer(deps.kube, KIND, msm, logic.MACHINE_FINALIZER)
    if not logic.status(world.msc).get("controlPlaneIPAllocated"):
        return []
    msm = await _allocate(msm, world, cause, deps)
    if logic.machine_id(logic.spec(msm).get("providerID")):
        await _await_node(msm, world.cluster["metadata"]["name"], cause, deps)
    return []


def _recorded(msm: Json, deps: Deps) -> bool:
    """Whether ``msm``'s machine is allocated and recorded (its id and its addresses)."""
    if not logic.machine_id(logic.spec(msm).get("providerID")):
        return False
    uid = msm["metadata"]["uid"]
    recorded = logic.status(msm).get("addresses") or deps.settled.knows(uid, ADDRESSES)
    return bool(recorded and logic.has_finalizer(msm, logic.MACHINE_FINALIZER))


async def _world(msm: Json, deps: Deps) -> World | None:
    namespace = msm["metadata"]["namespace"]
    name = logic.owner_name(msm, "Machine")
    machine = name and await get_or_none(deps.kube, MACHINE, namespace, name)
    cluster_name = machine and logic.cluster_label(machine)
    cluster = cluster_name and await get_or_none(deps.kube, CAPI_CLUSTER, namespace, cluster_name)
    msc_name = cluster and logic.infrastructure_name(cluster, METALSTACK_CLUSTER.kind)
    msc = msc_name and await get_or_none(deps.kube, METALSTACK_CLUSTER, namespace, msc_name)
    if not (machine and cluster and msc and logic.spec(msc).get("privateNetworkID")):
        return None
    bootstrap = (logic.spec(machine).get("bootstrap") or {}).get("dataSecretName")
    if not (logic.status(cluster).get("infrastructureReady") and bootstrap):
        return None
    return World(machine=machine, cluster=cluster, msc=msc)


# --- allocation -------------------------------------------------------------------------------


async def _allocate(msm: Json, world: World, cause: Message, deps: Deps) -> Json:
    """``msm`` with its machine allocated and recorded (unchanged if allocation failed)."""
    pinned = logic.machine_id(logic.spec(msm).get("providerID"))
    uid = msm["metadata"]["uid"]
    try:
        existing = await _existing(msm, pinned, world, deps)
        if existing is None:
            existing = await _new(msm, world, deps)
    except _Refused as refused:
        await _fail(deps, msm, cause, str(refused))
        return msm
    if existing is None:
        return msm
    msm = await set_spec(deps.kube, KIND, msm, {"providerID": logic.provider_id(existing["id"])})
    await report(deps, KIND, msm, cause, addresses=logic.addresses(existing))
    deps.settled.note(uid, ADDRESSES)
    return msm


class _Refused(Exception):
    """The machine cannot be allocated for good (upstream's ``CreateError``)."""


async def _existing(msm: Json, pinned: str | None, world: World, deps: Deps) -> Json | None:
    """The machine already allocated for ``msm``: the pinned one, or the one tagged for it."""
    place = world.place
    if pinned is None:
        found = await deps.metal.find_machines(
            project_id=place.project, tags=[place.cluster_tag, _resource_tag(msm)]
        )
        if found:
            log.info(
                "%s: adopting machine %s, allocated by an earlier run",
                logic.object_key(msm),
                found[0]["id"],
            )
        return found[0] if found else None
    try:
        machine = await deps.metal.get_machine(pinned)
    except MetalApiNotFound as exc:
        raise _Refused(f"machine {pinned} does not exist") from exc
    if not logic.allocated(machine):
        return None
    if not logic.belongs_to(machine, project=place.project):
        raise _Refused(f"machine {pinned} is allocated to another project")
    return machine


async def _new(msm: Json, world: World, deps: Deps) -> Json | None:
    user_data = await _bootstrap_data(world.machine, deps)
    if user_data is None:
        return None
    endpoint = logic.spec(world.msc).get("controlPlaneEndpoint") or {}
    request = logic.machine_request(
        msm,
        world.place,
        private_network=logic.spec(world.msc)["privateNetworkID"],
        user_data=user_data,
        control_plane=logic.is_control_plane(world.machine),
        control_plane_ip=endpoint.get("host"),
    )
    try:
        return await deps.metal.allocate_machine(request)
    except MetalApiRefused as exc:
        raise _Refused(exc.message) from exc


async def _bootstrap_data(machine: Json, deps: Deps) -> str | None:
    """The bootstrap Secret's ``value``, passed raw as upstream does; None while the Secret
    does not exist yet (its event wakes the machine)."""
    name = logic.spec(machine)["bootstrap"]["dataSecretName"]
    found = await secret_value(deps.kube, machine["metadata"]["namespace"], name, what="bootstrap")
    return found["value"] if found else None


def _resource_tag(msm: Json) -> str:
    return logic.tag(logic.MACHINE_RESOURCE, msm["metadata"]["uid"])


# --- the Node ---------------------------------------------------------------------------------


async def _await_node(msm: Json, cluster: str | None, cause: Message, deps: Deps) -> None:
    machine = logic.machine_id(logic.spec(msm).get("providerID"))
    workload = cluster and await workload_of(deps, msm["metadata"]["namespace"], cluster)
    if machine is None or not workload:
        return
    try:
        node = await deps.nodes.node_for(workload, machine)
    except CapibusError:
        # A kubeconfig replaced without an event reaching this replica (a Secret without the
        # cluster's label) would fail for good: the retry reads the Secret again.
        deps.kubeconfigs.forget(workload.key)
        raise
    if node is None:
        where = partition(deps, KIND, msm)
        deps.nodes.wait_for(workload, machine, ref_to(KIND, msm), where)
        return
    provider = logic.provider_id(machine)
    if logic.spec(node).get("providerID") != provider:
        await deps.nodes.set_provider_id(workload, node, provider)
    deps.nodes.forget(machine)
    ready = condition("NodeReady", True, "ProviderIDSet", f"Node {node['metadata']['name']}")
    await report(deps, KIND, msm, cause, conditions=[ready], ready=True)
    deps.settled.note(_target_key(msm), READY)


# --- deletion ---------------------------------------------------------------------------------


async def _delete(msm: Json, deps: Deps) -> None:
    if not logic.has_finalizer(msm, logic.MACHINE_FINALIZER):
        return
    recorded = logic.machine_id(logic.spec(msm).get("providerID"))
    if recorded:
        deps.nodes.forget(recorded)
    deps.settled.forget(msm["metadata"]["uid"])
    deps.settled.forget(_target_key(msm))
    ours = {m["id"] for m in await deps.metal.find_machines(tags=[_resource_tag(msm)])}
    if recorded and recorded not in ours:
        ours |= await _recorded_in_cluster(msm, recorded, deps)
    await free_machines(deps.metal, ours)
    await remove_finalizer(deps.kube, KIND, msm, logic.MACHINE_FINALIZER)
    log.info("%s: freed %s", logic.object_key(msm), ", ".join(sorted(ours)) or "nothing")


async def _recorded_in_cluster(msm: Json, machine: str, deps: Deps) -> set[str]:
    """The recorded machine, if it was allocated for this cluster (e.g. by upstream's
    provider, which tagged the cluster only): upstream's rule for what may be freed."""
    namespace = msm["metadata"]["namespace"]
    clusters, _ = await deps.kube.list(METALSTACK_CLUSTER, namespace=namespace)
    cluster = logic.cluster_label(msm)
    for msc in clusters:
        if cluster in (logic.owner_name(msc, "Cluster"), logic.cluster_label(msc)):
            place = ClusterPlace.of(msc)
            found = await deps.metal.find_machines(
                id=machine, project_id=place.project, tags=[place.cluster_tag]
            )
            return {m["id"] for m in found}
    return set()


# --- status -----------------------------------------------------------------------------------


async def _fail(deps: Deps, msm: Json, cause: Message, message: str) -> None:
    log.warning("%s: allocation failed for good: %s", logic.object_key(msm), message)
    failed = condition("MachineCreated", False, "CreateError", message)
    await report(
        deps,
        KIND,
        msm,
        cause,
        conditions=[failed],
        failureReason="CreateError",
        failureMessage=message,
    )
