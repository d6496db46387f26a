"""Which of two resource events of one object is newer, and what a consumer already applied.

**Why.** The stream does not keep one object's events in resourceVersion order. Two watcher
replicas follow the same objects, and their publishes are deduplicated by message id, which is
``<uid>:<resourceVersion>:<event>``: it catches the *same* version reported twice, not an older
one reported after a newer. That happens when one replica reports a version the other never did
and reports it late: a re-list (after a restart, a 410, or a publish that failed) reports each
object at the list's version, skipping the versions between, as ADDED when the replica had not
stored the object yet; a list taken just before the other replica's watch published a newer
version is published after that newer one, under an id nobody used. The fault soak
(``docs/operations.md``, "The fault soak") saw it as nodes left at ``Provisioning`` while their
Machines were Ready and addons left ``Installing``: in each of its 5 unsettled faults one
watcher, re-listing after a publish timed out, stored the object's listed state as ADDED
milliseconds after the other's newer MODIFIED, the monitor applied it last, and the object,
quiet from then on, never corrected it.

**The rule.** resourceVersions are etcd revisions: every watched kind is served from one etcd,
whose revisions are integers that only grow, so for one object (one uid) a larger one is a
later state. Kubernetes calls them opaque, so a version that does not parse as an integer is
never filtered (applied in stream order, as before). A different uid is a different object
(same name, new incarnation): never older than anything. Nothing follows an object's
DELETED: it is the newest event its uid will ever have, whatever version it carries (a
re-list reports a deletion at the list's version, a watch at the deletion's revision).

**What a consumer keeps (``Versions``).** Per uid, the newest version it applied; an event
older than that is *stale* and is skipped. The memory is bounded: a DELETED forgets its uid's
version and leaves a tombstone instead (any later event of that uid is stale: without it, a
lagging replica's ADDED or MODIFIED published after the deletion would bring a node back), and
both are LRU-bounded (``size`` objects, the newest ``TOMBSTONES`` deletions: a late event of a
deleted object comes from the watchers' race around the deletion, seconds later). Forgetting
is always safe because a remembered version is only ever a lower bound of the object's
current one: an object nobody remembers is *unseen*, and that is where a consumer that keeps
state from payloads must not trust the payload blindly.

**Why also read back (level-triggered) and not only remember.** Memory alone cannot know about
an event another replica handled: after a partition hand-over (or a restart, or an LRU
eviction) the new owner starts with no memory, and the stream order newer-then-older means
the old owner acked the newer event and the new owner receives only the older one. A consumer
that applies an unseen object's MODIFIED event therefore reads the object back from the API
server and applies what it reads (a quorum read: never older than any event): one GET per
object per replica memory, not per event. ADDED is the first event of a new object, so
reading it back would cost a GET per object created for nothing (the one gap left: a stale
ADDED needs a re-list racing another replica's watch *and* a hand-over, restart or eviction
between the two; the object's next change corrects it). DELETED is always applied. A deleted
object's late event whose tombstone is gone (hand-over, bound) is unseen too, and its
read-back finds it gone, which is what the consumer then applies.

A consumer that lists the objects when it claims a partition (the monitor's resync does) can
also note their versions: a listed version is one whose state, or a newer one, is reported by
some event still to come or already applied, so an older event after it is stale. That
narrows the ADDED gap to the moments between a claim and its list.

Neither half needs to know about partitions: entries of a partition handed away stay correct
lower bounds if it comes back, and the LRU bound ages them out otherwise.

**What the fix in the watcher would be** (not here: it needs ``shared/bus.py``): publish with
``Nats-Expected-Last-Subject-Sequence`` of the last event the replica saw stored for the
object and, on a mismatch, re-read the subject's last event and publish only if newer. That
would keep each object's events in order on the stream; this module would still guard
against what is stored out of order already, and costs nothing when nothing is.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.messages import ResourceChanged

#: deletions remembered: a late event of a deleted object comes from the watchers' race
#: around the deletion, seconds later, not after a thousand other deletions
TOMBSTONES = 1024

V = TypeVar("V")


def version_number(resource_version: object) -> int | None:
    """``resource_version`` as an etcd revision, or None if it is not one."""
    if isinstance(resource_version, bool):
        return None
    if isinstance(resource_version, int):
        return resource_version
    if isinstance(resource_version, str) and resource_version.isdecimal():
        return int(resource_version)
    return None


@dataclass(frozen=True)
class Stamp:
    """Where one event stands in its object's history."""

    uid: str
    #: the etcd revision, None if the event's version does not parse
    version: int | None
    deleted: bool


