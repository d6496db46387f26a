"""The helm service's handlers: converge one Cluster's release, or take it down.

Every trigger (the Cluster changed, a prerequisite settled, the CAPI Cluster went away, a
nudge) ends in ``reconcile``, which reads the Cluster and runs the create or the delete path
under the Cluster's lock. Both paths are level-triggered and idempotent: a run that finds the
world already converged changes nothing, and a run that has to wait reports why on the
``Reconciled`` condition and ends; the event that ends the wait starts the next run.

Order of effects on create matches upstream (capi-operator.md H5): finalizer, template,
cloud credentials, etcd key, identity, values, lease, Zenith reservation, the Helm release,
the per-cluster zenith-operator, then the ``cluster-template`` label and the
``last-handled-configuration`` annotation, written only once all of that succeeded.

Delete (H6, fixed where upstream is fragile): uninstall, delete the etcd key, wait for the
CAPI Cluster to disappear (its DELETED event wakes us; past ``delete_deadline_seconds`` the
condition names what is stuck), wait for the lease service to release the Lease, and only
then let the writer remove the finalizer. A paused Cluster is cleaned up all the same. Every
step reports on ``Reconciled`` as it begins or waits, and so does a failure (a permanent one,
such as RBAC forbidding the uninstall, at once and then dead-lettered), so a deletion always
writes the status, which the writer derives as phase Deleting. A release whose name helm
refuses cannot exist, so it counts as uninstalled and the delete completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.helm import logic, values, zenith
from services.helm.logic import Wait
from services.helm.ports import Bus, HelmDriver, Kube, Registrar
from services.helm.settings import HelmTuning
from shared import subjects
from shared.errors import CapibusError, KubeConflict, KubeNotFound, PermanentError
from shared.locks import KeyedLocks
from shared.messages import (
    Condition,
    Message,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
    decode,
    stable_id,
)
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, SECRET, ref_to

log = logging.getLogger(__name__)

Json = dict[str, Any]


@dataclass
class Context:
    """Dependencies and per-replica memory shared by every handler run."""

    kube: Kube
    helm: HelmDriver
    bus: Bus
    tuning: HelmTuning
    chart: Any
    source: str
    partitions: int
    oidc_enabled: bool
    registrar: Registrar | None = None
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    #: per Cluster: (uid, digest of chart and values) of the release we last converged
    releases: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: per Cluster: (uid, condition) we last reported, so a repeated wait is not re-sent
    reported: dict[str, tuple[str, Condition]] = field(default_factory=dict)
    #: per Cluster: (uid, generation) fully converged; its own status changes need no run
    converged: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: per Cluster: (uid, Secret resourceVersion) and the Zenith values rendered from it
    zenith_layers: dict[str, tuple[tuple[str, str], Json]] = field(default_factory=dict)
    #: Cluster uids whose release is already uninstalled
    uninstalled: set[str] = field(default_factory=set)
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    firing: set[asyncio.Future[None]] = field(default_factory=set)

    @property
    def zenith_enabled(self) -> bool:
        return self.registrar is not None and self.tuning.zenith.configured


# --- entry points ---------------------------------------------------------------------


async def reconcile(*, key: str, cause: Message, ctx: Context) -> None:
    namespace, name = key.split("/", 1)
    async with ctx.locks(key):
        try:
            cluster = await ctx.kube.get(CLUSTER, namespace, name)
        except KubeNotFound:
            ctx.releases.pop(key, None)
            ctx.reported.pop(key, None)
            return
        meta = cluster["metadata"]
        if meta.get("deletionTimestamp"):
            await take_down(cluster=cluster, cause=cause, ctx=ctx)
        elif isinstance(cause, ResourceChanged) and ctx.converged.get(key) == (
            meta["uid"],
            meta.get("generation"),
        ):
            # The Cluster's own status or metadata moved (often because of us): the spec we
            # converged is unchanged, and anything else we depend on wakes us by its own event.
            return
        else:
            await converge(cluster=cluster, cause=cause, ctx=ctx)


async def nudge_users_of_template(*, name: str, cause: Message, ctx: Context) -> None:
    """A ClusterTemplate appeared or changed: wake Clusters that still wait for it."""
    clusters, _ = await ctx.kube.list(CLUSTER)
    for cluster in clusters:
        if cluster["spec"].get("templateName") == name and not _reconciled(cluster):
            await _nudge(cluster, f"ClusterTemplate {name} changed", cause, ctx)


async def nudge_users_of_secret(*, namespace: str, name: str, cause: Message, ctx: Context) -> None:
    """A Secret appeared: wake Clusters of its namespace that wait for it as credentials."""
    clusters, _ = await ctx.kube.list(CLUSTER, namespace=namespace)
    for cluster in clusters:
        if cluster["spec"].get("cloudCredentialsSecretName") == name and not _reconciled(cluster):
            await _nudge(cluster, f"Secret {name} appeared", cause, ctx)


# --- create and update ----------------------------------------------------------------


async def converge(*, cluster: Json, cause: Message, ctx: Context) -> None:
    meta = cluster["metadata"]
    if ctx.tuning.finalizer not in (meta.get("finalizers") or []):
        # Nothing with a lifetime is made before the finalizer guarantees its cleanup.
        await _metadata(cluster, cause, ctx, add_finalizers=(ctx.tuning.finalizer,))
        return
    if cluster["spec"].get("paused"):
        await _report(cluster, cause, ctx, Wait("Paused", "spec.paused is set").condition())
        return
    try:
        outcome = await _install(cluster=cluster, cause=cause, ctx=ctx)
    except CapibusError as exc:
        await _report(cluster, cause, ctx, _failure(exc))
        raise
    key = f"{meta['namespace']}/{meta['name']}"
    if isinstance(outcome, Wait):
        ctx.converged.pop(key, None)
        await _report(cluster, cause, ctx, outcome.condition())
        return
    if outcome is None and ctx.converged.get(key) == (meta["uid"], meta["generation"]):
        return  # already converged and reported; nothing changed
    labels, annotations = logic.handled_metadata(cluster)
    await _metadata(
        cluster,
        cause,
        ctx,
        labels=labels,
        annotations=annotations,
        if_generation=meta["generation"],
    )
    revision = outcome or "release unchanged"
    done = Condition(type=logic.CONDITION, status="True", reason="Deployed", message=revision)
    await _report(cluster, cause, ctx, done, extra={"lastUpdated": _now()})
    ctx.converged[key] = (meta["uid"], meta["generation"])


async def _install(*, cluster: Json, cause: Message, ctx: Context) -> Wait | str | None:
    """Run the steps before the release in upstream's order; a ``Wait`` stops at the first gap.

    Returns the release's new revision, or None when the release was already as wanted.
    """
    meta, spec = cluster["metadata"], cluster["spec"]
    namespace = meta["namespace"]
    template = await _get(ctx, CLUSTER_TEMPLATE, None, spec["templateName"])
    if template is None:
        return Wait("TemplateNotFound", f"ClusterTemplate {spec['templateName']} does not exist")
    credentials = await _get(ctx, SECRET, namespace, spec["cloudCredentialsSecretName"])
    if credentials is None:
        secret = spec["cloudCredentialsSecretName"]
        return Wait("CloudCredentialsNotFound", f"Secret {secret} does not exist")
    await _ensure_etcd_key(cluster, ctx)
    oidc = None
    if ctx.oidc_enabled:
        fact = await _fact(cluster, "identity", ctx)
        wait = logic.prerequisite_wait(cluster, "identity", fact)
        if wait or fact is None:
            return wait or Wait("WaitingForIdentity", "")
        oidc = values.OidcInputs(**_oidc_fields(fact))
    size_name_map = None
    if spec.get("leaseName"):
        fact = await _fact(cluster, "lease", ctx)
        wait = logic.prerequisite_wait(cluster, "lease", fact)
        if wait or fact is None:
            return wait or Wait("WaitingForLease", "")
        size_name_map = dict(fact.outputs.get("sizeNameMap") or {})
    zenith_layer = None
    if ctx.zenith_enabled:
        layer = await zenith.apiserver_layer(cluster=cluster, ctx=ctx)
        if isinstance(layer, Wait):
            return layer
        zenith_layer = layer
    settings = ctx.tuning.values
    release_values = values.compose(
        defaults=settings.default_values,
        template_values=template["spec"].get("values") or {},
        cluster_layer=values.cluster_values(spec, oidc=oidc, settings=settings),
        overrides=settings.flavor_specific_node_group_overrides,
        size_name_map=size_name_map,
        zenith_layer=zenith_layer,
    )
    return await _release(cluster, release_values, credentials, ctx)


async def _release(
    cluster: Json, release_values: Json, credentials: Json, ctx: Context
) -> str | None:
    meta = cluster["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    fingerprint = logic.digest(ctx.chart, release_values)
    if ctx.releases.get(key) == (meta["uid"], fingerprint):
        return None
    outcome = await ctx.helm.ensure_release(
        meta["name"], meta["namespace"], ctx.chart, release_values
    )
    if ctx.zenith_enabled:
        await zenith.apply_operator(cluster=cluster, credentials=credentials, ctx=ctx)
    ctx.releases[key] = (meta["uid"], fingerprint)
    log.info("%s: release %s (revision %s)", key, outcome.action, outcome.revision)
    return f"revision {outcome.revision}"


async def _ensure_etcd_key(cluster: Json, ctx: Context) -> None:
    meta = cluster["metadata"]
    if await _get(ctx, SECRET, meta["namespace"], f"{meta['name']}-etcd-key") is not None:
        return
    # A conflict means an earlier run made it and did not get to see the answer.
    with contextlib.suppress(KubeConflict):
        await ctx.kube.create(SECRET, logic.etcd_key_secret(cluster, secrets.token_bytes(32)))


def _oidc_fields(fact: PrerequisiteChanged) -> Json:
    out = fact.outputs
    return {
        "issuer_url": out["issuerUrl"],
        "client_id": out["clientId"],
        "root_group": out["rootGroup"],
        "platform_users_group": out.get("platformUsersGroup"),
    }


# --- delete ---------------------------------------------------------------------------


async def take_down(*, cluster: Json, cause: Message, ctx: Context) -> None:
    meta = cluster["metadata"]
    if ctx.tuning.finalizer not in (meta.get("finalizers") or []):
        await _report_others(cluster, cause, ctx)
        return
    try:
        wait = await _dismantle(cluster, cause, ctx)
    except CapibusError as exc:
        # Reported at once, a permanent error long before the DeletionStuck deadline; raised
        # so the consumer retries a temporary one and dead-letters a permanent one.
        await _report(cluster, cause, ctx, _failure(exc, doing="deleting"))
        raise
    if wait is not None:
        await _report(cluster, cause, ctx, wait.condition())
        return
    await _metadata(cluster, cause, ctx, remove_finalizers=(ctx.tuning.finalizer,))


async def _dismantle(cluster: Json, cause: Message, ctx: Context) -> Wait | None:
    """Uninstall and delete the etcd key, then say what the deletion still waits for.

    A release whose name helm refuses cannot exist: the adapter answers "not installed" and
    the delete goes on.
    """
    meta = cluster["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    ctx.releases.pop(f"{namespace}/{name}", None)
    ctx.converged.pop(f"{namespace}/{name}", None)
    if meta["uid"] not in ctx.uninstalled:
        # Said before helm runs (pre-delete hooks may take long), so the condition and the
        # phase's write show the deletion at once instead of the last install error.
        uninstalling = Wait("UninstallingRelease", f"uninstalling Helm release {name}")
        await _report(cluster, cause, ctx, uninstalling.condition())
        if await ctx.helm.uninstall(name, namespace):
            log.info("%s/%s: release uninstalled", namespace, name)
        ctx.uninstalled.add(meta["uid"])
    await _delete(ctx, SECRET, namespace, f"{name}-etcd-key")
    return await _deletion_wait(cluster, ctx)


async def _report_others(cluster: Json, cause: Message, ctx: Context) -> None:
    """Our part of the deletion is done (or never began); name the finalizers it waits for,
    such as ``foregroundDeletion`` while the Cluster's dependents go."""
    others = cluster["metadata"].get("finalizers") or []
    if others:
        message = f"capibus has cleaned up; waiting for finalizers: {', '.join(others)}"
        await _report(cluster, cause, ctx, Wait("WaitingForFinalizers", message).condition())


