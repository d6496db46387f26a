"""The OpenshiftAssistedConfig: one host's bootstrap, from its Machine to the live ISO.

Upstream's order (``bootstrap/internal/controller/openshiftassistedconfig_controller.go`` of
openshift-assisted/cluster-api-provider-openshift-assisted v0.2.0), each step converging from
what exists:

1. the owner Machine (none yet: stop, its ownerReference arrives as this object's event);
2. deletion (below), else the finalizer;
3. the Cluster, and its ``infrastructureReady`` (``WaitingForClusterInfrastructure``);
4. exactly one ClusterDeployment labelled with the cluster, and the AgentClusterInstall it
   names (``WaitingForAssistedInstaller``);
5. the day-2 gate: a worker joins only while the ACI state is ``adding-hosts``,
   ``pending-for-input``, ``insufficient`` or empty (``WaitingForInstallComplete``);
6. the pool's InfraEnv (``<cluster>-control-plane`` or ``<cluster>-<machine deployment>``),
   created once by the first config that needs it and owned by it; ``status.infraEnvRef``.
   The configs of one pool take turns at the pool's shared objects (a lock per pool, here and
   for the template in 7): they run at once, and without turns each found the InfraEnv
   missing and applied it, and each patched the template from its own read (409s);
7. the InfraEnv's ISO URL (``WaitingForLiveISOURL``), optionally sent to the image service's
   cluster address, into ``status.isoDownloadURL``, the Machine's Metal3Machine and the pool's
   Metal3MachineTemplate (``image.url``, ``format: live-iso``; the Metal3Machine first, as it
   is what the host boots, the template serving later clones; upstream wrote the template
   first);
8. the empty bootstrap data Secret named like the config; then ``ready``.

Where upstream requeues (20 s for the infrastructure, 60 s for the day-2 gate, a plain requeue
for the installer's objects) this reconciler stops and reports the reason: the event that ends
the wait (the CAPI Cluster's, the ClusterDeployment's or ACI's, the InfraEnv's) wakes it,
``handlers`` maps those events to the configs still waiting. Upstream's separate InfraEnv
controller, which copied the ISO URL into every config's status, is folded in here: the config
reads its InfraEnv itself (level-triggered), so there is no second writer of
``isoDownloadURL`` and no "skipped, need to retry" when a config has no ref yet. The template
is patched only when it does not hold the image already (upstream patched it on every
reconcile, a pointer comparison).

Deletion (upstream's §"delete flow"): a control-plane config whose Machine is not being
deleted refuses (condition ``Deleting``, no error: the Machine's deletion event wakes it);
otherwise the bound Agent is deleted, ``agentRef`` cleared, the finalizer removed. Unlike
upstream, a config whose Machine is already gone lets go too (upstream stopped at the missing
owner and kept its finalizer forever).

Status goes through the writer: one report per run, only when the object does not say it
already, so a second run writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from services.baremetal.assisted_bootstrap import logic
from services.baremetal.assisted_bootstrap.logic import condition
from services.baremetal.assisted_bootstrap.ports import SERVICE_KIND, Deps, Json
from shared.errors import KubeConflict, KubeNotFound, PermanentError, TemporaryError
from shared.kube import ResourceKind
from shared.messages import Condition, Message, ResourceChanged
from shared.owned import add_finalizer, remove_finalizer, set_spec
from shared.reconcile import Target, get_or_none, report
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    METAL3_MACHINE,
    METAL3_MACHINE_TEMPLATE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
    owner_reference,
)
from shared.seen import key_of

log = logging.getLogger(__name__)

KIND = OPENSHIFT_ASSISTED_CONFIG
T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    """Where a run ended: ``DataSecretAvailable`` and the status fields to report."""

    reason: str
    ok: bool = False
    message: str = ""
    fields: Json = field(default_factory=dict)


class ImageServiceMissing(TemporaryError):
    """The image service's Service is not there (yet): upstream retried, so do we."""


