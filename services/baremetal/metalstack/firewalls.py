"""The MetalStackFirewall: one firewall machine carrying the workload cluster's kubeconfig.

Upstream (``controllers/metalstackfirewall_controller.go``) waits for its MetalStackCluster's
network and for the ``<cluster>-kubeconfig`` Secret (here both end with an event: the
cluster's, and the Secret's), allocates a firewall whose Ignition userData enables
``firewall-controller.service`` with that kubeconfig, and records ``metalstack://<id>``.

It then polled metal-api until ``allocation.succeeded``, which real metal-api never sets, so
upstream's firewall never became ready. capibus takes the successor provider's signal (the
newest event is ``Phoned Home``; ``allocation.succeeded`` is honoured too). metal-api pushes
nothing, so the one look-again is a timer: a ``RecheckObject`` for this firewall after 1 s,
then doubling up to the setting's maximum, until it runs; nothing polls once it is ready.

As for machines, the firewall is found by a tag naming this object's uid before one is
allocated, so a crash between allocation and recording never allocates a second one.
"""

from __future__ import annotations

import logging

from services.baremetal.metalstack import logic
from services.baremetal.metalstack.logic import ClusterPlace, condition
from services.baremetal.metalstack.ports import (
    Deps,
    Json,
    free_machines,
    minding_metal_api,
    partition,
    workload_of,
)
from shared.messages import Message, RecheckObject
from shared.metalapi import MetalApiRefused
from shared.owned import add_finalizer, remove_finalizer, set_spec
from shared.reconcile import Target, get_or_none, report
from shared.resources import METALSTACK_CLUSTER, METALSTACK_FIREWALL, ref_to

log = logging.getLogger(__name__)

KIND = METALSTACK_FIREWALL
RUNNING = "running"


def _uid(obj: Json) -> str:
    return str(obj["metadata"]["uid"])


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    msf = await get_or_none(deps.kube, KIND, target.namespace, target.name)
    if msf is None:
        return []
    return await minding_metal_api(deps, KIND, msf, cause, _converge(msf, cause, deps))


async def _converge(msf: Json, cause: Message, deps: Deps) -> list[Target]:
    if logic.deleting(msf):
        deps.rechecks.cancel(ref_to(KIND, msf))
        deps.settled.forget(_uid(msf))
        await _delete(msf, await _cluster(msf, deps), deps)
        return []
    running = logic.status(msf).get("ready") or deps.settled.knows(_uid(msf), RUNNING)
    if running and logic.has_finalizer(msf, logic.FIREWALL_FINALIZER):
        return []  # running: nothing to look at until it is deleted
    msc = await _cluster(msf, deps)
    if msc is None or not logic.spec(msc).get("privateNetworkID"):
        return []
    msf = await add_finalizer(deps.kube, KIND, msf, logic.FIREWALL_FINALIZER)
    machine = logic.machine_id(logic.spec(msf).get("providerID"))
    if machine is None:
        msf = await _allocate(msf, msc, cause, deps)
        machine = logic.machine_id(logic.spec(msf).get("providerID"))
    if machine is not None and not logic.status(msf).get("ready"):
        await _check_running(msf, machine, cause, deps)
    return []


async def _cluster(msf: Json, deps: Deps) -> Json | None:
    """The MetalStackCluster: the owner capibus sets, else the one named by the label
    (upstream's only link, for firewalls it created)."""
    name = logic.owner_name(msf, METALSTACK_CLUSTER.kind, METALSTACK_CLUSTER.group)
    name = name or logic.cluster_label(msf)
    if name is None:
        return None
    return await get_or_none(deps.kube, METALSTACK_CLUSTER, msf["metadata"]["namespace"], name)


async def _allocate(msf: Json, msc: Json, cause: Message, deps: Deps) -> Json:
    # The kubeconfig first: without it nothing can be allocated, and a firewall allocated
    # by an earlier run had it too, so looking it up can wait until it is there.
    kubeconfig = await _kubeconfig(msf, msc, deps)
    if kubeconfig is None:
        return msf
    place = ClusterPlace.of(msc)
    found = await deps.metal.find_firewalls(
        project_id=place.project, tags=[place.cluster_tag, _resource_tag(msf)]
    )
    if found:
        firewall = found[0]
    else:
        request = logic.firewall_request(
            msf, place, private_network=logic.spec(msc)["privateNetworkID"], kubeconfig=kubeconfig
        )
        try:
            firewall = await deps.metal.allocate_firewall(request)
        except MetalApiRefused as exc:
            refused = condition("FirewallCreated", False, "MetalApiRefused", exc.message)
            await report(deps, KIND, msf, cause, conditions=[refused])
            raise
    return await set_spec(deps.kube, KIND, msf, {"providerID": logic.provider_id(firewall["id"])})


async def _kubeconfig(msf: Json, msc: Json, deps: Deps) -> str | None:
    cluster = (
        logic.owner_name(msc, "Cluster") or logic.cluster_label(msf) or msc["metadata"]["name"]
    )
    workload = await workload_of(deps, msf["metadata"]["namespace"], cluster)
    return workload.kubeconfig if workload else None


async def _check_running(msf: Json, machine: str, cause: Message, deps: Deps) -> None:
    firewall = await deps.metal.get_firewall(machine)
    ref = ref_to(KIND, msf)
    if logic.phoned_home(firewall):
        deps.rechecks.cancel(ref)
        running = condition("FirewallReady", True, "PhonedHome")
        await report(deps, KIND, msf, cause, conditions=[running], ready=True)
        deps.settled.note(_uid(msf), RUNNING)
        return
    attempt = cause.attempt + 1 if isinstance(cause, RecheckObject) else 0
    where = partition(deps, KIND, msf)
    deps.rechecks.later(ref, partition=where, attempt=attempt, reason="FirewallNotRunning")


async def _delete(msf: Json, msc: Json | None, deps: Deps) -> None:
    if not logic.has_finalizer(msf, logic.FIREWALL_FINALIZER):
        return
    ours = {f["id"] for f in await deps.metal.find_firewalls(tags=[_resource_tag(msf)])}
    recorded = logic.machine_id(logic.spec(msf).get("providerID"))
    if recorded and recorded not in ours and msc is not None:
        place = ClusterPlace.of(msc)
        found = await deps.metal.find_firewalls(
            id=recorded, project_id=place.project, tags=[place.cluster_tag]
        )
        ours |= {f["id"] for f in found}
    await free_machines(deps.metal, ours)
    await remove_finalizer(deps.kube, KIND, msf, logic.FIREWALL_FINALIZER)


def _resource_tag(msf: Json) -> str:
    return logic.tag(logic.FIREWALL_RESOURCE, msf["metadata"]["uid"])
