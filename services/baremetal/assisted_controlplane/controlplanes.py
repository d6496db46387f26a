"""The OpenshiftAssistedControlPlane: pull secret, ClusterDeployment, control-plane Machines.

Upstream's order (``controlplane/internal/controller/openshiftassistedcontrolplane_controller.go``
of openshift-assisted/cluster-api-provider-openshift-assisted v0.2.0), each step converging from
what exists rather than from what this process remembers:

1. the owner ``Cluster`` set by Cluster API (nothing is done before; the finalizer written at
   once would race Cluster API's write of the owner and meet a conflict); the finalizer; then
   ``spec.version``: not semver is a ``PermanentError`` (a condition on the ACP, then a dead
   letter); below 4.14.0 ``MachinesCreated`` False / ``MachineGenerationFailed`` with
   upstream's message, and nothing more;
2. the ``Cluster``, its ``infrastructureReady`` and a valid ``controlPlaneEndpoint``: each
   arrives as an event of the ACP or of its Cluster, so waiting is simply returning (upstream
   polled every 10 s and 20 s);
3. with no ``spec.config.pullSecretRef``, the placeholder pull secret (upstream's exact content)
   and the reference written into the ACP's spec (``shared.owned.set_spec``). Upstream failed
   when the secret existed (a second ACP in the namespace, or a run that died before writing
   the reference); here an existing one is used, and gains this ACP as an owner too, so garbage
   collection keeps it while any ACP that refers to it lives. It is read before it is made,
   and the namespace's ACPs take turns at it;
4. the ClusterDeployment named like the ACP, by server-side apply (field manager
   ``capibus-assistedcontrolplane``), only when it lacks what we apply; one being deleted is
   waited for, and one that is gone is made again (its DELETED event wakes the ACP);
5. the replicas: for each missing Machine, clone the infrastructure template, create the OAC,
   then the Machine, all three under one name. A Machine that fails rolls the other two back
   (``MachineGenerationFailed``) unless it turns out to exist after all (a timeout). A run that
   died between the steps left an OAC or a clone without its Machine: the next run completes
   that name rather than drawing a new one, so a killed replica never leaves more Machines
   than ``spec.replicas``. Scale-down is not implemented (as upstream v0.2.0);
6. the status, through the writer, only when it differs from what the ACP shows.

Deletion deletes the ClusterDeployment (hive's finalizers unbind the Agents and deregister the
cluster, then the ACI goes with it) and lets go of the ACP once the ClusterDeployment's DELETED
event says it is gone. Machines, OACs and clones are garbage-collected through their owner
references to the ACP.

A run starts from the ACP, its Cluster, ClusterDeployment and ACI as this replica last saw
them (``shared.seen.Seen.get``: their events keep them current; only the Machines are
listed, as they decide what is made); where it ended is recorded (``shared.seen.Seen.decide``)
only when everything it waits for wakes it by an event: its Cluster, its Machines, its
ClusterDeployment's deletion, its ACI, its kubeconfig Secret.
"""

from __future__ import annotations

import contextlib
import logging

from services.baremetal.assisted_controlplane import logic
from services.baremetal.assisted_controlplane.logic import ACP, FIELD_MANAGER, Json
from services.baremetal.assisted_controlplane.ports import Deps
from shared.errors import CapibusError, KubeConflict, KubeNotFound, PermanentError, TemporaryError
from shared.kube import ResourceKind
from shared.messages import Condition, Message
from shared.owned import add_finalizer, patch_owned, remove_finalizer, set_spec
from shared.reconcile import Target, get_or_none, report
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    MACHINE,
    METAL3_MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
    SECRET,
    owner_reference,
)
from shared.seen import key_of

log = logging.getLogger(__name__)

KIND = ACP


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    acp = await deps.seen.get(deps.kube, KIND, target.namespace, target.name)
    if acp is None:
        deps.seen.forget(target.key)
        return []
    if logic.deleting(acp):
        await _delete(acp, cause, deps)
        deps.seen.forget(target.key)
        return []
    if logic.owner_name(acp, "Cluster") is None:
        # Cluster API sets it right after the ACP is made (this object's next event); nothing
        # is made before, so neither is the finalizer, which would race that write (a 409)
        log.debug("%s: waiting for Cluster API to set the owner Cluster", target.key)
        deps.seen.decide(target.key, acp)
        return []
    acp = deps.seen.note(target.key, await add_finalizer(deps.kube, KIND, acp, logic.ACP_FINALIZER))
    if not await _version_supported(acp, cause, deps):
        return []
    cluster = await _cluster(acp, deps)
    if cluster is None or logic.paused(cluster, acp) or not logic.infrastructure_ready(cluster):
        # each of these ends with an event of the ACP or of its Cluster
        log.debug("%s: waiting for its Cluster (owner, infrastructure, unpaused)", target.key)
        deps.seen.decide(target.key, acp)
        return []
    name = logic.name_of(cluster)
    acp = deps.seen.note(target.key, await _pull_secret(acp, deps))
    cd = await _cluster_deployment(acp, name, deps)
    machines = await _replicas(acp, name, cause, deps)
    fields, conditions = await _report_status(
        acp, cluster=name, machines=machines, cd=cd, cause=cause, deps=deps
    )
    deps.seen.decide(target.key, acp, fields, conditions)
    return []


