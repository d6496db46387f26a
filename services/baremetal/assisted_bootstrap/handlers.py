"""From an event to the configs and Agents it concerns, and one reconcile of each at a time.

Upstream runs three controllers: the OpenshiftAssistedConfig's (woken by configs, Machines and
ClusterDeployments, and requeued every 20 s or 60 s while it waits), the InfraEnv's (copying
the ISO URL into configs) and the Agent's (retrying with backoff until a host matches). Here
they are one service with one subscription, and every wait is an event:

=========================  ==================================================================
event                      wakes
=========================  ==================================================================
OpenshiftAssistedConfig    itself
Machine                    its configRef's config, when the Machine appears or is deleted
                           (what a config waits for from it: being there, being deleted)
CAPI Cluster               with ``infrastructureReady``: the cluster's configs waiting for it
ClusterDeployment, ACI     the cluster's configs waiting for the installer; an ACI whose
                           state lets workers join also wakes the workers held by the gate
InfraEnv                   with an ISO URL: the configs that reference it and do not hold
                           that URL yet, and the configs of its pool without a reference
Agent                      itself
BareMetalHost              claimed by a Metal3Machine: the unbound Agents with its boot MAC
=========================  ==================================================================

A config's wait reason is read from its ``DataSecretAvailable`` condition, so a Cluster event
does not walk the gates of configs it cannot help. That is safe against a run whose report is
not written yet: the writer's status write is itself an event of the config, which runs it
again against what exists by then. Configs and Agents of a cluster are listed by the label
``cluster.x-k8s.io/cluster-name`` (Cluster API and the control-plane provider put it on
configs, ClusterDeployments, ACIs and InfraEnvs), so no mapping lists a namespace's world.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from services.baremetal.assisted_bootstrap import agents, configs, logic
from services.baremetal.assisted_bootstrap.ports import Deps
from shared import reconcile
from shared.consumer import Batch
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Mapper, Reconciler, Target, gather
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
)

log = logging.getLogger(__name__)

Json = dict[str, Any]
OAC = OPENSHIFT_ASSISTED_CONFIG


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Reconcile every target the batch's events concern, each once."""
    await run(await gather(batch.messages, deps.kube, mappers(deps)), deps)


async def run(targets: dict[Target, Message], deps: Deps) -> None:
    await reconcile.run(targets, deps, reconcilers=RECONCILERS, locks=deps.locks)


async def targets_of(message: ResourceChanged, deps: Deps) -> list[Target]:
    return await reconcile.targets_of(message, deps.kube, mappers(deps))


def mappers(deps: Deps) -> dict[ResourceKind, Mapper]:
    """The mappers; the InfraEnv's knows whether URLs are rewritten (which URL a config
    holding the current image has)."""
    return {
        OAC: _own(OAC),
        AGENT: _own(AGENT),
        MACHINE: _machine,
        CAPI_CLUSTER: _capi_cluster,
        CLUSTER_DEPLOYMENT: _cluster_deployment,
        AGENT_CLUSTER_INSTALL: _agent_cluster_install,
        INFRA_ENV: _infra_env(internal=deps.images.internal),
        BARE_METAL_HOST: _host,
    }


RECONCILERS: dict[ResourceKind, Reconciler[Deps]] = {
    OAC: configs.reconcile,
    AGENT: agents.reconcile,
}


# --- which targets an event concerns --------------------------------------------------------


def _own(kind: ResourceKind) -> Mapper:
    async def own(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        return [Target(kind, message.ref.namespace or "", message.ref.name)]

    return own


async def _machine(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    ref = logic.config_ref(message.object)
    wakes = message.event in ("ADDED", "DELETED") or logic.deleting(message.object)
    if ref is None or not wakes:
        return []
    return [Target(OAC, message.ref.namespace or "", ref["name"])]


#: the wait reasons (None: nothing said yet) each kind of event can end
_FOR_INFRASTRUCTURE = frozenset({None, logic.WAITING_FOR_INFRA})
_FOR_INSTALLER = frozenset({None, logic.WAITING_FOR_INSTALLER})
_FOR_INSTALLER_OR_GATE = _FOR_INSTALLER | {logic.WAITING_FOR_INSTALL}


async def _capi_cluster(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    if message.event == "DELETED" or not logic.status(message.object).get("infrastructureReady"):
        return []
    namespace = message.ref.namespace or ""
    return await _waiting(kube, namespace, message.ref.name, _FOR_INFRASTRUCTURE)


async def _cluster_deployment(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    cluster = logic.labels(message.object).get(logic.CLUSTER_NAME_LABEL)
    if message.event == "DELETED" or not cluster:
        return []
    return await _waiting(kube, message.ref.namespace or "", cluster, _FOR_INSTALLER)


async def _agent_cluster_install(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    cluster = logic.labels(message.object).get(logic.CLUSTER_NAME_LABEL)
    if message.event == "DELETED" or not cluster:
        return []
    state = logic.lenient_aci_state(message.object)
    reasons = (
        _FOR_INSTALLER_OR_GATE if state is not None and logic.day2_open(state) else (_FOR_INSTALLER)
    )
    return await _waiting(kube, message.ref.namespace or "", cluster, reasons)


async def _waiting(
    kube: KubeReader, namespace: str, cluster: str, reasons: Collection[str | None]
) -> list[Target]:
    """The cluster's configs not ready whose wait one of ``reasons`` names."""
    return [
        _target(oac)
        for oac in await _configs_of(kube, namespace, cluster)
        if not logic.ready(oac) and not logic.deleting(oac) and logic.waiting_reason(oac) in reasons
    ]


def _infra_env(*, internal: bool) -> Mapper:
    async def infra_env(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        infra = message.object
        url = logic.iso_url(infra)
        cluster = logic.labels(infra).get(logic.CLUSTER_NAME_LABEL)
        if message.event == "DELETED" or not url or not cluster:
            return []
        name, namespace = message.ref.name, message.ref.namespace or ""
        return [
            _target(oac)
            for oac in await _configs_of(kube, namespace, cluster)
            if not logic.deleting(oac) and _needs_url(oac, name, cluster, url, internal)
        ]

    return infra_env


def _needs_url(oac: Json, infra: str, cluster: str, url: str, internal: bool) -> bool:
    ref = logic.infra_env_ref_name(oac)
    if ref is not None:
        recorded = str(logic.status(oac).get("isoDownloadURL") or "")
        return ref == infra and not logic.same_image(recorded, url, internal=internal)
    # no reference yet: its own status write wakes it once the reference is there, but a
    # config of this pool (by its labels, or unknown) that is not ready may as well look now
    return not logic.ready(oac) and logic.pool_by_labels(oac, cluster) in (None, infra)


async def _host(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    host = message.object
    mac = logic.boot_mac(host)
    claimed = logic.owner_name(host, "Metal3Machine") is not None
    if message.event == "DELETED" or not mac or not claimed:
        return []
    namespace = message.ref.namespace or ""
    found, _ = await kube.list(AGENT, namespace=namespace)
    return [
        Target(AGENT, namespace, agent["metadata"]["name"])
        for agent in found
        if not logic.bound(agent) and mac in logic.macs(agent)
    ]


async def _configs_of(kube: KubeReader, namespace: str, cluster: str) -> list[Json]:
    found, _ = await kube.list(
        OAC, namespace=namespace, label_selector=f"{logic.CLUSTER_NAME_LABEL}={cluster}"
    )
    return found


def _target(oac: Json) -> Target:
    return Target(OAC, oac["metadata"]["namespace"], oac["metadata"]["name"])
