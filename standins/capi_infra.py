"""Cluster API core for an infrastructure provider that is a real program (metal-stack's, or
metal3's as the host stand-in ``standins.assisted.hosts`` plays it).

On the OpenStack path the stand-in plays the infrastructure provider too: it makes the
OpenStackCluster and OpenStackMachines ready itself. Any other ``spec.infrastructureRef``
kind (``MetalStackCluster``; generically, a ``<Kind>`` with machines ``<Prefix>Machine`` cloned
from ``<Prefix>MachineTemplate``) belongs to a provider that is not ours, and the stand-in does
only what CAPI core does for it (upstream ``internal/controllers/cluster``,
``internal/controllers/machine``, the kubeadm bootstrap and control-plane providers), never
the provider's part:

- the infrastructure cluster gets the Cluster's ownerReference and the label
  ``cluster.x-k8s.io/cluster-name``; the provider waits for that reference;
- ``Cluster.status.infrastructureReady`` mirrors the infrastructure cluster's ``status.ready``
  and never runs ahead of it; its ``spec.controlPlaneEndpoint`` is copied to the Cluster once
  its host is set, and the Cluster is ``Provisioned`` when both are there;
- each Machine's infrastructure machine is cloned from the owner's template and gets the
  Machine's controller reference once the Machine exists;
- a bootstrap Secret ``<machine>-bootstrap`` is written once the Cluster's infrastructure is
  ready, and only then ``Machine.spec.bootstrap.dataSecretName`` (a step delay later), as the
  kubeadm bootstrap provider's Secret precedes the Machine controller's copy of its name: a
  provider must wait for the name, not guess it;
- a Machine is ``Provisioned`` once its infrastructure machine says ``status.ready`` (its
  ``spec.providerID`` copied to the Machine), ``Running`` a step later; being deleted, it
  deletes its infrastructure machine and keeps its finalizer until that is gone;
- the infrastructure cluster is deleted after every Machine and infrastructure machine of the
  cluster is gone, and the Cluster's finalizer goes after it (``capi_cluster``).

The MetalStackFirewall is the provider's alone: nothing here reads or writes it. Watches on
the infrastructure kinds (``WATCHED``) only nudge the CAPI objects that wait on them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from shared.kube import ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METAL3_CLUSTER,
    METAL3_MACHINE,
    METAL3_MACHINE_TEMPLATE,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE,
    METALSTACK_MACHINE_TEMPLATE,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    SECRET,
)
from standins.base import Json
from standins.capi_shapes import (
    CLUSTER_NAME_LABEL,
    OPENSTACK_MACHINE_TEMPLATE,
    bootstrap_secret,
    has_owner,
    infrastructure_machine,
    is_deleting,
    labels_of,
    owner_ref,
)
from standins.capi_world import World

API_PORT = 6443
WAIT = 1.0  # seconds: a safety requeue while waiting on another program's objects

_KNOWN = {
    kind.kind: kind
    for kind in (
        OPENSTACK_CLUSTER,
        OPENSTACK_MACHINE,
        OPENSTACK_MACHINE_TEMPLATE,
        METALSTACK_CLUSTER,
        METALSTACK_MACHINE,
        METALSTACK_MACHINE_TEMPLATE,
        METAL3_CLUSTER,
        METAL3_MACHINE,
        METAL3_MACHINE_TEMPLATE,
    )
}
_OPENSTACK = {OPENSTACK_CLUSTER.kind, OPENSTACK_MACHINE.kind, OPENSTACK_MACHINE_TEMPLATE.kind}

#: infrastructure (cluster, machine) kinds watched, so their changes reach the CAPI objects
WATCHED = ((METALSTACK_CLUSTER, METALSTACK_MACHINE), (METAL3_CLUSTER, METAL3_MACHINE))

Handler = Callable[[World, Json], Awaitable[None]]


# --- kinds ---------------------------------------------------------------------------------


def is_generic(ref: Json | None) -> bool:
    """Whether ``ref`` names infrastructure of a provider other than OpenStack (the chart's,
    whose references may leave the kind out)."""
    kind = str((ref or {}).get("kind") or "")
    return bool(kind) and kind not in _OPENSTACK


def kind_of(ref: Json) -> ResourceKind:
    """The kind ``ref`` names: a known one, else derived (plural: lower-case kind + s)."""
    kind = str(ref.get("kind") or "")
    group, _, version = str(ref.get("apiVersion") or "").rpartition("/")
    known = _KNOWN.get(kind)
    # Our CRDs serve one version of each known kind; a reference may still name another.
    if known is not None and (not group or group == known.group):
        return known
    return ResourceKind(kind.lower(), group, version, kind, f"{kind.lower()}s")


def _renamed(kind: ResourceKind, old: str, new: str) -> ResourceKind:
    name = kind.kind.removesuffix(old) + new
    return kind_of({"apiVersion": kind.api_version, "kind": name})


def infra_ref(cluster: Json) -> Json:
    return dict((cluster.get("spec") or {}).get("infrastructureRef") or {})


def generic_cluster(cluster: Json) -> bool:
    return is_generic(infra_ref(cluster))


def generic_machine(machine: Json) -> bool:
    return is_generic((machine.get("spec") or {}).get("infrastructureRef"))


def _ready(obj: Json | None) -> bool:
    return obj is not None and bool((obj.get("status") or {}).get("ready"))


def _ns_name(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


# --- the infrastructure cluster ------------------------------------------------------------


async def observe(world: World, cluster: Json) -> Json | None:
    """The Cluster's infrastructure cluster, owned by and labelled for it; None: not there."""
    namespace, name = _ns_name(cluster)
    ref = infra_ref(cluster)
    kind = kind_of(ref)
    infra = await world.get(kind, namespace, str(ref.get("name") or name))
    if infra is None or is_deleting(infra):
        return infra
    owned = has_owner(infra, cluster)
    if owned and labels_of(infra).get(CLUSTER_NAME_LABEL) == name:
        return infra
    meta: Json = {"labels": {CLUSTER_NAME_LABEL: name}}
    if not owned:
        # No controller flag: the provider owns the object's life, CAPI only links it.
        refs = infra["metadata"].get("ownerReferences") or []
        meta["ownerReferences"] = [*refs, owner_ref(cluster, controller=False)]
    return await world.patch(kind, infra, {"metadata": meta})


