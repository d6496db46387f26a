"""``shared.freshness``: which event of an object is newer, and what a consumer applied.

The property tests play a consumer that keeps state from payloads the way the module
docstring says one should (skip stale events, read an unseen object's MODIFIED back, apply
DELETED), over any order and duplication of one object's history, and across hand-overs
that empty its memory: it always ends at the object's last state.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.freshness import Stamp, Verdict, Versions, newest, older, stamp, version_number
from shared.messages import EventType, ObjectRef, ResourceChanged


def event(
    version: str, *, uid: str = "u1", kind: EventType = "MODIFIED", inner: str | None = None
) -> ResourceChanged:
    meta = {"name": "m", "namespace": "ns", "uid": uid, "resourceVersion": inner or version}
    return ResourceChanged(
        source="watcher/test",
        correlation_id="cluster:ns/demo",
        event=kind,
        ref=ObjectRef(
            api_version="cluster.x-k8s.io/v1beta1",
            kind="Machine",
            namespace="ns",
            name="m",
            uid=uid,
        ),
        resource_version=version,
        object={"metadata": meta},
    )


@pytest.mark.parametrize(
    ("raw", "number"),
    [("42", 42), ("0", 0), (7, 7), ("", None), ("abc", None), ("-1", None), ("1.5", None)],
)
def test_a_version_is_an_integer_only_if_it_parses_as_one(raw: object, number: int | None) -> None:
    assert version_number(raw) == number


def test_older_means_an_earlier_state_of_the_same_object() -> None:
    assert older(Stamp("u1", 5, False), Stamp("u1", 9, False))
    assert not older(Stamp("u1", 9, False), Stamp("u1", 5, False))
    assert not older(Stamp("u1", 5, False), Stamp("u1", 5, False))
    # Another uid is another object; an unparsed version is never judged.
    assert not older(Stamp("u1", 5, False), Stamp("u2", 9, False))
    assert not older(Stamp("u1", None, False), Stamp("u1", 9, False))
    assert not older(Stamp("u1", 5, False), Stamp("u1", None, False))
    # Nothing follows a deletion, and a deletion is never older, whatever its version.
    assert older(Stamp("u1", 99, False), Stamp("u1", 3, True))
    assert not older(Stamp("u1", 3, True), Stamp("u1", 99, False))


def test_a_stamp_takes_the_newer_of_the_event_and_its_object() -> None:
    """A trimmed event's object was read back later than the event was made."""
    assert stamp(event("5", inner="8")) == Stamp("u1", 8, False)
    assert stamp(event("12", kind="DELETED", inner="8")) == Stamp("u1", 12, True)
    assert stamp(event("x", inner="y")).version is None


def test_newest_of_a_batch_is_by_version_not_by_stream_order() -> None:
    late, early = event("9"), event("5")
    assert newest([late, early]) is late
    assert newest([early, late]) is late
    gone = event("7", kind="DELETED")
    assert newest([early, gone, late]) is gone
    # A new incarnation of the name follows in stream order; the old one's late event
    # cannot displace it once its own newer event was in the batch.
    reborn = event("20", uid="u2", kind="ADDED")
    assert newest([late, reborn, early]) is reborn
    assert newest([]) is None


def test_versions_skip_only_what_is_older_than_what_was_applied() -> None:
    versions = Versions(size=10)
    assert versions.check(Stamp("u1", 5, False)) is Verdict.UNSEEN
    versions.note(Stamp("u1", 9, False))
    assert versions.check(Stamp("u1", 5, False)) is Verdict.STALE
    assert versions.check(Stamp("u1", 9, False)) is Verdict.FRESH  # a redelivery runs again
    assert versions.check(Stamp("u1", 10, False)) is Verdict.FRESH
    assert versions.check(Stamp("u1", None, False)) is Verdict.FRESH
    assert versions.check(Stamp("u1", 1, True)) is Verdict.FRESH
    versions.note(Stamp("u1", 7, False))  # noting an older one never moves it back
    assert versions.check(Stamp("u1", 8, False)) is Verdict.STALE


def test_a_deleted_object_leaves_only_a_bounded_tombstone() -> None:
    versions = Versions(size=10, tombstones=2)
    versions.note(Stamp("u1", 9, False))
    versions.note(Stamp("u1", 10, True))
    assert len(versions) == 0
    # Whatever version it carries: nothing of a uid follows its deletion.
    assert versions.check(Stamp("u1", 50, False)) is Verdict.STALE
    assert versions.check(Stamp("u1", 11, True)) is Verdict.FRESH
    versions.note(Stamp("u2", 3, True))
    versions.note(Stamp("u3", 4, True))
    assert versions.check(Stamp("u1", 5, False)) is Verdict.UNSEEN
    assert versions.check(Stamp("u3", 1, False)) is Verdict.STALE