# --- gates ----------------------------------------------------------------------------------


async def _version_supported(acp: Json, cause: Message, deps: Deps) -> bool:
    version = str(logic.spec(acp).get("version") or "")
    try:
        refusal = logic.unsupported_version(version)
    except PermanentError as exc:
        failed = logic.condition(logic.MACHINES_CREATED, False, exc.reason, str(exc))
        await _report(acp, {}, [failed], cause, deps)
        raise
    if refusal is None:
        return True
    failed = logic.condition(
        logic.MACHINES_CREATED, False, logic.MACHINE_GENERATION_FAILED, refusal
    )
    generation = logic.meta(acp).get("generation")
    await _report(acp, {"observedGeneration": generation}, [failed], cause, deps)
    return False


async def _cluster(acp: Json, deps: Deps) -> Json | None:
    owner = logic.owner_name(acp, "Cluster")
    if owner is None:
        return None
    return await deps.seen.get(deps.kube, CAPI_CLUSTER, logic.meta(acp)["namespace"], owner)


# --- the pull secret and the ClusterDeployment ----------------------------------------------


async def _pull_secret(acp: Json, deps: Deps) -> Json:
    """The placeholder, read before it is created: every ACP of a namespace without a pull
    secret shares it, and they take turns at it (a lock per namespace), so the first creates
    it and the others find it and add themselves as owners, one preconditioned patch each,
    instead of a race of refused creates and owner patches."""
    if logic.config(acp).get("pullSecretRef"):
        return acp
    namespace = logic.meta(acp)["namespace"]
    async with deps.locks(f"placeholder/{namespace}"):
        secret = await get_or_none(deps.kube, SECRET, namespace, logic.PLACEHOLDER_PULL_SECRET)
        if secret is None:
            try:
                await deps.kube.create(SECRET, logic.placeholder_pull_secret(acp))
            except KubeConflict:  # another replica's ACP made it meanwhile
                secret = await deps.kube.get(SECRET, namespace, logic.PLACEHOLDER_PULL_SECRET)
        if secret is not None:
            await _share_placeholder(acp, secret, deps)
    reference = {"config": {"pullSecretRef": {"name": logic.PLACEHOLDER_PULL_SECRET}}}
    return await set_spec(deps.kube, KIND, acp, reference)


async def _share_placeholder(acp: Json, secret: Json, deps: Deps) -> None:
    if logic.owned_by(secret, acp):
        return
    owners = [*(logic.meta(secret).get("ownerReferences") or [])]
    owners.append(owner_reference(KIND, acp, controller=False))
    await patch_owned(deps.kube, SECRET, secret, {"metadata": {"ownerReferences": owners}})


async def _cluster_deployment(acp: Json, cluster: str, deps: Deps) -> Json | None:
    """The ClusterDeployment as it stands after this run (None while one is being deleted)."""
    desired = logic.cluster_deployment(acp, cluster)
    namespace, name = logic.meta(acp)["namespace"], logic.name_of(acp)
    cd = await deps.seen.get(deps.kube, CLUSTER_DEPLOYMENT, namespace, name)
    if cd is not None and logic.deleting(cd):
        log.info("%s: waiting for its ClusterDeployment to go before making it again", name)
        return None
    if cd is None or not logic.holds(cd, desired):
        cd = await deps.kube.apply(CLUSTER_DEPLOYMENT, desired, field_manager=FIELD_MANAGER)
        deps.seen.note(key_of(CLUSTER_DEPLOYMENT, namespace, name), cd)
    return cd


# --- replicas -------------------------------------------------------------------------------