def _failure(exc: CapibusError, *, doing: str = "") -> Condition:
    """The condition for a run that failed: a permanent error's reason, else the error type."""
    reason = exc.reason if isinstance(exc, PermanentError) else type(exc).__name__
    return Wait(reason, f"{doing}: {exc}" if doing else str(exc)).condition()


async def _deletion_wait(cluster: Json, ctx: Context) -> Wait | None:
    meta, spec = cluster["metadata"], cluster["spec"]
    capi = await _get(ctx, CAPI_CLUSTER, meta["namespace"], meta["name"])
    if capi is not None:
        deadline = logic.delete_deadline(cluster, ctx.tuning.delete_deadline_seconds)
        if deadline is not None and datetime.now(UTC) >= deadline:
            return Wait("DeletionStuck", logic.stuck_message(capi))
        if deadline is not None:
            _arm_deadline(cluster, deadline, ctx)
        return Wait("WaitingForClusterAPI", "waiting for the Cluster API cluster to be deleted")
    if spec.get("leaseName"):
        fact = await _fact(cluster, "lease", ctx)
        if fact is None or fact.ref.uid != meta["uid"] or not fact.released:
            return Wait("WaitingForLeaseRelease", f"waiting to release Lease {spec['leaseName']}")
    return None


def _arm_deadline(cluster: Json, deadline: datetime, ctx: Context) -> None:
    """Wake this Cluster at its deadline, not every minute before it.

    Every replica that sees the deletion arms the same timer and publishes the same message
    id, so JetStream keeps one nudge; the replica owning the partition acts on it.
    """
    ref = ref_to(CLUSTER, cluster)
    if ref.key in ctx.timers:
        return
    delay = max(0.0, (deadline - datetime.now(UTC)).total_seconds())
    nudge = ReconcileCluster(
        id=stable_id(str(ref.uid), "delete-deadline"),
        source=ctx.source,
        correlation_id=f"cluster:{ref.key}",
        ref=ref,
        reason="deletion deadline",
    )

    def fire() -> None:
        ctx.timers.pop(ref.key, None)
        task = asyncio.ensure_future(_publish_nudge(nudge, ctx))
        ctx.firing.add(task)
        task.add_done_callback(ctx.firing.discard)

    ctx.timers[ref.key] = asyncio.get_running_loop().call_later(delay, fire)


