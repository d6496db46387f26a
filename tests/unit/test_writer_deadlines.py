"""Deadline timers: a nudge at the timeout, none for settled phases, one per deadline and
round, and the writer consuming them."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from services.writer.deadlines import GRACE_SECONDS, DeadlineTimers
from services.writer.handlers import Deps, write_status
from services.writer.logic import StatusCache
from services.writer.rules import Rules, azimuth_cluster
from shared.consumer import Batch
from shared.messages import ObjectRef, PatchStatus
from shared.resources import CLUSTER
from shared.status import StatusReporter
from shared.timers import Timers
from tests.fakes import FakeBus, FakeKube

REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="t", name="c", uid="u1"
)


class Armed:
    """Deadline timers with the Cluster rule of one timeout."""

    def __init__(self, bus: FakeBus, timeout: float, grace: float = GRACE_SECONDS) -> None:
        self.bus = bus
        self.rule = azimuth_cluster(timeout)
        self.timers = Timers(bus)
        reporter = StatusReporter(bus, partitions=4, source="writer/w")
        self.deadlines = DeadlineTimers(timers=self.timers, reporter=reporter, grace_seconds=grace)

    def arm(self, status: dict[str, Any], after: str | None = None) -> None:
        self.deadlines.arm(REF, status, self.rule, after=after)

    def nudge_id(self, status: dict[str, Any], after: str | None = None) -> str:
        """The id of the nudge ``arm`` schedules (the timer is then cancelled)."""
        self.arm(status, after)
        ((_, armed),) = self.deadlines.pending().values()
        self.timers.cancel_all()
        return armed


def stamp(seconds_ago: float) -> str:
    moment = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_waiting_cluster_is_nudged_at_its_deadline() -> None:
    bus = FakeBus()
    armed = Armed(bus, timeout=60)
    armed.arm({"phase": "Reconciling", "lastUpdated": stamp(59)})
    await asyncio.sleep(0.3)
    assert bus.published == []  # not before: the stamp has one-second precision, and a grace second
    await asyncio.sleep(2.0)
    ((subject, nudge),) = bus.published
    assert isinstance(nudge, PatchStatus)
    assert nudge.patch == {}
    assert subject.startswith("capibus.status.patch.cluster.")
    assert subject.endswith(".t.c")


async def test_settled_phases_and_rearming_cancel_the_timer() -> None:
    bus = FakeBus()
    armed = Armed(bus, timeout=0.1)
    armed.arm({"phase": "Reconciling", "lastUpdated": stamp(0)})
    armed.arm({"phase": "Ready"})
    await asyncio.sleep(1.2)
    assert bus.published == []


def patch(status: dict[str, Any], **fields: Any) -> PatchStatus:
    return PatchStatus(source="t", correlation_id="cluster:t/c", ref=REF, patch=status, **fields)


async def test_replicas_share_a_nudge_and_a_second_round_gets_its_own() -> None:
    stuck = {"phase": "Reconciling", "lastUpdated": stamp(0)}
    one, other = Armed(FakeBus(), timeout=60), Armed(FakeBus(), timeout=60)
    first = one.nudge_id(stuck)
    assert other.nudge_id(stuck) == first
    again = one.nudge_id(stuck, after=first)
    assert again != first
    assert other.nudge_id(stuck, after=first) == again
    late = one.nudge_id({"phase": "Reconciling", "lastUpdated": stamp(120)})
    assert late not in (first, again)


async def test_a_timer_for_the_same_deadline_is_kept() -> None:
    armed = Armed(FakeBus(), timeout=60)
    stuck = {"phase": "Reconciling", "lastUpdated": stamp(0)}
    armed.arm(stuck)
    before = armed.deadlines.pending()
    armed.arm({**stuck, "nodes": {"a": {}}})
    assert armed.deadlines.pending() == before
    armed.arm(stuck, after="early")
    assert armed.deadlines.pending() != before
    armed.timers.cancel_all()


async def test_an_early_nudge_is_followed_by_one_that_turns_the_cluster_unhealthy() -> None:
    """Another replica's clock ran ahead: its nudge arrived before the owner's deadline."""
    bus = FakeBus()
    armed = Armed(bus, timeout=2, grace=0.1)
    kube = FakeKube()
    stored = kube.put(CLUSTER, {"metadata": {"name": "c", "namespace": "t", "uid": "u1"}})
    assert stored["metadata"]["uid"] == REF.uid
    journal = FakeBus()
    deps = Deps(
        kube=kube,
        journal=journal,
        cache=StatusCache(10),
        rules=Rules(armed.rule),
        writer="w1",
        deadlines=armed.deadlines,
    )

    async def write(message: PatchStatus) -> None:
        await write_status(Batch(key="t/c", partition=0, messages=(message,), lease_token=1), deps)

    def status() -> dict[str, Any]:
        return dict(kube.objects[("cluster", "t", "c")]["status"])

    await write(patch({"networkingPhase": "Pending"}))
    assert status()["phase"] == "Reconciling"
    # The other replica armed the same deadline, so its nudge has the id of the owner's timer.
    early = patch({}, id=Armed(FakeBus(), timeout=2).nudge_id(status()))
    await write(early)
    assert journal.published[-1][1].skipped  # type: ignore[attr-defined]
    for _ in range(40):
        if bus.published:
            break
        await asyncio.sleep(0.1)
    ((_, nudge),) = bus.published
    assert isinstance(nudge, PatchStatus)
    assert nudge.id != early.id
    assert nudge.causation_id == early.id
    await write(nudge)
    assert status()["phase"] == "Unhealthy"
    assert armed.deadlines.pending() == {}


def ref(i: int) -> ObjectRef:
    return REF.model_copy(update={"name": f"c{i}", "uid": f"u{i}"})


async def test_deadlines_of_lost_partitions_and_fired_timers_are_forgotten() -> None:
    """10,000 Clusters armed: losing their partitions, or their timers firing with nothing
    arming them again, leaves no deadline behind."""
    bus = FakeBus()
    armed = Armed(bus, timeout=3600)
    waiting = {"phase": "Reconciling", "lastUpdated": stamp(0)}
    for i in range(10_000):
        armed.deadlines.arm(ref(i), waiting, armed.rule)
    assert len(armed.deadlines) == 10_000
    armed.deadlines.drop(range(4))
    assert len(armed.deadlines) == 0
    assert armed.timers.pending() == {}
    late = Armed(bus, timeout=1, grace=0.0)
    for i in range(1_000):
        late.deadlines.arm(ref(i), {"phase": "Reconciling", "lastUpdated": stamp(60)}, late.rule)
    await asyncio.sleep(0.2)
    assert len(bus.published) == 1_000
    assert late.timers.pending() == {}
    late.deadlines.drop(())
    assert len(late.deadlines) == 0


async def test_a_gone_cluster_keeps_no_deadline() -> None:
    armed = Armed(FakeBus(), timeout=3600)
    deps = Deps(
        kube=FakeKube(),
        journal=FakeBus(),
        cache=StatusCache(10),
        rules=Rules(armed.rule),
        writer="w1",
        deadlines=armed.deadlines,
    )
    armed.arm({"phase": "Reconciling", "lastUpdated": stamp(0)})
    assert len(armed.deadlines) == 1
    await write_status(Batch(key="t/c", partition=0, messages=(patch({}),), lease_token=1), deps)
    assert len(armed.deadlines) == 0
    assert armed.timers.pending() == {}
