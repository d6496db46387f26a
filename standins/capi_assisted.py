"""Cluster API core for a control plane and a bootstrap provider that are not ours: OpenShift
Assisted (cluster-api-provider-openshift-assisted, capibus's ``assistedcontrolplane`` and
``assistedbootstrap`` services).

On the kubeadm path the stand-in plays the KubeadmControlPlane and the kubeadm bootstrap
provider itself. A Cluster whose ``spec.controlPlaneRef`` is an
``OpenshiftAssistedControlPlane`` and Machines whose ``spec.bootstrap.configRef`` is an
``OpenshiftAssistedConfig`` belong to real programs; the stand-in does only what CAPI core
does for them (upstream ``internal/controllers/cluster/cluster_controller_phases.go``,
``internal/controllers/machine/machine_controller_phases.go``, the MachineSet controller):

- the control plane gets the Cluster's ownerReference (not as controller: CAPI only links it)
  and the label ``cluster.x-k8s.io/cluster-name``; its provider waits for that reference.
  The stand-in creates no control-plane Machines: the provider does;
- ``Cluster.status.controlPlaneReady`` mirrors the control plane's ``status.ready``, and
  ``ControlPlaneInitialized`` follows its ``status.initialized`` (the admin kubeconfig exists);
- a Machine's bootstrap config gets the Machine's controller ownerReference (only an owner
  link if something else already controls it) and the cluster-name label, and once the
  config says ``status.ready`` with ``status.dataSecretName`` that name is copied to
  ``Machine.spec.bootstrap.dataSecretName``: CAPI writes no bootstrap Secret of its own here;
- a MachineDeployment whose template names an ``OpenshiftAssistedConfigTemplate`` gets a
  MachineSet, as in CAPI, which owns its Machines: the bootstrap provider finds a worker's
  infrastructure template through the Machine's owning MachineSet
  (``bootstrap/internal/controller/openshiftassistedconfig_controller.go``). Each Machine gets
  an OpenshiftAssistedConfig cloned from the template's ``spec.template`` under the Machine's
  name and labels, and its infrastructure machine as on any generic path (``capi_infra``);
- a Machine being deleted deletes its bootstrap config too and keeps its finalizer until the
  config is gone (the bootstrap provider's finalizer decides when), as CAPI's
  ``reconcileDelete`` waits for both external objects;
- a Cluster being deleted deletes its control plane once the workers are gone and waits for it
  to go (its provider's finalizer), deleting its Machines meanwhile as the garbage collector
  would once the control plane is gone, then the infrastructure cluster (``capi_cluster``).
"""

from __future__ import annotations

import copy

from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    MACHINE_SET,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONFIG_TEMPLATE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
)
from standins.base import Json
from standins.capi_shapes import (
    CLUSTER_NAME_LABEL,
    DEPLOYMENT_NAME_LABEL,
    adopted,
    is_deleting,
    labels_of,
    owner_ref,
)
from standins.capi_world import World

WAIT = 1.0  # seconds: a safety requeue while waiting on another program's objects

ACP = OPENSHIFT_ASSISTED_CONTROL_PLANE
OAC = OPENSHIFT_ASSISTED_CONFIG
OACT = OPENSHIFT_ASSISTED_CONFIG_TEMPLATE


