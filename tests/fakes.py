"""The fakes every unit test shares: a bus that behaves like JetStream, an API server in memory.

They stand in for ``shared.bus.Bus`` and ``shared.kube.KubeClient`` through the Protocols the
services depend on, with the behaviour tests rely on made real rather than scripted:

* ``FakeBus`` drops a repeated message id (JetStream's duplicate window), keeps every
  message in order, answers ``last_message`` for a subject (with ``*`` and ``>`` wildcards,
  as NATS filters), and can be told to fail the next publishes.
* ``FakeMsg`` (``delivered``) is a JetStream message as the consumer sees it.
* ``FakeKube`` keeps objects by kind, namespace and name; gives each a uid, a generation and
  a resourceVersion that moves on every change; applies merge patches (RFC 7386, on the
  ``status`` subresource or the object) with their ``uid``/``resourceVersion`` preconditions
  (409 when they do not hold), and JSON patches with ``test`` operations; lets an object being
  deleted go once its last finalizer is removed; filters lists by
  namespace and by equality or existence label selectors; counts reads; and fails the next
  call of a verb with any error a test names (``fail``).

A test module that needs more (a verb recorded in its own way) subclasses them.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shared import jsonpatch
from shared.bus import Published
from shared.errors import KubeConflict, KubeNotFound
from shared.kube import ResourceKind
from shared.mergepatch import apply as merge
from shared.messages import Message, encode

Json = dict[str, Any]


class FakeBus:
    #: NATS's default maximum payload
    max_payload = 1 << 20

    def __init__(self) -> None:
        self.published: list[tuple[str, Message]] = []
        self._ids: set[str] = set()
        self._failures: list[BaseException] = []

    def fail(self, *errors: BaseException) -> None:
        """The next ``len(errors)`` publishes raise these, in order."""
        self._failures.extend(errors)

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        if self._failures:
            raise self._failures.pop(0)
        msg_id = msg_id or message.id
        if msg_id in self._ids:
            return Published(sequence=len(self.published), duplicate=True)
        self._ids.add(msg_id)
        self.published.append((subject, message.model_copy(update={"subject": subject})))
        return Published(sequence=len(self.published), duplicate=False)

    async def publish_many(
        self, items: list[tuple[str, Message, str | None]], *, ack_timeout: float = 10.0
    ) -> list[Published]:
        return [await self.publish(s, m, msg_id=i) for s, m, i in items]

    async def last_message(self, stream: str, subject: str) -> bytes | None:
        found = [m for s, m in self.published if matches(subject, s)]
        return encode(found[-1]) if found else None

    async def last_per_subject(self, stream: str, filter_subject: str) -> list[bytes]:
        last = {s: m for s, m in self.published if matches(filter_subject, s)}
        return [encode(m) for m in last.values()]

    def of(self, kind: type[Message]) -> list[Any]:
        """Every message of ``kind`` published, in order."""
        return [m for _, m in self.published if isinstance(m, kind)]

    def on(self, pattern: str) -> list[Message]:
        """Every message published on a subject ``pattern`` matches."""
        return [m for s, m in self.published if matches(pattern, s)]


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


@dataclass
class FakeSequence:
    stream: int


@dataclass
class FakeMetadata:
    sequence: FakeSequence
    num_delivered: int
    num_pending: int = 0


@dataclass
class FakeMsg:
    """A JetStream message as the consumer sees it; ``settled`` is set by ack, nak or term."""

    subject: str
    data: bytes
    metadata: FakeMetadata
    headers: dict[str, str] = field(default_factory=dict)
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    how: str = ""

    async def ack(self) -> None:
        self._settle("ack")

    async def nak(self, delay: float | None = None) -> None:
        self._settle("nak")

    async def term(self) -> None:
        self._settle("term")

    async def in_progress(self) -> None:
        pass

    def _settle(self, how: str) -> None:
        self.how = how
        self.settled.set()


_stream_sequence = itertools.count(1)


def delivered(subject: str, data: bytes, *, deliveries: int = 1) -> FakeMsg:
    """A message delivered for the ``deliveries``-th time, with the next stream sequence."""
    metadata = FakeMetadata(FakeSequence(next(_stream_sequence)), deliveries)
    return FakeMsg(subject=subject, data=data, metadata=metadata)


Key = tuple[str, str, str]


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[Key, Json] = {}
        self.reads = 0
        self.calls: list[tuple[str, str, str | None, str]] = []
        self._failures: dict[str, list[BaseException]] = defaultdict(list)
        self._versions = itertools.count(1)
        self._uids = itertools.count(1)

    # --- arranging ------------------------------------------------------------------------

    def put(self, kind: ResourceKind, obj: Json) -> Json:
        """Store ``obj`` as the API server would after a create; returns the stored copy."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._versions))
        stored.setdefault("apiVersion", kind.api_version)
        stored.setdefault("kind", kind.kind)
        self.objects[_key(kind, meta.get("namespace"), meta["name"])] = stored
        return copy.deepcopy(stored)

    def fail(self, verb: str, *errors: BaseException) -> None:
        """The next calls of ``verb`` (get, list, create, apply, patch, delete) raise these."""
        self._failures[verb].extend(errors)

    def stored(self, kind: ResourceKind, namespace: str | None, name: str) -> Json | None:
        """The object as stored (no read counted), or None."""
        return self.objects.get(_key(kind, namespace, name))

    def of_kind(self, kind: ResourceKind) -> list[Json]:
        return [o for (token, _, _), o in self.objects.items() if token == kind.token]

    # --- the API --------------------------------------------------------------------------

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self._called("get", kind, namespace, name)
        self.reads += 1
        return copy.deepcopy(self._existing(kind, namespace, name))

    async def get_metadata(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        obj = await self.get(kind, namespace, name)
        return {"metadata": obj["metadata"]}

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        **_: Any,
    ) -> tuple[list[Json], str]:
        self._called("list", kind, namespace, "")
        self.reads += 1
        items = [
            copy.deepcopy(obj)
            for (token, ns, _), obj in self.objects.items()
            if token == kind.token
            and (namespace is None or ns == namespace)
            and selected(obj, label_selector)
        ]
        return items, str(next(self._versions))

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        meta = obj["metadata"]
        self._called("create", kind, meta.get("namespace"), meta["name"])
        if _key(kind, meta.get("namespace"), meta["name"]) in self.objects:
            raise KubeConflict(f"{kind.kind} {meta['name']} already exists")
        return self.put(kind, obj)

    async def apply(self, kind: ResourceKind, obj: Json, **_: Any) -> Json:
        """Server-side apply, simplified: the applied fields merge into the stored object."""
        meta = obj["metadata"]
        self._called("apply", kind, meta.get("namespace"), meta["name"])
        current = self.objects.get(_key(kind, meta.get("namespace"), meta["name"]))
        if current is None:
            return self.put(kind, obj)
        return self._store(kind, merge(current, copy.deepcopy(obj)))

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        self._called("patch", kind, namespace, name)
        current = self._existing(kind, namespace, name)
        _check_preconditions(current, patch.get("metadata") or {})
        if subresource == "status":
            patch = {"status": patch.get("status")}
        else:
            patch = {k: v for k, v in patch.items() if k != "status"}
        return self._store(kind, merge(current, patch))

    async def patch_json(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        ops: Iterable[Json],
        *,
        subresource: str | None = None,
    ) -> Json:
        self._called("patch", kind, namespace, name)
        obj = copy.deepcopy(self._existing(kind, namespace, name))
        for op in ops:
            jsonpatch.apply_op(obj, op)
        return self._store(kind, obj)

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self._called("delete", kind, namespace, name)
        current = self._existing(kind, namespace, name)
        del self.objects[_key(kind, namespace, name)]
        return copy.deepcopy(current)

    # --- inside -----------------------------------------------------------------------------

    def _called(self, verb: str, kind: ResourceKind, namespace: str | None, name: str) -> None:
        self.calls.append((verb, kind.kind, namespace, name))
        if self._failures[verb]:
            raise self._failures[verb].pop(0)

    def _existing(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        try:
            return self.objects[_key(kind, namespace, name)]
        except KeyError:
            raise KubeNotFound(f"{kind.plural} {name!r} not found") from None

    def _store(self, kind: ResourceKind, obj: Json) -> Json:
        """Store a change; an object being deleted goes once its last finalizer has."""
        meta = obj["metadata"]
        meta["resourceVersion"] = str(next(self._versions))
        key = _key(kind, meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        return copy.deepcopy(obj)


def _key(kind: ResourceKind, namespace: str | None, name: str) -> Key:
    return (kind.token, namespace or "", name)


def _check_preconditions(current: Json, wanted: Json) -> None:
    meta = current["metadata"]
    for name in ("uid", "resourceVersion"):
        if wanted.get(name) and wanted[name] != meta.get(name):
            raise KubeConflict(f"precondition failed: {name} {wanted[name]} != {meta.get(name)}")


def selected(obj: Json, selector: str | None) -> bool:
    """Equality (``k=v``) and existence (``k``) terms of a label selector."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in (selector or "").split(","):
        key, _, value = term.partition("=")
        if term and (key not in labels or (value and labels[key] != value)):
            return False
    return True