async def _replicas(acp: Json, cluster: str, cause: Message, deps: Deps) -> list[Json]:
    """The ACP's Machines after creating the missing ones."""
    namespace = logic.meta(acp)["namespace"]
    listed, _ = await deps.kube.list(
        MACHINE, namespace=namespace, label_selector=f"{logic.CLUSTER_NAME_LABEL}={cluster}"
    )
    machines = [m for m in listed if logic.owned_by(m, acp)]
    missing = int(logic.spec(acp).get("replicas") or 0) - len(machines)
    if missing <= 0:
        return machines
    try:
        infra_kind = _infra_kind(acp)
    except PermanentError as exc:
        await _creation_failed(acp, exc.reason, str(exc), cause, deps)
        raise
    oacs = await _owned_parts(acp, OPENSHIFT_ASSISTED_CONFIG, deps)
    clones = await _owned_parts(acp, infra_kind, deps)
    resume, stale = logic.pending_names(machines, [*oacs.values(), *clones.values()])
    surplus = resume[missing:]
    for name in [*stale, *surplus]:
        await _roll_back(namespace, name, infra_kind, deps)
    names = resume[:missing]
    names += [deps.names(acp) for _ in range(missing - len(names))]
    template: Json | None = None
    for name in names:
        if name not in clones:
            template = template or await _template(acp, cause, deps)
        made = await _replica(
            acp,
            cluster=cluster,
            name=name,
            template=template,
            present=(name in oacs, name in clones),
            cause=cause,
            deps=deps,
        )
        machines.append(made)
    return machines


def _infra_kind(acp: Json) -> ResourceKind:
    """The kind the infrastructure template clones into (a Metal3Machine for CAPM3)."""
    ref = (logic.spec(acp).get("machineTemplate") or {}).get("infrastructureRef") or {}
    api_version, kind = str(ref.get("apiVersion") or ""), str(ref.get("kind") or "")
    if "/" not in api_version or not kind.endswith("Template") or not ref.get("name"):
        raise PermanentError(
            f"{logic.object_key(acp)}: spec.machineTemplate.infrastructureRef must name an "
            f"infrastructure machine template (apiVersion group/version, kind *Template, name); "
            f"got {ref!r}",
            reason=logic.INFRA_CLONING_FAILED,
        )
    group, version = api_version.split("/", 1)
    machine_kind = kind.removesuffix("Template")
    if (group, machine_kind) == (METAL3_MACHINE.group, METAL3_MACHINE.kind):
        return METAL3_MACHINE
    return ResourceKind(
        machine_kind.lower(), group, version, machine_kind, f"{machine_kind}s".lower()
    )


async def _owned_parts(acp: Json, kind: ResourceKind, deps: Deps) -> dict[str, Json]:
    selector = f"{logic.CONTROL_PLANE_NAME_LABEL}={logic.name_of(acp)}"
    items, _ = await deps.kube.list(
        kind, namespace=logic.meta(acp)["namespace"], label_selector=selector
    )
    return {logic.name_of(i): i for i in items if logic.owned_by(i, acp)}


async def _template(acp: Json, cause: Message, deps: Deps) -> Json:
    ref = (logic.spec(acp).get("machineTemplate") or {}).get("infrastructureRef") or {}
    group, version = str(ref["apiVersion"]).split("/", 1)
    kind = ResourceKind(
        str(ref["kind"]).lower(), group, version, str(ref["kind"]), f"{ref['kind']}s".lower()
    )
    namespace = ref.get("namespace") or logic.meta(acp)["namespace"]
    try:
        return await deps.kube.get(kind, namespace, str(ref["name"]))
    except KubeNotFound:
        message = f"infrastructure template {ref['kind']} {namespace}/{ref['name']} not found"
        await _creation_failed(acp, logic.INFRA_CLONING_FAILED, message, cause, deps)
        # Not watched: it may be created after the ACP (kubectl apply order); retry.
        raise TemporaryError(f"{logic.object_key(acp)}: {message}") from None


async def _replica(
    acp: Json,
    *,
    cluster: str,
    name: str,
    template: Json | None,
    present: tuple[bool, bool],
    cause: Message,
    deps: Deps,
) -> Json:
    """Clone, OAC, Machine under ``name``, skipping the parts a dead run already made."""
    have_oac, have_clone = present
    infra_kind = _infra_kind(acp)
    if have_clone:
        infra = {"apiVersion": infra_kind.api_version, "kind": infra_kind.kind}
    else:
        assert template is not None  # read by the caller for every replica without its clone
        infra = logic.infra_clone(acp, template, name, cluster)
        await _create(
            infra_kind, infra, acp=acp, reason=logic.INFRA_CLONING_FAILED, cause=cause, deps=deps
        )
    if not have_oac:
        oac = logic.bootstrap_config(acp, name, cluster)
        await _create(
            OPENSHIFT_ASSISTED_CONFIG,
            oac,
            acp=acp,
            reason=logic.BOOTSTRAP_CLONING_FAILED,
            cause=cause,
            deps=deps,
        )
    wanted = logic.machine(acp, name, cluster, infra)
    namespace = logic.meta(acp)["namespace"]
    try:
        made = await deps.kube.create(MACHINE, wanted)
    except CapibusError as exc:
        # A timeout may hide a Machine that was made: never roll back under one.
        existing = await get_or_none(deps.kube, MACHINE, namespace, name)
        if existing is not None:
            return existing
        await _roll_back(namespace, name, infra_kind, deps)
        message = f"error creating machine {name}: {exc}"
        await _creation_failed(acp, logic.MACHINE_GENERATION_FAILED, message, cause, deps)
        raise
    log.info("%s: created control-plane Machine %s", logic.object_key(acp), name)
    return made


