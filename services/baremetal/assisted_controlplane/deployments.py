"""The ClusterDeployment an ACP made: its ClusterImageSet, registry manifests and ACI.

Upstream's ``controlplane/internal/controller/clusterdeployment_controller.go`` (v0.2.0):

1. the ClusterDeployment must be owned by an ACP, else it is none of ours;
2. once its ACI exists, there is nothing to do but make sure ``spec.clusterInstallRef`` names
   it. Upstream's existence check answered *true when the read failed*, so it re-applied
   everything while the ACI existed and skipped while it was missing; this is the check it
   meant. The ACI is created once and never updated: its worker count is what the cluster's
   MachineDeployments asked for when it was made (later workers join as day-2 hosts), which is
   why MachineDeployments are not watched;
3. the ClusterImageSet named like the ClusterDeployment (cluster-scoped, server-side apply),
   with ``spec.config.releaseImage`` (unset: the public release of ``spec.version``);
4. with ``spec.config.imageRegistryRef``, the ``additional-registry-config`` ConfigMap
   rendered from the referenced one (``logic.registry_config_map``); a missing source (not
   watched: it may come later) is retried, a malformed one dead-lettered, either shown on the
   ACP as ``ImageRegistryConfigured`` False until a run gets through;
5. the ACI (``logic.agent_cluster_install``), AlreadyExists being success;
6. ``spec.clusterInstallRef`` on the ClusterDeployment: a field of its spec we own, written as
   a merge patch preconditioned on the version we read (``shared.owned.set_spec``), so the
   ACP's server-side apply of the ClusterDeployment, which does not name it, leaves it alone.

Same-named objects upstream shares are kept: ``additional-registry-config`` is one per
namespace and the ClusterImageSet one per ClusterDeployment name across namespaces.

A run starts from the ClusterDeployment and its ACI as this replica last saw them (``seen``);
once the ACI exists and is referred to, the ClusterDeployment's later events (hive's status)
bring nothing new and are dropped: only the ACI's deletion can undo it, and its DELETED event
wakes the ClusterDeployment.
"""

from __future__ import annotations

import logging

from services.baremetal.assisted_controlplane import logic
from services.baremetal.assisted_controlplane.logic import ACP, FIELD_MANAGER, Json
from services.baremetal.assisted_controlplane.ports import Deps
from shared.errors import KubeConflict, KubeNotFound, PermanentError, TemporaryError
from shared.messages import Message
from shared.owned import set_spec
from shared.reconcile import Target, get_or_none, report
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    CLUSTER_IMAGE_SET,
    CONFIG_MAP,
    MACHINE_DEPLOYMENT,
)
from shared.seen import key_of

log = logging.getLogger(__name__)

KIND = CLUSTER_DEPLOYMENT
REGISTRY_CONFIGURED = "ImageRegistryConfigured"


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    cd = await deps.seen.get(deps.kube, KIND, target.namespace, target.name)
    if cd is None or logic.deleting(cd):
        deps.seen.forget(target.key)
        return []
    owner = logic.acp_owner(cd)
    if owner is None:
        deps.seen.decide(target.key, cd)  # an owner would be a change of its own
        return []
    name = logic.name_of(cd)
    if await deps.seen.get(deps.kube, AGENT_CLUSTER_INSTALL, target.namespace, name) is not None:
        # made: the ACI's deletion (its DELETED event) is all that could undo it
        deps.seen.decide(target.key, deps.seen.note(target.key, await _refer(cd, deps)))
        return []
    acp = await get_or_none(deps.kube, ACP, target.namespace, owner)
    if acp is None or logic.deleting(acp) or not logic.owned_by(cd, acp):
        return []
    cluster_name = logic.cluster_name_of(acp)
    cluster = cluster_name and await get_or_none(
        deps.kube, CAPI_CLUSTER, target.namespace, cluster_name
    )
    if not cluster:
        return []
    image = logic.cluster_image_set(name, logic.release_image(acp))
    await deps.kube.apply(CLUSTER_IMAGE_SET, image, field_manager=FIELD_MANAGER)
    registry = await _registry(acp, cause, deps)
    workers = await _workers(target.namespace, logic.name_of(cluster), deps)
    aci = logic.agent_cluster_install(cd, acp, cluster, workers=workers, registry=registry)
    key = key_of(AGENT_CLUSTER_INSTALL, target.namespace, name)
    try:
        deps.seen.note(key, await deps.kube.create(AGENT_CLUSTER_INSTALL, aci))
        log.info("%s: created its AgentClusterInstall", logic.object_key(cd))
    except KubeConflict:
        deps.seen.distrust(key)  # created by a run that died before referring to it
    deps.seen.decide(target.key, deps.seen.note(target.key, await _refer(cd, deps)))
    return []


async def _refer(cd: Json, deps: Deps) -> Json:
    ref = logic.cluster_install_ref(logic.name_of(cd))
    return await set_spec(deps.kube, KIND, cd, {"clusterInstallRef": ref})


async def _workers(namespace: str, cluster: str, deps: Deps) -> int:
    selector = f"{logic.CLUSTER_NAME_LABEL}={cluster}"
    items, _ = await deps.kube.list(
        MACHINE_DEPLOYMENT, namespace=namespace, label_selector=selector
    )
    return logic.worker_count(items)


async def _registry(acp: Json, cause: Message, deps: Deps) -> bool:
    """Whether the ACI names ``additional-registry-config`` (made here when it does)."""
    ref = logic.config(acp).get("imageRegistryRef") or {}
    if not ref.get("name"):
        return False
    namespace = logic.meta(acp)["namespace"]
    try:
        source = await deps.kube.get(CONFIG_MAP, namespace, str(ref["name"]))
    except KubeNotFound:
        message = f"image registry ConfigMap {namespace}/{ref['name']} not found"
        await _failed(acp, message, cause, deps)
        # Not watched: it may be created after the ACP; retried with backoff.
        raise TemporaryError(message) from None
    try:
        wanted = logic.registry_config_map(source, namespace)
    except PermanentError as exc:
        await _failed(acp, str(exc), cause, deps)
        raise
    await deps.kube.apply(CONFIG_MAP, wanted, field_manager=FIELD_MANAGER)
    if _failed_before(acp):
        healed = logic.condition(REGISTRY_CONFIGURED, True, "Rendered")
        await report(deps, ACP, acp, cause, conditions=[healed])
    return True


async def _failed(acp: Json, message: str, cause: Message, deps: Deps) -> None:
    failed = logic.condition(REGISTRY_CONFIGURED, False, "InvalidImageRegistry", message)
    await report(deps, ACP, acp, cause, conditions=[failed])


def _failed_before(acp: Json) -> bool:
    return any(
        c.get("type") == REGISTRY_CONFIGURED and c.get("status") == "False"
        for c in logic.status(acp).get("conditions") or []
    )
