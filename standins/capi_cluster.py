"""The CAPI Cluster and KubeadmControlPlane controllers of the stand-in (``docs/upstream.md`` §5).

Each reconcile advances its object by one step and returns; the event of its own write brings
it back for the next step, so every transition is a separate status write the capi-operator
can observe, a step delay apart.

Cluster: finalizer, ``Pending``, ``Provisioning``, then (unless the cluster is listed as stuck)
a control-plane endpoint on the OpenStackCluster and the Cluster and ``Provisioned``; from
then on its conditions mirror the control plane. Deletion runs in Cluster API's order
(Machines first) and waits for Machine DELETED events between stages.

KubeadmControlPlane: ``Ready False WaitingForKubeadmInit``; once the Cluster's infrastructure
is ready, one Machine (kubeadm init), then the kubeconfig Secret and ``initialized``, then the
remaining replicas one at a time; spec changes (replicas, version, machine template) converge
the same way, replacing out-of-date Machines one by one with a surge of one.

Another provider's infrastructure (``capi_infra``, metal-stack) changes three things. The
Cluster waits for the provider's ``status.ready`` and endpoint instead of making them up, and
keeps mirroring ``status.ready`` once provisioned. The kubeconfig Secret is written as soon as
the infrastructure is ready and the endpoint known, before any Machine, as the real
KubeadmControlPlane controller does (``reconcileKubeconfig`` runs before it scales): the
provider needs it to boot its firewall and to reach the workload cluster's Nodes, which a
control-plane Machine's readiness depends on, so waiting for ``initialized`` would deadlock.
It is owned by the Cluster. Deletion follows CAPI's ``reconcileDelete``: MachineDeployments
and worker Machines, then the control plane's Machines and the KubeadmControlPlane, then any
leftover infrastructure machine, then the infrastructure cluster, each stage waiting until the
previous one is gone (the provider's finalizers decide when), then the Cluster's finalizer.

An OpenShift Assisted control plane (``capi_assisted``) is another program too: the Cluster
links it (ownerReference, label) on every pass, mirrors its ``ready`` and ``initialized``
once provisioned, writes no kubeconfig (that provider does), and on deletion deletes it after
the workers and waits for it to go before the infrastructure cluster.
"""

from __future__ import annotations

from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    SECRET,
)
from standins import capi_assisted, capi_infra
from standins.base import Json
from standins.capi_machines import create_machine, list_machines
from standins.capi_shapes import (
    CLUSTER_FINALIZER,
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    CONTROL_PLANE_NAME_LABEL,
    TEMPLATE_HASH_LABEL,
    Plan,
    address_for,
    cluster_name_of,
    condition,
    condition_true,
    finalizers_of,
    find_condition,
    is_deleting,
    kubeconfig_secret,
    kubeconfig_text,
    labels_of,
    lowest_version,
    merge_conditions,
    phase_of,
    plan_machines,
    random_suffix,
    status_differs,
    template_hash,
)
from standins.capi_world import World

API_PORT = 6443