def _endpoint(infra: Json) -> Json | None:
    endpoint = (infra.get("spec") or {}).get("controlPlaneEndpoint") or {}
    if not endpoint.get("host"):
        return None
    return {"host": endpoint["host"], "port": int(endpoint.get("port") or API_PORT)}


async def provision(world: World, cluster: Json) -> bool:
    """True once the infrastructure is ready and the Cluster has its endpoint."""
    infra = await observe(world, cluster)
    if infra is None:
        world.requeue(CAPI_CLUSTER, cluster)  # not created yet: no event of ours will come
        return False
    if not _ready(infra):
        return False  # its next change nudges the Cluster (``WATCHED``)
    if ((cluster.get("spec") or {}).get("controlPlaneEndpoint") or {}).get("host"):
        return True  # an endpoint set on the Cluster wins, as in CAPI
    endpoint = _endpoint(infra)
    if endpoint is not None:
        await world.patch(CAPI_CLUSTER, cluster, {"spec": {"controlPlaneEndpoint": endpoint}})
    return False  # our spec write (or the provider's endpoint) brings the Cluster back


async def still_ready(world: World, cluster: Json) -> bool:
    """A provisioned Cluster's ``infrastructureReady``: the infrastructure cluster's now."""
    return _ready(await observe(world, cluster))


async def release(world: World, cluster: Json) -> bool:
    """Deletion, after the Machines: the cluster's leftover infrastructure machines, then the
    infrastructure cluster; True once both are gone."""
    namespace, name = _ns_name(cluster)
    ref = infra_ref(cluster)
    kind = kind_of(ref)
    machine_kind = _renamed(kind, "Cluster", "Machine")
    leftovers = await world.list(machine_kind, namespace, f"{CLUSTER_NAME_LABEL}={name}")
    infra = await world.get(kind, namespace, str(ref.get("name") or name))
    waiting = leftovers or ([infra] if infra is not None else [])
    for obj in waiting:
        if not is_deleting(obj):
            found_kind = machine_kind if leftovers else kind
            await world.delete(found_kind, namespace, obj["metadata"]["name"])
    if waiting:
        world.requeue(CAPI_CLUSTER, cluster, WAIT)
    return not waiting


# --- machines ------------------------------------------------------------------------------


