"""From an event to the objects it concerns, and one reconcile of each at a time.

Upstream runs three controllers in the control-plane binary (the ACP, the ClusterDeployment
and the AgentClusterInstall); here they are one service with one subscription, on the frame
of ``shared.reconcile``: a mapper per event kind names the targets, and each target is
reconciled under a per-object lock. Everything one ACP decides on belongs to its cluster, and
so to one partition (the watcher partitions by ``cluster.x-k8s.io/cluster-name``, which every
object made here carries).

The mappings, each cheap (no reads):

- an ACP: itself;
- a CAPI Cluster: the ACP its ``spec.controlPlaneRef`` names (readiness, the endpoint);
- a Machine owned by an ACP: that ACP (replica counts; a deleted one is made again);
- a ClusterDeployment: itself; once deleted, also its owner ACP, which makes it again or, being
  deleted, lets go;
- an ACI: itself and its controlling ACP (the installation's state is the control plane's);
  once deleted, also its ClusterDeployment, which makes it again;
- a Secret: an admin kubeconfig (label ``hive.openshift.io/cluster-deployment-name``) wakes the
  ACI of that name; a Secret an ACP controls (``<cluster>-kubeconfig``) wakes the ACI and the
  ACP named like it (a changed or deleted kubeconfig is published again).

MachineDeployments are not watched: the ACI's worker count is fixed at its creation.

Only what the ACP looks at wakes it (``seen`` marks, recorded once the batch ran): a Cluster
whose readiness, endpoint, pause and control-plane reference stayed, a Machine whose
readiness stayed, an ACI whose state, state info and kubeconfig reference stayed wake no ACP
and cost no read. An object's own event that brings nothing its last decision did not see
(the writer's write of that decision, this replica's own patch, an installer's status on an
ACI or ClusterDeployment) is dropped before any read.
"""

from __future__ import annotations

from collections.abc import Hashable

from services.baremetal.assisted_controlplane import controlplanes, deployments, installs, logic
from services.baremetal.assisted_controlplane.ports import Deps
from shared import reconcile
from shared.consumer import Batch
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Mapper, Reconciler, Target, latest_per_kind
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    MACHINE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)
from shared.seen import Marks, gather, key_of

