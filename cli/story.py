"""The pure part of ``capibus``: which subjects name an object, filters, merging, the tree.

Nothing here talks to NATS, so every rule the command applies is unit-tested on plain values.

- **Subjects, not whole streams.** Every subject ends in ``<namespace>.<name>`` but the
  tokens before differ per stream (``evt.<kind>.<p>``, ``status.<patch|meta>.<kind>.<p>``,
  ``lifecycle.prep.<step>.<p>`` against ``lifecycle.reconcile.<p>``). NATS wildcards match one
  token each (``>`` only at the end), so one object is a handful of filters per stream, each
  with the exact token count; a dead letter's subject is ``capibus.dlq.<service>.`` followed
  by the original subject, so its filters are the others prefixed. Filters of one consumer
  must not overlap; these differ in length, so they never do.
- **Time order.** Each stream is in its own order; the story is all of them sorted by the
  envelope's ``time`` (when the producer made the message), ties by the time the stream stored
  it, then stream and sequence, so the listing is stable.
- **The causation tree** links a message to its parent by ``causation_id``. A dead letter's
  ``causation_id`` is the original's ``Nats-Msg-Id`` header, which can differ from the
  envelope id, so a record answers to both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shared import subjects
from shared.errors import BadMessage
from shared.messages import Message, MessageDeadLettered, decode_any
from shared.tracing import trace_id_of

TRACE_HEADERS = ("traceparent", "tracestate")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True)
class Record:
    """One stored message: where it is, when the stream took it, and what it says."""

    stream: str
    sequence: int
    subject: str
    stored: datetime
    body: bytes
    msg_id: str | None = None
    message: Message | None = None
    problem: str | None = None
    #: the W3C trace id of its ``traceparent`` header (``docs/operations.md``, Tracing)
    trace_id: str | None = None
    #: its trace headers (``traceparent``, ``tracestate``), for what continues its trace
    trace_headers: tuple[tuple[str, str], ...] = ()

    @property
    def time(self) -> datetime:
        return self.message.time if self.message is not None else self.stored

    @property
    def type(self) -> str:
        return str(getattr(self.message, "type", "?"))

    @property
    def ids(self) -> set[str]:
        """Every id a child's ``causation_id`` may name this record by."""
        own = {self.message.id} if self.message is not None else set()
        return own | ({self.msg_id} if self.msg_id else set())


def record(
    stream: str,
    sequence: int,
    subject: str,
    stored: datetime,
    body: bytes,
    *,
    msg_id: str | None,
    headers: Mapping[str, str] | None = None,
) -> Record:
    """Decode ``body``; a body no model accepts is still a record, with its problem."""
    try:
        message: Message | None = decode_any(body)
        problem = None
    except BadMessage as exc:
        message, problem = None, str(exc)
    trace = trace_id_of(headers)
    carried = tuple((k, v) for k, v in (headers or {}).items() if k.lower() in TRACE_HEADERS)
    return Record(stream, sequence, subject, stored, body, msg_id, message, problem, trace, carried)


# --- which subjects name one object -------------------------------------------------------


def parse_object(text: str) -> tuple[str | None, str]:
    """``<namespace>/<name>``; ``/<name>`` (or ``_/<name>``) for a cluster-scoped object."""
    namespace, sep, name = text.rpartition("/")
    if not sep or not name:
        raise ValueError(f"expected <namespace>/<name>, got {text!r}")
    if namespace in ("", subjects.CLUSTER_SCOPED):
        return None, name
    return namespace, name


def object_filters(namespace: str | None, name: str) -> dict[str, list[str]]:
    """Per stream, the subject filters that match every message about one object."""
    obj = f"{subjects.namespace_token(namespace)}.{subjects.name_token(name)}"
    p = subjects.PREFIX
    own = {
        subjects.EVENTS.name: [f"{p}.evt.*.*.{obj}"],
        subjects.STATUS.name: [f"{p}.status.*.*.*.{obj}"],
        subjects.LIFECYCLE.name: [f"{p}.lifecycle.*.*.{obj}", f"{p}.lifecycle.*.*.*.{obj}"],
        subjects.JOURNAL.name: [f"{p}.journal.*.*.{obj}"],
    }
    dead = [f"{p}.dlq.*.{f}" for filters in own.values() for f in filters]
    return {**own, subjects.DEADLETTER.name: dead}


