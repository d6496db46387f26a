"""The AgentClusterInstall: the workload cluster's kubeconfig, once the installation has one.

Upstream's ``controlplane/internal/controller/agentclusterinstall_controller.go`` (v0.2.0):
when the ACI names its admin kubeconfig Secret (``spec.clusterMetadata.adminKubeconfigSecretRef``,
set by assisted-service during the installation), label that Secret with the cluster name and
publish its ``kubeconfig`` as Cluster API's ``<cluster>-kubeconfig`` (key ``value``, type
``cluster.x-k8s.io/secret``, controlled by the ACP), updated whenever the admin kubeconfig
changes. ``initialized`` and ``ready`` are the ACP's status, so the ACP's own reconciler
reports them (one reporter per object): this one names the ACP as a follow-up whenever it
changed the kubeconfig, and the ACI's own events wake the ACP for its state.

An ACI that no ACP controls is none of ours and is left alone quietly (upstream returned an
error for it, and so retried it forever).

A run starts from the ACI and its ACP as this replica last saw them (``seen``); the Secrets
are read (their events carry no data). The ACI's status walking through the install states
brings the ACI itself nothing new (its ACP is woken for it), so those events are dropped once
a run has decided from the ACI's spec.
"""

from __future__ import annotations

import logging

from services.baremetal.assisted_controlplane import logic
from services.baremetal.assisted_controlplane.logic import ACP, Json
from services.baremetal.assisted_controlplane.ports import Deps
from shared.errors import PermanentError
from shared.messages import Message
from shared.owned import patch_owned
from shared.reconcile import Target, get_or_none, report
from shared.resources import AGENT_CLUSTER_INSTALL, SECRET, owner_reference
from shared.seen import key_of

log = logging.getLogger(__name__)

KIND = AGENT_CLUSTER_INSTALL


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    aci = await deps.seen.get(deps.kube, KIND, target.namespace, target.name)
    if aci is None:
        deps.seen.forget(target.key)
        return []
    owner = logic.acp_owner(aci, controller=True)
    if owner is None:
        log.debug("%s: not controlled by an ACP; none of ours", logic.object_key(aci))
        deps.seen.decide(target.key, aci)
        return []
    admin_name = logic.admin_kubeconfig_name(aci)
    if not admin_name:
        deps.seen.decide(target.key, aci)  # its spec naming one is a change of its own
        return []
    acp = await deps.seen.get(deps.kube, ACP, target.namespace, owner)
    cluster = acp and logic.cluster_name_of(acp)
    if not (acp and cluster) or logic.deleting(acp):
        return []  # no ACP to publish it for
    value = await _admin_kubeconfig(acp, cluster, admin_name, cause, deps)
    changed = value is not None and await _publish(acp, cluster, value, deps)
    # the Secrets' events wake it for what is left: the admin kubeconfig appearing or changing
    deps.seen.decide(target.key, aci)
    return [Target(ACP, target.namespace, owner)] if changed else []


async def _admin_kubeconfig(
    acp: Json, cluster: str, name: str, cause: Message, deps: Deps
) -> str | None:
    """The admin kubeconfig (base64, as stored), its Secret labelled with the cluster; None
    while the Secret does not exist (its event wakes the ACI)."""
    namespace = logic.meta(acp)["namespace"]
    admin = await get_or_none(deps.kube, SECRET, namespace, name)
    if admin is None:
        return None
    if logic.labels(admin).get(logic.CLUSTER_NAME_LABEL) != cluster:
        labelled = {"metadata": {"labels": {logic.CLUSTER_NAME_LABEL: cluster}}}
        admin = await patch_owned(deps.kube, SECRET, admin, labelled)
    value = (admin.get("data") or {}).get("kubeconfig")
    if value:
        return str(value)
    message = f"Key 'kubeconfig' is missing in admin kubeconfig secret {namespace}/{name}"
    unavailable = logic.condition(
        logic.KUBECONFIG_AVAILABLE, False, "KubeconfigUnavailable", message
    )
    await report(deps, ACP, acp, cause, conditions=[unavailable])
    raise PermanentError(message, reason="SecretKeyMissing")


async def _publish(acp: Json, cluster: str, value: str, deps: Deps) -> bool:
    """Make ``<cluster>-kubeconfig`` hold ``value``; whether anything was written."""
    namespace = logic.meta(acp)["namespace"]
    current = await get_or_none(deps.kube, SECRET, namespace, f"{cluster}-kubeconfig")
    if current is None:
        made = await deps.kube.create(SECRET, logic.kubeconfig_secret(acp, cluster, value))
        deps.seen.note(key_of(SECRET, namespace, f"{cluster}-kubeconfig"), made)
        log.info("%s: published the kubeconfig of cluster %s", logic.object_key(acp), cluster)
        return True
    if (current.get("data") or {}).get("value") == value:
        return False
    patch: Json = {"data": {"value": value}}
    owners = list(logic.meta(current).get("ownerReferences") or [])
    if not any(o.get("controller") for o in owners):
        patch["metadata"] = {
            "ownerReferences": [*owners, owner_reference(ACP, acp, controller=True)]
        }
    await patch_owned(deps.kube, SECRET, current, patch)
    log.info("%s: updated the kubeconfig of cluster %s", logic.object_key(acp), cluster)
    return True
