"""Machines and MachineDeployments of the Cluster API stand-in (``docs/upstream.md`` §3 and §5).

A Machine is created with its OpenStackMachine first (cloned from the owner's
OpenStackMachineTemplate, so it has ``spec.flavor``; the capi-operator fetches it on every
Machine event) and then walks ``Pending``, ``Provisioning``, ``Provisioned``, ``Running``, one
status write per reconcile. Every Machine carries the finalizer ``machine.cluster.x-k8s.io``:
however it is deleted (scale down, rollout, Cluster deletion, garbage collection of its
owner), it shows ``Deleting`` and takes its OpenStackMachine with it before it goes.

With another provider's template (``capi_infra``: metal-stack) the phases are the same, but
the steps between them wait on that provider: ``Provisioning`` once the bootstrap Secret is
written and named, ``Provisioned`` once the infrastructure machine is ready, and a Machine
being deleted keeps its finalizer until the provider let its infrastructure machine go.

A MachineDeployment stands in for its MachineSets too: once the Cluster's control plane is
initialised it creates or deletes the difference to ``spec.replicas`` (or the autoscaler's
min-size annotation) at once, and replaces out-of-date Machines one at a time, without surge
unless ``spec.strategy.rollingUpdate.maxSurge`` asks for it (the chart's default is 0).

With an OpenShift Assisted bootstrap (``capi_assisted``) a Machine's bootstrap is its
``OpenshiftAssistedConfig``: ``Provisioning`` once that config's data is named, and a Machine
being deleted waits for the config to go as well. A MachineDeployment whose template names an
``OpenshiftAssistedConfigTemplate`` creates a real MachineSet owning its Machines, each with a
config cloned from the template, and does not wait for the control plane (see
``reconcile_deployment``).
"""

from __future__ import annotations

import uuid

from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    OPENSTACK_MACHINE,
)
from standins import capi_assisted, capi_infra
from standins.base import Json
from standins.capi_shapes import (
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    CONTROL_PLANE_NAME_LABEL,
    DEPLOYMENT_NAME_LABEL,
    MACHINE_FINALIZER,
    MIN_SIZE_ANNOTATION,
    OPENSTACK_MACHINE_TEMPLATE,
    SET_NAME_LABEL,
    TEMPLATE_HASH_LABEL,
    Plan,
    address_for,
    adopted,
    condition_true,
    finalizers_of,
    is_deleting,
    labels_of,
    machine,
    openstack_machine,
    phase_of,
    plan_machines,
    random_suffix,
    running_status,
    status_differs,
    template_hash,
)
from standins.capi_world import World