def test_memory_is_bounded_and_keeps_the_most_recently_seen() -> None:
    versions = Versions(size=3)
    for n in range(10):
        versions.note(Stamp(f"u{n}", n, False))
    versions.note(Stamp("u7", 70, False))
    versions.note(Stamp("u10", 10, False))
    assert len(versions) == 3
    assert versions.check(Stamp("u7", 1, False)) is Verdict.STALE
    assert versions.check(Stamp("u8", 1, False)) is Verdict.UNSEEN
    with pytest.raises(ValueError, match="at least one"):
        Versions(size=0)


def test_events_without_a_uid_or_a_parsed_version_are_never_skipped() -> None:
    versions = Versions(size=10)
    versions.note(Stamp("", 9, False))
    assert len(versions) == 0
    assert versions.check(Stamp("", 1, False)) is Verdict.FRESH
    versions.note(Stamp("u1", None, False))
    assert versions.check(Stamp("u1", 1, False)) is Verdict.FRESH


# --- any order of one object's history ends at its last state ------------------------------


@dataclass
class World:
    """One object's history: versions 1..n of uid u1, maybe deleted at n+1."""

    last: int
    deleted: bool

    def truth(self) -> tuple[str, int] | None:
        return None if self.deleted else ("u1", self.last)


@dataclass
class Consumer:
    versions: Versions
    state: tuple[str, int] | None = None
    reads: int = 0

    def handle(self, change: ResourceChanged, world: World) -> None:
        seen = stamp(change)
        verdict = self.versions.check(seen)
        if verdict is Verdict.STALE:
            return
        if verdict is Verdict.UNSEEN and change.event == "MODIFIED":
            self.reads += 1
            truth = world.truth()
            seen = Stamp("u1", truth[1], False) if truth else Stamp("u1", None, True)
        self.state = None if seen.deleted else (seen.uid, seen.version or 0)
        self.versions.note(seen)


def history(world: World) -> list[ResourceChanged]:
    changes = [event("1", kind="ADDED")]
    changes += [event(str(v)) for v in range(2, world.last + 1)]
    if world.deleted:
        changes.append(event(str(world.last + 1), kind="DELETED"))
    return changes


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[World, list[ResourceChanged]]:
    """A history, then any interleaving of its events, each at least once."""
    world = World(last=draw(st.integers(1, 8)), deleted=draw(st.booleans()))
    events = history(world)
    extra = draw(st.lists(st.sampled_from(events), max_size=8))
    return world, list(draw(st.permutations(events + extra)))


@settings(max_examples=300, deadline=None)
@given(deliveries())
def test_any_interleaving_of_versions_ends_at_the_newest(
    case: tuple[World, list[ResourceChanged]],
) -> None:
    world, order = case
    consumer = Consumer(Versions(size=4))
    for change in order:
        consumer.handle(change, world)
    assert consumer.state == world.truth()
    assert consumer.reads <= 1


@settings(max_examples=300, deadline=None)
@given(deliveries(), st.lists(st.integers(0, 20), max_size=3))
def test_hand_overs_that_empty_the_memory_still_end_at_the_newest(
    case: tuple[World, list[ResourceChanged]], handovers: list[int]
) -> None:
    """The new owner of a partition starts with no memory. The one gap the module docstring
    names, a stale ADDED as the first event the new owner sees of the object, is left out:
    ADDED is only delivered before the first hand-over here."""
    world, order = case
    first = min(handovers, default=len(order))
    added = [c for c in order if c.event == "ADDED"]
    rest = [c for c in order if c.event != "ADDED"]
    order = rest[:first] + added + rest[first:]
    consumer = Consumer(Versions(size=4))
    for n, change in enumerate(order):
        if n in handovers and n > first:
            consumer = Consumer(Versions(size=4), state=consumer.state)
        consumer.handle(change, world)
    assert consumer.state == world.truth()


def test_the_gap_a_stale_added_first_seen_after_a_hand_over() -> None:
    world = World(last=3, deleted=False)
    consumer = Consumer(Versions(size=4))
    consumer.handle(event("3"), world)
    consumer = Consumer(Versions(size=4), state=consumer.state)
    consumer.handle(event("1", kind="ADDED"), world)
    assert consumer.state == ("u1", 1)  # until the object's next change


@settings(max_examples=200, deadline=None)
@given(st.permutations([event(str(v)) for v in range(2, 9)]))
def test_one_replica_reads_nothing_back_once_the_object_appeared(
    order: list[ResourceChanged],
) -> None:
    world = World(last=8, deleted=False)
    consumer = Consumer(Versions(size=4))
    consumer.handle(event("1", kind="ADDED"), world)
    for change in order:
        consumer.handle(change, world)
    assert consumer.state == ("u1", 8)
    assert consumer.reads == 0
