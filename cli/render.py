"""How ``capibus`` shows records: aligned tables for people, JSON lines for scripts.

Colour is decided once per run (``Style``): on only when stdout is a terminal and
``NO_COLOR`` is unset (https://no-color.org), or when asked with ``--color always``; piped
output is plain text, so ``grep`` and ``awk`` see no escape codes. JSON lines carry the whole
decoded message plus where it is stored, so a script never has to parse the table.
Each message type shows the few fields that tell its part of the story (``summary``); the
rest is one ``--json`` away.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from cli.story import Line, Record, service_of
from shared import messages as m

_CODES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_TYPE_COLOUR = {
    "ResourceChanged": "cyan",
    "PatchStatus": "green",
    "PatchMetadata": "green",
    "StatusWritten": "dim",
    "MessageDeadLettered": "red",
    "PrerequisiteChanged": "yellow",
}
_WIDTH = 60


@dataclass(frozen=True)
class Style:
    colour: bool

    @classmethod
    def for_stream(cls, out: TextIO, choice: str = "auto") -> Style:
        if choice != "auto":
            return cls(choice == "always")
        tty = hasattr(out, "isatty") and out.isatty()
        return cls(tty and not os.environ.get("NO_COLOR"))

    def paint(self, text: str, colour: str | None) -> str:
        if not self.colour or colour is None:
            return text
        return f"\033[{_CODES[colour]}m{text}\033[0m"


def table(rows: Sequence[Sequence[str]], header: Sequence[str], style: Style) -> list[str]:
    """Columns padded to their widest cell; the last column is never padded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells, widths, strict=False)]
        return "  ".join([*padded, cells[-1]]).rstrip()

    return [style.paint(line(header), "bold"), *(line(r) for r in rows)]


def clock(rec: Record) -> str:
    return rec.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def short_subject(subject: str) -> str:
    """The subject without ``capibus.`` and the object's own tokens, which every row shares."""
    tokens = subject.split(".")
    if tokens[:2] == ["capibus", "dlq"]:
        return f"dlq.{tokens[2]}:{short_subject('.'.join(tokens[3:]))}"
    return ".".join(tokens[1:-2]) if len(tokens) > 3 else subject


def event_rows(records: Sequence[Record]) -> list[list[str]]:
    return [
        [
            clock(r),
            r.stream.removeprefix("CAPIBUS_").lower(),
            r.type,
            service_of(r) or "?",
            short_subject(r.subject),
            summary(r),
        ]
        for r in records
    ]


EVENT_HEADER = ("TIME", "STREAM", "TYPE", "SOURCE", "SUBJECT", "DETAILS")


def event_lines(records: Sequence[Record], style: Style, header: bool = True) -> list[str]:
    lines = table(event_rows(records), EVENT_HEADER, style)
    coloured = [
        style.paint(line, _TYPE_COLOUR.get(rec.type))
        for line, rec in zip(lines[1:], records, strict=True)
    ]
    return [lines[0], *coloured] if header else coloured


def json_line(rec: Record) -> str:
    """One record as one line of JSON: where it is stored, then the message itself."""
    out: dict[str, Any] = {
        "stream": rec.stream,
        "sequence": rec.sequence,
        "subject": rec.subject,
        "stored": rec.stored.isoformat(),
        "msg_id": rec.msg_id,
        "trace_id": rec.trace_id,
    }
    if rec.message is not None:
        out["message"] = rec.message.model_dump(mode="json")
    else:
        out["problem"] = rec.problem
        out["body"] = rec.body.decode("utf-8", errors="replace")
    return json.dumps(out, separators=(",", ":"))


def summary(rec: Record) -> str:
    """The fields that tell this message's part of the story, on one short line."""
    msg = rec.message
    if msg is None:
        return _cut(f"undecodable: {rec.problem}")
    for model, describe in _SUMMARIES:
        if isinstance(msg, model):
            return _cut(describe(msg))
    return ""


def _cut(text: str, width: int = _WIDTH * 2) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _conditions(msg: m.PatchStatus) -> str:
    conds = [f"{c.type}={c.status}({c.reason})" for c in msg.conditions]
    keys = [f"{k}={json.dumps(v)}" for k, v in msg.patch.items()]
    return " ".join([*conds, *keys]) or "(empty)"


def _metadata(msg: m.PatchMetadata) -> str:
    parts = [f"+{f}" for f in msg.add_finalizers] + [f"-{f}" for f in msg.remove_finalizers]
    parts += [f"label {k}={v}" for k, v in msg.labels.items()]
    parts += [f"annotation {k}={v}" for k, v in msg.annotations.items()]
    return " ".join(parts)


def _changed(msg: m.ResourceChanged) -> str:
    trimmed = f" trimmed {','.join(msg.trimmed.fields)}" if msg.trimmed else ""
    return f"{msg.event} {msg.ref.kind} rv={msg.resource_version}{trimmed}"


def _prerequisite(msg: m.PrerequisiteChanged) -> str:
    state = "released" if msg.released else ("ready" if msg.ready else "not ready")
    return f"{msg.step} {state} gen={msg.generation} {msg.reason} {msg.detail}"


def _written(msg: m.StatusWritten) -> str:
    verb = "skipped" if msg.skipped else "wrote"
    return f"{verb} {len(msg.update_ids)} updates rv={msg.resource_version} by {msg.writer}"


def _dead(msg: m.MessageDeadLettered) -> str:
    return f"{msg.reason} after {msg.deliveries} deliveries: {msg.error}"


_SUMMARIES: list[tuple[type[Any], Any]] = [
    (m.ResourceChanged, _changed),
    (m.PatchStatus, _conditions),
    (m.PatchMetadata, _metadata),
    (m.PrerequisiteChanged, _prerequisite),
    (m.StatusWritten, _written),
    (m.MessageDeadLettered, _dead),
    (m.ReconcileCluster, lambda msg: msg.reason),
    (m.RecheckObject, lambda msg: f"{msg.reason} attempt {msg.attempt}"),
    (m.SyncAppTemplate, lambda msg: f"{msg.reason} due {msg.due.isoformat()}"),
    (m.ResourcesListed, lambda msg: f"{msg.count} {msg.kind} at rv={msg.resource_version}"),
    (m.MetadataChanged, lambda msg: " ".join(sorted(msg.command))),
]


def tree_lines(lines: Sequence[Line], style: Style) -> list[str]:
    """One line per message, indented by depth; the message asked about is marked ``*``."""
    out = []
    for line in lines:
        rec = line.record
        mark = "* " if line.target else "  "
        head = f"{'  ' * line.depth}{mark}{rec.type} {_id(rec)}"
        text = f"{head}  {clock(rec)}  {service_of(rec) or '?'}  {rec.subject}  {summary(rec)}"
        out.append(style.paint(text, "bold" if line.target else _TYPE_COLOUR.get(rec.type)))
    out += _traces(lines)
    return out


def _traces(lines: Sequence[Line]) -> list[str]:
    """Which traces the tree's messages belong to, for finding their spans in a tracing
    backend: one trace for a tree that one change started, more where a timer, a nudge or
    an external publisher began another."""
    found = list(dict.fromkeys(line.record.trace_id for line in lines if line.record.trace_id))
    if not found:
        return []
    return [f"trace{'s' if len(found) > 1 else ''}: {', '.join(found)}"]


def _id(rec: Record) -> str:
    return rec.message.id if rec.message is not None else (rec.msg_id or "?")
