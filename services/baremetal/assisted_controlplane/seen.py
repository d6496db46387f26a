"""What this replica has seen and decided, so that a run reads only what it cannot know.

Every run used to read its object and the chain behind it, whatever woke it, and every
change of a Cluster, a Machine or an ACI woke the ACP; at the client's 50 requests/s the runs
then queued behind each other's reads (bench phase ``o``). Three memories cut that down (the
bootstrap provider keeps the same ones, in its own copy of this module: services share no
code but ``shared``). Each is this replica's only, each can be lost (a restart, a partition
taken over) at the price of reads, and none lets a stale view write:

* **Versions.** The newest ``resourceVersion`` this replica has seen of an object, from its
  reads, its own writes and the events it started from. A run woken by an object's own event
  starts from the object the event carries when that is at least as new (``carried``): a newer
  change is an event still to come, which runs it again. An older one would undo this
  replica's own write in its view, so then it reads. Everything written from such a view is
  preconditioned on its ``resourceVersion`` (``shared.owned``) or is a server-side apply of
  what the view asks for; a run that fails for any reason distrusts the object, and its retry
  reads. Versions are compared as numbers, which they are on every API server backed by etcd;
  one that is not a number is never trusted.
* **Decisions.** Where a run ended: the version it decided from, the object's parts that are
  not status (``fingerprint``) and the status it asked the writer for. An own event at or
  below that version, or one that differs only by status that still says what was asked (the
  writer's write of it, an installer's state on an ACI), brings nothing the decision did not
  see: it is dropped before any read (``nothing_new``). A decision is recorded only where every
  input the run waited on wakes it by an event of its own (the reconcilers say where).
* **Marks.** Per object of another kind, the part of it a mapping looks at, as of the last
  batch that ran through without error (``unchanged``/``mark``): an event that changes none of
  it wakes nobody. A first event (after a restart too) always maps.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

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
        self._marks: dict[str, Hashable] = {}

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
        found = version(cause.object)
        if found is None or found < self._versions.get(key, 0):
            return None
        self._versions[key] = found
        return copy.deepcopy(cause.object)

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