class _Failed(Exception):
    """A step failed: its condition is reported, then ``error`` propagates."""

    def __init__(self, reason: str, error: Exception) -> None:
        super().__init__(str(error))
        self.reason = reason
        self.error = error


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    oac = await deps.seen.get(deps.kube, KIND, target.namespace, target.name)
    if oac is None:
        deps.settled.forget(target.key)
        deps.seen.forget(target.key)
        return []
    if _done(oac, target, cause, deps):
        return []
    if logic.deleting(oac):
        await _delete(oac, await _machine(oac, deps, fresh=True), cause, deps)
        deps.settled.forget(target.key)
        deps.seen.forget(target.key)
        return []
    machine = await _machine(oac, deps)
    if machine is None:
        log.debug("%s: waiting for its owner Machine", logic.object_key(oac))
        deps.seen.decide(target.key, oac)
        return []
    oac = deps.seen.note(target.key, await add_finalizer(deps.kube, KIND, oac, logic.FINALIZER))
    try:
        outcome = await _converge(oac, machine, deps)
    except _Failed as failed:
        message = str(failed.error)
        log.warning("%s: %s: %s", logic.object_key(oac), failed.reason, message)
        await _report(oac, Outcome(failed.reason, message=message), cause, deps, success=False)
        raise failed.error from None
    if outcome is None:
        deps.seen.decide(target.key, oac)
        return []
    patch, conditions = await _report(oac, outcome, cause, deps, success=True)
    deps.seen.decide(target.key, oac, patch, conditions)
    if outcome.ok:
        deps.settled.note(target.key, _ready_fact(oac))
    return []


async def _machine(oac: Json, deps: Deps, *, fresh: bool = False) -> Json | None:
    """The config's owner Machine. Only the facts a Machine keeps for life are used here (its
    cluster, role, pool, infrastructure and owners), so one read (or its event, see
    ``handlers``) serves every later run, until the Machine goes; a deleting config reads
    it ``fresh`` (whether the Machine is being deleted too)."""
    owner = logic.owner_ref(oac, "Machine", logic.CAPI_GROUP)
    if owner is None:
        return None
    if not fresh and (known := deps.seen.recall(owner.get("uid"))) is not None:
        return known
    namespace = logic.meta(oac)["namespace"]
    machine = await get_or_none(deps.kube, MACHINE, namespace, str(owner["name"]))
    if machine is not None and not logic.deleting(machine):
        remember_machine(machine, deps)
    return machine


async def of_cluster(
    deps: Deps, kind: ResourceKind, namespace: str, cluster: str
) -> list[tuple[Json, bool]]:
    """The cluster's objects of ``kind`` (labelled with it), each with whether it is current
    (False: in doubt, to be read): listed once, then as their events keep them (``handlers``
    notes every event of these kinds; ``seen.Seen.kept``)."""
    index = f"{kind.token}/{namespace}/{cluster}"
    if not deps.seen.listed(index):
        found, _ = await deps.kube.list(
            kind, namespace=namespace, label_selector=f"{logic.CLUSTER_NAME_LABEL}={cluster}"
        )
        for obj in found:
            deps.seen.note(key_of(kind, namespace, logic.meta(obj)["name"]), obj)
        deps.seen.list_done(index)
    return [
        (obj, current)
        for obj, current in deps.seen.kept(kind, namespace)
        if logic.labels(obj).get(logic.CLUSTER_NAME_LABEL) == cluster
    ]


def remember_machine(machine: Json, deps: Deps) -> None:
    """A Machine's life-long facts, by its uid and by its infrastructure machine's name."""
    deps.seen.remember(logic.meta(machine).get("uid"), machine)
    deps.seen.remember(_infra_key(machine), machine)


def forget_machine(machine: Json, deps: Deps) -> None:
    deps.seen.drop(logic.meta(machine).get("uid"))
    deps.seen.drop(_infra_key(machine))
    deps.seen.drop(_template_key(machine))