def _ns_name(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


async def list_machines(world: World, namespace: str, label: str, owner: Json) -> list[Json]:
    return await world.list(MACHINE, namespace, f"{label}={owner['metadata']['name']}")


async def create_machine(
    world: World,
    *,
    owner: Json,
    name: str,
    labels: dict[str, str],
    version: str,
    template_ref: Json,
    config_template: Json | None = None,
) -> bool:
    """Infrastructure machine, bootstrap config (cloned from ``config_template``, if given),
    then Machine; False while the machine template does not exist."""
    namespace = owner["metadata"]["namespace"]
    infrastructure: Json | None = None
    bootstrap: Json | None = None
    if capi_infra.is_generic(template_ref):
        infrastructure = await capi_infra.create_machine(
            world, namespace=namespace, name=name, labels=labels, template_ref=template_ref
        )
        if infrastructure is None:
            return False
    else:
        name_ = str(template_ref.get("name"))
        template = await world.get(OPENSTACK_MACHINE_TEMPLATE, namespace, name_)
        if template is None:
            return False
        await world.knobs.step()
        osm = openstack_machine(name=name, namespace=namespace, labels=labels, template=template)
        await world.kube.create(OPENSTACK_MACHINE, osm)
    if config_template is not None:
        config = await capi_assisted.create_config(
            world, template=config_template, namespace=namespace, name=name, labels=labels
        )
        bootstrap = {"configRef": config}
    cluster = labels[CLUSTER_NAME_LABEL]
    await world.kube.create(
        MACHINE,
        machine(
            name=name,
            namespace=namespace,
            cluster=cluster,
            version=version,
            labels=labels,
            owner=owner,
            infrastructure=infrastructure,
            bootstrap=bootstrap,
        ),
    )
    return True


# --- Machine -------------------------------------------------------------------------------


async def reconcile_machine(world: World, seen: Json) -> None:
    found = await world.kube.get(MACHINE, *_ns_name(seen))
    if is_deleting(found):
        await _retire(world, found)
        return
    if MACHINE_FINALIZER not in finalizers_of(found):
        # A Machine another program made (an OpenShift Assisted control plane's): CAPI's
        # Machine controller adds its finalizer first, as ours are created with it.
        await world.add_finalizer(MACHINE, found, MACHINE_FINALIZER)
        return
    step = await _next_step(world, found)
    if step is None:
        return
    found, status = step
    await world.write_status(MACHINE, found, status)
    _nudge_owner(world, found)


async def _next_step(world: World, found: Json) -> tuple[Json, Json] | None:
    """The Machine (as changed on the way) and its next status; None: nothing to do yet."""
    phase = phase_of(found)
    if not phase:
        return found, {"phase": "Pending", "bootstrapReady": False, "infrastructureReady": False}
    if phase == "Pending":
        return await _bootstrapped(world, found)
    if phase == "Provisioning":
        return await _infrastructure_ready(world, found)
    if phase == "Provisioned":
        status = running_status(found, healthy=await _healthy(world, found))
        if capi_infra.generic_machine(found):
            status["addresses"] = await capi_infra.addresses(world, found) or status["addresses"]
        return found, status
    return None


async def _bootstrapped(world: World, found: Json) -> tuple[Json, Json] | None:
    await _adopt_infrastructure(world, found)
    if capi_assisted.config_ref(found) is not None:
        if not await capi_assisted.bootstrap(world, found):
            return None
    elif capi_infra.generic_machine(found) and not await capi_infra.bootstrap(world, found):
        return None
    return found, {"phase": "Provisioning", "bootstrapReady": True}


async def _infrastructure_ready(world: World, found: Json) -> tuple[Json, Json] | None:
    if capi_infra.generic_machine(found):
        ready = await capi_infra.provisioned(world, found)
        if ready is None:
            return None
        found = ready
    else:
        found = await _provision(world, found)
    return found, {"phase": "Provisioned", "infrastructureReady": True}


def _nudge_owner(world: World, found: Json) -> None:
    namespace = found["metadata"]["namespace"]
    labels = labels_of(found)
    if labels.get(CONTROL_PLANE_NAME_LABEL):
        world.offer(CONTROL_PLANE, namespace, labels[CONTROL_PLANE_NAME_LABEL])
    if labels.get(DEPLOYMENT_NAME_LABEL):
        world.offer(MACHINE_DEPLOYMENT, namespace, labels[DEPLOYMENT_NAME_LABEL])


async def _adopt_infrastructure(world: World, found: Json) -> None:
    """As CAPI does: the infrastructure machine becomes owned by (and deleted with) its
    Machine."""
    ref = found["spec"].get("infrastructureRef") or {"kind": OPENSTACK_MACHINE.kind}
    kind = capi_infra.kind_of(ref)
    name = str(ref.get("name") or found["metadata"]["name"])
    infra = await world.get(kind, found["metadata"]["namespace"], name)
    refs = None if infra is None else adopted(infra, found, controller=True)
    if infra is not None and refs is not None:
        await world.patch(kind, infra, {"metadata": {"ownerReferences": refs}})


async def _provision(world: World, found: Json) -> Json:
    """The server exists: a providerID on the Machine, an address on the OpenStackMachine."""
    server = str(uuid.uuid4())
    osm = await world.get(OPENSTACK_MACHINE, *_ns_name(found))
    if osm is not None:
        osm = await world.patch(
            OPENSTACK_MACHINE, osm, {"spec": {"providerID": f"openstack:///{server}"}}
        )
        address = address_for(found["metadata"]["name"])
        status = {
            "ready": True,
            "instanceState": "ACTIVE",
            "addresses": [{"type": "InternalIP", "address": address}],
        }
        await world.write_status(OPENSTACK_MACHINE, osm, status)
    return await world.patch(MACHINE, found, {"spec": {"providerID": f"openstack:///{server}"}})


async def _healthy(world: World, found: Json) -> bool:
    """Knob STANDIN_CAPI_UNHEALTHY_MACHINES: the first N workers of a cluster, by name."""
    if not world.knobs.unhealthy_machines or CONTROL_PLANE_LABEL in labels_of(found):
        return True
    namespace = found["metadata"]["namespace"]
    cluster = labels_of(found).get(CLUSTER_NAME_LABEL, "")
    selector = f"{CLUSTER_NAME_LABEL}={cluster},!{CONTROL_PLANE_LABEL}"
    workers = sorted(
        m["metadata"]["name"]
        for m in await world.list(MACHINE, namespace, selector)
        if not is_deleting(m)
    )
    limit = world.knobs.unhealthy_workers(len(workers))
    return found["metadata"]["name"] not in workers[:limit]


async def _retire(world: World, found: Json) -> None:
    if MACHINE_FINALIZER not in finalizers_of(found):
        return
    if phase_of(found) != "Deleting":
        await world.write_status(MACHINE, found, {"phase": "Deleting"})
        _nudge_owner(world, found)
        return
    await world.knobs.step()
    if capi_infra.generic_machine(found):
        # Both at once, as CAPI deletes both external objects and waits for both.
        infra_gone = await capi_infra.retire(world, found)
        if not await capi_assisted.retire_config(world, found) or not infra_gone:
            return  # a provider holds its object; its DELETED event brings us back
    else:
        await world.delete(OPENSTACK_MACHINE, *_ns_name(found))
    await world.remove_finalizer(MACHINE, found, MACHINE_FINALIZER)


async def on_machine_deleted(world: World, gone: Json) -> None:
    _nudge_owner(world, gone)
    namespace = gone["metadata"]["namespace"]
    world.offer(CAPI_CLUSTER, namespace, labels_of(gone).get(CLUSTER_NAME_LABEL, ""))


# --- MachineDeployment ---------------------------------------------------------------------


def _desired(md: Json) -> int:
    replicas = md["spec"].get("replicas")
    if replicas is None:  # autoscaled: CAPI's webhook defaults to the autoscaler's minimum
        annotations = md["metadata"].get("annotations") or {}
        replicas = annotations.get(MIN_SIZE_ANNOTATION, 1)
    return int(replicas)


def _template(md: Json) -> str:
    spec = md["spec"].get("template", {}).get("spec") or {}
    ref = spec.get("infrastructureRef") or {}
    return template_hash(str(spec.get("version", "")), str(ref.get("name", "")))


def _surge(md: Json) -> bool:
    rolling = (md["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    return int(rolling.get("maxSurge") or 0) > 0


async def reconcile_deployment(world: World, seen: Json) -> None:
    md = await world.kube.get(MACHINE_DEPLOYMENT, *_ns_name(seen))
    namespace = md["metadata"]["namespace"]
    cluster = await world.get(CAPI_CLUSTER, namespace, str(md["spec"].get("clusterName")))
    if is_deleting(md) or cluster is None or is_deleting(cluster):
        return
    # The wait stands in for the kubeadm bootstrap provider's: a worker joins an initialised
    # control plane. OpenShift Assisted installs the workers day 1 together with the control
    # plane: the AgentClusterInstall counts them (provisionRequirements.workerAgents) and stays
    # insufficient until their Agents are there, so waiting here would never end.
    assisted = capi_assisted.assisted_deployment(md)
    if not assisted and not condition_true(cluster, "ControlPlaneInitialized"):
        return  # the Cluster nudges its MachineDeployments when that changes
    machines = await list_machines(world, namespace, DEPLOYMENT_NAME_LABEL, md)
    plan = plan_machines(
        machines, desired=_desired(md), template=_template(md), surge=_surge(md), batch=True
    )
    if plan.create or plan.delete:
        await _carry_out(world, md, plan)
        machines = await list_machines(world, namespace, DEPLOYMENT_NAME_LABEL, md)
    wanted = _deployment_status(md, machines)
    if status_differs(md.get("status") or {}, wanted):
        await world.write_status(MACHINE_DEPLOYMENT, md, wanted)


async def _carry_out(world: World, md: Json, plan: Plan) -> None:
    namespace, name = _ns_name(md)
    for m in plan.delete:
        await world.delete(MACHINE, namespace, m["metadata"]["name"])
    template = md["spec"].get("template", {})
    set_name = f"{name}-{_template(md)[:5]}"
    labels = {
        **(template.get("metadata", {}).get("labels") or {}),
        CLUSTER_NAME_LABEL: str(md["spec"]["clusterName"]),
        DEPLOYMENT_NAME_LABEL: name,
        SET_NAME_LABEL: set_name,
        TEMPLATE_HASH_LABEL: _template(md),
    }
    owner, config_template = md, None
    if capi_assisted.assisted_deployment(md):
        config_template = await capi_assisted.config_template(world, md)
        if config_template is None and plan.create:
            world.requeue(MACHINE_DEPLOYMENT, md)
            return
        owner = await capi_assisted.machine_set(
            world, md, name=set_name, labels=labels, replicas=_desired(md)
        )
    for _ in range(plan.create):
        created = await create_machine(
            world,
            owner=owner,
            name=f"{set_name}-{random_suffix()}",
            labels=labels,
            version=str(template.get("spec", {}).get("version", "")),
            template_ref=template.get("spec", {}).get("infrastructureRef") or {},
            config_template=config_template,
        )
        if not created:
            world.requeue(MACHINE_DEPLOYMENT, md)
            return


def _deployment_status(md: Json, machines: list[Json]) -> Json:
    live = [m for m in machines if not is_deleting(m)]
    ready = sum(phase_of(m) == "Running" and condition_true(m, "NodeHealthy") for m in live)
    desired = _desired(md)
    phase = "ScalingUp" if len(live) < desired else "ScalingDown" if len(live) > desired else ""
    updated = sum(labels_of(m).get(TEMPLATE_HASH_LABEL) == _template(md) for m in live)
    return {
        "replicas": len(live),
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": len(live) - ready,
        "phase": phase or "Running",
        "observedGeneration": md["metadata"].get("generation"),
    }


async def on_deployment_deleted(world: World, gone: Json) -> None:
    """A node group went (helm upgrade or uninstall): its Machines go, each via Deleting."""
    namespace = gone["metadata"]["namespace"]
    for m in await list_machines(world, namespace, DEPLOYMENT_NAME_LABEL, gone):
        if not is_deleting(m):
            await world.delete(MACHINE, namespace, m["metadata"]["name"])
    if capi_assisted.assisted_deployment(gone):
        await capi_assisted.delete_machine_sets(world, gone)
