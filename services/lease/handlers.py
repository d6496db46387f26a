"""The lease service's work: hold a Cluster's Lease while the Cluster lives, let go after.

``converge`` is level-triggered and idempotent. Whatever brought us here (an event of the
Cluster, of its Lease, of its Cluster API cluster, or a nudge), it runs under the Cluster's lock
and reads the current state:

- **Live Cluster** with ``spec.leaseName`` and not paused: adopt the Lease (finalizer and
  ownerReference, a JSON patch guarded by the resourceVersion it was computed from), then
  report ``status.leasePhase``, the ``LeaseReady`` condition and the ``lease`` prerequisite.
  The adoption patch comes back as a Lease event that finds nothing left to do; adopting
  after a restore, when a Lease lost its ownerReference, is the same path.
- **Paused live Cluster**: no adoption and no prerequisite (pausing stops reconciling), but
  ``status.leasePhase`` and ``LeaseReady`` still follow the Lease: they report, as upstream
  H9 keeps mirroring the phase of a paused Cluster's Lease. The unpausing spec change is the
  next Cluster event and adopts.
- **Deleting or gone Cluster** (paused or not: upstream leaks the Lease finalizer for paused
  Clusters): keep the Lease until the Cluster API cluster of the same name is gone, because
  releasing it lets the schedule operator delete the cloud credentials Secret that Cluster
  API still needs to tear the machines down (azimuth-peers.md §9 item 4). The wait is the
  subscription to Cluster API cluster events: its DELETED event runs us again. Then the
  finalizer goes and the prerequisite says ``released``. A Cluster that is already gone is
  known from its last event on the bus, or from the Lease's ownerReference.

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
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from services.lease import logic
from shared import ports, subjects
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
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE

log = logging.getLogger(__name__)

Json = dict[str, Any]
M = TypeVar("M", bound=Message)


class KubeApi(ports.KubeReader, ports.KubeWriter, Protocol): ...


class Publisher(ports.Publisher, ports.StreamReader, Protocol): ...


@dataclass(frozen=True)
class Config:
    source: str
    partitions: int
    finalizer: str


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


async def on_cluster_event(
    *, event: ResourceChanged, kube: KubeApi, bus: Publisher, locks: KeyedLocks, config: Config
) -> None:
    if event.ref.namespace:
        trigger = Trigger(event.ref.namespace, event.ref.name, event)
        await converge(trigger=trigger, kube=kube, bus=bus, locks=locks, config=config)


async def on_capi_cluster_event(
    *, event: ResourceChanged, kube: KubeApi, bus: Publisher, locks: KeyedLocks, config: Config
) -> None:
    # Only its disappearance can unblock a release; other changes would cost reads for nothing.
    if event.event == "DELETED" and event.ref.namespace:
        trigger = Trigger(event.ref.namespace, event.ref.name, event)
        await converge(trigger=trigger, kube=kube, bus=bus, locks=locks, config=config)


async def on_reconcile(
    *, command: ReconcileCluster, kube: KubeApi, bus: Publisher, locks: KeyedLocks, config: Config
) -> None:
    if command.ref.namespace:
        trigger = Trigger(command.ref.namespace, command.ref.name, command)
        await converge(trigger=trigger, kube=kube, bus=bus, locks=locks, config=config)


async def on_lease_event(
    *, event: ResourceChanged, kube: KubeApi, bus: Publisher, locks: KeyedLocks, config: Config
) -> None:
    """Converge the owning Cluster; a Lease that names no owner nudges the Clusters naming it.

    An owned Lease hashes to its Cluster's partition. One without an ownerReference (a
    restore dropped it, or the portal has not set it) hashes to a partition of its own, so
    the Clusters that use it are reached with ``ReconcileCluster`` in theirs.
    """
    namespace, lease = event.ref.namespace, event.object
    if not namespace:
        return
    owner = logic.owning_cluster(lease)
    if owner is not None:
        trigger = Trigger(namespace, owner["name"], event, lease=lease)
        await converge(trigger=trigger, kube=kube, bus=bus, locks=locks, config=config)
        return
    clusters, _ = await kube.list(CLUSTER, namespace=namespace)
    for cluster in clusters:
        if logic.names_lease(cluster, event.ref.name):
            subject, nudge = logic.nudge(
                cluster,
                lease_name=event.ref.name,
                partitions=config.partitions,
                cause_id=event.id,
                source=config.source,
            )
            await bus.publish(subject, nudge)


# --- convergence ---------------------------------------------------------------------------


async def converge(
    *, trigger: Trigger, kube: KubeApi, bus: Publisher, locks: KeyedLocks, config: Config
) -> None:
    async with locks(trigger.key):
        cluster = await _observe(trigger, kube=kube, bus=bus, config=config)
        if cluster is None or cluster.lease_name is None:
            return
        run = _Run(cluster, trigger.cause, kube=kube, bus=bus, config=config)
        if cluster.deleting:
            await run.release(cluster.lease_name)
        elif cluster.paused:
            await run.mirror(cluster.lease_name)
        else:
            await run.hold(cluster.lease_name)


async def _observe(
    trigger: Trigger, *, kube: KubeApi, bus: Publisher, config: Config
) -> logic.ClusterView | None:
    cluster = await _get(kube, CLUSTER, trigger.namespace, trigger.name)
    if cluster is not None:
        return logic.ClusterView.of(cluster)
    last = await _last_known_cluster(trigger, bus=bus, config=config)
    return logic.gone_cluster(last, trigger.lease)


async def _last_known_cluster(trigger: Trigger, *, bus: Publisher, config: Config) -> Json | None:
    """The Cluster as its last event showed it: a DELETED event carries its final state."""
    partition = subjects.partition_of(trigger.key, config.partitions)
    subject = subjects.resource_event(CLUSTER.token, partition, trigger.namespace, trigger.name)
    body = await bus.last_message(subjects.EVENTS.name, subject)
    event = _decoded(body, ResourceChanged)
    return event.object if event is not None else None


class _Run:
    """One convergence of one Cluster's Lease; holds what every step needs."""

    def __init__(
        self,
        cluster: logic.ClusterView,
        cause: Message,
        *,
        kube: KubeApi,
        bus: Publisher,
        config: Config,
    ) -> None:
        self.cluster = cluster
        self.kube = kube
        self.bus = bus
        self.config = config
        self.partition = subjects.partition_of(cluster.key, config.partitions)
        self.envelope = logic.Envelope(source=config.source, causation_id=cause.id)

    async def hold(self, lease_name: str) -> None:
        lease = await _get(self.kube, LEASE, self.cluster.namespace, lease_name)
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
        """Paused: the Lease's phase is still reported (status, as upstream H9), nothing else."""
        lease = await _get(self.kube, LEASE, self.cluster.namespace, lease_name)
        verdict = logic.assess(lease, lease_name)
        await self._report_status(verdict.phase, verdict.condition)

    async def release(self, lease_name: str) -> None:
        if await _get(self.kube, CAPI_CLUSTER, self.cluster.namespace, self.cluster.name):
            await self._report_status(None, logic.waiting_for_capi(self.cluster))
            return
        lease = await _get(self.kube, LEASE, self.cluster.namespace, lease_name)
        ops = logic.release_patch(lease, finalizer=self.config.finalizer) if lease else []
        if lease is not None and ops and await self._patch(lease, ops) is not None:
            log.info("%s: released lease %s", self.cluster.key, lease_name)
        await self._report_prerequisite(logic.released(lease_name))

    async def _adopt(self, lease: Json) -> Json | None:
        owner = logic.owner_reference(self.cluster)
        ops = logic.adoption_patch(lease, owner=owner, finalizer=self.config.finalizer)
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
            return await self.kube.patch_json(LEASE, meta["namespace"], meta["name"], ops)
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
        found = logic.status_message(
            self.cluster,
            phase=phase,
            condition=condition,
            partition=self.partition,
            envelope=self.envelope,
        )
        if found is not None:
            subject, message = found
            await self.bus.publish(subject, message)

    async def _report_prerequisite(self, prerequisite: logic.Prerequisite) -> None:
        subject = logic.prerequisite_subject(self.cluster, self.partition)
        body = await self.bus.last_message(subjects.LIFECYCLE.name, subject)
        message = logic.prerequisite_message(
            self.cluster,
            prerequisite,
            last=_decoded(body, PrerequisiteChanged),
            envelope=self.envelope,
        )
        if message is not None:
            await self.bus.publish(subject, message)
            log.info("%s: lease %s: %s", self.cluster.key, message.reason, message.detail)


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
