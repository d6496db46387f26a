"""Pure decisions of the watcher: which changes to publish, under which ids.

The watcher's memory of what it already published is the stream itself (the last event per
object subject), so a restarted or second replica knows what is new. Each change's message id
is derived from the fact it reports, ``<uid>:<resourceVersion>:<event>`` (deletions:
``<uid>:DELETED``, because an object is deleted once whatever resourceVersion a replica saw it
go at), so JetStream stores a fact once however many replicas or re-lists report it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared import subjects
from shared.kube import ResourceKind
from shared.messages import EventType, ObjectRef, ResourceChanged, stable_id
from shared.resources import cluster_key, correlation_id


@dataclass(frozen=True)
class Known:
    """The last state of one object that the stream holds."""

    uid: str
    resource_version: str
    deleted: bool
    object: dict[str, Any]


def object_key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


def dedupe_id(uid: str, resource_version: str, event: EventType) -> str:
    return f"{uid}:DELETED" if event == "DELETED" else f"{uid}:{resource_version}:{event}"


@dataclass(frozen=True)
class Change:
    event: EventType
    object: dict[str, Any]
    resource_version: str

    @property
    def uid(self) -> str:
        return str(self.object["metadata"]["uid"])

    @property
    def dedupe_id(self) -> str:
        return dedupe_id(self.uid, self.resource_version, self.event)


def changes_from_list(
    known: dict[str, Known], items: list[dict[str, Any]], list_version: str
) -> list[Change]:
    """What a full list says happened since ``known``: additions, changes and deletions."""
    changes: list[Change] = []
    seen: set[str] = set()
    for item in items:
        key, meta = object_key(item), item["metadata"]
        seen.add(key)
        before = known.get(key)
        if before and not before.deleted and before.uid != meta["uid"]:
            # Same name, new incarnation: the old one went while we were not looking.
            changes.append(Change("DELETED", before.object, list_version))
            before = None
        if before is None or before.deleted:
            changes.append(Change("ADDED", item, meta["resourceVersion"]))
        elif before.resource_version != meta["resourceVersion"]:
            changes.append(Change("MODIFIED", item, meta["resourceVersion"]))
    for key, before in known.items():
        if key not in seen and not before.deleted:
            changes.append(Change("DELETED", before.object, list_version))
    return changes


def change_from_watch(
    known: dict[str, Known], event: EventType, obj: dict[str, Any]
) -> Change | None:
    """The change a watch event reports, or None if the stream already has it."""
    before = known.get(object_key(obj))
    version = obj["metadata"]["resourceVersion"]
    if before and before.uid == obj["metadata"]["uid"] and before.resource_version == version:
        return None
    return Change(event, obj, version)


def remember(known: dict[str, Known], change: Change) -> None:
    """Note what the stream now holds for ``change``'s object.

    A deletion is forgotten, not kept as a tombstone: a list or watch treats an object it
    does not know exactly as one known deleted (it is new), so a tombstone saved nothing and
    the watcher's memory grew with every object ever deleted until it restarted. A repeated
    DELETED event has the same message id (``<uid>:DELETED``), which JetStream drops.
    """
    key = object_key(change.object)
    if change.event == "DELETED":
        known.pop(key, None)
        return
    known[key] = Known(
        uid=change.uid,
        resource_version=change.resource_version,
        deleted=False,
        object=change.object,
    )


def to_message(
    kind: ResourceKind, change: Change, *, partitions: int, source: str
) -> tuple[str, ResourceChanged, str]:
    """(subject, message, dedupe id) for one change.

    ``change.object`` is already scrubbed: the handlers scrub every object as it arrives from
    the API server, so Secret data is never even held in the watcher's memory, and the
    message model refuses a Secret that still has any.
    """
    obj = change.object
    meta = obj["metadata"]
    message = ResourceChanged(
        id=stable_id(change.dedupe_id),
        source=source,
        correlation_id=correlation_id(kind, obj),
        event=change.event,
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=meta.get("namespace"),
            name=meta["name"],
            uid=meta["uid"],
        ),
        resource_version=change.resource_version,
        object=obj,
    )
    partition = subjects.partition_of(cluster_key(kind, obj), partitions)
    subject = subjects.resource_event(kind.token, partition, meta.get("namespace"), meta["name"])
    return subject, message, change.dedupe_id
