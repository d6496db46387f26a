"""``capibus replay <ns>/<name> --service <svc>``: what that service would decide now, for
every stored message about the object it consumes, next to what the streams say it did.

This module reads the object's story (``cli.story.object_filters``, every stream, as
``events`` does), hands it to the replay engine, and shows the engine's report. The engine
(``services.replay``) builds the service's handlers on recorder ports, so nothing is written
to the API server and nothing is published; its module docstring says what is real and what
is recorded, and how decisions are compared.

Why ``cli`` imports a service module here, against the contract that ``cli`` reads the bus
through ``shared`` only: a replay *is* the service's own code (its ``ROUTES``, its composition
root), which only a module inside ``services`` may import. The import-linter contract in
pyproject.toml therefore makes one exception, ``cli.replay -> services.replay``, and nothing
else in ``cli`` may reach a service; the engine imports a service only when it is named.

Output: each replayed message (as in ``events``) with the subscription that consumed it, then
its decisions, one a line: ``=`` on the streams too, ``+`` decided now only, ``-`` on the
streams only, ``·`` a side effect the streams do not record (an API write, a helm command, a
timer). A last line counts them. ``--json``: one object per replayed message, then a summary
object. Exit 0 whatever the differences; 1 when nothing about the object is stored, or the
service consumes none of it, or replay does not support the service; 2 when NATS or the API
server cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from cli import streams
from cli.errors import Unreachable
from cli.render import Style, clock, json_line, short_subject, summary, table
from cli.story import Record, merged, object_filters, parse_object, parse_since
from services.replay import (
    ApiServerUnreachable,
    Decision,
    Mark,
    Report,
    StepReport,
    Stored,
    compare,
    open_session,
)
from shared.bus import Bus

_WIDTH = 160
_MARK_COLOUR = {Mark.SAME: "dim", Mark.NOW_ONLY: "green", Mark.THEN_ONLY: "red"}


class NothingToReplay(ValueError):
    """No stored message about the object, or none the service consumes (exit code 1)."""


async def command(args: argparse.Namespace, bus: Bus) -> int:
    namespace, name = parse_object(args.object)
    since = parse_since(args.since) if args.since else None
    scope = object_filters(namespace, name).items()
    found = await asyncio.gather(*(streams.read(bus, s, f, since) for s, f in scope))
    story = [r for r in merged(found) if r.message is not None]
    if not story:
        raise NothingToReplay(f"no messages about {args.object}")
    stored = [_stored(r) for r in story]
    report = await _replayed(args, bus, stored)
    if not report.steps:
        raise NothingToReplay(
            f"{args.service} consumes none of the {len(stored)} message(s) about {args.object}"
        )
    records = {(r.stream, r.sequence): r for r in story}
    _print(args, report, records)
    return 0


def _stored(rec: Record) -> Stored:
    assert rec.message is not None
    return Stored(rec.stream, rec.sequence, rec.subject, rec.message, rec.msg_id)


async def _replayed(args: argparse.Namespace, bus: Bus, stored: Sequence[Stored]) -> Report:
    try:
        session = await open_session(args.service, bus=bus, kubeconfig=args.kubeconfig)
    except ApiServerUnreachable as exc:
        raise Unreachable(f"cannot reach the API server at {exc.server}: {exc.reason}") from exc
    try:
        steps = await session.feed(stored)
    finally:
        await session.close()
    return compare(args.service, steps, stored)


# --- showing the report ------------------------------------------------------------------------


def _print(
    args: argparse.Namespace, report: Report, records: dict[tuple[str, int], Record]
) -> None:
    out = sys.stdout
    if args.json:
        for step in report.steps:
            print(_step_json(step, records), file=out)
        print(json.dumps(_totals(report), separators=(",", ":")), file=out)
        return
    style = Style.for_stream(out, args.color)
    for step in report.steps:
        for line in step_lines(step, records[(step.input.stream, step.input.sequence)], style):
            print(line, file=out)
    print(style.paint(totals_line(report), "bold"), file=out)


def step_lines(step: StepReport, rec: Record, style: Style) -> list[str]:
    """The message (as ``events`` shows it) and the subscription, then one line a decision."""
    head = (
        f"#{rec.sequence} {clock(rec)}  {rec.stream.removeprefix('CAPIBUS_').lower()}  "
        f"{rec.type}  {short_subject(rec.subject)}  {summary(rec)}  -> {step.subscription}"
    )
    if not step.decisions:
        return [style.paint(head, "cyan"), "  (nothing: the handler decided to do nothing)"]
    rows = [_row(d) for d in step.decisions]
    aligned = table(rows, ("", "", "", "", ""), Style(False))[1:]
    painted = [
        style.paint(f"  {line}", _MARK_COLOUR.get(d.mark))
        for line, d in zip(aligned, step.decisions, strict=True)
    ]
    return [style.paint(head, "cyan"), *painted]


def _row(decision: Decision) -> list[str]:
    text = _cut(decision.text)
    if decision.mark is Mark.THEN_ONLY and decision.stored is not None:
        text += f"  (on the streams: {decision.stored.stream} #{decision.stored.sequence})"
    return [str(decision.mark), decision.port, decision.verb, decision.target, text]


def _cut(text: str, width: int = _WIDTH) -> str:
    """One line of at most ``width`` characters (``--json`` has it whole)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def totals_line(report: Report) -> str:
    return (
        f"{report.service}: {len(report.steps)} message(s) replayed, "
        f"{report.decisions} decision(s), {report.differences} difference(s) from the streams "
        "(+ decided now only, - on the streams only; nothing was written or published)"
    )


def _step_json(step: StepReport, records: dict[tuple[str, int], Record]) -> str:
    rec = records[(step.input.stream, step.input.sequence)]
    doc = {
        "input": json.loads(json_line(rec)),
        "subscription": step.subscription,
        "decisions": [_decision_json(d) for d in step.decisions],
    }
    return json.dumps(doc, separators=(",", ":"))


def _decision_json(decision: Decision) -> dict[str, Any]:
    stored = decision.stored
    return {
        "mark": decision.mark.name.lower(),
        "port": decision.port,
        "verb": decision.verb,
        "target": decision.target,
        "text": decision.text,
        "stored": None
        if stored is None
        else {"stream": stored.stream, "sequence": stored.sequence},
    }


def _totals(report: Report) -> dict[str, Any]:
    return {
        "service": report.service,
        "replayed": len(report.steps),
        "decisions": report.decisions,
        "differences": report.differences,
    }
