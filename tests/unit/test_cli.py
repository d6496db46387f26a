"""The pure parts of ``capibus``: which subjects name an object, filters, merging, the
causation tree, and how records are shown (tables, colour, JSON lines)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from datetime import UTC, datetime, timedelta

import pytest

from cli import main as main_module
from cli.dlq import DlqError, original_body
from cli.render import Style, event_lines, json_line, short_subject, summary, table, tree_lines
from cli.story import (
    Filter,
    Record,
    causation_tree,
    merged,
    object_filters,
    parse_object,
    parse_since,
    record,
)
from shared import subjects
from shared.messages import (
    Condition,
    Message,
    MessageDeadLettered,
    ObjectRef,
    PatchStatus,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
    encode,
)
from tests.fakes import matches

T0 = datetime(2026, 11, 28, 6, 0, tzinfo=UTC)
REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="ns", name="a.b"
)


def rec(
    message: Message, stream: str = "CAPIBUS_EVENTS", seq: int = 1, subject: str = ""
) -> Record:
    body = encode(message)
    return record(stream, seq, subject or message.subject, message.time, body, msg_id=message.id)


def event(at: int, **envelope: str | None) -> ResourceChanged:
    return ResourceChanged(
        source="watcher/w1",
        correlation_id="cluster:ns/a.b",
        time=T0 + timedelta(seconds=at),
        event="MODIFIED",
        ref=REF,
        resource_version=str(at),
        object={},
        **envelope,  # type: ignore[arg-type]
    )


def patch(at: int, cause: Message, source: str = "helm/h1") -> PatchStatus:
    return PatchStatus(
        source=source,
        time=T0 + timedelta(seconds=at),
        ref=REF,
        conditions=(Condition(type="Ready", status="False", reason="Waiting"),),
        **cause.caused(),
    )


# --- subjects ---------------------------------------------------------------------------------


def test_an_object_is_namespace_slash_name() -> None:
    assert parse_object("tenant-a/demo") == ("tenant-a", "demo")
    assert parse_object("/tmpl") == (None, "tmpl")
    assert parse_object("_/tmpl") == (None, "tmpl")
    with pytest.raises(ValueError, match="namespace"):
        parse_object("demo")


def test_object_filters_match_every_subject_about_the_object_and_nothing_else() -> None:
    ns, name = "ns", "a.b"
    about = {
        "CAPIBUS_EVENTS": subjects.resource_event("cluster", 3, ns, name),
        "CAPIBUS_STATUS": subjects.status_patch("cluster", 3, ns, name),
        "CAPIBUS_LIFECYCLE": subjects.prerequisite("lease", 3, ns, name),
        "CAPIBUS_JOURNAL": subjects.journal("status", "cluster", ns, name),
    }
    more = [
        ("CAPIBUS_STATUS", subjects.metadata_patch("cluster", 3, ns, name)),
        ("CAPIBUS_LIFECYCLE", subjects.reconcile(3, ns, name)),
        ("CAPIBUS_LIFECYCLE", subjects.recheck("monitor", 3, ns, name)),
        ("CAPIBUS_DEADLETTER", subjects.dead_letter("helm", about["CAPIBUS_STATUS"])),
        ("CAPIBUS_DEADLETTER", subjects.dead_letter("lease", about["CAPIBUS_LIFECYCLE"])),
    ]
    filters = object_filters(ns, name)
    for stream, subject in [*about.items(), *more]:
        assert any(matches(f, subject) for f in filters[stream]), subject
    others = [
        subjects.resource_event("cluster", 3, ns, "a"),
        subjects.resource_event("cluster", 3, "other", name),
        subjects.resource_listed("cluster"),
    ]
    for subject in others:
        assert not any(matches(f, subject) for fs in filters.values() for f in fs), subject


def test_cluster_scoped_objects_use_the_underscore_namespace() -> None:
    (only,) = object_filters(None, "tmpl")["CAPIBUS_EVENTS"]
    assert matches(only, subjects.resource_event("clustertemplate", 0, None, "tmpl"))


# --- filters and merging -----------------------------------------------------------------------


def test_since_is_a_duration_back_from_now_or_an_iso_time() -> None:
    assert parse_since("10m", now=T0) == T0 - timedelta(minutes=10)
    assert parse_since("1.5h", now=T0) == T0 - timedelta(hours=1.5)
    assert parse_since("2026-11-28T06:00:00") == T0
    assert parse_since("2026-11-28T07:00:00+01:00") == T0
    with pytest.raises(ValueError, match="--since"):
        parse_since("yesterday")


def test_the_story_is_in_envelope_time_order_across_streams() -> None:
    first = event(0)
    late = patch(5, first)
    early = patch(2, first, source="lease/l1")
    story = merged(
        [[rec(first), rec(late, "CAPIBUS_STATUS", 1)], [rec(early, "CAPIBUS_STATUS", 2)]]
    )
    assert [r.message for r in story] == [first, early, late]


def test_filters_by_time_kind_type_and_service() -> None:
    first = event(0)
    records = [rec(first), rec(patch(5, first), "CAPIBUS_STATUS")]

    def kept(keep: Filter) -> list[str]:
        return [r.type for r in merged([records], keep)]

    assert kept(Filter.of(since=T0 + timedelta(seconds=1))) == ["PatchStatus"]
    assert kept(Filter.of(types=["resourcechanged"])) == ["ResourceChanged"]
    assert kept(Filter.of(services=["helm"])) == ["PatchStatus"]
    assert kept(Filter.of(kinds=["Cluster"])) == ["ResourceChanged", "PatchStatus"]
    assert kept(Filter.of(kinds=["Machine"])) == []


def test_a_body_no_model_decodes_is_still_listed_with_its_problem() -> None:
    bad = record("CAPIBUS_EVENTS", 4, "capibus.evt.cluster.0.ns.x", T0, b"{nope", msg_id="m")
    assert (bad.message, bad.type, bad.time) == (None, "?", T0)
    assert summary(bad).startswith("undecodable: not a capibus message")
    assert json.loads(json_line(bad))["body"] == "{nope"


# --- the causation tree ---------------------------------------------------------------------


def test_the_tree_shows_ancestors_the_message_and_its_descendants() -> None:
    root = event(0)
    middle = patch(1, root)
    child = ReconcileCluster(source="lease/l", ref=REF, reason="why", **middle.caused())
    sibling = patch(2, root, source="lease/l")
    unrelated = event(3)
    records = [rec(m) for m in (unrelated, child, sibling, middle, root)]

    lines = causation_tree(records, middle.id)
    assert [(ln.depth, ln.record.message, ln.target) for ln in lines] == [
        (0, root, False),
        (1, middle, True),
        (2, child, False),
    ]
    assert [ln.record.message for ln in causation_tree(records, root.id)] == [
        root,
        middle,
        child,
        sibling,
    ]
    assert causation_tree(records, "nope") == []


def test_a_dead_letter_hangs_under_the_original_by_its_header_id() -> None:
    original = event(0)
    stored = record("CAPIBUS_EVENTS", 1, "s", T0, encode(original), msg_id="header-id")
    entry = letter(encode(original), causation_id="header-id")
    lines = causation_tree([stored, rec(entry, "CAPIBUS_DEADLETTER")], entry.id)
    assert [ln.depth for ln in lines] == [0, 1]


def test_a_causation_cycle_is_cut() -> None:
    a = event(0, id="a", causation_id="b")
    b = event(1, id="b", causation_id="a")
    assert len(causation_tree([rec(a), rec(b)], "a")) == 2


# --- rendering ----------------------------------------------------------------------------------


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert Style.for_stream(Tty()).colour
    assert not Style.for_stream(io.StringIO()).colour
    assert Style.for_stream(io.StringIO(), "always").colour
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Style.for_stream(Tty()).colour
    assert Style(True).paint("x", "red") == "\033[31mx\033[0m"
    assert Style(False).paint("x", "red") == "x"


def test_tables_align_columns_and_leave_the_last_unpadded() -> None:
    lines = table([["1", "long value", "end"], ["22", "v", "e"]], ["A", "B", "C"], Style(False))
    assert lines == ["A   B           C", "1   long value  end", "22  v           e"]


def test_event_lines_name_stream_type_source_and_what_it_says() -> None:
    first = event(0)
    subject = subjects.status_patch("cluster", 3, "ns", "a.b")
    (header, line) = event_lines(
        [rec(patch(1, first), "CAPIBUS_STATUS", subject=subject)], Style(False)
    )
    assert header.split() == ["TIME", "STREAM", "TYPE", "SOURCE", "SUBJECT", "DETAILS"]
    assert line.split()[2:] == [
        "status",
        "PatchStatus",
        "helm",
        "status.patch.cluster.3",
        "Ready=False(Waiting)",
    ]


def test_short_subjects_drop_the_prefix_and_the_object() -> None:
    assert short_subject("capibus.evt.cluster.3.ns.demo") == "evt.cluster.3"
    assert short_subject("capibus.dlq.helm.capibus.lifecycle.prep.lease.3.ns.demo") == (
        "dlq.helm:lifecycle.prep.lease.3"
    )


def test_summaries_say_what_each_type_is_about() -> None:
    prep = PrerequisiteChanged(
        source="lease/l",
        correlation_id="c",
        ref=REF,
        step="lease",
        generation=2,
        ready=True,
        reason="Active",
    )
    assert summary(rec(prep)) == "lease ready gen=2 Active"
    assert summary(rec(event(4))) == "MODIFIED Cluster rv=4"


def test_tree_lines_indent_by_depth_and_mark_the_message() -> None:
    root = event(0)
    child = patch(1, root)
    lines = tree_lines(causation_tree([rec(root), rec(child)], child.id), Style(False))
    assert lines[0].startswith(f"  ResourceChanged {root.id}")
    assert lines[1].startswith(f"  * PatchStatus {child.id}")
    assert len(lines) == 2  # no trace line: these carry no traceparent


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-00f067aa0ba902b7-01", TRACE),
        ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),
        ("not a traceparent", None),
        (None, None),
    ],
)
def test_a_record_knows_its_trace_from_the_traceparent(
    header: str | None, expected: str | None
) -> None:
    message = event(0)
    headers = {"traceparent": header} if header is not None else {}
    found = record("S", 1, "s", T0, encode(message), msg_id=None, headers=headers)
    assert found.trace_id == expected
    assert json.loads(json_line(found))["trace_id"] == expected


def test_the_tree_names_the_traces_of_its_messages() -> None:
    root, headers = event(0), {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
    child = patch(1, root)
    traced = record("S", 1, "s", T0, encode(root), msg_id=root.id, headers=headers)
    lines = tree_lines(causation_tree([traced, rec(child)], child.id), Style(False))
    assert lines[-1] == f"trace: {TRACE}"


# --- dead letters -------------------------------------------------------------------------------


def letter(payload: bytes, **fields: object) -> MessageDeadLettered:
    return MessageDeadLettered(
        source="helm",
        correlation_id="deadletter:s",
        service="helm",
        original_subject="s",
        original_id="o",
        error="x",
        reason="PermanentError",
        deliveries=1,
        payload=payload.decode("utf-8", errors="replace"),
        payload_size=len(payload),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        **fields,  # type: ignore[arg-type]
    )


async def test_a_whole_entry_is_retried_from_itself_and_a_part_is_never_guessed() -> None:
    assert await original_body(None, letter(b'{"a": 1}')) == b'{"a": 1}'  # type: ignore[arg-type]
    with pytest.raises(DlqError, match="names no stream"):
        await original_body(None, letter(b"\xff\xfe"))  # type: ignore[arg-type]
    with pytest.raises(DlqError, match="names no stream"):
        await original_body(None, letter(b"abc", payload_truncated=True))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "passed"),
    [
        (["run", "--all"], ["--all"]),
        (["run", "--only", "writer,lease"], ["--only", "writer,lease"]),
        (["run"], []),
    ],
)
def test_run_becomes_the_services_own_entry_point(
    monkeypatch: pytest.MonkeyPatch, given: list[str], passed: list[str]
) -> None:
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv)))
    main_module.main(given)
    assert calls == [(sys.executable, [sys.executable, "-m", "services", "run", *passed])]
