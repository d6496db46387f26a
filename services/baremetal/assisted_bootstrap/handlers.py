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
ClusterDeployment, ACI     the cluster's configs waiting for the installer (a deleted
                           ClusterDeployment too, not one naming no ACI yet); an ACI whose
                           state lets workers join also wakes the workers held by the gate
InfraEnv                   with an ISO URL: the configs that reference it and do not hold
                           that URL yet, and the configs of its pool without a reference
Agent                      itself
BareMetalHost              claimed by a Metal3Machine: the unbound Agents with its boot MAC
=========================  ==================================================================

A config's wait reason is read from its ``DataSecretAvailable`` condition, so a Cluster event
does not walk the gates of configs it cannot help. A config whose report is not written yet
is woken too: it is still running, or this replica remembers the reason it decided
(``_in_doubt``; the writer's write of the report used to be the event that caught this, and
is now dropped as nothing new). Configs and Agents of a cluster are listed by the label
``cluster.x-k8s.io/cluster-name`` (Cluster API and the control-plane provider put it on
configs, ClusterDeployments, ACIs and InfraEnvs), so no mapping lists a namespace's world.

Only what a mapping looks at can wake anyone (``seen`` marks, recorded once the batch ran):
a Cluster that was ready already, an ACI that changed state without opening or closing the
gate, an InfraEnv whose URL stayed, a host claimed as before wake nobody and cost no read. An
object's own event that brings nothing its last decision did not see (the writer's write of
that decision, this replica's own patch) is dropped before any read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Hashable
from typing import Any

from services.baremetal.assisted_bootstrap import agents, configs, logic
from services.baremetal.assisted_bootstrap.ports import Deps
from shared import reconcile
from shared.consumer import Batch
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Mapper, Reconciler, Target, latest_per_kind
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
from shared.seen import Marks, gather, key_of

log = logging.getLogger(__name__)