def machine_of(namespace: str, infra: str, deps: Deps) -> Json | None:
    """The Machine known to own the Metal3Machine ``infra`` (its ``infrastructureRef``)."""
    return deps.seen.recall(f"machine-of/{namespace}/{infra}")


def _infra_key(machine: Json) -> str | None:
    ref = logic.spec(machine).get("infrastructureRef") or {}
    if ref.get("kind") != METAL3_MACHINE.kind or not ref.get("name"):
        return None
    return f"machine-of/{logic.meta(machine).get('namespace')}/{ref['name']}"


def _done(oac: Json, target: Target, cause: Message, deps: Deps) -> bool:
    """Ready at this generation, and not woken by its InfraEnv (whose URL may have changed):
    nothing else can change what this config has done."""
    if logic.deleting(oac) or _from_infra_env(cause):
        return False
    if deps.settled.knows(target.key, _ready_fact(oac)):
        return True
    state = logic.status(oac)
    available = logic.condition_of(oac, logic.DATA_SECRET) or {}
    return bool(
        state.get("ready")
        and state.get("dataSecretName")
        and state.get("observedGeneration") == logic.meta(oac).get("generation")
        and available.get("status") == "True"
    )


def _ready_fact(oac: Json) -> str:
    return f"ready/{logic.meta(oac).get('uid')}/{logic.meta(oac).get('generation')}"


def _from_infra_env(cause: Message) -> bool:
    return isinstance(cause, ResourceChanged) and (cause.ref.api_version, cause.ref.kind) == (
        INFRA_ENV.api_version,
        INFRA_ENV.kind,
    )


async def _step(reason: str, work: Awaitable[T]) -> T:
    """``work``'s result; a failure that must be shown (permanent, or the image service
    missing) becomes ``_Failed`` under ``reason``. Other temporary failures (the API server
    unavailable, a conflict) propagate as they are and the consumer retries."""
    try:
        return await work
    except PermanentError as exc:
        # a rule's own reason (a malformed ACI) says more than the step's generic one
        raise _Failed(reason if exc.reason == "Failed" else exc.reason, exc) from exc
    except ImageServiceMissing as exc:
        raise _Failed(reason, exc) from exc


# --- the gates -------------------------------------------------------------------------------


async def _converge(oac: Json, machine: Json, deps: Deps) -> Outcome | None:
    namespace = logic.meta(oac)["namespace"]
    cluster_name = logic.cluster_of(machine) or ""
    deployment = await _gates(namespace, cluster_name, machine, deps)
    if deployment is None or isinstance(deployment, Outcome):
        return deployment
    pool = await _step(logic.INFRA_ENV_FAILED, _pool(cluster_name, machine))
    async with deps.locks(_pool_key(namespace, pool)):
        infra = await _step(
            logic.INFRA_ENV_FAILED,
            _infra_env(oac, pool, cluster_name, deployment, deps),
        )
    fields: Json = {}
    if not logic.infra_env_ref_name(oac):
        fields["infraEnvRef"] = logic.infra_env_ref(infra)
    published = logic.iso_url(infra)
    if not published:
        message = f"InfraEnv {logic.meta(infra)['name']} has no ISO URL yet"
        return Outcome(logic.WAITING_FOR_URL, message=message, fields=fields)
    url = await _step(logic.PROPAGATING_FAILED, download_url(published, deps))
    fields["isoDownloadURL"] = url
    # the host's own Metal3Machine first: it is what boots; the template serves later clones
    clone = await _step(logic.PROPAGATING_FAILED, _machine_image(url, machine, deps))
    async with deps.locks(_pool_key(namespace, pool)):
        await _step(logic.PROPAGATING_FAILED, _template_image(url, machine, clone, deps))
    await _step(logic.CREATING_SECRET_FAILED, _secret(oac, cluster_name, deps))
    fields |= {"ready": True, "dataSecretName": logic.meta(oac)["name"]}
    return Outcome(logic.SECRET_CREATED, ok=True, fields=fields)