# --- filters --------------------------------------------------------------------------------


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``90s``, ``10m``, ``2h``, ``1d`` before now, or an ISO 8601 time (UTC if naive)."""
    match = _DURATION.match(text.strip())
    if match:
        amount = timedelta(**{_UNITS[match[2]]: float(match[1])})
        return (now or datetime.now(UTC)) - amount
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since: expected e.g. 10m, 2h, 1d or an ISO time, got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Filter:
    """What to keep; an empty set keeps everything. Names compare case-insensitively."""

    since: datetime | None = None
    kinds: frozenset[str] = field(default_factory=frozenset)
    types: frozenset[str] = field(default_factory=frozenset)
    services: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(
        cls,
        since: datetime | None = None,
        kinds: Iterable[str] = (),
        types: Iterable[str] = (),
        services: Iterable[str] = (),
    ) -> Filter:
        def low(values: Iterable[str]) -> frozenset[str]:
            return frozenset(v.lower() for v in values)

        return cls(since, low(kinds), low(types), low(services))

    def keeps(self, rec: Record) -> bool:
        return (
            (self.since is None or rec.time >= self.since)
            and _matches(self.kinds, kind_of(rec))
            and _matches(self.types, rec.type)
            and _matches(self.services, service_of(rec))
        )


def _matches(wanted: frozenset[str], value: str | None) -> bool:
    return not wanted or (value is not None and value.lower() in wanted)


def service_of(rec: Record) -> str | None:
    """The producing service: a message's ``source`` without its replica."""
    if rec.message is None:
        return None
    return rec.message.source.split("/", 1)[0]


def kind_of(rec: Record) -> str | None:
    """The object's kind: its ``ref`` when the message has one, else the subject's kind token."""
    ref = getattr(rec.message, "ref", None)
    if ref is not None:
        return str(ref.kind)
    if isinstance(rec.message, MessageDeadLettered):
        return _kind_token(rec.message.original_subject)
    return _kind_token(rec.subject)


def _kind_token(subject: str) -> str | None:
    """The kind token where the layout has one; prerequisites and nudges are about Clusters."""
    tokens = subject.split(".")
    section = tokens[1] if len(tokens) > 3 else ""
    if section == "evt":
        return tokens[2]
    if section in ("status", "journal"):
        return tokens[3]
    if section == "lifecycle" and tokens[2] in ("prep", "reconcile"):
        return subjects.AZIMUTH_CLUSTER
    return None


def merged(batches: Iterable[Sequence[Record]], keep: Filter = Filter()) -> list[Record]:
    """Every stream's records as one story in time order, filtered."""
    every = [r for batch in batches for r in batch if keep.keeps(r)]
    return sorted(every, key=lambda r: (r.time, r.stored, r.stream, r.sequence))


# --- the causation tree ---------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    depth: int
    record: Record
    target: bool = False


def causation_tree(records: Sequence[Record], message_id: str) -> list[Line]:
    """The found message's ancestors (oldest first), itself, then what it caused, depth-first.

    Empty when no record answers to ``message_id``. Cycles (which a correct producer never
    makes) are cut: each record appears once.
    """
    by_id = {i: r for r in records for i in r.ids}
    target = by_id.get(message_id)
    if target is None:
        return []
    ancestors = _ancestors(target, by_id)
    lines = [Line(depth, rec) for depth, rec in enumerate(ancestors)]
    lines.append(Line(len(ancestors), target, target=True))
    seen = {id(r) for r in [*ancestors, target]}
    lines += _descendants(target, _children(records), len(ancestors) + 1, seen)
    return lines


def _ancestors(rec: Record, by_id: dict[str, Record]) -> list[Record]:
    chain: list[Record] = []
    seen = {id(rec)}
    cause = rec.message.causation_id if rec.message else None
    while cause and cause in by_id and id(by_id[cause]) not in seen:
        parent = by_id[cause]
        chain.append(parent)
        seen.add(id(parent))
        cause = parent.message.causation_id if parent.message else None
    return chain[::-1]


def _children(records: Sequence[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for rec in records:
        if rec.message is not None and rec.message.causation_id:
            out.setdefault(rec.message.causation_id, []).append(rec)
    for kids in out.values():
        kids.sort(key=lambda r: (r.time, r.stream, r.sequence))
    return out


def _descendants(
    rec: Record, children: dict[str, list[Record]], depth: int, seen: set[int]
) -> list[Line]:
    lines: list[Line] = []
    kids = [k for i in sorted(rec.ids) for k in children.get(i, [])]
    for kid in sorted(kids, key=lambda r: (r.time, r.stream, r.sequence)):
        if id(kid) in seen:
            continue
        seen.add(id(kid))
        lines.append(Line(depth, kid))
        lines += _descendants(kid, children, depth + 1, seen)
    return lines
