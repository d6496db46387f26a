"""Pure rules of the writer: composing merge patches, conditions, derived status, metadata.

N close patches become one PATCH with the same result: the writer applies them in turn to
the status it read and sends the difference (``shared.mergepatch.diff``), preconditioned on
the resourceVersion of that read. Composing the patches instead (``compose``) is not exact: a
batch that removes a node entry and sets it again would merge the new entry into the old
one, keeping the old entry's other fields.

Three things a merge patch cannot express are decided here, because only the writer sees the
whole status it is about to produce:

- ``conditions`` is a list, which a merge patch replaces wholesale; services send conditions
  by type and the writer merges them into the current list, moving ``lastTransitionTime``
  only when a condition's status flips (the Kubernetes convention).
- Derived keys (for an Azimuth Cluster: ``phase``, ``nodeCount``, ``addonCount`` and
  ``lastUpdated``, ``shared.phase``) come from the status that results, on every write, by
  the kind's rule (``rules``), so no publisher has to know them.
- Metadata (finalizers, labels, annotations) changes are computed against the current object
  and sent with its ``resourceVersion``: lists such as ``finalizers`` must never be
  overwritten with a stale copy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from shared.mergepatch import apply, compose, diff
from shared.messages import Condition, PatchMetadata, PatchStatus
from shared.phase import format_time

__all__ = ["apply", "compose"]  # re-exported: tests and the bench read them from here

Json = dict[str, Any]
M = TypeVar("M", bound=PatchStatus)


def compose_all(patches: list[Json]) -> Json:
    result: Json = {}
    for patch in patches:
        result = compose(result, patch)
    return result


def split_incarnations(messages: list[M]) -> tuple[list[M], list[M]]:
    """(patches for the newest incarnation of an object, patches for older ones), in order.

    An object deleted and created again under the same name is a different object: patches
    addressed to the old uid must not land on the new one even when they share a batch.
    """
    newest = messages[-1].ref.uid
    current = [m for m in messages if m.ref.uid in (None, newest)]
    stale = [m for m in messages if m.ref.uid not in (None, newest)]
    return current, stale


def last_nudge(messages: Iterable[PatchStatus]) -> str | None:
    """The id of the last nudge among ``messages``: a patch that asks only for a re-derivation
    (the timeout timers send those, ``deadlines``)."""
    nudges = [m.id for m in messages if not m.patch and not m.conditions]
    return nudges[-1] if nudges else None


def merge_conditions(
    current: list[Json], updates: Iterable[Condition], now: datetime
) -> list[Json]:
    """``current`` with each update set by type; order kept, new types appended."""
    merged = {c["type"]: dict(c) for c in current if isinstance(c, dict) and "type" in c}
    for update in updates:
        before = merged.get(update.type) or {}
        since = before.get("lastTransitionTime")
        merged[update.type] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": since
            if since and before.get("status") == update.status
            else format_time(now),
        }
    return list(merged.values())


#: what a kind's rule derives from a resulting status (and the snapshot's facts, at ``now``)
Derive = Callable[[Json, Mapping[str, Any], datetime], Json]


def plan(
    snapshot: Snapshot, messages: Iterable[PatchStatus], derive: Derive, now: datetime
) -> Json | None:
    """The one merge patch that carries ``messages`` out on ``snapshot``, with the derived keys
    the result would change; None when the result is the status already there."""
    messages = list(messages)
    result = snapshot.status
    for message in messages:
        result = apply(result, message.patch)
    # By type the last word counts: a condition that flipped and flipped back within the batch
    # never showed, and a late patch replayed under newer ones (``shared.consumer``) must not
    # move ``lastTransitionTime`` either.
    conditions = list({c.type: c for m in messages for c in m.conditions}.values())
    if conditions:
        current = snapshot.status.get("conditions") or []
        result = {**result, "conditions": merge_conditions(current, conditions, now)}
    derived = derive(result, snapshot.facts, now)
    result = apply(result, {k: v for k, v in derived.items() if result.get(k) != v})
    return None if result == snapshot.status else diff(snapshot.status, result)


@dataclass(frozen=True)
class Snapshot:
    """What the writer knows of one object incarnation: enough to derive its status."""

    uid: str
    status: Json
    #: what of the object besides its status its kind's rule derives from (``rules.Rule.facts``)
    facts: Mapping[str, Any]
    #: the version this snapshot was read at; a write computed from it names it as precondition
    resource_version: str | None = None

    @classmethod
    def of(cls, obj: Json, facts: Callable[[Json], Mapping[str, Any]]) -> Snapshot:
        meta = obj["metadata"]
        return cls(
            uid=meta["uid"],
            status=obj.get("status") or {},
            facts=facts(obj),
            resource_version=meta.get("resourceVersion"),
        )


def metadata_patch(obj: Json, command: PatchMetadata) -> Json | None:
    """The merge patch that carries ``command`` out on ``obj``, or None if there is nothing to do.

    The patch names the ``resourceVersion`` it was computed from, so the server refuses it
    (409) if anything changed in between, instead of losing someone's finalizer.
    """
    meta = obj["metadata"]
    if command.if_generation is not None and meta.get("generation") != command.if_generation:
        return None
    finalizers = list(meta.get("finalizers") or [])
    wanted = [f for f in finalizers if f not in command.remove_finalizers]
    if not meta.get("deletionTimestamp"):
        # The API server forbids new finalizers on an object that is being deleted.
        wanted += [f for f in command.add_finalizers if f not in wanted]
    change: Json = {}
    if wanted != finalizers:
        change["finalizers"] = wanted
    for field, updates in (("labels", command.labels), ("annotations", command.annotations)):
        have = meta.get(field) or {}
        diff = {k: v for k, v in updates.items() if have.get(k) != v and (v or k in have)}
        if diff:
            change[field] = diff
    if not change:
        return None
    return {"metadata": {**change, "uid": meta["uid"], "resourceVersion": meta["resourceVersion"]}}


class StatusCache:
    """The Cluster as we last wrote (or listed) it, per incarnation and per partition claim.

    It lets the writer skip writes that change nothing and compute a patch without a GET. That
    is sound only while this replica is the Cluster's one writer, which holds for one claim of
    its partition: once the partition has been with another replica, that replica may have
    written the Cluster, and a stale entry could make a real change look like a no-op (a lost
    update). So every entry carries the fencing token of the claim it was made under, and is
    trusted only under that same claim. Bounded: the oldest entries fall out and cost one GET.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[int, Snapshot]] = OrderedDict()

    def get(self, key: str, uid: str | None, token: int) -> Snapshot | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != token or (uid is not None and entry[1].uid != uid):
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: str, snapshot: Snapshot, token: int) -> None:
        if self.size == 0:
            return
        self._entries[key] = (token, snapshot)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def seed(self, key: str, snapshot: Snapshot, token: int) -> bool:
        """``put`` unless this claim already knows the Cluster (its own write is newer)."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] == token:
            return False
        self.put(key, snapshot, token)
        return True

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