# --- publishing -----------------------------------------------------------------------


def _partition(ref: ObjectRef, ctx: Context) -> int:
    return subjects.partition_of(ref.key, ctx.partitions)


async def _report(
    cluster: Json, cause: Message, ctx: Context, condition: Condition, extra: Json | None = None
) -> None:
    ref = ref_to(CLUSTER, cluster)
    if ctx.reported.get(ref.key) == (ref.uid, condition) and not extra:
        return
    message = PatchStatus(
        source=ctx.source, **cause.caused(), ref=ref, patch=extra or {}, conditions=(condition,)
    )
    subject = subjects.cluster_status(_partition(ref, ctx), ref.namespace or "", ref.name)
    await ctx.bus.publish(subject, message)
    ctx.reported[ref.key] = (str(ref.uid), condition)


async def _metadata(
    cluster: Json, cause: Message, ctx: Context, *, if_generation: int | None = None, **change: Any
) -> None:
    ref = ref_to(CLUSTER, cluster)
    command = PatchMetadata(
        source=ctx.source, **cause.caused(), ref=ref, if_generation=if_generation, **change
    )
    # The same change for the same Cluster is one message, however many runs decide it.
    identity = stable_id(
        str(ref.uid), str(if_generation), command.model_dump_json(include=set(change))
    )
    subject = subjects.metadata_patch(CLUSTER.token, _partition(ref, ctx), ref.namespace, ref.name)
    await ctx.bus.publish(subject, command.model_copy(update={"id": identity}))