Json = dict[str, Any]
OAC = OPENSHIFT_ASSISTED_CONFIG


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Reconcile every target the batch's events concern, each once; then remember what the
    mappings looked at (only now: a batch that failed is mapped again on its retry)."""
    messages = latest_per_kind(batch.messages)
    for message in messages:
        _learn(message, deps)
    await run(await gather(messages, deps.kube, mappers(deps), deps.seen), deps)
    MARKS.record(deps.seen, messages)


async def run(targets: dict[Target, Message], deps: Deps) -> None:
    """Every target at once, each under its own lock (``shared.reconcile.run`` of one). An
    event often wakes several configs (an InfraEnv's ISO URL, the configs of its pool), and
    taken one at a time the last of them waited for every request of the others. A failure
    is raised once all have run (the first in the targets' order): the consumer retries the
    batch, every step on the way being idempotent."""

    async def one(target: Target, cause: Message) -> None:
        await reconcile.run({target: cause}, deps, reconcilers=RECONCILERS, locks=deps.locks)

    outcomes = await asyncio.gather(
        *(one(target, cause) for target, cause in targets.items()), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def targets_of(message: ResourceChanged, deps: Deps) -> list[Target]:
    return await reconcile.targets_of(message, deps.kube, mappers(deps))


def mappers(deps: Deps) -> dict[ResourceKind, Mapper]:
    """The mappers; they know this replica's marks and runs, and the InfraEnv's whether URLs
    are rewritten (which URL a config holding the current image has)."""
    return {
        OAC: _own(OAC),
        AGENT: _own(AGENT),
        MACHINE: _machine,
        CAPI_CLUSTER: _capi_cluster(deps),
        CLUSTER_DEPLOYMENT: _cluster_deployment(deps),
        AGENT_CLUSTER_INSTALL: _agent_cluster_install(deps),
        INFRA_ENV: _infra_env(deps),
        BARE_METAL_HOST: _host(deps),
    }


def _tracked(reconciler: Reconciler[Deps]) -> Reconciler[Deps]:
    """A run is in flight while it runs (mappings wake it again); one that fails leaves its
    object to be read and decided again."""

    async def tracked(target: Target, cause: Message, deps: Deps) -> list[Target]:
        with deps.seen.running(target.key):
            try:
                return await reconciler(target, cause, deps)
            except BaseException:
                deps.seen.distrust(target.key)
                raise

    return tracked


RECONCILERS: dict[ResourceKind, Reconciler[Deps]] = {
    OAC: _tracked(configs.reconcile),
    AGENT: _tracked(agents.reconcile),
}


# --- what each mapping looks at -------------------------------------------------------------


def _cluster_mark(message: ResourceChanged) -> Hashable:
    return bool(logic.status(message.object).get("infrastructureReady"))


def _deployment_mark(message: ResourceChanged) -> Hashable:
    cd = message.object
    install = (logic.spec(cd).get("clusterInstallRef") or {}).get("name")
    return (logic.labels(cd).get(logic.CLUSTER_NAME_LABEL), install, logic.deleting(cd))


def _install_mark(message: ResourceChanged) -> Hashable:
    state = logic.lenient_aci_state(message.object)
    gate = None if state is None else logic.day2_open(state)
    return (logic.labels(message.object).get(logic.CLUSTER_NAME_LABEL), gate)


def _infra_env_mark(message: ResourceChanged) -> Hashable:
    infra = message.object
    return (logic.iso_url(infra), logic.labels(infra).get(logic.CLUSTER_NAME_LABEL))


def _host_mark(message: ResourceChanged) -> Hashable:
    host = message.object
    return (logic.boot_mac(host), logic.owner_name(host, "Metal3Machine"))


MARKS = Marks(
    {
        CAPI_CLUSTER: _cluster_mark,
        CLUSTER_DEPLOYMENT: _deployment_mark,
        AGENT_CLUSTER_INSTALL: _install_mark,
        INFRA_ENV: _infra_env_mark,
        BARE_METAL_HOST: _host_mark,
    }
)


def _unchanged(deps: Deps, kind: ResourceKind, message: ResourceChanged) -> bool:
    return MARKS.unchanged(deps.seen, kind, message)


def _learn(message: ResourceChanged, deps: Deps) -> None:
    """What an event tells ``seen``, before any mapping or run of its batch: the object's
    newest version (of the kinds runs read), and the facts it makes or unmakes."""
    ref = message.ref
    for kind in _KEPT:
        if (ref.api_version, ref.kind) == (kind.api_version, kind.kind):
            key = key_of(kind, ref.namespace or "", ref.name)
            if message.event != "DELETED":
                deps.seen.note(key, message.object)
            elif kind in RECONCILERS:
                deps.seen.distrust(key)  # its run reads it, and lets go
            else:
                deps.seen.forget(key)
    for kind, learn in _LEARNERS.items():
        if (ref.api_version, ref.kind) == (kind.api_version, kind.kind):
            learn(message, deps)


#: the kinds whose newest version the runs take from ``seen`` instead of reading
_KEPT = (OAC, AGENT, CAPI_CLUSTER, CLUSTER_DEPLOYMENT, INFRA_ENV, AGENT_CLUSTER_INSTALL)


def _learn_machine(message: ResourceChanged, deps: Deps) -> None:
    """A Machine of ours brings its facts, and takes them when it goes."""
    if message.event == "DELETED" or logic.deleting(message.object):
        configs.forget_machine(message.object, deps)
    elif logic.config_ref(message.object) is not None:
        configs.remember_machine(message.object, deps)


_LEARNERS: dict[ResourceKind, Callable[[ResourceChanged, Deps], None]] = {
    MACHINE: _learn_machine,
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


def _capi_cluster(deps: Deps) -> Mapper:
    async def capi_cluster(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        ready = logic.status(message.object).get("infrastructureReady")
        if message.event == "DELETED" or not ready or _unchanged(deps, CAPI_CLUSTER, message):
            return []
        namespace = message.ref.namespace or ""
        return await _waiting(deps, namespace, message.ref.name, _FOR_INFRASTRUCTURE)

    return capi_cluster


def _cluster_deployment(deps: Deps) -> Mapper:
    async def cluster_deployment(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        # a deleted one counts too (the cluster may have exactly one left); one that names
        # no ACI yet lets nobody in
        cluster = logic.labels(message.object).get(logic.CLUSTER_NAME_LABEL)
        install = (logic.spec(message.object).get("clusterInstallRef") or {}).get("name")
        if not cluster or (message.event != "DELETED" and not install):
            return []
        if _unchanged(deps, CLUSTER_DEPLOYMENT, message):
            return []
        return await _waiting(deps, message.ref.namespace or "", cluster, _FOR_INSTALLER)

    return cluster_deployment


def _agent_cluster_install(deps: Deps) -> Mapper:
    async def agent_cluster_install(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        cluster = logic.labels(message.object).get(logic.CLUSTER_NAME_LABEL)
        if message.event == "DELETED" or not cluster:
            return []
        if _unchanged(deps, AGENT_CLUSTER_INSTALL, message):
            return []
        state = logic.lenient_aci_state(message.object)
        open_ = state is not None and logic.day2_open(state)
        reasons = _FOR_INSTALLER_OR_GATE if open_ else _FOR_INSTALLER
        return await _waiting(deps, message.ref.namespace or "", cluster, reasons)

    return agent_cluster_install


async def _waiting(
    deps: Deps, namespace: str, cluster: str, reasons: Collection[str | None]
) -> list[Target]:
    """The cluster's configs not ready whose wait one of ``reasons`` names, by their status or
    by what this replica is deciding or decided for them and the writer may not have written
    yet."""
    return [
        _target(oac)
        for oac, current in await configs.of_cluster(deps, OAC, namespace, cluster)
        if not current
        or (
            not logic.ready(oac)
            and not logic.deleting(oac)
            and (logic.waiting_reason(oac) in reasons or _in_doubt(deps, _target(oac), reasons))
        )
    ]


def _in_doubt(deps: Deps, target: Target, reasons: Collection[str | None]) -> bool:
    """Whether this replica is deciding for the config, or decided a wait in ``reasons``
    that its status may not show yet."""
    if deps.seen.is_running(target.key):
        return True
    decided = deps.seen.decided_reason(target.key, logic.DATA_SECRET)
    return decided is not None and decided in reasons


def _infra_env(deps: Deps) -> Mapper:
    internal = deps.images.internal

    async def infra_env(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        infra = message.object
        url = logic.iso_url(infra)
        cluster = logic.labels(infra).get(logic.CLUSTER_NAME_LABEL)
        if message.event == "DELETED" or not url or not cluster:
            return []
        if _unchanged(deps, INFRA_ENV, message):
            return []
        name, namespace = message.ref.name, message.ref.namespace or ""
        return [
            _target(oac)
            for oac, current in await configs.of_cluster(deps, OAC, namespace, cluster)
            if not current
            or (not logic.deleting(oac) and _needs_url(oac, name, cluster, url, internal))
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


def _host(deps: Deps) -> Mapper:
    async def host(message: ResourceChanged, kube: KubeReader) -> list[Target]:
        obj = message.object
        mac = logic.boot_mac(obj)
        claimed = logic.owner_name(obj, "Metal3Machine") is not None
        if message.event == "DELETED" or not mac or not claimed:
            return []
        if _unchanged(deps, BARE_METAL_HOST, message):
            return []
        namespace = message.ref.namespace or ""
        found, _ = await kube.list(AGENT, namespace=namespace)
        return [
            Target(AGENT, namespace, agent["metadata"]["name"])
            for agent in found
            if not logic.bound(agent) and mac in logic.macs(agent)
        ]

    return host


def _target(oac: Json) -> Target:
    return Target(OAC, oac["metadata"]["namespace"], oac["metadata"]["name"])
