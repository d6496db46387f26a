"""What this replica has seen and decided, so that a run reads only what it cannot know.

Every run used to read its object and the whole chain behind it, whatever woke it; at the
client's 50 requests/s the configs and Agents then queued behind each other's reads (bench
phase ``o``). These memories cut that down (the control-plane provider keeps the first two
and the marks in its own copy of this module: services share no code but ``shared``). Each
is this replica's only, each can be lost (a restart, a partition taken over) at the price of
reads, and none lets a stale view write:

* **Versions.** The newest ``resourceVersion`` this replica has seen of an object, from its
  reads, its own writes and the events it started from. A run woken by an object's own event
  starts from the object the event carries when that is at least as new (``carried``): a newer
  change is an event still to come, which runs it again. An older one would undo this
  replica's own write in its view, so then it reads. Everything written from such a view is
  preconditioned on its ``resourceVersion`` (``shared.owned``); a run that fails for any reason
  distrusts the object, and its retry reads. Versions are compared as numbers, which they are
  on every API server backed by etcd; one that is not a number is never trusted.
* **Decisions.** Where a run ended: the version it decided from, the object's parts that are
  not status (``fingerprint``) and the status it asked the writer for. An own event at or
  below that version, or one that differs only by status that still says what was asked (the
  writer's write of it, another provider's condition), brings nothing the decision did not see:
  it is dropped before any read (``nothing_new``). A decision is recorded only where every
  input the run waited on wakes it by an event of its own (the reconcilers say where).
* **Runs in flight and the reasons decided.** A mapping that wakes the configs waiting for
  something reads their wait from their status; a run that has read its inputs and not yet
  had its report written is not there yet. ``is_running`` and ``decided_reason`` let the
  mapping wake such a config anyway (``handlers._in_doubt``). This is what the writer's own
  event used to do, and why that event may now be dropped.
* **Marks.** Per object of another kind, the part of it a mapping looks at, as of the last
  batch that ran through without error (``unchanged``/``mark``): an event that changes none of
  it wakes nobody. A first event (after a restart too) always maps.
* **Facts.** What holds until an event of this replica's says otherwise: the parts of a
  Machine that never change for its uid (cluster, role, pool, infrastructure reference,
  owners), a Cluster's infrastructure being ready, a cluster's one ClusterDeployment and its
  ACI (``recall``; ``handlers`` learns and unlearns them from the events, before any mapping).
* **Offers.** An object a mapping just listed, handed to the run it wakes instead of a read.

Memories hold because this replica sees every event of the objects they are about (a
cluster's objects share its partition). When partitions move they are all forgotten
(``Forgetting``, the consumer's claim follower).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.claims import Claim
from shared.kube import ResourceKind
from shared.messages import Condition, Message, ResourceChanged

Json = dict[str, Any]
J = TypeVar("J", bound=Json | None)

#: a version above every real one: the object must be read
_UNTRUSTED = 1 << 62
#: status fields a decision never counts on: a CRD may prune them
_IGNORED = frozenset({"observedGeneration"})


def key_of(kind: ResourceKind, namespace: str, name: str) -> str:
    """The key ``shared.reconcile.Target.key`` gives the same object."""
    return f"{kind.token}/{namespace}/{name}"


def version(obj: Json) -> int | None:
    try:
        return int((obj.get("metadata") or {})["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


def fingerprint(obj: Json) -> str:
    """Everything of ``obj`` but its status and bookkeeping: ``generation`` stands for the
    spec (the API server raises it with every spec change)."""
    meta = obj.get("metadata") or {}
    parts = [
        meta.get(k)
        for k in (
            "uid",
            "generation",
            "labels",
            "annotations",
            "ownerReferences",
            "finalizers",
            "deletionTimestamp",
        )
    ]
    return json.dumps(parts, sort_keys=True, default=str)


@dataclass(frozen=True)
class Decision:
    version: int
    fingerprint: str
    fields: Json
    conditions: tuple[Condition, ...]

    def holds(self, obj: Json) -> bool:
        """Whether ``obj``'s status still says what this decision asked for."""
        status = obj.get("status") or {}
        if any(status.get(k) != v for k, v in self.fields.items()):
            return False
        found = {c.get("type"): c for c in status.get("conditions") or []}
        return all(
            (found.get(c.type) or {}).get("status") == c.status
            and (found.get(c.type) or {}).get("reason") == c.reason
            and ((found.get(c.type) or {}).get("message") or "") == c.message
            for c in self.conditions
        )


