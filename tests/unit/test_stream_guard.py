"""The publisher's guard at the stream limits (``shared.bus``): which consumers a publish waits
for, and when it may go on anyway."""

from __future__ import annotations

import pytest

from shared import subjects
from shared.bus import (
    ConsumerPosition,
    StreamFill,
    _StreamGuard,
    admitted,
    subject_matches,
    waiting_on,
)


def fill(messages: int, *, max_msgs: int = 100, first_seq: int = 1, size: int = 0) -> StreamFill:
    return StreamFill(
        stream="S",
        messages=messages,
        bytes=size,
        max_msgs=max_msgs,
        max_bytes=-1,
        first_seq=first_seq,
    )


def durable(name: str, *, pending: int, floor: int) -> ConsumerPosition:
    return ConsumerPosition(name=name, durable=True, pending=pending, ack_floor=floor)


def test_below_the_high_water_mark_nobody_is_waited_for() -> None:
    assert waiting_on(fill(89), [durable("c", pending=89, floor=0)]) == []


def test_above_it_a_consumer_that_still_needs_the_oldest_messages_is_waited_for() -> None:
    # 90 messages from sequence 1: the oldest 10% (1..9) go first.
    assert waiting_on(fill(90), [durable("c", pending=90, floor=0)]) == ["c"]
    assert waiting_on(fill(90), [durable("c", pending=1, floor=8)]) == ["c"]


def test_a_consumer_past_the_oldest_messages_is_not_waited_for() -> None:
    assert waiting_on(fill(90), [durable("c", pending=81, floor=9)]) == []


def test_a_consumer_with_nothing_pending_is_caught_up_whatever_its_floor() -> None:
    # A filtered consumer's floor stays at its last matching message.
    assert waiting_on(fill(95, first_seq=500), [durable("c", pending=0, floor=3)]) == []


def test_history_readers_never_hold_a_publisher_back() -> None:
    reader = ConsumerPosition(name="follow", durable=False, pending=95, ack_floor=0)
    assert waiting_on(fill(95), [reader]) == []


def test_a_large_batch_protects_as_many_messages_as_it_adds() -> None:
    # 20 new messages push out 1..20, past the oldest 10%.
    assert waiting_on(fill(95), [durable("c", pending=80, floor=15)], adding=20) == ["c"]
    assert waiting_on(fill(95), [durable("c", pending=75, floor=20)], adding=20) == []


def test_the_byte_limit_counts_like_the_message_limit() -> None:
    by_bytes = StreamFill("S", messages=10, bytes=950, max_msgs=-1, max_bytes=1000, first_seq=1)
    assert by_bytes.ratio == pytest.approx(0.95)
    assert waiting_on(by_bytes, [durable("c", pending=10, floor=0)]) == ["c"]
    unlimited = StreamFill("S", messages=10, bytes=950, max_msgs=-1, max_bytes=-1, first_seq=1)
    assert waiting_on(unlimited, [durable("c", pending=10, floor=0)]) == []


def test_the_consumer_waited_for_may_still_publish_what_it_needs_to_catch_up() -> None:
    waiting = ["svc-sub-p0"]
    assert not admitted(waiting, fill(95), None)
    assert not admitted(waiting, fill(95), "other-sub-p0")
    assert admitted(waiting, fill(95), "svc-sub-p0")
    # ... as long as nothing is discarded for it.
    assert admitted(waiting, fill(99), "svc-sub-p0")
    assert not admitted(waiting, fill(100), "svc-sub-p0")
    assert not admitted(waiting, fill(98), "svc-sub-p0", count=3)
    by_bytes = StreamFill("S", messages=10, bytes=990, max_msgs=-1, max_bytes=1000, first_seq=1)
    assert admitted(waiting, by_bytes, "svc-sub-p0", size=10)
    assert not admitted(waiting, by_bytes, "svc-sub-p0", size=11)
    assert admitted([], fill(100), None)


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("capibus.evt.>", "capibus.evt.cluster.3.ns.c", True),
        ("capibus.evt.>", "capibus.evt", False),
        ("capibus.*.x", "capibus.a.x", True),
        ("capibus.*.x", "capibus.a.b.x", False),
        ("capibus.status.>", "capibus.evt.cluster", False),
        ("a.b", "a.b", True),
    ],
)
def test_subjects_match_as_nats_matches_them(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


def test_a_subject_is_guarded_on_its_stream() -> None:
    guard = _StreamGuard(None, subjects.ALL_STREAMS)  # type: ignore[arg-type]
    guard.know(subjects.StreamSpec("ODD", ("odd.*.x",), "a stream of another shape"))
    assert guard.stream_of(subjects.cluster_status(3, "ns", "c")) == subjects.STATUS.name
    assert guard.stream_of("capibus.evt.cluster.1.ns.c") == subjects.EVENTS.name
    assert guard.stream_of("capibus.evt") is None
    assert guard.stream_of("capibus.evtx.a") is None
    assert guard.stream_of("odd.a.x") == "ODD"
    assert guard.stream_of("elsewhere.a") is None
