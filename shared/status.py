"""How a service tells the writer something: one reporter for every kind capibus owns.

The writer is the one writer of status (and of finalizers, labels and annotations) for every
custom resource capibus owns; every other service publishes what it knows and lets the
writer coalesce, guard and apply it. ``StatusReporter`` is the only code that knows how such
a message is addressed, so no service computes a subject, a partition, a correlation id or a
message id for it:

* **Which kinds.** ``WRITTEN`` lists the kinds whose status the writer writes; a reference to
  any other kind is refused here (``UnknownKind``) rather than dead-lettered by the writer.
  A new provider adds its kinds to ``WRITTEN`` and a derivation rule to the writer, nothing
  else.
* **Where.** Status patches go to ``capibus.status.patch.<kind>.<partition>.<ns>.<name>`` and
  metadata changes to ``capibus.status.meta...``, partitioned by the object's own key, so one
  writer replica applies one object's changes in order.
* **Whose story.** A message names its cause (``causation_id``) and belongs to a cluster's
  story when its cause does (a Machine's event is part of its cluster's story, and so is the
  status it leads to); otherwise to the object's own story (``cluster:<ns>/<name>`` for an
  Azimuth Cluster, ``<kind>:<ns>/<name>`` otherwise). So a Realm that changed, fanning out
  nudges to the Clusters of its namespace, puts each nudge in that Cluster's story, with the
  Realm's event as its cause.
* **Which id (deduplication).** A status patch's id is derived from the reporting service, the
  object's uid, the cause and the content: a redelivered or replayed cause reports the same
  message, which JetStream stores once, while a new cause with the same content is a new
  (cheap: the writer skips writes that change nothing) message. A metadata change's id is
  derived from the uid, the generation it is conditional on and the change alone: the same
  change decided by several runs is one command. A nudge's id is derived from its cause. An
  explicit ``message_id`` (a timer's, which must be equal across replicas) always wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from shared import subjects
from shared.errors import PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    Condition,
    Message,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    ReconcileCluster,
    stable_id,
)
from shared.ports import Publisher
from shared.resources import (
    APP_TEMPLATE,
    CLUSTER,
    LADYBUG_CLUSTER,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
)

Json = dict[str, Any]

#: The kinds whose status and metadata the writer writes.
WRITTEN: tuple[ResourceKind, ...] = (
    CLUSTER,
    APP_TEMPLATE,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE,
    METALSTACK_FIREWALL,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    LADYBUG_CLUSTER,
)
_BY_REF = {(kind.api_version, kind.kind): kind for kind in WRITTEN}


class UnknownKind(PermanentError):
    """A status or metadata change for a kind the writer does not write."""

    def __init__(self, ref: ObjectRef) -> None:
        super().__init__(
            f"capibus does not write {ref.kind} ({ref.api_version}) objects", reason="UnknownKind"
        )


def written_kind(ref: ObjectRef) -> ResourceKind:
    """The registered kind ``ref`` names; ``UnknownKind`` if the writer does not write it."""
    kind = _BY_REF.get((ref.api_version, ref.kind))
    if kind is None:
        raise UnknownKind(ref)
    return kind


#: the prefix of a cluster's story
CLUSTER_STORY = "cluster:"


def story_of(ref: ObjectRef) -> str:
    """The correlation id of ``ref``'s own story."""
    azimuth = (ref.api_version, ref.kind) == (CLUSTER.api_version, CLUSTER.kind)
    return f"{'cluster' if azimuth else ref.kind.lower()}:{ref.key}"