class Seen:
    def __init__(self) -> None:
        self._versions: dict[str, int] = {}
        self._decisions: dict[str, Decision] = {}
        self._running: Counter[str] = Counter()
        self._marks: dict[str, Hashable] = {}
        self._facts: dict[str, Json] = {}
        self._offers: dict[str, Json] = {}

    def clear(self) -> None:
        """Forget everything but the runs in flight (partitions moved: see ``Forgetting``)."""
        for memory in (self._versions, self._decisions, self._marks, self._facts, self._offers):
            memory.clear()

    # --- versions -------------------------------------------------------------------------

    def note(self, key: str, obj: J) -> J:
        """Remember ``obj``'s version (read or written by this replica); returns ``obj``."""
        found = version(obj) if obj is not None else None
        if found is not None and found > self._versions.get(key, -1):
            self._versions[key] = found
        return obj

    def carried(self, kind: ResourceKind, key: str, cause: Message) -> Json | None:
        """The object ``cause`` carries when it is this object's event and at least as new as
        any version of it this replica has seen; None: read it."""
        if not _own_event(kind, key, cause):
            return None
        assert isinstance(cause, ResourceChanged)
        return self._fresh(key, cause.object)

    def offer(self, key: str, obj: Json) -> None:
        """The object as a mapping just listed it (after the event it maps), for the run it
        wakes: as good as a read made a moment earlier."""
        self._offers[key] = obj

    def offered(self, key: str) -> Json | None:
        """The offered object, when at least as new as any version this replica has seen."""
        found = self._offers.pop(key, None)
        return self._fresh(key, found) if found is not None else None

    def withdraw(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._offers.pop(key, None)

    def _fresh(self, key: str, obj: Json) -> Json | None:
        found = version(obj)
        if found is None or found < self._versions.get(key, 0):
            return None
        self._versions[key] = found
        return copy.deepcopy(obj)

    def distrust(self, key: str) -> None:
        """The next run reads the object and decides again (this one failed)."""
        self._versions[key] = _UNTRUSTED
        self._decisions.pop(key, None)

    def forget(self, key: str) -> None:
        self._versions.pop(key, None)
        self._decisions.pop(key, None)

    # --- decisions ------------------------------------------------------------------------

    def decide(
        self, key: str, obj: Json, fields: Json | None = None, conditions: Iterable[Condition] = ()
    ) -> None:
        """A run ended at ``obj`` having asked the writer for ``fields`` and ``conditions``."""
        found = version(obj)
        if found is None:
            return
        wanted = {k: v for k, v in (fields or {}).items() if k not in _IGNORED}
        self._decisions[key] = Decision(found, fingerprint(obj), wanted, tuple(conditions))

    def nothing_new(self, kind: ResourceKind, key: str, message: Message) -> bool:
        """Whether ``message``, the object's own event, brings nothing the last decision did
        not see (see the module's docstring)."""
        decision = self._decisions.get(key)
        if decision is None or not _own_event(kind, key, message):
            return False
        assert isinstance(message, ResourceChanged)
        found = version(message.object)
        if found is None:
            return False
        if found <= decision.version:
            return True
        return fingerprint(message.object) == decision.fingerprint and decision.holds(
            message.object
        )

    def decided_reason(self, key: str, condition: str) -> str | None:
        decision = self._decisions.get(key)
        for found in decision.conditions if decision else ():
            if found.type == condition:
                return found.reason
        return None

    # --- runs in flight -------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, key: str) -> Iterator[None]:
        self._running[key] += 1
        try:
            yield
        finally:
            self._running[key] -= 1
            if self._running[key] <= 0:
                del self._running[key]

    def is_running(self, key: str) -> bool:
        return key in self._running

    # --- marks ----------------------------------------------------------------------------

    def unchanged(self, mark: str | None, value: Hashable) -> bool:
        return mark is not None and mark in self._marks and self._marks[mark] == value

    def mark(self, mark: str | None, value: Hashable | None) -> None:
        """``value`` (None: the object is gone) as what the mappings last looked at."""
        if mark is None:
            return
        if value is None:
            self._marks.pop(mark, None)
        else:
            self._marks[mark] = value

    # --- facts ----------------------------------------------------------------------------

    def remember(self, key: str | None, obj: Json) -> None:
        if key:
            self._facts[key] = copy.deepcopy(obj)

    def recall(self, key: str | None) -> Json | None:
        found = self._facts.get(key) if key else None
        return copy.deepcopy(found) if found is not None else None

    def drop(self, key: str | None) -> None:
        if key:
            self._facts.pop(key, None)


class Forgetting:
    """The consumer's claim follower: when a partition comes or goes, this replica forgets
    everything it remembers. Its memories hold because it sees every event of the objects
    they are about; a partition held by another replica meanwhile had events it never saw.
    The consumer tells ``lost`` before a partition taken again is fetched from (a new claim
    is fenced for a lease's time), so no run of it decides from memories older than its
    claim."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def claimed(self, claim: Claim) -> None:
        self.seen.clear()

    async def lost(self, partitions: frozenset[int]) -> None:
        self.seen.clear()


def mark_of(kind: ResourceKind, message: ResourceChanged) -> str | None:
    """The mark of the object an event is about (None: it has no uid to tell it by)."""
    uid = (message.object.get("metadata") or {}).get("uid") or message.ref.uid
    return f"{kind.token}/{uid}" if uid else None


def _own_event(kind: ResourceKind, key: str, message: Message) -> bool:
    if not isinstance(message, ResourceChanged) or message.event == "DELETED":
        return False
    ref = message.ref
    same_kind = (ref.api_version, ref.kind) == (kind.api_version, kind.kind)
    return same_kind and key_of(kind, ref.namespace or "", ref.name) == key