def stamp(change: ResourceChanged) -> Stamp:
    """The stamp of ``change``: the newer of the event's version and its object's.

    They differ when the consumer read a trimmed object back (``shared.oversize``): the object
    is then newer than the event that announced it.
    """
    meta = change.object.get("metadata")
    inner = meta.get("resourceVersion") if isinstance(meta, dict) else None
    versions = [
        v for v in (version_number(change.resource_version), version_number(inner)) if v is not None
    ]
    return Stamp(
        uid=change.ref.uid or "",
        version=max(versions) if versions else None,
        deleted=change.event == "DELETED",
    )


def object_stamp(obj: dict[str, Any]) -> Stamp:
    """The stamp of ``obj`` as a list or read returned it (alive)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return Stamp(
        uid=str(meta.get("uid") or ""),
        version=version_number(meta.get("resourceVersion")),
        deleted=False,
    )


def older(candidate: Stamp, than: Stamp) -> bool:
    """Whether ``candidate`` is an earlier state of the same object than ``than``."""
    if not candidate.uid or candidate.uid != than.uid or candidate.deleted:
        return False
    if than.deleted:
        return True
    if candidate.version is None or than.version is None:
        return False
    return candidate.version < than.version


def newest(changes: Iterable[ResourceChanged]) -> ResourceChanged | None:
    """The event of ``changes`` (stream order) that says most: the last one that is not an
    older state of an object an earlier one of ``changes`` already reported."""
    best: ResourceChanged | None = None
    seen: dict[str, Stamp] = {}
    for change in changes:
        now = stamp(change)
        before = seen.get(now.uid)
        if before is not None and older(now, before):
            continue
        seen[now.uid] = now
        best = change
    return best


class Verdict(enum.Enum):
    #: as new as, or newer than, what was applied: apply it
    FRESH = "fresh"
    #: older than what was applied: skip it
    STALE = "stale"
    #: nothing is remembered of its object: it may be stale (the module docstring says what to do)
    UNSEEN = "unseen"


class Versions:
    """Per object uid, the newest version a consumer applied (LRU, ``size`` objects), and the
    uids of the newest ``tombstones`` deletions."""

    def __init__(self, *, size: int, tombstones: int = TOMBSTONES) -> None:
        if size < 1 or tombstones < 0:
            raise ValueError("Versions needs room for at least one object")
        self.size = size
        self.tombstones = tombstones
        self._newest: OrderedDict[str, int | None] = OrderedDict()
        self._deleted: OrderedDict[str, None] = OrderedDict()

    def check(self, seen: Stamp) -> Verdict:
        """What to do with an event stamped ``seen`` (remembers nothing)."""
        if seen.deleted or not seen.uid:
            return Verdict.FRESH
        if seen.uid in self._deleted:
            return Verdict.STALE
        if seen.uid not in self._newest:
            return Verdict.UNSEEN
        applied = Stamp(seen.uid, self._newest[seen.uid], deleted=False)
        return Verdict.STALE if older(seen, applied) else Verdict.FRESH

    def note(self, seen: Stamp) -> None:
        """The state stamped ``seen`` was applied (a DELETED forgets its object's version)."""
        if not seen.uid:
            return
        if seen.deleted:
            self._newest.pop(seen.uid, None)
            _bounded_put(self._deleted, seen.uid, None, self.tombstones)
            return
        before = self._newest.get(seen.uid)
        keep = seen.version
        if before is not None and (keep is None or before > keep):
            keep = before
        _bounded_put(self._newest, seen.uid, keep, self.size)

    def __len__(self) -> int:
        """Objects remembered alive (tombstones not counted)."""
        return len(self._newest)


def _bounded_put(entries: OrderedDict[str, V], key: str, value: V, size: int) -> None:
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > size:
        entries.popitem(last=False)