async def _create(
    kind: ResourceKind, obj: Json, *, acp: Json, reason: str, cause: Message, deps: Deps
) -> None:
    try:
        await deps.kube.create(kind, obj)
    except KubeConflict:
        return  # made by a run that died before its Machine: ours, by name and owner
    except CapibusError as exc:
        message = f"error creating {kind.kind} {logic.name_of(obj)}: {exc}"
        await _creation_failed(acp, reason, message, cause, deps)
        raise


async def _roll_back(namespace: str, name: str, infra_kind: ResourceKind, deps: Deps) -> None:
    for kind in (OPENSHIFT_ASSISTED_CONFIG, infra_kind):
        with contextlib.suppress(KubeNotFound):
            await deps.kube.delete(kind, namespace, name)


async def _creation_failed(
    acp: Json, reason: str, message: str, cause: Message, deps: Deps
) -> None:
    failed = logic.condition(logic.MACHINES_CREATED, False, reason, message)
    await _report(acp, {}, [failed], cause, deps)


# --- status ---------------------------------------------------------------------------------


async def _report_status(
    acp: Json, *, cluster: str, machines: list[Json], cd: Json | None, cause: Message, deps: Deps
) -> tuple[Json, list[Condition]]:
    """Report what the status lacks; returns all it should say."""
    namespace, name = logic.meta(acp)["namespace"], logic.name_of(acp)
    current = logic.status(acp)
    fields = logic.replica_status(acp, cluster, machines)
    fields["observedGeneration"] = logic.meta(acp).get("generation")
    if cd is not None:
        fields["clusterDeploymentRef"] = logic.cluster_deployment_ref(cd)
    conditions = [logic.machines_created(acp, machines)]
    aci = await deps.seen.get(deps.kube, AGENT_CLUSTER_INSTALL, namespace, name)
    initialized = bool(current.get("initialized"))
    if not initialized and aci is not None and logic.admin_kubeconfig_name(aci):
        # its being there is all that counts: an event of it (without its data) says so
        kubeconfig = await deps.seen.get(deps.kube, SECRET, namespace, f"{cluster}-kubeconfig")
        initialized = kubeconfig is not None
    ready = bool(current.get("ready")) or (
        aci is not None and logic.aci_state(aci) == logic.ADDING_HOSTS
    )
    fields |= {"initialized": initialized, "ready": ready}
    conditions.append(logic.kubeconfig_available(initialized))
    if aci is not None:
        conditions.append(logic.control_plane_ready(aci))
    await _report(acp, dict(fields), conditions, cause, deps)
    return fields, conditions


async def _report(
    acp: Json, fields: Json, conditions: list[Condition], cause: Message, deps: Deps
) -> None:
    """Report what the ACP's status lacks. ``observedGeneration`` rides along with a change
    but is never one by itself: a run that reported it every time would never be quiet, and a
    CRD installed from upstream's v0.2.0 schema (which lacks the field) prunes it."""
    observed = fields.pop("observedGeneration", None)
    patch, changed = logic.status_changes(logic.status(acp), fields, conditions)
    if patch or changed:
        if observed is not None:
            patch["observedGeneration"] = observed
        await report(deps, KIND, acp, cause, conditions=changed, **patch)


# --- deletion -------------------------------------------------------------------------------


async def _delete(acp: Json, cause: Message, deps: Deps) -> None:
    if not logic.has_finalizer(acp, logic.ACP_FINALIZER):
        return
    ref = logic.status(acp).get("clusterDeploymentRef") or {}
    namespace = ref.get("namespace") or logic.meta(acp)["namespace"]
    name = ref.get("name") or logic.name_of(acp)
    cd = await get_or_none(deps.kube, CLUSTER_DEPLOYMENT, namespace, name)
    if cd is not None and (ref or logic.owned_by(cd, acp)):
        if not logic.deleting(cd):
            with contextlib.suppress(KubeNotFound):
                await deps.kube.delete(CLUSTER_DEPLOYMENT, namespace, name)
            log.info("%s: deleting its ClusterDeployment", logic.object_key(acp))
        waiting = logic.condition(
            "Deleting", True, "WaitingForClusterDeployment", "the ClusterDeployment is going"
        )
        await _report(acp, {}, [waiting], cause, deps)
        return
    if ref:
        await report(deps, KIND, acp, cause, clusterDeploymentRef=None)
    await remove_finalizer(deps.kube, KIND, acp, logic.ACP_FINALIZER)
    log.info("%s: its ClusterDeployment is gone; let go", logic.object_key(acp))