ACP = OPENSHIFT_ASSISTED_CONTROL_PLANE


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Reconcile every target the batch's events concern, each once; then remember what the
    mappings looked at (only now: a batch that failed is mapped again on its retry)."""
    messages = latest_per_kind(batch.messages)
    for message in messages:
        _learn(message, deps)
    await run(await gather(messages, deps.kube, mappers(deps), deps.seen), deps)
    MARKS.record(deps.seen, messages)


async def run(targets: dict[Target, Message], deps: Deps) -> None:
    await reconcile.run(targets, deps, reconcilers=RECONCILERS, locks=deps.locks)


async def targets_of(message: ResourceChanged, deps: Deps) -> list[Target]:
    return await reconcile.targets_of(message, deps.kube, mappers(deps))


def _namespace(message: ResourceChanged) -> str:
    return message.ref.namespace or ""


def _learn(message: ResourceChanged, deps: Deps) -> None:
    """The object's newest version, before any mapping or run of its batch (``shared.seen``).
    Secrets arrive without their data: only their being there is taken from an event."""
    ref = message.ref
    for kind in _KEPT:
        if (ref.api_version, ref.kind) == (kind.api_version, kind.kind):
            key = key_of(kind, ref.namespace or "", ref.name)
            if message.event == "DELETED":
                deps.seen.distrust(key)
            else:
                deps.seen.note(key, message.object)


#: the kinds whose newest version the runs take from ``seen`` instead of reading
_KEPT = (ACP, CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL, CAPI_CLUSTER, SECRET)


# --- what the ACP looks at in its inputs ----------------------------------------------------


def _cluster_mark(message: ResourceChanged) -> Hashable:
    cluster = message.object
    return (
        logic.control_plane_ref(cluster),
        logic.infrastructure_ready(cluster),
        logic.paused(cluster),
    )


def _machine_mark(message: ResourceChanged) -> Hashable:
    machine = message.object
    return (logic.acp_owner(machine), logic.machine_ready(machine), logic.deleting(machine))


def _install_mark(message: ResourceChanged) -> Hashable:
    aci = message.object
    info = (logic.status(aci).get("debugInfo") or {}).get("stateInfo")
    return (
        logic.acp_owner(aci, controller=True),
        logic.aci_state(aci),
        str(info or ""),
        logic.admin_kubeconfig_name(aci),
    )


MARKS = Marks(
    {
        CAPI_CLUSTER: _cluster_mark,
        MACHINE: _machine_mark,
        AGENT_CLUSTER_INSTALL: _install_mark,
    }
)


def _unchanged(deps: Deps, kind: ResourceKind, message: ResourceChanged) -> bool:
    """Whether the event changes nothing the ACP looks at (a DELETED one always counts)."""
    return MARKS.unchanged(deps.seen, kind, message)


# --- which targets an event concerns --------------------------------------------------------


async def _acp(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return [Target(ACP, _namespace(message), message.ref.name)]


def _capi_cluster(deps: Deps) -> Mapper:
    async def capi_cluster(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        acp = logic.control_plane_ref(message.object)
        if not acp or _unchanged(deps, CAPI_CLUSTER, message):
            return []
        return [Target(ACP, _namespace(message), acp)]

    return capi_cluster


def _machine(deps: Deps) -> Mapper:
    async def machine(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        acp = logic.acp_owner(message.object)
        if not acp or _unchanged(deps, MACHINE, message):
            return []
        return [Target(ACP, _namespace(message), acp)]

    return machine


async def _cluster_deployment(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    namespace = _namespace(message)
    found = [Target(CLUSTER_DEPLOYMENT, namespace, message.ref.name)]
    acp = logic.acp_owner(message.object)
    if message.event == "DELETED" and acp:
        found.append(Target(ACP, namespace, acp))
    return found


def _agent_cluster_install(deps: Deps) -> Mapper:
    async def agent_cluster_install(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        namespace = _namespace(message)
        found = [Target(AGENT_CLUSTER_INSTALL, namespace, message.ref.name)]
        acp = logic.acp_owner(message.object, controller=True)
        if acp and not _unchanged(deps, AGENT_CLUSTER_INSTALL, message):
            found.append(Target(ACP, namespace, acp))
        if message.event == "DELETED":
            found.append(Target(CLUSTER_DEPLOYMENT, namespace, message.ref.name))
        return found

    return agent_cluster_install


async def _secret(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    namespace = _namespace(message)
    cd = logic.is_admin_kubeconfig(message.object)
    if cd:
        return [Target(AGENT_CLUSTER_INSTALL, namespace, cd)]
    acp = logic.acp_owner(message.object, controller=True)
    if acp:
        return [Target(AGENT_CLUSTER_INSTALL, namespace, acp), Target(ACP, namespace, acp)]
    return []


def _tracked(reconciler: Reconciler[Deps]) -> Reconciler[Deps]:
    """A run that fails leaves its object to be read and decided again."""

    async def tracked(target: Target, cause: Message, deps: Deps) -> list[Target]:
        try:
            return await reconciler(target, cause, deps)
        except BaseException:
            deps.seen.distrust(target.key)
            raise

    return tracked


RECONCILED = (ACP, CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL)
RECONCILERS: dict[ResourceKind, Reconciler[Deps]] = {
    ACP: _tracked(controlplanes.reconcile),
    CLUSTER_DEPLOYMENT: _tracked(deployments.reconcile),
    AGENT_CLUSTER_INSTALL: _tracked(installs.reconcile),
}


def mappers(deps: Deps) -> dict[ResourceKind, Mapper]:
    """The mappers; they know this replica's marks."""
    return {
        ACP: _acp,
        CAPI_CLUSTER: _capi_cluster(deps),
        MACHINE: _machine(deps),
        CLUSTER_DEPLOYMENT: _cluster_deployment,
        AGENT_CLUSTER_INSTALL: _agent_cluster_install(deps),
        SECRET: _secret,
    }
