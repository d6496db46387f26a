"""The lease service's work: hold a Cluster's Lease while the Cluster lives, let go after.

Every handler has the shape ``(batch, deps)`` and ends in ``converge``, which is
level-triggered and idempotent. Whatever brought us here (an event of the Cluster, of its
Lease, of its Cluster API cluster, or a nudge), it runs under the Cluster's lock
(``Deps.locks``, shared by the four subscriptions) and reads the current state:

- **Live Cluster** with ``spec.leaseName`` and not paused: adopt the Lease (finalizer and
  ownerReference, a JSON patch guarded by the resourceVersion it was computed from), then
  report ``status.leasePhase``, the ``LeaseReady`` condition and the ``lease`` prerequisite.
  The adoption patch comes back as a Lease event that finds nothing left to do; adopting
  after a restore, when a Lease lost its ownerReference, is the same path.
- **Paused live Cluster**: no adoption and no prerequisite (pausing stops reconciling), but
  ``status.leasePhase`` and ``LeaseReady`` still follow the Lease: upstream's Lease event
  handler (``on_lease_event``, ``docs/upstream.md`` §1 H9) mirrors the phase whatever
  ``spec.paused`` says. The unpausing spec change is the next Cluster event and adopts.
- **Deleting or gone Cluster** (paused or not: upstream leaks the Lease finalizer for paused
  Clusters): keep the Lease until the Cluster API cluster of the same name is gone, because
  releasing it lets the schedule operator delete the Lease, and with it the cloud credentials
  Secret that Cluster API still needs to tear the machines down (``docs/upstream.md`` §2). The
  wait is the subscription to Cluster API cluster events: its DELETED event runs us again.
  Then the finalizer goes and the prerequisite says ``released``. A Cluster that is already
  gone is known from its last event on the bus, or from the Lease's ownerReference.

Status goes to the writer through ``Deps.reporter`` (``shared.status``), only what the
Cluster does not say already. The prerequisite is published on the Cluster's ``lease``
subject of the lifecycle stream, where the helm service reads the newest one.

Errors: a lost race on the guarded patch is ``KubeConflict`` (the adapter tells a failed
``test`` from a real rejection, which the API server answers alike, see ``shared.kube``);
``TemporaryError`` passes to the consumer, which retries with a fresh read. A real rejection
(422, or 403 for ``blockOwnerDeletion`` without rights on the Cluster) is first reported as
``LeaseReady`` False ``LeasePatchRejected`` and a not-ready prerequisite, then raised as the
``PermanentError`` it is, so the event is dead-lettered with the reason. A Lease that vanishes
mid-way is simply not there (404 is a fact, not a failure).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from services.lease import logic
from shared import ports, subjects
from shared.consumer import Batch
from shared.errors import BadMessage, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import (
    Condition,
    Message,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
    decode,
)
from shared.models.azimuth import LeasePhase
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE, owner_reference
from shared.status import StatusReporter

log = logging.getLogger(__name__)

Json = dict[str, Any]
M = TypeVar("M", bound=Message)
#: what names a Cluster to converge: its own event, or a nudge
Naming = TypeVar("Naming", ResourceChanged, ReconcileCluster)


class KubeApi(ports.KubeReader, ports.KubeWriter, Protocol): ...


class Bus(ports.Publisher, ports.StreamReader, Protocol): ...


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    #: publishes the prerequisite and reads back the last one, and a gone Cluster's last event
    bus: Bus
    reporter: StatusReporter
    finalizer: str
    locks: KeyedLocks = field(default_factory=KeyedLocks)

    def partition(self, namespace: str, name: str) -> int:
        """The partition of Cluster ``namespace/name`` (the reporter's, so one setting)."""
        return subjects.partition_of(f"{namespace}/{name}", self.reporter.partitions)


@dataclass(frozen=True)
class Trigger:
    """Which Cluster to look at, why, and the Lease when a Lease event is the reason."""

    namespace: str
    name: str
    cause: Message
    lease: Json | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --- entry points --------------------------------------------------------------------------


async def on_cluster(batch: Batch[Naming], deps: Deps) -> None:
    """A Cluster event or a ``ReconcileCluster`` nudge: converge the Cluster it names.

    A Cluster whose newest event names no Lease is left alone without a read: a switched-off
    prerequisite costs nothing, even for the dozens of status writes a Cluster sees on its
    way to Ready. Level-triggering holds, since a spec that names a Lease later comes with an
    event of its own, and one that stops naming it is left alone with or without the read.
    """
    message = batch.latest
    if isinstance(message, ResourceChanged) and not logic.names_any_lease(message.object):
        return
    if message.ref.namespace:
        await converge(Trigger(message.ref.namespace, message.ref.name, message), deps)


async def on_capi_cluster_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    # Only its disappearance can unblock a release; other changes would cost reads for nothing.
    event = batch.latest
    if event.event == "DELETED" and event.ref.namespace:
        await converge(Trigger(event.ref.namespace, event.ref.name, event), deps)


async def on_lease_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Converge the owning Cluster; a Lease that names no owner nudges the Clusters naming it.

    An owned Lease hashes to its Cluster's partition. One without an ownerReference (a
    restore dropped it, or the portal has not set it) hashes to a partition of its own, so
    the Clusters that use it are reached with ``ReconcileCluster`` in theirs.
    """
    event = batch.latest
    namespace, lease = event.ref.namespace, event.object
    if not namespace:
        return
    owner = logic.owning_cluster(lease)
    if owner is not None:
        await converge(Trigger(namespace, owner["name"], event, lease=lease), deps)
        return
    clusters, _ = await deps.kube.list(CLUSTER, namespace=namespace)
    for cluster in clusters:
        if logic.names_lease(cluster, event.ref.name):
            view = logic.ClusterView.of(cluster)
            reason = f"lease {event.ref.name} changed and names no owner"
            await deps.reporter.nudge(view.ref, reason=reason, cause=event)


# --- convergence ---------------------------------------------------------------------------


async def converge(trigger: Trigger, deps: Deps) -> None:
    async with deps.locks(trigger.key):
        cluster = await _observe(trigger, deps)
        if cluster is None or cluster.lease_name is None:
            return
        run = _Run(cluster, trigger.cause, deps)
        if cluster.deleting:
            await run.release(cluster.lease_name)
        elif cluster.paused:
            await run.mirror(cluster.lease_name)
        else:
            await run.hold(cluster.lease_name)


async def _observe(trigger: Trigger, deps: Deps) -> logic.ClusterView | None:
    cluster = await _get(deps.kube, CLUSTER, trigger.namespace, trigger.name)
    if cluster is not None:
        return logic.ClusterView.of(cluster)
    last = await _last_known_cluster(trigger, deps)
    return logic.gone_cluster(last, trigger.lease)


async def _last_known_cluster(trigger: Trigger, deps: Deps) -> Json | None:
    """The Cluster as its last event showed it: a DELETED event carries its final state."""
    partition = deps.partition(trigger.namespace, trigger.name)
    subject = subjects.resource_event(CLUSTER.token, partition, trigger.namespace, trigger.name)
    body = await deps.bus.last_message(subjects.EVENTS.name, subject)
    event = _decoded(body, ResourceChanged)
    return event.object if event is not None else None


class _Run:
    """One convergence of one Cluster's Lease; holds what every step needs."""

    def __init__(self, cluster: logic.ClusterView, cause: Message, deps: Deps) -> None:
        self.cluster = cluster
        self.cause = cause
        self.deps = deps

    async def hold(self, lease_name: str) -> None:
        lease = await _get(self.deps.kube, LEASE, self.cluster.namespace, lease_name)
        if lease is not None and not logic.is_deleting(lease):
            # A deleting object accepts no new finalizer; it is on its way out anyway.
            lease = await self._adopt(lease)
        verdict = logic.assess(lease, lease_name)
        if verdict.unrecognised is not None:
            log.warning(
                "%s: lease %s has unknown phase %r; reporting Unknown",
                self.cluster.key,
                lease_name,
                verdict.unrecognised,
            )
        await self._report(verdict)

    async def mirror(self, lease_name: str) -> None:
        """Paused: the Lease's phase is still reported (status only, as upstream), nothing else."""
        lease = await _get(self.deps.kube, LEASE, self.cluster.namespace, lease_name)
        verdict = logic.assess(lease, lease_name)
        await self._report_status(verdict.phase, verdict.condition)

    async def release(self, lease_name: str) -> None:
        kube = self.deps.kube
        if await _get(kube, CAPI_CLUSTER, self.cluster.namespace, self.cluster.name):
            await self._report_status(None, logic.waiting_for_capi(self.cluster))
            return
        lease = await _get(kube, LEASE, self.cluster.namespace, lease_name)
        ops = logic.release_patch(lease, finalizer=self.deps.finalizer) if lease else []
        if lease is not None and ops and await self._patch(lease, ops) is not None:
            log.info("%s: released lease %s", self.cluster.key, lease_name)
        await self._report_prerequisite(logic.released(lease_name))

    async def _adopt(self, lease: Json) -> Json | None:
        # Not a controller reference: the Lease is the schedule operator's, we only depend on it.
        owner = owner_reference(CLUSTER, self.cluster.obj, controller=False)
        ops = logic.adoption_patch(lease, owner=owner, finalizer=self.deps.finalizer)
        if not ops:
            return lease
        adopted = await self._patch(lease, ops)
        if adopted is not None:
            log.info("%s: adopted lease %s", self.cluster.key, lease["metadata"]["name"])
        return adopted

    async def _patch(self, lease: Json, ops: list[Json]) -> Json | None:
        """The patched Lease, or None if it is gone; a refusal is reported, then dead-lettered."""
        meta = lease["metadata"]
        try:
            return await self.deps.kube.patch_json(LEASE, meta["namespace"], meta["name"], ops)
        except KubeNotFound:
            return None
        except PermanentError as exc:
            await self._report(logic.rejected(lease["metadata"]["name"], exc))
            raise

    async def _report(self, verdict: logic.Verdict) -> None:
        await self._report_status(verdict.phase, verdict.condition)
        await self._report_prerequisite(verdict.prerequisite)

    async def _report_status(self, phase: LeasePhase | None, condition: Condition) -> None:
        if self.cluster.gone:
            return  # no Cluster to write to
        change = logic.status_change(self.cluster, phase=phase, condition=condition)
        if change is not None:
            await self.deps.reporter.report(
                self.cluster.ref, patch=change.patch, conditions=change.conditions, cause=self.cause
            )

    async def _report_prerequisite(self, prerequisite: logic.Prerequisite) -> None:
        cluster, bus = self.cluster, self.deps.bus
        partition = self.deps.partition(cluster.namespace, cluster.name)
        subject = subjects.prerequisite(logic.STEP, partition, cluster.namespace, cluster.name)
        body = await bus.last_message(subjects.LIFECYCLE.name, subject)
        message = logic.prerequisite_message(
            cluster,
            prerequisite,
            last=_decoded(body, PrerequisiteChanged),
            envelope=logic.Envelope(source=self.deps.reporter.source, causation_id=self.cause.id),
        )
        if message is not None:
            await bus.publish(subject, message)
            log.info("%s: lease %s: %s", cluster.key, message.reason, message.detail)


# --- adapters' edges -----------------------------------------------------------------------


async def _get(kube: KubeApi, kind: ResourceKind, namespace: str, name: str) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


def _decoded(body: bytes | None, model: type[M]) -> M | None:
    if body is None:
        return None
    try:
        return decode(body, model)
    except BadMessage:
        return None  # not something we can read; act as if nothing was said