async def _gates(namespace: str, cluster: str, machine: Json, deps: Deps) -> str | Outcome | None:
    """The Cluster's infrastructure, the installer, for a worker the day-2 gate: the
    ClusterDeployment's name once all pass, else why the config waits (None: no Cluster)."""
    ready = await _cluster_ready(namespace, cluster, deps) if cluster else None
    if ready is None:
        log.debug("%s/%s: waiting for its Cluster", namespace, logic.meta(machine).get("name"))
        return None
    if not ready:
        return Outcome(
            logic.WAITING_FOR_INFRA, message=f"Cluster {cluster} infrastructure is not ready"
        )
    installer = await _installer(namespace, cluster, deps)
    if isinstance(installer, Outcome):
        return installer
    deployment, aci = installer
    if logic.is_control_plane(machine):
        return deployment
    state = await _step(logic.WAITING_FOR_INSTALL, _state(aci))
    if not logic.day2_open(state):
        return Outcome(
            logic.WAITING_FOR_INSTALL,
            message=f"the cluster's installation is {state}: workers join once it is adding-hosts",
        )
    return deployment


async def _state(aci: Json) -> str:
    return logic.aci_state(aci)


async def _pool(cluster: str, machine: Json) -> str:
    return logic.infra_env_name(cluster, machine)


def _pool_key(namespace: str, pool: str) -> str:
    """The lock of one pool's shared objects (its InfraEnv, its template): the configs of a
    pool run at once, and one of them writing while the others wait and then find it done
    costs one write instead of a race of writes (two applies, a conflict on the template)."""
    return f"pool/{namespace}/{pool}"


async def _cluster_ready(namespace: str, cluster: str, deps: Deps) -> bool | None:
    """Whether the Cluster's infrastructure is ready (None: no Cluster)."""
    found = await deps.seen.get(deps.kube, CAPI_CLUSTER, namespace, cluster)
    return None if found is None else bool(logic.status(found).get("infrastructureReady"))


async def _installer(namespace: str, cluster: str, deps: Deps) -> tuple[str, Json] | Outcome:
    """The name of the cluster's one ClusterDeployment and its AgentClusterInstall, or why
    we wait (both as this replica knows them: listed once, then kept by their events)."""
    deployments = [cd for cd, _ in await of_cluster(deps, CLUSTER_DEPLOYMENT, namespace, cluster)]
    if len(deployments) != 1:
        return Outcome(
            logic.WAITING_FOR_INSTALLER,
            message=f"{len(deployments)} ClusterDeployments of cluster {cluster}, waiting for one",
        )
    deployment = logic.meta(deployments[0])["name"]
    name = (logic.spec(deployments[0]).get("clusterInstallRef") or {}).get("name")
    aci = await deps.seen.get(deps.kube, AGENT_CLUSTER_INSTALL, namespace, name) if name else None
    if aci is None:
        return Outcome(
            logic.WAITING_FOR_INSTALLER,
            message=f"waiting for the AgentClusterInstall of ClusterDeployment {deployment}",
        )
    return deployment, aci


# --- the InfraEnv and its image ----------------------------------------------------------------


async def _infra_env(oac: Json, name: str, cluster: str, deployment: str, deps: Deps) -> Json:
    """The pool's InfraEnv; created (server-side apply) only when it does not exist, so the
    first config stays its owner. The caller holds the pool's lock, so the configs of this
    replica never race to create it; two replicas still might (a partition moving), and then
    both configs end up owners: the ownerReference is not a controller one, which the API
    server accepts and GC honours. Known from its events (its ISO URL), it is not read."""
    namespace = logic.meta(oac)["namespace"]
    found = await deps.seen.get(deps.kube, INFRA_ENV, namespace, name)
    if found is not None:
        return found
    body = logic.infra_env(
        oac,
        name=name,
        cluster=cluster,
        cluster_deployment=deployment,
        owner=owner_reference(KIND, oac, controller=False),
    )
    log.info("%s: creating InfraEnv %s", logic.object_key(oac), name)
    made = await deps.kube.apply(INFRA_ENV, body, field_manager=logic.FIELD_MANAGER)
    return deps.seen.note(key_of(INFRA_ENV, namespace, name), made)


