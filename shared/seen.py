"""What a replica has seen and decided, so that a run reads only what it cannot know.

The OpenShift Assisted providers' runs used to read their object and the chain behind it,
whatever woke them; at the client's 50 requests/s the runs then queued behind each other's
reads (bench phase ``o``, ``bench/ANALYSIS.md``). These memories cut that down. Each is this
replica's only and each can be lost (a restart, a partition taken over) at the price of
reads; none lets a stale view write unchecked:

* **The newest version of each object** this replica has seen, from the events of it (noted
  by the handlers before any mapping or run of their batch), its reads and its own writes
  (``note``, ``current``, ``get``). A run starts from it instead of a read. That is as current
  as a read made when this replica last heard of the object: any later change is an event of
  the object still to come, and that event runs what depends on it again (its own object;
  what a mapping wakes for the others). Everything written from such a view is
  preconditioned on its ``resourceVersion`` (``shared.owned``) or is a server-side apply of
  what the view asks for; a run that fails for any reason, and an object's DELETED event,
  make the next run read it (``distrust``). An object read as absent is known absent until an
  event or a write says otherwise. Versions are compared as numbers, which they are on every
  API server backed by etcd; an object whose version is not a number is never kept.
* **Decisions.** Where a run ended: the version it decided from, the object's parts that are
  not status (``fingerprint``) and the status it asked the writer for. An own event at or
  below that version, or one that differs only by status that still says what was asked (the
  writer's write of it, another controller's condition or state), brings nothing the decision
  did not see: it is dropped before the run (``nothing_new``, ``gather``). A decision is
  recorded only where every input the run waited on wakes it by an event of its own (the
  reconcilers say where).
* **Marks.** Per object of another kind, the part of it a mapping looks at, as of the last
  batch that ran through without error (``Marks``): an event that changes none of it wakes
  nobody. A first event (after a restart too) always maps.

All of it holds because this replica sees every event of the objects it is about (a
cluster's objects share its partition). When partitions move it is all forgotten
(``Forgetting``, the consumer's claim follower).

A provider that needs more memories subclasses ``Seen`` (the bootstrap provider's
``services/baremetal/assisted_bootstrap/seen.py``: listings, runs in flight, Machine facts).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.claims import Claim
from shared.kube import ResourceKind
from shared.messages import Condition, Message, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Mapper, Target, get_or_none, targets_of

Json = dict[str, Any]
J = TypeVar("J", bound=Json | None)

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
        self._latest: dict[str, Json] = {}
        self._absent: set[str] = set()
        self._untrusted: set[str] = set()
        self._decisions: dict[str, Decision] = {}
        self._marks: dict[str, Hashable] = {}

    def clear(self) -> None:
        """Forget everything (partitions moved: see ``Forgetting``)."""
        for memory in (self._latest, self._decisions, self._marks):
            memory.clear()
        self._untrusted.clear()
        self._absent.clear()

    # --- the newest version of each object -----------------------------------------------

    def note(self, key: str, obj: J, *, read: bool = False) -> J:
        """Keep ``obj`` as the object's newest version if it is (an event, a listing, this
        replica's own write); ``read``: a fresh read, the newest whatever came before (None:
        there is none). Returns ``obj``."""
        if read:
            self._untrusted.discard(key)
            if obj is None:  # known not to be there, until an event or a write says otherwise
                self._latest.pop(key, None)
                self._absent.add(key)
        if obj is None or key in self._untrusted:
            return obj
        self._absent.discard(key)
        found = version(obj)
        held = version(self._latest[key]) if key in self._latest else None
        if found is not None and (read or held is None or found >= held):
            self._latest[key] = copy.deepcopy(obj)
        return obj

    def current(self, key: str) -> Json | None:
        """The newest version of the object this replica has seen, unless it must be read."""
        found = None if key in self._untrusted else self._latest.get(key)
        return copy.deepcopy(found) if found is not None else None

    async def get(
        self, kube: KubeReader, kind: ResourceKind, namespace: str, name: str
    ) -> Json | None:
        """The object as this replica knows it at its newest, else as read now (None: there
        is none; known once read, until its ADDED event or a write of this replica's)."""
        key = key_of(kind, namespace, name)
        found = self.current(key)
        if found is not None or (key in self._absent and key not in self._untrusted):
            return found
        return self.note(key, await get_or_none(kube, kind, namespace, name), read=True)

    def distrust(self, key: str) -> None:
        """The next run reads the object and decides again (this one failed, or the object
        went)."""
        self._latest.pop(key, None)
        self._doubt(key)

    def _doubt(self, key: str) -> None:
        """The object must be read before it is trusted or decided from again."""
        self._absent.discard(key)
        self._untrusted.add(key)
        self._decisions.pop(key, None)

    def forget(self, key: str) -> None:
        self._latest.pop(key, None)
        self._absent.discard(key)
        self._untrusted.discard(key)
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
        """The reason the last decision asked ``condition`` to have, which the object's status
        may not show yet (None: no decision, or none about that condition)."""
        decision = self._decisions.get(key)
        for found in decision.conditions if decision else ():
            if found.type == condition:
                return found.reason
        return None

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


#: what the mappings look at in a live object of one kind
Marker = Callable[[ResourceChanged], Hashable]


@dataclass(frozen=True)
class Marks:
    """What the mappings look at, per kind of event. A DELETED event always maps, and takes
    its object's mark with it."""

    markers: Mapping[ResourceKind, Marker]

    def kind_of(self, message: ResourceChanged) -> ResourceKind | None:
        ref = message.ref
        return next(
            (k for k in self.markers if (k.api_version, k.kind) == (ref.api_version, ref.kind)),
            None,
        )

    def unchanged(self, seen: Seen, kind: ResourceKind, message: ResourceChanged) -> bool:
        """Whether the event changes nothing the mappings looked at in the last batch that
        ran through."""
        if message.event == "DELETED":
            return False
        return seen.unchanged(mark_of(kind, message), self.markers[kind](message))

    def record(self, seen: Seen, messages: Iterable[ResourceChanged]) -> None:
        """What the mappings looked at in ``messages``; only once their batch ran through (a
        batch that failed is mapped again on its retry)."""
        for message in messages:
            kind = self.kind_of(message)
            if kind is not None:
                gone = message.event == "DELETED"
                seen.mark(mark_of(kind, message), None if gone else self.markers[kind](message))


async def gather(
    messages: Iterable[ResourceChanged],
    kube: KubeReader,
    mappers: Mapping[ResourceKind, Mapper],
    seen: Seen,
) -> dict[Target, Message]:
    """``shared.reconcile.gather`` of events already one per kind (``latest_per_kind``), less
    the targets woken only by an own event that brings nothing new (``Seen.nothing_new``)."""
    found: dict[Target, Message] = {}
    others: set[Target] = set()
    for message in messages:
        for target in await targets_of(message, kube, mappers):
            if target.named_by(message):
                found[target] = message
            else:
                others.add(target)
                found.setdefault(target, message)
    return {
        target: cause
        for target, cause in found.items()
        if target in others or not seen.nothing_new(target.kind, target.key, cause)
    }


def _own_event(kind: ResourceKind, key: str, message: Message) -> bool:
    if not isinstance(message, ResourceChanged) or message.event == "DELETED":
        return False
    ref = message.ref
    same_kind = (ref.api_version, ref.kind) == (kind.api_version, kind.kind)
    return same_kind and key_of(kind, ref.namespace or "", ref.name) == key