class StatusReporter:
    """Status patches, metadata changes and nudges for the objects a service looks after."""

    def __init__(self, bus: Publisher, *, partitions: int, source: str) -> None:
        self.bus = bus
        self.partitions = partitions
        self.source = source
        #: the service, without the replica: every replica derives the same ids
        self.service = source.split("/", 1)[0]

    def partition(self, ref: ObjectRef) -> int:
        return subjects.partition_of(ref.key, self.partitions)

    # --- status ---------------------------------------------------------------------------

    def status(
        self,
        ref: ObjectRef,
        *,
        patch: Json | None = None,
        conditions: Iterable[Condition] = (),
        cause: Message | None = None,
        message_id: str | None = None,
    ) -> tuple[str, PatchStatus]:
        """The subject and message of a status patch, without publishing it (for timers)."""
        kind = written_kind(ref)
        conditions = tuple(conditions)
        content = _canonical(
            {"patch": patch or {}, "conditions": [c.model_dump() for c in conditions]}
        )
        message = PatchStatus(
            id=message_id or stable_id(self.service, str(ref.uid), _cause_id(cause), content),
            source=self.source,
            **self._envelope(ref, cause),
            ref=ref,
            patch=patch or {},
            conditions=conditions,
        )
        subject = subjects.status_patch(kind.token, self.partition(ref), ref.namespace, ref.name)
        return subject, message

    async def report(
        self,
        ref: ObjectRef,
        *,
        patch: Json | None = None,
        conditions: Iterable[Condition] = (),
        cause: Message | None = None,
        message_id: str | None = None,
    ) -> PatchStatus:
        """Ask the writer to merge ``patch`` and set ``conditions`` on ``ref``'s status."""
        subject, message = self.status(
            ref, patch=patch, conditions=conditions, cause=cause, message_id=message_id
        )
        await self.bus.publish(subject, message)
        return message

    # --- metadata -------------------------------------------------------------------------

    async def change_metadata(
        self,
        ref: ObjectRef,
        *,
        cause: Message | None = None,
        add_finalizers: Iterable[str] = (),
        remove_finalizers: Iterable[str] = (),
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        if_generation: int | None = None,
    ) -> PatchMetadata:
        """Ask the writer to change ``ref``'s finalizers, labels or annotations."""
        kind = written_kind(ref)
        change = {
            "add_finalizers": tuple(add_finalizers),
            "remove_finalizers": tuple(remove_finalizers),
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }
        message = PatchMetadata(
            id=stable_id(str(ref.uid), str(if_generation), _canonical(change)),
            source=self.source,
            **self._envelope(ref, cause),
            ref=ref,
            if_generation=if_generation,
            **change,
        )
        subject = subjects.metadata_patch(kind.token, self.partition(ref), ref.namespace, ref.name)
        await self.bus.publish(subject, message)
        return message

    # --- nudges ---------------------------------------------------------------------------

    def reconcile(
        self,
        ref: ObjectRef,
        *,
        reason: str,
        cause: Message | None = None,
        message_id: str | None = None,
    ) -> tuple[str, ReconcileCluster]:
        """The subject and message of a nudge, without publishing it (for timers)."""
        if message_id is None and cause is not None:
            message_id = stable_id(cause.id, str(ref.uid))
        message = ReconcileCluster(
            **({"id": message_id} if message_id else {}),
            source=self.source,
            **self._envelope(ref, cause),
            ref=ref,
            reason=reason,
        )
        subject = subjects.reconcile(self.partition(ref), ref.namespace or "", ref.name)
        return subject, message

    async def nudge(
        self,
        ref: ObjectRef,
        *,
        reason: str,
        cause: Message | None = None,
        message_id: str | None = None,
    ) -> ReconcileCluster:
        """Ask every service that looks after ``ref`` to look at it again."""
        subject, message = self.reconcile(ref, reason=reason, cause=cause, message_id=message_id)
        await self.bus.publish(subject, message)
        return message

    def _envelope(self, ref: ObjectRef, cause: Message | None) -> dict[str, Any]:
        if cause is None:
            return {"correlation_id": story_of(ref), "causation_id": None}
        story = cause.correlation_id
        if not story.startswith(CLUSTER_STORY):
            story = story_of(ref)
        return {"correlation_id": story, "causation_id": cause.id}


def _cause_id(cause: Message | None) -> str:
    return cause.id if cause is not None else ""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
