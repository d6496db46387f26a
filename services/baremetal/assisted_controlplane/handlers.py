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
"""

from __future__ import annotations

from services.baremetal.assisted_controlplane import controlplanes, deployments, installs, logic
from services.baremetal.assisted_controlplane.ports import Deps
from shared import reconcile
from shared.consumer import Batch
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Mapper, Reconciler, Target, gather
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    MACHINE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)

ACP = OPENSHIFT_ASSISTED_CONTROL_PLANE


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Reconcile every target the batch's events concern, each once."""
    await run(await gather(batch.messages, deps.kube, _MAPPERS), deps)


async def run(targets: dict[Target, Message], deps: Deps) -> None:
    await reconcile.run(targets, deps, reconcilers=RECONCILERS, locks=deps.locks)


async def targets_of(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return await reconcile.targets_of(message, kube, _MAPPERS)


def _namespace(message: ResourceChanged) -> str:
    return message.ref.namespace or ""


async def _acp(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return [Target(ACP, _namespace(message), message.ref.name)]


async def _capi_cluster(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    acp = logic.control_plane_ref(message.object)
    return [Target(ACP, _namespace(message), acp)] if acp else []


async def _machine(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    acp = logic.acp_owner(message.object)
    return [Target(ACP, _namespace(message), acp)] if acp else []


async def _cluster_deployment(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    namespace = _namespace(message)
    found = [Target(CLUSTER_DEPLOYMENT, namespace, message.ref.name)]
    acp = logic.acp_owner(message.object)
    if message.event == "DELETED" and acp:
        found.append(Target(ACP, namespace, acp))
    return found


async def _agent_cluster_install(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    namespace = _namespace(message)
    found = [Target(AGENT_CLUSTER_INSTALL, namespace, message.ref.name)]
    acp = logic.acp_owner(message.object, controller=True)
    if acp:
        found.append(Target(ACP, namespace, acp))
    if message.event == "DELETED":
        found.append(Target(CLUSTER_DEPLOYMENT, namespace, message.ref.name))
    return found


async def _secret(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    namespace = _namespace(message)
    cd = logic.is_admin_kubeconfig(message.object)
    if cd:
        return [Target(AGENT_CLUSTER_INSTALL, namespace, cd)]
    acp = logic.acp_owner(message.object, controller=True)
    if acp:
        return [Target(AGENT_CLUSTER_INSTALL, namespace, acp), Target(ACP, namespace, acp)]
    return []


RECONCILED = (ACP, CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL)
RECONCILERS: dict[ResourceKind, Reconciler[Deps]] = {
    ACP: controlplanes.reconcile,
    CLUSTER_DEPLOYMENT: deployments.reconcile,
    AGENT_CLUSTER_INSTALL: installs.reconcile,
}

_MAPPERS: dict[ResourceKind, Mapper] = {
    ACP: _acp,
    CAPI_CLUSTER: _capi_cluster,
    MACHINE: _machine,
    CLUSTER_DEPLOYMENT: _cluster_deployment,
    AGENT_CLUSTER_INSTALL: _agent_cluster_install,
    SECRET: _secret,
}