async def download_url(url: str, deps: Deps) -> str:
    """``url`` as hosts should fetch it: as published, or at the image service's cluster
    address (upstream's ``USE_INTERNAL_IMAGE_URL``)."""
    images = deps.images
    if not images.internal:
        return url
    try:
        service = await deps.kube.get(SERVICE_KIND, images.namespace, images.name)
    except KubeNotFound as exc:
        raise ImageServiceMissing(
            f"image service Service {images.namespace}/{images.name} not found"
        ) from exc
    cluster_ip = logic.spec(service).get("clusterIP")
    ports = logic.spec(service).get("ports") or []
    if not cluster_ip or cluster_ip == "None" or not ports or not ports[0].get("port"):
        raise PermanentError(
            f"image service Service {images.namespace}/{images.name} has no cluster IP or port",
            reason=logic.PROPAGATING_FAILED,
        )
    return logic.internal_url(url, cluster_ip, int(ports[0]["port"]))


async def _template_image(url: str, machine: Json, clone: Json | None, deps: Deps) -> None:
    """The image into the pool's Metal3MachineTemplate, written only when it does not hold it
    already (under the pool's lock: the first config of the pool writes, the others find it).
    The template is the one the Machine's Metal3Machine says it was cloned from (Cluster
    API's ``cloned-from`` annotations), else found through the Machine's owners."""
    namespace = logic.meta(machine)["namespace"]
    template_name = logic.cloned_from(clone) if clone else None
    template_name = template_name or await _template(machine, deps)
    template = await get_or_none(deps.kube, METAL3_MACHINE_TEMPLATE, namespace, template_name)
    if template is None:
        raise PermanentError(
            f"Metal3MachineTemplate {namespace}/{template_name} does not exist",
            reason=logic.PROPAGATING_FAILED,
        )
    await set_spec(
        deps.kube,
        METAL3_MACHINE_TEMPLATE,
        template,
        {"template": {"spec": {"image": logic.image(url)}}},
    )


async def _machine_image(url: str, machine: Json, deps: Deps) -> Json | None:
    """The image into the Machine's Metal3Machine, written only when it does not hold it;
    returns the Metal3Machine (None: not there yet, and then it is cloned from the template,
    image included)."""
    namespace = logic.meta(machine)["namespace"]
    ref = logic.spec(machine).get("infrastructureRef") or {}
    if ref.get("kind") != METAL3_MACHINE.kind or not ref.get("name"):
        return None
    infra = await get_or_none(deps.kube, METAL3_MACHINE, namespace, ref["name"])
    if infra is None:
        return None
    return await set_spec(deps.kube, METAL3_MACHINE, infra, {"image": logic.image(url)})


async def _template(machine: Json, deps: Deps) -> str:
    """The name of the Metal3MachineTemplate the Machine's pool is made from: its control
    plane's ``machineTemplate.infrastructureRef``, else its MachineSet's (or, failing that,
    its MachineDeployment's) ``spec.template.spec.infrastructureRef``. Looked up once per
    Machine: the template a Machine was made from stays its own (a control plane or
    deployment moved to another template makes new Machines, which look it up)."""
    key = _template_key(machine)
    if (known := deps.seen.recall(key)) is not None:
        return str(known["name"])
    name = await _template_of(machine, deps)
    deps.seen.remember(key, {"name": name})
    return name


def _template_key(machine: Json) -> str:
    return f"template-of/{logic.meta(machine).get('uid')}"


