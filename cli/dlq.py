"""``capibus dlq list|show|retry|purge``: the dead letters, and putting one back after a fix.

A dead letter (``MessageDeadLettered``, written by ``shared.consumer``) keeps the first 64 KiB
of the original body, its size and SHA-256, its subject, and its stream and sequence. ``retry``
takes the original from the entry when the entry holds all of it (not truncated, and the hash
matches: the entry decodes the body as UTF-8 with replacement, so a body that was not UTF-8 is
not whole there), else from its stream by sequence while retention keeps it; a body that
matches neither hash is refused rather than republished wrong.

The copy gets a **new message id**: JetStream drops a repeated ``Nats-Msg-Id`` for the
duplicate window (10 minutes), so republishing under the original id could be swallowed
silently. The retry is recorded in the copy itself: its ``causation_id`` is the dead letter's
id (whose own ``causation_id`` is the original's), so ``capibus trace`` shows original → dead
letter → retry (with ``--purge`` the letter goes, so the copy names the original instead), and
its ``time`` is the retry's, so ``capibus events`` lists it when it happened; everything else
(source, correlation, payload) is the original's. An undecodable original (a ``BadMessage``) is
republished byte for byte with a new ``Nats-Msg-Id`` and a ``Capibus-Retry-Of`` header. The
dead letter stays unless ``--purge`` is given, so a retry that fails again leaves both entries
to compare.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cli import streams
from cli.render import Style, clock, table
from cli.story import Record
from shared import subjects, tracing
from shared.bus import Bus
from shared.errors import BadMessage
from shared.messages import MessageDeadLettered, decode_any

STREAM = subjects.DEADLETTER.name
HEADER = ("SEQ", "TIME", "SERVICE", "REASON", "SUBJECT", "ERROR")


class DlqError(Exception):
    """A dead-letter operation that cannot be done as asked (exit code 1)."""


@dataclass(frozen=True)
class Retried:
    dead_letter: int
    subject: str
    message_id: str
    sequence: int
    source: str
    purged: bool


def filter_of(service: str | None) -> str:
    return subjects.dead_letter(service or "*", ">")


async def entries(bus: Bus, service: str | None = None, subject: str | None = None) -> list[Record]:
    """The dead letters, oldest first; ``subject`` is a glob on the original subject."""
    found = await streams.read(bus, STREAM, [filter_of(service)])
    return [r for r in found if subject is None or _subject_matches(r, subject)]


def _subject_matches(rec: Record, pattern: str) -> bool:
    return isinstance(rec.message, MessageDeadLettered) and fnmatch.fnmatchcase(
        rec.message.original_subject, pattern
    )


def list_lines(records: Sequence[Record], style: Style) -> list[str]:
    rows = [_row(r) for r in records]
    return [style.paint(line, None) for line in table(rows, HEADER, style)]


def _row(rec: Record) -> list[str]:
    msg = rec.message
    if not isinstance(msg, MessageDeadLettered):
        return [str(rec.sequence), clock(rec), "?", "?", rec.subject, rec.problem or ""]
    error = msg.error.splitlines()[0] if msg.error else ""
    return [
        str(rec.sequence),
        clock(rec),
        msg.service,
        msg.reason,
        msg.original_subject,
        error[:100],
    ]


async def entry(bus: Bus, sequence: int) -> MessageDeadLettered:
    return (await _entry(bus, sequence))[1]


async def _entry(bus: Bus, sequence: int) -> tuple[Record, MessageDeadLettered]:
    rec = await streams.get(bus, STREAM, sequence)
    if rec is None:
        raise DlqError(f"no dead letter #{sequence} on {STREAM}")
    if not isinstance(rec.message, MessageDeadLettered):
        raise DlqError(f"#{sequence} on {STREAM} is not a dead letter: {rec.problem or rec.type}")
    return rec, rec.message


def show_lines(sequence: int, msg: MessageDeadLettered) -> list[str]:
    where = f"{msg.stream} #{msg.stream_sequence}" if msg.stream else "unknown"
    fields = [
        ("dead letter", f"#{sequence} ({msg.id}) at {msg.time.isoformat()}"),
        ("service", msg.service),
        ("reason", msg.reason),
        ("deliveries", str(msg.deliveries)),
        ("subject", msg.original_subject),
        ("original id", msg.original_id or "-"),
        ("original at", where),
        ("payload", _payload_note(msg)),
        ("error", msg.error),
    ]
    width = max(len(k) for k, _ in fields)
    return [f"{k.ljust(width)}  {v}" for k, v in fields] + ["", _pretty(msg.payload)]


def _payload_note(msg: MessageDeadLettered) -> str:
    cut = ", truncated: `retry` reads it from its stream" if msg.payload_truncated else ""
    return f"{msg.payload_size} bytes, sha256 {msg.payload_sha256[:12]}{cut}"


def _pretty(payload: str) -> str:
    try:
        return json.dumps(json.loads(payload), indent=2)
    except ValueError:
        return payload


async def original_body(bus: Bus, msg: MessageDeadLettered) -> bytes:
    """The whole original body: from the entry when it is whole, else from its stream."""
    kept = msg.payload.encode()
    if not msg.payload_truncated and _whole(kept, msg):
        return kept
    if msg.stream is None or msg.stream_sequence is None:
        raise DlqError("the entry keeps only part of the original and names no stream")
    rec = await streams.get(bus, msg.stream, msg.stream_sequence)
    if rec is None:
        raise DlqError(
            f"the original ({msg.stream} #{msg.stream_sequence}) is gone from its stream"
        )
    if not _whole(rec.body, msg):
        raise DlqError(f"{msg.stream} #{msg.stream_sequence} is not the dead-lettered message")
    return rec.body


def _whole(body: bytes, msg: MessageDeadLettered) -> bool:
    if not msg.payload_sha256:  # an entry from before hashes were kept: trust the size
        return len(body) == msg.payload_size
    return hashlib.sha256(body).hexdigest() == msg.payload_sha256


async def retry(bus: Bus, sequence: int, *, purge: bool) -> Retried:
    """Store the original again; it continues the original's trace (the dead letter carries
    the original's trace headers), so its second run shows beside its first."""
    rec, dead = await _entry(bus, sequence)
    body = await original_body(bus, dead)
    new_id = str(uuid.uuid4())
    try:
        original = decode_any(body)
    except BadMessage:
        headers = {"Nats-Msg-Id": new_id, "Capibus-Retry-Of": f"{STREAM}:{sequence}"}
        headers |= dict(rec.trace_headers)
        seq = await streams.publish_raw(bus, dead.original_subject, body, headers)
        source = "?"
    else:
        # A purged letter can no longer be a parent in ``trace``: the original is, instead.
        cause = (dead.original_id or original.id) if purge else dead.id
        update = {"id": new_id, "causation_id": cause, "time": datetime.now(UTC)}
        copy = original.model_copy(update=update)
        with tracing.continuing(dict(rec.trace_headers)):
            seq = (await bus.publish(dead.original_subject, copy)).sequence
        source = original.source
    purged = purge and await streams.delete(bus, STREAM, sequence)
    return Retried(sequence, dead.original_subject, new_id, seq, source, purged)


def retried_line(done: Retried) -> str:
    gone = "; dead letter purged" if done.purged else ""
    return (
        f"retried #{done.dead_letter}: {done.subject} stored again as sequence {done.sequence}, "
        f"id {done.message_id}{gone}"
    )


async def purge(
    bus: Bus, *, sequences: Sequence[int], every: bool, service: str | None
) -> list[int] | None:
    """Delete the chosen dead letters; returns the sequences deleted (None: all of a filter)."""
    if sequences:
        return [s for s in sequences if await streams.delete(bus, STREAM, s)]
    if not every and service is None:
        raise DlqError("say which: sequences, --service NAME or --all")
    await streams.purge(bus, STREAM, None if service is None else filter_of(service))
    return None