def _ns_name(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _kcp_name(cluster: Json) -> str:
    ref = (cluster.get("spec") or {}).get("controlPlaneRef") or {}
    return str(ref.get("name") or f"{cluster['metadata']['name']}-control-plane")


def _nudge_dependents(world: World, cluster: Json) -> None:
    namespace, name = _ns_name(cluster)
    world.offer(CONTROL_PLANE, namespace, _kcp_name(cluster))
    for kind in (MACHINE_DEPLOYMENT, HELM_RELEASE, MANIFESTS):
        world.nudge(kind, namespace, name)
    if capi_infra.generic_cluster(cluster):
        world.nudge(MACHINE, namespace, name)  # their bootstrap waits on infrastructureReady


# --- Cluster -------------------------------------------------------------------------------


async def reconcile_cluster(world: World, seen: Json) -> None:
    cluster = await world.kube.get(CAPI_CLUSTER, *_ns_name(seen))
    if is_deleting(cluster):
        await _delete_cluster(world, cluster)
        return
    if CLUSTER_FINALIZER not in finalizers_of(cluster):
        await world.add_finalizer(CAPI_CLUSTER, cluster, CLUSTER_FINALIZER)
        return
    if capi_assisted.assisted_control_plane(cluster):
        # CAPI links the control plane on every pass, whatever the phase: its provider waits
        # for the reference before it does anything.
        await capi_assisted.adopt_control_plane(world, cluster)
    phase = phase_of(cluster)
    if not phase:
        await world.write_status(CAPI_CLUSTER, cluster, {"phase": "Pending"})
    elif phase == "Pending":
        status = {"phase": "Provisioning", "infrastructureReady": False, "controlPlaneReady": False}
        await world.write_status(CAPI_CLUSTER, cluster, status)
    elif phase == "Provisioning":
        if "/".join(_ns_name(cluster)) in world.knobs.stuck or not await _provision(world, cluster):
            return
        status = {
            "phase": "Provisioned",
            "infrastructureReady": True,
            "conditions": [condition("InfrastructureReady", True)],
        }
        await world.write_status(CAPI_CLUSTER, cluster, status)
    elif not await _mirror_control_plane(world, cluster):
        return
    _nudge_dependents(world, cluster)


def _endpoint(cluster: Json, infra: Json | None) -> Json:
    """Keep an endpoint the chart set (Zenith: its FQDN, port 443), else make one up."""
    for obj in (cluster, infra or {}):
        endpoint = (obj.get("spec") or {}).get("controlPlaneEndpoint") or {}
        if endpoint.get("host"):
            return {"host": endpoint["host"], "port": int(endpoint.get("port") or API_PORT)}
    return {"host": address_for("/".join(_ns_name(cluster)), "10.1"), "port": API_PORT}


async def _provision(world: World, cluster: Json) -> bool:
    """The OpenStackCluster comes up and both objects get the endpoint; False: not yet."""
    if capi_infra.generic_cluster(cluster):
        return await capi_infra.provision(world, cluster)
    namespace, name = _ns_name(cluster)
    ref = (cluster.get("spec") or {}).get("infrastructureRef")
    infra = await world.get(OPENSTACK_CLUSTER, namespace, ref["name"]) if ref else None
    if ref and infra is None:
        world.requeue(CAPI_CLUSTER, cluster)  # the chart has not created it yet
        return False
    endpoint = _endpoint(cluster, infra)
    if infra is not None:
        if (infra.get("spec") or {}).get("controlPlaneEndpoint") != endpoint:
            infra = await world.patch(
                OPENSTACK_CLUSTER, infra, {"spec": {"controlPlaneEndpoint": endpoint}}
            )
        if not (infra.get("status") or {}).get("ready"):
            await world.write_status(OPENSTACK_CLUSTER, infra, {"ready": True})
    if (cluster.get("spec") or {}).get("controlPlaneEndpoint") != endpoint:
        await world.kube.patch_merge(
            CAPI_CLUSTER, namespace, name, {"spec": {"controlPlaneEndpoint": endpoint}}
        )
        return False  # our spec write changed the Cluster: the next run goes on from there
    return True


def _cluster_conditions(
    cluster: Json, control_plane: tuple[bool, bool, str], *, infra_ready: bool
) -> list[Json]:
    """``control_plane``: initialised, ready, and why not ready."""
    existing = (cluster.get("status") or {}).get("conditions") or []
    present = {c.get("type") for c in existing}
    now_initialized, cp_ready, reason = control_plane
    initialized = now_initialized or condition_true(cluster, "ControlPlaneInitialized")
    wanted = [condition("InfrastructureReady", infra_ready, "WaitingForInfrastructure")]
    for kind, ok, why in (
        ("ControlPlaneInitialized", initialized, "WaitingForControlPlaneProviderInitialized"),
        ("ControlPlaneReady", cp_ready, reason),
        ("Ready", cp_ready, reason),
    ):
        if ok or kind in present:
            wanted.append(condition(kind, ok, why))
    return merge_conditions(existing, wanted)


async def _control_plane(world: World, cluster: Json) -> tuple[bool, bool, str, bool]:
    """The control plane's (initialised, ready by its Ready condition, why not, and
    ``status.ready``)."""
    namespace = cluster["metadata"]["namespace"]
    if capi_assisted.assisted_control_plane(cluster):
        acp = await world.get(capi_assisted.ACP, namespace, _kcp_name(cluster))
        initialized, ready = capi_assisted.control_plane_state(acp)
        why = str(((acp and find_condition(acp, "Ready")) or {}).get("reason") or "")
        return initialized, ready, "" if ready else why or "WaitingForControlPlane", ready
    kcp = await world.get(CONTROL_PLANE, namespace, _kcp_name(cluster))
    kcp_status = (kcp or {}).get("status") or {}
    reason = str(((kcp and find_condition(kcp, "Ready")) or {}).get("reason") or "")
    cp_ready = kcp is not None and condition_true(kcp, "Ready")
    return bool(kcp_status.get("initialized")), cp_ready, reason, bool(kcp_status.get("ready"))


async def _mirror_control_plane(world: World, cluster: Json) -> bool:
    """Provisioned: conditions follow the control plane. True if anything changed."""
    initialized, cp_ready, reason, ready = await _control_plane(world, cluster)
    infra_ready = True  # the OpenStackCluster is ours: it stays ready
    if capi_infra.generic_cluster(cluster):
        infra_ready = await capi_infra.still_ready(world, cluster)
    conditions = _cluster_conditions(
        cluster, (initialized, cp_ready, reason), infra_ready=infra_ready
    )
    wanted = {
        "infrastructureReady": infra_ready,
        "controlPlaneReady": ready,
        "conditions": conditions,
    }
    if not status_differs(cluster.get("status") or {}, wanted):
        return False
    await world.write_status(CAPI_CLUSTER, cluster, wanted)
    return True


async def _delete_cluster(world: World, cluster: Json) -> None:
    """Deletion in Cluster API's order; returns early to wait for Machines, whose DELETED
    events nudge us."""
    if CLUSTER_FINALIZER not in finalizers_of(cluster):
        return
    namespace, name = _ns_name(cluster)
    if phase_of(cluster) != "Deleting":
        await world.write_status(CAPI_CLUSTER, cluster, {"phase": "Deleting"})
        return
    if capi_infra.generic_cluster(cluster):
        await _delete_generic(world, cluster)
        return
    kcp = await world.get(CONTROL_PLANE, namespace, _kcp_name(cluster))
    if kcp is not None:
        await _mark_kcp_deleting(world, kcp)
    machines = await world.list(MACHINE, namespace, f"{CLUSTER_NAME_LABEL}={name}")
    workers = [m for m in machines if CONTROL_PLANE_LABEL not in labels_of(m)]
    for stage in (workers, machines):
        if stage:
            for m in stage:
                if not is_deleting(m):
                    await world.delete(MACHINE, namespace, m["metadata"]["name"])
            return
    await _delete_leftovers(world, cluster)
    await world.remove_finalizer(CAPI_CLUSTER, cluster, CLUSTER_FINALIZER)


async def _delete_generic(world: World, cluster: Json) -> None:
    """CAPI's order for another provider's infrastructure (see the module docstring); each
    stage returns early, and the DELETED events of what it waits for bring it back."""
    namespace, name = _ns_name(cluster)
    await _delete_deployments(world, cluster)
    assisted = capi_assisted.assisted_control_plane(cluster)
    kcp = None if assisted else await world.get(CONTROL_PLANE, namespace, _kcp_name(cluster))
    if kcp is not None:
        await _mark_kcp_deleting(world, kcp)
    machines = await world.list(MACHINE, namespace, f"{CLUSTER_NAME_LABEL}={name}")
    workers = [m for m in machines if CONTROL_PLANE_LABEL not in labels_of(m)]
    # An OpenShift Assisted control plane is deleted as soon as the workers are gone, before
    # its Machines: left alive without them, its provider would create them again.
    stages = (workers,) if assisted else (workers, machines)
    for stage in stages:
        if stage:
            for m in stage:
                if not is_deleting(m):
                    await world.delete(MACHINE, namespace, m["metadata"]["name"])
            return
    if assisted and not await capi_assisted.release_control_plane(world, cluster, machines):
        return
    if kcp is not None:
        await world.delete(CONTROL_PLANE, namespace, kcp["metadata"]["name"])
    if not await capi_infra.release(world, cluster):
        return
    await world.delete(SECRET, namespace, f"{name}-kubeconfig")
    await world.remove_finalizer(CAPI_CLUSTER, cluster, CLUSTER_FINALIZER)


async def _delete_deployments(world: World, cluster: Json) -> None:
    namespace, name = _ns_name(cluster)
    # By spec.clusterName: the chart's MachineDeployments carry only the chart's labels.
    deployments, _ = await world.kube.list(MACHINE_DEPLOYMENT, namespace=namespace)
    for md in deployments:
        if cluster_name_of(md) == name and not is_deleting(md):
            await world.delete(MACHINE_DEPLOYMENT, namespace, md["metadata"]["name"])


async def _mark_kcp_deleting(world: World, kcp: Json) -> None:
    ready = find_condition(kcp, "Ready") or {}
    if ready.get("reason") == "Deleting":
        return
    existing = (kcp.get("status") or {}).get("conditions") or []
    others = [c for c in existing if c.get("type") != "Ready"]
    conditions = [condition("Ready", False, "Deleting"), *others]
    await world.write_status(CONTROL_PLANE, kcp, {"conditions": conditions})


async def _delete_leftovers(world: World, cluster: Json) -> None:
    namespace, name = _ns_name(cluster)
    await _delete_deployments(world, cluster)
    for osm in await world.list(OPENSTACK_MACHINE, namespace, f"{CLUSTER_NAME_LABEL}={name}"):
        await world.delete(OPENSTACK_MACHINE, namespace, osm["metadata"]["name"])
    await world.delete(CONTROL_PLANE, namespace, _kcp_name(cluster))
    ref = (cluster.get("spec") or {}).get("infrastructureRef") or {"name": name}
    await world.delete(OPENSTACK_CLUSTER, namespace, ref["name"])
    await world.delete(SECRET, namespace, f"{name}-kubeconfig")


async def on_cluster_deleted(world: World, cluster: Json) -> None:
    _nudge_dependents(world, cluster)


# --- KubeadmControlPlane -------------------------------------------------------------------


async def reconcile_control_plane(world: World, seen: Json) -> None:
    kcp = await world.kube.get(CONTROL_PLANE, *_ns_name(seen))
    namespace = kcp["metadata"]["namespace"]
    cluster = await world.get(CAPI_CLUSTER, namespace, cluster_name_of(kcp))
    if is_deleting(kcp) or cluster is None or is_deleting(cluster):
        return
    if not (kcp.get("status") or {}).get("conditions"):
        await world.write_status(CONTROL_PLANE, kcp, _waiting_status(kcp))
        return
    if not (cluster.get("status") or {}).get("infrastructureReady"):
        return  # the Cluster's Provisioned write nudges us
    if capi_infra.generic_cluster(cluster):
        await _ensure_kubeconfig(world, cluster, owner=cluster)
    machines = await list_machines(world, namespace, CONTROL_PLANE_NAME_LABEL, kcp)
    initialized = bool(kcp["status"].get("initialized")) or any(
        phase_of(m) == "Running" for m in machines
    )
    plan = _control_plane_plan(kcp, machines, initialized=initialized)
    if plan.create or plan.delete:
        await _carry_out(world, kcp, cluster, plan)
        machines = await list_machines(world, namespace, CONTROL_PLANE_NAME_LABEL, kcp)
    if initialized:
        await _ensure_kubeconfig(world, cluster, owner=kcp)
    wanted = _control_plane_status(kcp, machines, initialized=initialized)
    if status_differs(kcp["status"], wanted):
        await world.write_status(CONTROL_PLANE, kcp, wanted)
        world.offer(CAPI_CLUSTER, namespace, cluster["metadata"]["name"])


def _desired(kcp: Json) -> int:
    return int(kcp["spec"].get("replicas", 1))


def _template(kcp: Json) -> str:
    ref = kcp["spec"].get("machineTemplate", {}).get("infrastructureRef") or {}
    return template_hash(str(kcp["spec"].get("version", "")), str(ref.get("name", "")))


def _waiting_status(kcp: Json) -> Json:
    return {
        "version": kcp["spec"].get("version"),
        "replicas": 0,
        "readyReplicas": 0,
        "initialized": False,
        "ready": False,
        "conditions": [
            condition("Ready", False, "WaitingForKubeadmInit"),
            condition("Available", False, "WaitingForKubeadmInit"),
        ],
    }


def _control_plane_plan(kcp: Json, machines: list[Json], *, initialized: bool) -> Plan:
    if not initialized:  # kubeadm init runs on exactly one machine first
        return Plan(create=0 if machines else 1)
    rolling = (kcp["spec"].get("rolloutStrategy") or {}).get("rollingUpdate") or {}
    surge = int(rolling.get("maxSurge", 1)) > 0
    return plan_machines(
        machines, desired=_desired(kcp), template=_template(kcp), surge=surge, batch=False
    )


async def _carry_out(world: World, kcp: Json, cluster: Json, plan: Plan) -> None:
    namespace, name = _ns_name(kcp)
    for m in plan.delete:
        await world.delete(MACHINE, namespace, m["metadata"]["name"])
    template_meta = kcp["spec"].get("machineTemplate", {})
    labels = {
        **(template_meta.get("metadata", {}).get("labels") or {}),
        CLUSTER_NAME_LABEL: cluster["metadata"]["name"],
        CONTROL_PLANE_LABEL: "",
        CONTROL_PLANE_NAME_LABEL: name,
        TEMPLATE_HASH_LABEL: _template(kcp),
    }
    for _ in range(plan.create):
        created = await create_machine(
            world,
            owner=kcp,
            name=f"{name}-{random_suffix()}",
            labels=labels,
            version=str(kcp["spec"].get("version", "")),
            template_ref=template_meta.get("infrastructureRef") or {},
        )
        if not created:
            world.requeue(CONTROL_PLANE, kcp)


def _ready_reason(kcp: Json, machines: list[Json], *, initialized: bool) -> str:
    """Why Ready is False, or "" when it is True; Machines being deleted still count."""
    live = [m for m in machines if not is_deleting(m)]
    running = sum(phase_of(m) == "Running" for m in live)
    if not initialized:
        return "WaitingForKubeadmInit"
    if any(labels_of(m).get(TEMPLATE_HASH_LABEL) != _template(kcp) for m in machines):
        return "RollingUpdateInProgress"
    if len(machines) > _desired(kcp):
        return "ScalingDown"
    if len(live) < _desired(kcp) or running < len(live):
        return "ScalingUp"
    return ""


def _control_plane_status(kcp: Json, machines: list[Json], *, initialized: bool) -> Json:
    running = sum(phase_of(m) == "Running" for m in machines)
    updated = sum(labels_of(m).get(TEMPLATE_HASH_LABEL) == _template(kcp) for m in machines)
    reason = _ready_reason(kcp, machines, initialized=initialized)
    existing = kcp["status"].get("conditions") or []
    wanted = [
        condition("Ready", not reason, reason),
        condition("Available", initialized, "WaitingForKubeadmInit"),
    ]
    if not reason or find_condition(kcp, "ControlPlaneComponentsHealthy"):
        wanted.append(condition("ControlPlaneComponentsHealthy", True))
    return {
        "version": lowest_version(machines, str(kcp["spec"].get("version", ""))),
        "replicas": len(machines),
        "updatedReplicas": updated,
        "readyReplicas": running,
        "unavailableReplicas": len(machines) - running,
        "initialized": initialized,
        "ready": initialized and running > 0,
        "observedGeneration": kcp["metadata"].get("generation"),
        "conditions": merge_conditions(existing, wanted),
    }


async def _ensure_kubeconfig(world: World, cluster: Json, *, owner: Json) -> None:
    """Its value is ``STANDIN_CAPI_KUBECONFIG``'s file, else a placeholder for the endpoint."""
    namespace, name = _ns_name(cluster)
    if await world.get(SECRET, namespace, f"{name}-kubeconfig") is not None:
        return
    endpoint = (cluster.get("spec") or {}).get("controlPlaneEndpoint") or {}
    value = world.knobs.kubeconfig or kubeconfig_text(
        str(endpoint.get("host", "")), int(endpoint.get("port") or API_PORT), name
    )
    secret = kubeconfig_secret(cluster=name, namespace=namespace, value=value, owner=owner)
    await world.kube.create(SECRET, secret)
