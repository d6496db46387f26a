"""The helm service's handlers: converge one Cluster's release, or take it down.

Every trigger (the Cluster changed, a prerequisite settled, the CAPI Cluster went away, a
nudge) ends in ``reconcile``, which reads the Cluster and runs the create or the delete path
under the Cluster's lock. Both paths are level-triggered and idempotent: a run that finds the
world already converged changes nothing, and a run that has to wait reports why on the
``Reconciled`` condition and ends; the event that ends the wait starts the next run. A
ClusterTemplate or a Secret appearing nudges the Clusters that wait for it.

A run names its Cluster once (``Run``: the object as read, its ref, partition and cause) and
tells the writer everything through ``deps.reporter``: conditions, the finalizer, the
``cluster-template`` label and ``last-handled-configuration`` annotation, and nudges.

Order of effects on create follows upstream's create handler (``on_cluster_create`` in
azimuth-cloud/azimuth-capi-operator ``azimuth_capi/operator.py``): finalizer, template, cloud
credentials, etcd key, identity, values, lease, Zenith reservation, the Helm release, the
per-cluster zenith-operator, then the ``cluster-template`` label and the
``last-handled-configuration`` annotation, written only once all of that succeeded.

Delete (upstream's ``on_cluster_delete``, which blocks on a watch of the CAPI Cluster with no
timeout): uninstall, delete the etcd key, wait for the CAPI Cluster to disappear (its DELETED
event wakes us; past ``delete_deadline_seconds`` the condition names what is stuck), wait for
the lease service to release the Lease, and only then let the writer remove the finalizer. A
paused Cluster is cleaned up all the same. Every step reports on ``Reconciled`` as it begins or
waits, and so does a failure (a permanent one, such as RBAC forbidding the uninstall, at once
and then dead-lettered), so a deletion always writes the status, which the writer derives as
phase Deleting. A release whose name helm refuses cannot exist, so it counts as uninstalled
and the delete completes.

The deadline is a timer (``shared.timers``) that publishes a nudge into the Cluster's
partition at that moment. Timers live in memory, so they follow claims: a deletion seen by a
run arms its Cluster's deadline, and a claimed partition arms those of its Clusters already
being deleted (``arm_claimed``); a lost partition's timers go (``drop_deadlines``), and its
next owner arms them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from services.helm import logic, values, zenith
from services.helm.logic import Wait
from services.helm.ports import Deps, Json
from shared import subjects
from shared.claims import Claim
from shared.consumer import Batch
from shared.errors import CapibusError, KubeConflict, KubeNotFound, PermanentError
from shared.helm import release_selector
from shared.kube import ResourceKind
from shared.messages import (
    Condition,
    Message,
    ObjectRef,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
    decode,
    stable_id,
)
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, SECRET, ref_to

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """The Cluster one run works on, named once: the object as read, its ref and partition,
    and the message that caused the run (None for the work a claim starts)."""

    cluster: Json
    ref: ObjectRef
    partition: int
    cause: Message | None = None

    @classmethod
    def of(cls, cluster: Json, deps: Deps, cause: Message | None = None) -> Run:
        ref = ref_to(CLUSTER, cluster)
        return cls(cluster, ref, subjects.partition_of(ref.key, deps.partitions), cause)

    @property
    def key(self) -> str:
        return self.ref.key

    @property
    def uid(self) -> str:
        return str(self.ref.uid)

    @property
    def meta(self) -> Json:
        meta: Json = self.cluster["metadata"]
        return meta

    @property
    def spec(self) -> Json:
        spec: Json = self.cluster["spec"]
        return spec


# --- entry points ---------------------------------------------------------------------


async def on_cluster_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    if batch.latest.event != "DELETED":
        await reconcile(batch.latest.ref.key, cause=batch.latest, deps=deps)


async def on_capi_cluster_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    # Only its disappearance matters here: it is what a deleting Cluster waits for.
    if batch.latest.event == "DELETED":
        await reconcile(batch.latest.ref.key, cause=batch.latest, deps=deps)


async def on_cluster_message(
    batch: Batch[PrerequisiteChanged] | Batch[ReconcileCluster], deps: Deps
) -> None:
    await reconcile(batch.latest.ref.key, cause=batch.latest, deps=deps)


async def on_template_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """A ClusterTemplate appeared or changed: wake Clusters that still wait for it."""
    event = batch.latest
    if event.event == "DELETED":
        return
    name = event.ref.name
    clusters, _ = await deps.kube.list(CLUSTER)
    users = (c for c in clusters if c["spec"].get("templateName") == name)
    await _nudge_waiting(users, f"ClusterTemplate {name} changed", event, deps)


async def on_secret_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """A Secret appeared: wake Clusters of its namespace that wait for it as credentials."""
    event = batch.latest
    if event.event != "ADDED" or not logic.may_be_credentials(event.object):
        return
    name = event.ref.name
    clusters, _ = await deps.kube.list(CLUSTER, namespace=event.ref.namespace or "")
    users = (c for c in clusters if c["spec"].get("cloudCredentialsSecretName") == name)
    await _nudge_waiting(users, f"Secret {name} appeared", event, deps)


async def reconcile(key: str, *, cause: Message, deps: Deps) -> None:
    namespace, name = key.split("/", 1)
    memory = deps.memory
    async with memory.locks(key):
        try:
            cluster = await deps.kube.get(CLUSTER, namespace, name)
        except KubeNotFound:
            memory.forget(key)
            deps.timers.cancel(key)
            return
        run = Run.of(cluster, deps, cause)
        if run.meta.get("deletionTimestamp"):
            await take_down(run, deps)
        elif isinstance(cause, ResourceChanged) and memory.converged.get(key) == (
            run.uid,
            run.meta.get("generation"),
        ):
            # The Cluster's own status or metadata moved (often because of us): the spec we
            # converged is unchanged, and anything else we depend on wakes us by its own event.
            return
        else:
            await converge(run, deps)


# --- create and update ----------------------------------------------------------------


async def converge(run: Run, deps: Deps) -> None:
    meta, finalizer = run.meta, deps.tuning.finalizer
    if finalizer not in (meta.get("finalizers") or []):
        # Nothing with a lifetime is made before the finalizer guarantees its cleanup.
        await deps.reporter.change_metadata(run.ref, cause=run.cause, add_finalizers=(finalizer,))
        return
    if run.spec.get("paused"):
        await _report(run, Wait("Paused", "spec.paused is set").condition(), deps)
        return
    try:
        outcome = await _install(run, deps)
    except CapibusError as exc:
        await _report(run, _failure(exc), deps)
        raise
    converged = deps.memory.converged
    if isinstance(outcome, Wait):
        converged.pop(run.key, None)
        await _report(run, outcome.condition(), deps)
        return
    if outcome is None and converged.get(run.key) == (run.uid, meta["generation"]):
        return  # already converged and reported; nothing changed
    labels, annotations = logic.handled_metadata(run.cluster)
    await deps.reporter.change_metadata(
        run.ref,
        cause=run.cause,
        labels=labels,
        annotations=annotations,
        if_generation=meta["generation"],
    )
    revision = outcome or "release unchanged"
    done = Condition(type=logic.CONDITION, status="True", reason="Deployed", message=revision)
    await _report(run, done, deps, extra={"lastUpdated": _now()})
    converged[run.key] = (run.uid, meta["generation"])


async def _install(run: Run, deps: Deps) -> Wait | str | None:
    """Run the steps before the release in upstream's order; a ``Wait`` stops at the first gap.

    Returns the release's new revision, or None when the release was already as wanted.
    """
    spec = run.spec
    inputs = await _inputs(run, deps)
    if isinstance(inputs, Wait):
        return inputs
    template, credentials, stored = inputs
    oidc = None
    if deps.oidc_enabled:
        fact = await _fact(run, "identity", deps)
        wait = logic.prerequisite_wait(run.cluster, "identity", fact)
        if wait or fact is None:
            return wait or Wait("WaitingForIdentity", "")
        oidc = values.OidcInputs(**_oidc_fields(fact))
    size_name_map = None
    if spec.get("leaseName"):
        fact = await _fact(run, "lease", deps)
        wait = logic.prerequisite_wait(run.cluster, "lease", fact)
        if wait or fact is None:
            return wait or Wait("WaitingForLease", "")
        size_name_map = dict(fact.outputs.get("sizeNameMap") or {})
    zenith_layer = None
    if deps.zenith_enabled:
        layer = await zenith.apiserver_layer(cluster=run.cluster, deps=deps)
        if isinstance(layer, Wait):
            return layer
        zenith_layer = layer
    settings = deps.tuning.values
    release_values = values.compose(
        defaults=settings.default_values,
        template_values=template["spec"].get("values") or {},
        cluster_layer=values.cluster_values(spec, oidc=oidc, settings=settings),
        overrides=settings.flavor_specific_node_group_overrides,
        size_name_map=size_name_map,
        zenith_layer=zenith_layer,
    )
    return await _release(run, release_values, credentials, deps, stored=stored)


async def _release(
    run: Run, release_values: Json, credentials: Json, deps: Deps, *, stored: bool
) -> str | None:
    releases = deps.memory.releases
    fingerprint = logic.digest(deps.chart, release_values)
    if releases.get(run.key) == (run.uid, fingerprint):
        return None
    outcome = await deps.helm.ensure_release(
        run.ref.name, run.ref.namespace or "", deps.chart, release_values, absent=not stored
    )
    if deps.zenith_enabled:
        await zenith.apply_operator(cluster=run.cluster, credentials=credentials, deps=deps)
    releases[run.key] = (run.uid, fingerprint)
    log.info("%s: release %s (revision %s)", run.key, outcome.action, outcome.revision)
    return f"revision {outcome.revision}"


async def _stored(run: Run, deps: Deps) -> bool:
    """Whether Helm stores a revision of the Cluster's release; when it stores none, helm's
    own checks (the revision to repair or compare) are two processes that cannot matter.

    One LIST of the release's storage Secrets, unless this replica installed it already.
    """
    if run.key in deps.memory.releases and deps.memory.releases[run.key][0] == run.uid:
        return True
    selector = release_selector(run.ref.name)
    stored, _ = await deps.kube.list(
        SECRET, namespace=run.ref.namespace, label_selector=selector, limit=1
    )
    return bool(stored)


async def _inputs(run: Run, deps: Deps) -> tuple[Json, Json, bool] | Wait:
    """The template, the credentials and whether Helm stores the release, read at once with
    the etcd key (one round trip instead of four in a row: on a busy API server each is tens
    of milliseconds of a first install's way); the key is made only once template and
    credentials exist, in upstream's order. The release LIST is wasted when a prerequisite
    is missing, a rare run that ends in a wait anyway."""
    namespace, spec = run.ref.namespace, run.spec
    template, credentials, etcd_key, stored = await asyncio.gather(
        _get(deps, CLUSTER_TEMPLATE, None, spec["templateName"]),
        _get(deps, SECRET, namespace, spec["cloudCredentialsSecretName"]),
        _get(deps, SECRET, namespace, f"{run.ref.name}-etcd-key"),
        _stored(run, deps),
    )
    if template is None:
        return Wait("TemplateNotFound", f"ClusterTemplate {spec['templateName']} does not exist")
    if credentials is None:
        secret = spec["cloudCredentialsSecretName"]
        return Wait("CloudCredentialsNotFound", f"Secret {secret} does not exist")
    if etcd_key is None:
        # A conflict means an earlier run made it and did not get to see the answer.
        with contextlib.suppress(KubeConflict):
            key = logic.etcd_key_secret(run.cluster, secrets.token_bytes(32))
            await deps.kube.create(SECRET, key)
    return template, credentials, stored


def _oidc_fields(fact: PrerequisiteChanged) -> Json:
    out = fact.outputs
    return {
        "issuer_url": out["issuerUrl"],
        "client_id": out["clientId"],
        "root_group": out["rootGroup"],
        "platform_users_group": out.get("platformUsersGroup"),
    }


# --- delete ---------------------------------------------------------------------------


async def take_down(run: Run, deps: Deps) -> None:
    finalizer = deps.tuning.finalizer
    if finalizer not in (run.meta.get("finalizers") or []):
        await _report_others(run, deps)
        return
    try:
        wait = await _dismantle(run, deps)
    except CapibusError as exc:
        # Reported at once, a permanent error long before the DeletionStuck deadline; raised
        # so the consumer retries a temporary one and dead-letters a permanent one.
        await _report(run, _failure(exc, doing="deleting"), deps)
        raise
    if wait is not None:
        await _report(run, wait.condition(), deps)
        return
    await deps.reporter.change_metadata(run.ref, cause=run.cause, remove_finalizers=(finalizer,))


async def _dismantle(run: Run, deps: Deps) -> Wait | None:
    """Uninstall and delete the etcd key, then say what the deletion still waits for.

    A release whose name helm refuses cannot exist: the adapter answers "not installed" and
    the delete goes on.
    """
    memory = deps.memory
    namespace, name = run.ref.namespace or "", run.ref.name
    memory.releases.pop(run.key, None)
    memory.converged.pop(run.key, None)
    if memory.uninstalled.get(run.key) != run.uid:
        # Said before helm runs (pre-delete hooks may take long), so the condition and the
        # phase's write show the deletion at once instead of the last install error.
        uninstalling = Wait("UninstallingRelease", f"uninstalling Helm release {name}")
        await _report(run, uninstalling.condition(), deps)
        if await deps.helm.uninstall(name, namespace):
            log.info("%s: release uninstalled", run.key)
        memory.uninstalled[run.key] = run.uid
    await _delete(deps, SECRET, namespace, f"{name}-etcd-key")
    return await _deletion_wait(run, deps)


async def _report_others(run: Run, deps: Deps) -> None:
    """Our part of the deletion is done (or never began); name the finalizers it waits for,
    such as ``foregroundDeletion`` while the Cluster's dependents go."""
    others = run.meta.get("finalizers") or []
    if others:
        message = f"capibus has cleaned up; waiting for finalizers: {', '.join(others)}"
        await _report(run, Wait("WaitingForFinalizers", message).condition(), deps)


def _failure(exc: CapibusError, *, doing: str = "") -> Condition:
    """The condition for a run that failed: a permanent error's reason, else the error type."""
    reason = exc.reason if isinstance(exc, PermanentError) else type(exc).__name__
    return Wait(reason, f"{doing}: {exc}" if doing else str(exc)).condition()


async def _deletion_wait(run: Run, deps: Deps) -> Wait | None:
    capi = await _get(deps, CAPI_CLUSTER, run.ref.namespace, run.ref.name)
    if capi is not None:
        deadline = logic.delete_deadline(run.cluster, deps.tuning.delete_deadline_seconds)
        if deadline is not None and datetime.now(UTC) >= deadline:
            return Wait("DeletionStuck", logic.stuck_message(capi))
        if deadline is not None:
            _arm_deadline(run, deadline, deps)
        return Wait("WaitingForClusterAPI", "waiting for the Cluster API cluster to be deleted")
    lease = run.spec.get("leaseName")
    if lease:
        fact = await _fact(run, "lease", deps)
        if fact is None or fact.ref.uid != run.uid or not fact.released:
            return Wait("WaitingForLeaseRelease", f"waiting to release Lease {lease}")
    return None


# --- deadlines --------------------------------------------------------------------------


def _arm_deadline(run: Run, deadline: datetime, deps: Deps) -> None:
    """Wake this Cluster at its deadline, not every minute before it.

    Every replica that sees the deletion arms the same moment with the same message id, so
    JetStream keeps one nudge; the replica owning the partition acts on it.
    """
    message_id = stable_id(run.uid, "delete-deadline")
    armed = deps.timers.pending().get(run.key)
    if armed is not None and armed.message.id == message_id:
        return  # armed by an earlier run: only the new message's time stamp would differ
    subject, nudge = deps.reporter.reconcile(
        run.ref, reason="deletion deadline", message_id=message_id
    )
    deps.timers.at(run.key, deadline, subject, nudge, partition=run.partition)


async def arm_claimed(claim: Claim, deps: Deps) -> int:
    """Arm the deadline of every Cluster of ``claim``'s partition that we are deleting, from
    the one list of Clusters the claims of this rebalance share; returns how many.

    A deadline already past fires at once, so a deletion that got stuck while no replica held
    the partition is reported now rather than at its Cluster's next event.
    """
    clusters, _ = await claim.round.once("clusters", lambda: deps.kube.list(CLUSTER))
    armed = 0
    for cluster in clusters:
        run = Run.of(cluster, deps)
        deadline = logic.delete_deadline(cluster, deps.tuning.delete_deadline_seconds)
        ours = deps.tuning.finalizer in (run.meta.get("finalizers") or [])
        if run.partition == claim.partition and deadline is not None and ours:
            _arm_deadline(run, deadline, deps)
            armed += 1
    return armed


def drop_deadlines(partitions: Collection[int], deps: Deps) -> None:
    """Forget the deadlines of ``partitions`` and what was learned of their Clusters (lost:
    their next owner arms and learns them)."""
    deps.timers.drop(partitions)
    deps.memory.drop(partitions, deps.partitions)


# --- telling the writer ---------------------------------------------------------------


async def _report(run: Run, condition: Condition, deps: Deps, *, extra: Json | None = None) -> None:
    """Report ``condition`` (and ``extra`` status fields), unless this replica has reported
    the same condition for this Cluster last: a repeated wait is not sent again."""
    reported = deps.memory.reported
    if reported.get(run.key) == (run.uid, condition) and not extra:
        return
    await deps.reporter.report(run.ref, patch=extra, conditions=(condition,), cause=run.cause)
    reported[run.key] = (run.uid, condition)


async def _nudge_waiting(clusters: Iterable[Json], reason: str, cause: Message, deps: Deps) -> None:
    for cluster in clusters:
        if _reconciled(cluster):
            continue
        ref = ref_to(CLUSTER, cluster)
        try:
            await deps.reporter.nudge(ref, reason=reason, cause=cause)
        except CapibusError as exc:
            # The Cluster's own next event (or the deadline) still wakes it.
            log.warning("%s: could not publish a nudge: %s", ref.key, exc)


# --- reading --------------------------------------------------------------------------


async def _fact(run: Run, step: str, deps: Deps) -> PrerequisiteChanged | None:
    ref = run.ref
    subject = subjects.prerequisite(step, run.partition, ref.namespace or "", ref.name)
    body = await deps.bus.last_message(subjects.LIFECYCLE.name, subject)
    return decode(body, PrerequisiteChanged) if body else None


async def _get(deps: Deps, kind: ResourceKind, namespace: str | None, name: str) -> Json | None:
    try:
        return await deps.kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def _delete(deps: Deps, kind: ResourceKind, namespace: str | None, name: str) -> None:
    with contextlib.suppress(KubeNotFound):
        await deps.kube.delete(kind, namespace, name)


def _reconciled(cluster: Json) -> bool:
    for condition in (cluster.get("status") or {}).get("conditions") or []:
        if condition.get("type") == logic.CONDITION:
            return bool(condition.get("status") == "True")
    return False


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