async def create_machine(
    world: World, *, namespace: str, name: str, labels: dict[str, str], template_ref: Json
) -> Json | None:
    """The infrastructure machine cloned from ``template_ref``; the Machine's reference to
    it, or None while the template does not exist."""
    template_kind = kind_of(template_ref)
    template = await world.get(template_kind, namespace, str(template_ref.get("name")))
    if template is None:
        return None
    kind = _renamed(template_kind, "Template", "")
    await world.knobs.step()
    obj = infrastructure_machine(
        kind=kind, name=name, namespace=namespace, labels=labels, template=template
    )
    await world.kube.create(kind, obj)
    return {"apiVersion": kind.api_version, "kind": kind.kind, "name": name, "namespace": namespace}


def _machine_ref(machine: Json) -> tuple[ResourceKind, str, str]:
    ref = machine["spec"].get("infrastructureRef") or {}
    namespace, name = _ns_name(machine)
    return kind_of(ref), namespace, str(ref.get("name") or name)


async def bootstrap(world: World, machine: Json) -> bool:
    """True once the Machine names its bootstrap data; else maybe one step towards it."""
    if (machine["spec"].get("bootstrap") or {}).get("dataSecretName"):
        return True
    namespace = machine["metadata"]["namespace"]
    cluster = await world.get(CAPI_CLUSTER, namespace, str(machine["spec"].get("clusterName")))
    if not (cluster and (cluster.get("status") or {}).get("infrastructureReady")):
        return False  # the Cluster nudges its Machines when that changes
    secret = bootstrap_secret(machine)
    if await world.get(SECRET, namespace, secret["metadata"]["name"]) is None:
        await world.knobs.step()
        await world.kube.create(SECRET, secret)
    await world.knobs.step()  # the window in which the Secret exists but is not named yet
    patch = {"spec": {"bootstrap": {"dataSecretName": secret["metadata"]["name"]}}}
    await world.patch(MACHINE, machine, patch)
    return False  # our spec write brings the Machine back


async def provisioned(world: World, machine: Json) -> Json | None:
    """The Machine with its providerID once its infrastructure machine is ready, else None."""
    infra = await world.get(*_machine_ref(machine))
    if infra is None or not _ready(infra):
        return None  # its next change nudges the Machine (``WATCHED``)
    provider_id = (infra.get("spec") or {}).get("providerID")
    if provider_id and machine["spec"].get("providerID") != provider_id:
        return await world.patch(MACHINE, machine, {"spec": {"providerID": provider_id}})
    return machine


async def addresses(world: World, machine: Json) -> list[Json]:
    infra = await world.get(*_machine_ref(machine))
    return list(((infra or {}).get("status") or {}).get("addresses") or [])


async def retire(world: World, machine: Json) -> bool:
    """A Machine being deleted: its infrastructure machine goes first; True once gone."""
    kind, namespace, name = _machine_ref(machine)
    infra = await world.get(kind, namespace, name)
    if infra is None:
        return True
    if not is_deleting(infra):
        await world.delete(kind, namespace, name)
    world.requeue(MACHINE, machine, WAIT)  # the provider releases it in its own time
    return False


# --- watches on the provider's objects -----------------------------------------------------


def cluster_watcher(kind: ResourceKind) -> Handler:
    """An infrastructure cluster changed or went: its CAPI Clusters look again."""

    async def nudge(world: World, obj: Json) -> None:
        namespace, name = _ns_name(obj)
        for cluster in world.known(CAPI_CLUSTER):
            ref = infra_ref(cluster)
            if (
                cluster["metadata"].get("namespace") == namespace
                and ref.get("kind") == kind.kind
                and ref.get("name") == name
            ):
                world.offer(CAPI_CLUSTER, namespace, cluster["metadata"]["name"])

    return nudge


async def machine_changed(world: World, obj: Json) -> None:
    """An infrastructure machine changed: its Machine looks again."""
    namespace, name = _ns_name(obj)
    owners = {
        r["name"] for r in obj["metadata"].get("ownerReferences") or [] if r["kind"] == "Machine"
    }
    for machine in owners | {name}:
        world.offer(MACHINE, namespace, machine)


async def machine_gone(world: World, obj: Json) -> None:
    """An infrastructure machine went: its Machine and, deleting, its Cluster look again."""
    await machine_changed(world, obj)
    cluster = labels_of(obj).get(CLUSTER_NAME_LABEL)
    if cluster:
        world.offer(CAPI_CLUSTER, obj["metadata"]["namespace"], cluster)