def _ns_name(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


# --- the control plane ---------------------------------------------------------------------


def assisted_control_plane(cluster: Json) -> bool:
    ref = (cluster.get("spec") or {}).get("controlPlaneRef") or {}
    return ref.get("kind") == ACP.kind


def _control_plane_name(cluster: Json) -> str:
    ref = (cluster.get("spec") or {}).get("controlPlaneRef") or {}
    return str(ref.get("name") or f"{cluster['metadata']['name']}-control-plane")


async def adopt_control_plane(world: World, cluster: Json) -> Json | None:
    """The Cluster's control plane, linked to it (owner and label); None: not there."""
    namespace, name = _ns_name(cluster)
    acp = await world.get(ACP, namespace, _control_plane_name(cluster))
    if acp is None or is_deleting(acp):
        return acp
    refs = adopted(acp, cluster, controller=False)
    if refs is None and labels_of(acp).get(CLUSTER_NAME_LABEL) == name:
        return acp
    meta: Json = {"labels": {CLUSTER_NAME_LABEL: name}}
    if refs is not None:
        meta["ownerReferences"] = refs
    return await world.patch(ACP, acp, {"metadata": meta})


def control_plane_state(acp: Json | None) -> tuple[bool, bool]:
    """(initialized, ready) as the control plane reports them."""
    status = (acp or {}).get("status") or {}
    return bool(status.get("initialized")), bool(status.get("ready"))


async def release_control_plane(world: World, cluster: Json, machines: list[Json]) -> bool:
    """Deletion, once the workers are gone: the control plane and its Machines; True once
    both are gone."""
    namespace, _ = _ns_name(cluster)
    acp = await world.get(ACP, namespace, _control_plane_name(cluster))
    if acp is not None and not is_deleting(acp):
        await world.delete(ACP, namespace, acp["metadata"]["name"])
    for m in machines:
        if not is_deleting(m):
            await world.delete(MACHINE, namespace, m["metadata"]["name"])
    if acp is None and not machines:
        return True
    world.requeue(CAPI_CLUSTER, cluster, WAIT)
    return False


async def control_plane_changed(world: World, acp: Json) -> None:
    """The control plane changed or went: its Cluster looks again."""
    namespace = acp["metadata"]["namespace"]
    names = {labels_of(acp).get(CLUSTER_NAME_LABEL, "")}
    names |= {
        str(r["name"])
        for r in acp["metadata"].get("ownerReferences") or []
        if r.get("kind") == CAPI_CLUSTER.kind
    }
    for name in names - {""}:
        world.offer(CAPI_CLUSTER, namespace, name)


# --- bootstrap configs ---------------------------------------------------------------------


def config_ref(machine: Json) -> Json | None:
    """The Machine's OpenshiftAssistedConfig reference, if that is its bootstrap."""
    ref = ((machine.get("spec") or {}).get("bootstrap") or {}).get("configRef") or {}
    return dict(ref) if ref.get("kind") == OAC.kind else None


async def bootstrap(world: World, machine: Json) -> bool:
    """True once the Machine names its bootstrap data; else maybe one step towards it."""
    if (machine["spec"].get("bootstrap") or {}).get("dataSecretName"):
        return True
    ref = config_ref(machine) or {}
    namespace, name = _ns_name(machine)
    oac = await world.get(OAC, namespace, str(ref.get("name") or name))
    if oac is None or is_deleting(oac):
        return False  # its creation (an event on the config) brings the Machine back
    cluster = str(machine["spec"].get("clusterName") or labels_of(machine)[CLUSTER_NAME_LABEL])
    refs = adopted(oac, machine, controller=True)
    if refs is not None or labels_of(oac).get(CLUSTER_NAME_LABEL) != cluster:
        meta: Json = {"labels": {CLUSTER_NAME_LABEL: cluster}}
        if refs is not None:
            meta["ownerReferences"] = refs
        await world.patch(OAC, oac, {"metadata": meta})
        return False  # the provider answers the link; its status event brings us back
    status = oac.get("status") or {}
    secret = status.get("dataSecretName")
    if not (status.get("ready") and secret):
        return False
    await world.knobs.step()
    await world.patch(MACHINE, machine, {"spec": {"bootstrap": {"dataSecretName": secret}}})
    return False  # our spec write brings the Machine back


async def retire_config(world: World, machine: Json) -> bool:
    """A Machine being deleted: its bootstrap config goes too; True once gone."""
    ref = config_ref(machine)
    if ref is None:
        return True
    namespace, _ = _ns_name(machine)
    oac = await world.get(OAC, namespace, str(ref.get("name")))
    if oac is None:
        return True
    if not is_deleting(oac):
        await world.delete(OAC, namespace, oac["metadata"]["name"])
    world.requeue(MACHINE, machine, WAIT)
    return False


async def config_changed(world: World, oac: Json) -> None:
    """A bootstrap config changed or went: its Machine looks again."""
    namespace, name = _ns_name(oac)
    owners = {
        str(r["name"])
        for r in oac["metadata"].get("ownerReferences") or []
        if r.get("kind") == MACHINE.kind
    }
    for machine in owners | {name}:
        world.offer(MACHINE, namespace, machine)


# --- MachineDeployments with an OpenshiftAssistedConfigTemplate ----------------------------


def assisted_deployment(md: Json) -> bool:
    template = (md.get("spec") or {}).get("template") or {}
    ref = ((template.get("spec") or {}).get("bootstrap") or {}).get("configRef") or {}
    return ref.get("kind") == OACT.kind


async def config_template(world: World, md: Json) -> Json | None:
    spec = md["spec"].get("template", {}).get("spec") or {}
    ref = (spec.get("bootstrap") or {}).get("configRef") or {}
    return await world.get(OACT, md["metadata"]["namespace"], str(ref.get("name")))


async def create_config(
    world: World, *, template: Json, namespace: str, name: str, labels: dict[str, str]
) -> Json:
    """The Machine's OpenshiftAssistedConfig cloned from ``template``; its reference."""
    resource = template.get("spec", {}).get("template", {})
    extra = resource.get("metadata") or {}
    oac = {
        "apiVersion": OAC.api_version,
        "kind": OAC.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(extra.get("labels") or {}), **labels},
            "annotations": {
                **(extra.get("annotations") or {}),
                "cluster.x-k8s.io/cloned-from-name": template["metadata"]["name"],
                "cluster.x-k8s.io/cloned-from-groupkind": f"{OACT.kind}.{OACT.group}",
            },
        },
        "spec": copy.deepcopy(resource.get("spec") or {}),
    }
    await world.knobs.step()
    await world.kube.create(OAC, oac)
    return {"apiVersion": OAC.api_version, "kind": OAC.kind, "name": name, "namespace": namespace}


