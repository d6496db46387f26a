"""Deadline timers: a nudge at the timeout, none for settled phases, one per deadline and
round, and the writer consuming them."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from services.writer.deadlines import GRACE_SECONDS, DeadlineTimers
from services.writer.handlers import write_status
from services.writer.logic import StatusCache
from shared import phase
from shared.consumer import Batch
from shared.messages import Message, ObjectRef, PatchStatus
from shared.phase import parse_time
from tests.unit.test_writer_handlers import FakeApi, FakeJournal

REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="t", name="c", uid="u1"
)


def timers(
    sent: list[tuple[str, Message]], timeout: float, grace: float = GRACE_SECONDS
) -> DeadlineTimers:
    async def publish(subject: str, message: Message) -> Any:
        sent.append((subject, message))

    return DeadlineTimers(
        publish=publish, timeout_seconds=timeout, partitions=4, source="w", grace_seconds=grace
    )


def stamp(seconds_ago: float) -> str:
    moment = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_waiting_cluster_is_nudged_at_its_deadline() -> None:
    sent: list[tuple[str, Message]] = []
    deadlines = timers(sent, timeout=60)
    deadlines.arm(REF, {"phase": "Reconciling", "lastUpdated": stamp(59)})
    await asyncio.sleep(0.3)
    assert sent == []  # not before: the stamp has one-second precision, and a grace second
    await asyncio.sleep(2.0)
    ((subject, nudge),) = sent
    assert isinstance(nudge, PatchStatus)
    assert nudge.patch == {}
    assert subject.startswith("capibus.status.patch.cluster.")
    assert subject.endswith(".t.c")


async def test_settled_phases_and_rearming_cancel_the_timer() -> None:
    sent: list[tuple[str, Message]] = []
    deadlines = timers(sent, timeout=0.1)
    deadlines.arm(REF, {"phase": "Reconciling", "lastUpdated": stamp(0)})
    deadlines.arm(REF, {"phase": "Ready"})
    await asyncio.sleep(1.2)
    assert sent == []


def patch(status: dict[str, Any], **fields: Any) -> PatchStatus:
    return PatchStatus(source="t", correlation_id="cluster:t/c", ref=REF, patch=status, **fields)


def nudge_id(deadlines: DeadlineTimers, status: dict[str, Any], after: str | None = None) -> str:
    """The id of the nudge ``arm`` schedules (the timer is then cancelled)."""
    deadlines.arm(REF, status, after=after)
    ((_, armed),) = deadlines.pending().values()
    deadlines.cancel_all()
    return armed


async def test_replicas_share_a_nudge_and_a_second_round_gets_its_own() -> None:
    stuck = {"phase": "Reconciling", "lastUpdated": stamp(0)}
    one, other = timers([], timeout=60), timers([], timeout=60)
    first = nudge_id(one, stuck)
    assert nudge_id(other, stuck) == first
    again = nudge_id(one, stuck, after=first)
    assert again != first
    assert nudge_id(other, stuck, after=first) == again
    late = nudge_id(one, {"phase": "Reconciling", "lastUpdated": stamp(120)})
    assert late not in (first, again)


async def test_a_timer_for_the_same_deadline_is_kept() -> None:
    deadlines = timers([], timeout=60)
    stuck = {"phase": "Reconciling", "lastUpdated": stamp(0)}
    deadlines.arm(REF, stuck)
    armed = deadlines.pending()
    deadlines.arm(REF, {**stuck, "nodes": {"a": {}}})
    assert deadlines.pending() == armed
    deadlines.arm(REF, stuck, after="early")
    assert deadlines.pending() != armed
    deadlines.cancel_all()


async def test_arm_existing_arms_each_cluster_that_can_time_out() -> None:
    deadlines = timers([], timeout=60)
    started = stamp(10)

    def listed(name: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"namespace": "t", "name": name, "uid": name}, "status": status}

    deadlines.arm_existing(
        [
            listed("stuck", {"phase": "Upgrading", "lastUpdated": started}),
            listed("fine", {"phase": "Ready"}),
            listed("new", {}),
        ]
    )
    assert {k: at for k, (at, _) in deadlines.pending().items()} == {
        "t/stuck": parse_time(started) + timedelta(seconds=60)
    }
    deadlines.cancel_all()
    assert deadlines.pending() == {}


async def test_an_early_nudge_is_followed_by_one_that_turns_the_cluster_unhealthy() -> None:
    """Another replica's clock ran ahead: its nudge arrived before the owner's deadline."""
    sent: list[tuple[str, Message]] = []
    deadlines = timers(sent, timeout=2, grace=0.1)
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)

    def derive(
        status: dict[str, Any], lease: str | None, deleting: bool, now: datetime
    ) -> dict[str, Any]:
        return phase.derive(status, lease_name=lease, now=now, timeout_seconds=2, deleting=deleting)

    async def write(message: PatchStatus) -> None:
        await write_status(
            batch=Batch(key="t/c", partition=0, messages=(message,), lease_token=1),
            kube=api,
            journal=journal,
            cache=cache,
            writer="w1",
            derive=derive,
            deadlines=deadlines,
        )

    await write(patch({"networkingPhase": "Pending"}))
    assert api.status["phase"] == "Reconciling"
    # The other replica armed the same deadline, so its nudge has the id of the owner's timer.
    early = patch({}, id=nudge_id(timers([], timeout=2), api.status))
    await write(early)
    assert journal.entries[-1].skipped
    for _ in range(40):
        if sent:
            break
        await asyncio.sleep(0.1)
    ((_, nudge),) = sent
    assert isinstance(nudge, PatchStatus)
    assert nudge.id != early.id
    assert nudge.causation_id == early.id
    await write(nudge)
    assert api.status["phase"] == "Unhealthy"
    assert deadlines.pending() == {}