async def _nudge(cluster: Json, reason: str, cause: Message, ctx: Context) -> None:
    ref = ref_to(CLUSTER, cluster)
    nudge = ReconcileCluster(
        id=stable_id(cause.id, str(ref.uid)),
        source=ctx.source,
        correlation_id=f"cluster:{ref.key}",
        causation_id=cause.id,
        ref=ref,
        reason=reason,
    )
    await _publish_nudge(nudge, ctx)


async def _publish_nudge(nudge: ReconcileCluster, ctx: Context) -> None:
    ref = nudge.ref
    try:
        subject = subjects.reconcile(_partition(ref, ctx), ref.namespace or "", ref.name)
        await ctx.bus.publish(subject, nudge)
    except CapibusError as exc:
        log.warning("%s: could not publish a nudge: %s", ref.key, exc)


# --- reading --------------------------------------------------------------------------


async def _fact(cluster: Json, step: str, ctx: Context) -> PrerequisiteChanged | None:
    ref = ref_to(CLUSTER, cluster)
    subject = subjects.prerequisite(step, _partition(ref, ctx), ref.namespace or "", ref.name)
    body = await ctx.bus.last_message(subjects.LIFECYCLE.name, subject)
    return decode(body, PrerequisiteChanged) if body else None


async def _get(ctx: Context, kind: Any, namespace: str | None, name: str) -> Json | None:
    try:
        return await ctx.kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def _delete(ctx: Context, kind: Any, namespace: str | None, name: str) -> None:
    with contextlib.suppress(KubeNotFound):
        await ctx.kube.delete(kind, namespace, name)


def _reconciled(cluster: Json) -> bool:
    for condition in (cluster.get("status") or {}).get("conditions") or []:
        if condition.get("type") == logic.CONDITION:
            return bool(condition.get("status") == "True")
    return False


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def arm_pending_deadlines(ctx: Context) -> None:
    """At start-up, re-arm the deadline of every Cluster already being deleted.

    Timers live in memory; without this a restart would leave a stuck deletion unreported
    until its next event.
    """
    clusters, _ = await ctx.kube.list(CLUSTER)
    for cluster in clusters:
        deadline = logic.delete_deadline(cluster, ctx.tuning.delete_deadline_seconds)
        if deadline is not None and ctx.tuning.finalizer in (
            cluster["metadata"].get("finalizers") or []
        ):
            _arm_deadline(cluster, deadline, ctx)