async def _template_of(machine: Json, deps: Deps) -> str:
    namespace = logic.meta(machine)["namespace"]
    ref: Json = {}
    acp = logic.owner_name(machine, OPENSHIFT_ASSISTED_CONTROL_PLANE.kind)
    if acp:
        found = await get_or_none(deps.kube, OPENSHIFT_ASSISTED_CONTROL_PLANE, namespace, acp)
        ref = (logic.spec(found or {}).get("machineTemplate") or {}).get("infrastructureRef") or {}
    else:
        machine_set = logic.owner_name(machine, MACHINE_SET.kind, logic.CAPI_GROUP)
        if machine_set:
            ref = _template_ref(await get_or_none(deps.kube, MACHINE_SET, namespace, machine_set))
        deployment = logic.labels(machine).get(logic.DEPLOYMENT_LABEL)
        if not ref and deployment:
            ref = _template_ref(
                await get_or_none(deps.kube, MACHINE_DEPLOYMENT, namespace, deployment)
            )
    if ref.get("kind") != METAL3_MACHINE_TEMPLATE.kind or not ref.get("name"):
        raise PermanentError(
            f"Machine {logic.object_key(machine)}: no Metal3MachineTemplate found through "
            f"its control plane, MachineSet or MachineDeployment (found {ref or 'none'})",
            reason=logic.PROPAGATING_FAILED,
        )
    return str(ref["name"])


def _template_ref(owner: Json | None) -> Json:
    template = logic.spec(owner or {}).get("template") or {}
    return dict((template.get("spec") or {}).get("infrastructureRef") or {})


async def _secret(oac: Json, cluster: str, deps: Deps) -> None:
    """The empty bootstrap data Secret (a host boots the live ISO, not user data); created
    once: the status naming it says it exists, so does this replica having reported it ready
    (a run right after that one may read the status before the writer wrote it), and
    AlreadyExists is fine."""
    name = logic.meta(oac)["name"]
    key = key_of(KIND, logic.meta(oac)["namespace"], name)
    if logic.status(oac).get("dataSecretName") == name or deps.settled.knows(key, _ready_fact(oac)):
        return
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": logic.meta(oac)["namespace"],
            "labels": {logic.CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [owner_reference(KIND, oac, controller=True)],
        },
    }
    with contextlib.suppress(KubeConflict):  # created by an earlier run
        await deps.kube.create(SECRET, secret)


# --- status ----------------------------------------------------------------------------------


async def _report(
    oac: Json, outcome: Outcome, cause: Message, deps: Deps, *, success: bool
) -> tuple[Json, tuple[Condition, ...]]:
    """``DataSecretAvailable``, its ``Ready`` summary and the fields, unless the object says
    them already; ``observedGeneration`` only for a run that did not fail (as upstream).
    Returns what the status should say."""
    available = condition(logic.DATA_SECRET, outcome.ok, outcome.reason, outcome.message)
    conditions = logic.summary(available)
    patch = dict(outcome.fields)
    if success:
        patch["observedGeneration"] = logic.meta(oac).get("generation")
    if not logic.holds(oac, patch, conditions):
        await report(deps, KIND, oac, cause, conditions=conditions, **patch)
    return patch, conditions


# --- deletion --------------------------------------------------------------------------------


async def _delete(oac: Json, machine: Json | None, cause: Message, deps: Deps) -> None:
    if logic.FINALIZER not in (logic.meta(oac).get("finalizers") or []):
        return
    if logic.is_control_plane(oac) and machine is not None and not logic.deleting(machine):
        message = (
            f"a control-plane config is deleted with its Machine {logic.meta(machine)['name']}, "
            "which is not being deleted"
        )
        log.warning("%s: deletion refused: %s", logic.object_key(oac), message)
        refused = condition(logic.DELETING, False, logic.MACHINE_NOT_DELETED, message)
        if not logic.holds(oac, {}, [refused]):
            await report(deps, KIND, oac, cause, conditions=[refused])
        return
    agent = logic.agent_ref_name(oac)
    if agent:
        try:
            await deps.kube.delete(AGENT, logic.meta(oac)["namespace"], agent)
            log.info("%s: deleted Agent %s", logic.object_key(oac), agent)
        except KubeNotFound:
            pass
        await report(deps, KIND, oac, cause, agentRef=None)
    await remove_finalizer(deps.kube, KIND, oac, logic.FINALIZER)