async def machine_set(
    world: World, md: Json, *, name: str, labels: dict[str, str], replicas: int
) -> Json:
    """The MachineSet ``name`` of ``md`` (its Machines' owner), created or resized."""
    namespace = md["metadata"]["namespace"]
    found = await world.get(MACHINE_SET, namespace, name)
    if found is not None:
        if found["spec"].get("replicas") != replicas:
            found = await world.patch(MACHINE_SET, found, {"spec": {"replicas": replicas}})
        return found
    template = copy.deepcopy(md["spec"].get("template") or {})
    template.setdefault("metadata", {})["labels"] = {
        **(template.get("metadata", {}).get("labels") or {}),
        **labels,
    }
    selector = {CLUSTER_NAME_LABEL: labels[CLUSTER_NAME_LABEL]}
    selector[DEPLOYMENT_NAME_LABEL] = labels[DEPLOYMENT_NAME_LABEL]
    obj = {
        "apiVersion": MACHINE_SET.api_version,
        "kind": MACHINE_SET.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_ref(md, controller=True)],
        },
        "spec": {
            "clusterName": labels[CLUSTER_NAME_LABEL],
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }
    return await world.kube.create(MACHINE_SET, obj)


async def delete_machine_sets(world: World, md: Json) -> None:
    namespace, name = _ns_name(md)
    for ms in await world.list(MACHINE_SET, namespace, f"{DEPLOYMENT_NAME_LABEL}={name}"):
        if not is_deleting(ms):
            await world.delete(MACHINE_SET, namespace, ms["metadata"]["name"])
