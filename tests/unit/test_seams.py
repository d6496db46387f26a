"""The seams every service stands on: the status reporter, timers, claims and routes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.__main__ import main
from shared import subjects
from shared.claims import Claim, ClaimTracker
from shared.consumer import Batch
from shared.errors import BusUnavailable, MessageTooLarge, TemporaryError
from shared.messages import (
    Condition,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    ReconcileCluster,
    ResourceChanged,
)
from shared.resources import APP_TEMPLATE, CLUSTER, LEASE
from shared.status import StatusReporter, UnknownKind
from shared.timers import Timers
from shared.wiring import Routes, events, messages, table
from tests.fakes import FakeBus, matches

CLUSTER_REF = ObjectRef(
    api_version=CLUSTER.api_version, kind="Cluster", namespace="ns", name="demo", uid="u1"
)
READY = Condition(type="Ready", status="True", reason="Done")


def reporter(bus: FakeBus) -> StatusReporter:
    return StatusReporter(bus, partitions=16, source="monitor/replica-a")


# --- StatusReporter ---------------------------------------------------------------------------


async def test_a_report_is_addressed_by_kind_partition_and_object() -> None:
    bus = FakeBus()
    await reporter(bus).report(CLUSTER_REF, patch={"phase": "Ready"}, conditions=[READY])
    ((subject, message),) = bus.published
    partition = subjects.partition_of("ns/demo", 16)
    assert subject == f"capibus.status.patch.cluster.{partition}.ns.demo"
    assert isinstance(message, PatchStatus)
    assert (message.correlation_id, message.causation_id) == ("cluster:ns/demo", None)
    assert message.conditions == (READY,)


async def test_a_redelivered_cause_reports_once_and_a_new_cause_again() -> None:
    bus = FakeBus()
    cause = ReconcileCluster(
        source="t", correlation_id="cluster:ns/demo", ref=CLUSTER_REF, reason="x"
    )
    other = ReconcileCluster(
        source="t", correlation_id="cluster:ns/demo", ref=CLUSTER_REF, reason="y"
    )
    for _ in range(2):
        await reporter(bus).report(CLUSTER_REF, patch={"a": 1}, cause=cause)
    await StatusReporter(bus, partitions=16, source="monitor/replica-b").report(
        CLUSTER_REF, patch={"a": 1}, cause=cause
    )
    assert len(bus.published) == 1
    assert bus.published[0][1].causation_id == cause.id
    await reporter(bus).report(CLUSTER_REF, patch={"a": 1}, cause=other)
    assert len(bus.published) == 2


async def test_other_kinds_have_their_own_subjects_and_stories() -> None:
    bus = FakeBus()
    ref = ObjectRef(api_version=APP_TEMPLATE.api_version, kind="AppTemplate", name="app", uid="u")
    await reporter(bus).report(ref, patch={"label": "x"})
    subject, message = bus.published[0]
    assert matches("capibus.status.patch.apptemplate.*._.app", subject)
    assert message.correlation_id == "apptemplate:/app"


async def test_a_kind_the_writer_does_not_write_is_refused() -> None:
    ref = ObjectRef(api_version=LEASE.api_version, kind="Lease", namespace="ns", name="l")
    with pytest.raises(UnknownKind):
        await reporter(FakeBus()).report(ref, patch={})


async def test_the_same_metadata_change_is_one_command() -> None:
    bus = FakeBus()
    for source in ("helm/a", "helm/b"):
        await StatusReporter(bus, partitions=16, source=source).change_metadata(
            CLUSTER_REF, add_finalizers=["f"], if_generation=2
        )
    ((subject, command),) = bus.published
    assert matches("capibus.status.meta.cluster.*.ns.demo", subject)
    assert isinstance(command, PatchMetadata)
    assert (command.add_finalizers, command.if_generation) == (("f",), 2)


async def test_a_nudge_caused_outside_a_cluster_belongs_to_the_clusters_story() -> None:
    bus = FakeBus()
    realm = ObjectRef(api_version="identity.azimuth.stackhpc.com/v1alpha1", kind="Realm", name="r")
    cause = ResourceChanged(
        source="watcher",
        correlation_id="realm:ns/r",
        event="MODIFIED",
        ref=realm,
        resource_version="3",
        object={"metadata": {"name": "r"}},
    )
    nudge = await reporter(bus).nudge(CLUSTER_REF, reason="realm changed", cause=cause)
    assert (nudge.correlation_id, nudge.causation_id) == ("cluster:ns/demo", cause.id)
    machine_event = cause.model_copy(update={"correlation_id": "cluster:ns/demo"})
    patch = await reporter(bus).report(CLUSTER_REF, patch={"a": 1}, cause=machine_event)
    assert patch.correlation_id == "cluster:ns/demo"


async def test_a_nudge_goes_to_the_objects_partition() -> None:
    bus = FakeBus()
    nudge = await reporter(bus).nudge(CLUSTER_REF, reason="template changed")
    assert matches("capibus.lifecycle.reconcile.*.ns.demo", bus.published[0][0])
    assert nudge.reason == "template changed"


# --- Timers -----------------------------------------------------------------------------------


def status_nudge(bus: FakeBus, message_id: str) -> tuple[str, PatchStatus]:
    return reporter(bus).status(CLUSTER_REF, message_id=message_id)


async def test_a_timer_publishes_at_its_moment_once() -> None:
    bus = FakeBus()
    timers = Timers(bus)
    soon = datetime.now(UTC) + timedelta(seconds=0.05)
    subject, message = status_nudge(bus, "deadline-1")
    timers.at("ns/demo", soon, subject, message, partition=3)
    timers.at("ns/demo", soon, subject, message, partition=3)  # the same: kept
    assert list(timers.pending()) == ["ns/demo"]
    await asyncio.sleep(0.15)
    assert [m.id for _, m in bus.published] == ["deadline-1"]
    assert timers.pending() == {}


async def test_a_timer_retries_its_publish_until_stored() -> None:
    bus = FakeBus()
    bus.fail(BusUnavailable("down"), BusUnavailable("still down"))
    timers = Timers(bus, retry_base=0.01)
    timers.at("k", datetime.now(UTC), *status_nudge(bus, "x"))
    await asyncio.sleep(0.2)
    assert [m.id for _, m in bus.published] == ["x"]


async def test_a_timer_gives_up_a_message_that_can_never_be_stored() -> None:
    bus = FakeBus()
    bus.fail(MessageTooLarge("too big"))
    timers = Timers(bus, retry_base=0.01)
    timers.at("k", datetime.now(UTC), *status_nudge(bus, "x"))
    await asyncio.sleep(0.1)
    assert bus.published == []


async def test_timers_follow_the_partitions_held() -> None:
    bus = FakeBus()
    timers = Timers(bus)
    later = datetime.now(UTC) + timedelta(hours=1)
    timers.at("a", later, *status_nudge(bus, "a"), partition=1)
    timers.at("b", later, *status_nudge(bus, "b"), partition=2)
    timers.drop({1})
    assert list(timers.pending()) == ["b"]
    timers.cancel_all()
    assert timers.pending() == {}


# --- claims -----------------------------------------------------------------------------------


class Follower:
    def __init__(self, *failures: BaseException, block: bool = False) -> None:
        self.failures = list(failures)
        self.block = block
        self.claimed_: list[Claim] = []
        self.lost_: list[frozenset[int]] = []
        self.reads = 0
        self.cancelled: list[int] = []

    async def claimed(self, claim: Claim) -> None:
        self.claimed_.append(claim)
        await claim.round.once("list", self._read)
        if self.failures:
            raise self.failures.pop(0)
        if self.block:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(claim.partition)
                raise

    async def _read(self) -> int:
        self.reads += 1
        return self.reads

    async def lost(self, partitions: frozenset[int]) -> None:
        self.lost_.append(partitions)


def tracker(follower: Follower) -> ClaimTracker:
    return ClaimTracker(follower, service="svc", retry_base=0.01, retry_max=0.05)


async def test_claims_of_one_round_share_their_read() -> None:
    follower = Follower()
    claims = tracker(follower)
    await claims.follow({1: 10, 2: 20})
    await asyncio.sleep(0.05)
    assert sorted(c.partition for c in follower.claimed_) == [1, 2]
    assert follower.reads == 1


async def test_a_lost_partition_is_cancelled_and_told_and_a_new_token_starts_afresh() -> None:
    follower = Follower(block=True)
    claims = tracker(follower)
    await claims.follow({1: 10, 2: 20})
    await asyncio.sleep(0.02)
    await claims.follow({2: 21})
    assert sorted(follower.cancelled) == [1, 2]
    assert follower.lost_ == [frozenset({1, 2})]
    await asyncio.sleep(0.02)
    assert [(c.partition, c.token) for c in follower.claimed_][-1] == (2, 21)
    await claims.close()
    assert follower.lost_[-1] == frozenset({2})


async def test_a_temporary_failure_of_claim_work_is_retried() -> None:
    follower = Follower(TemporaryError("api down"), TemporaryError("api down"))
    claims = tracker(follower)
    await claims.follow({1: 10})
    await asyncio.sleep(0.2)
    assert len(follower.claimed_) == 3
    await claims.close()


# --- routes -----------------------------------------------------------------------------------


class Deps:
    def __init__(self) -> None:
        self.seen: list[Any] = []


async def on_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    deps.seen.append(batch.key)


async def on_nudge(batch: Batch[ReconcileCluster], deps: Deps) -> None:
    deps.seen.append(batch.latest.reason)


ROUTES = Routes(
    "svc",
    events("objects", CLUSTER, LEASE, handle=on_event),
    messages(
        "nudges",
        ReconcileCluster,
        subjects.LIFECYCLE,
        subjects.reconciles_in_partition,
        handle=on_nudge,
        coalesce=False,
    ),
)


async def test_routes_bind_their_handlers_to_the_deps_once() -> None:
    deps = Deps()
    objects, nudges = ROUTES.bind(deps, coalesce_seconds=0.5)
    assert objects.filters(3) == ["capibus.evt.cluster.3.*.*", "capibus.evt.lease.3.*.*"]
    assert (objects.coalesce_seconds, nudges.coalesce_seconds) == (0.5, 0.0)
    nudge = ReconcileCluster(source="t", correlation_id="c", ref=CLUSTER_REF, reason="why")
    await nudges.handle(Batch(key="ns/demo", partition=3, messages=(nudge,)))
    assert deps.seen == ["why"]


def test_routes_describe_what_they_consume_for_any_partition() -> None:
    rows = table([ROUTES])
    assert [(r.stream, r.subject, r.model) for r in rows] == [
        ("CAPIBUS_EVENTS", "capibus.evt.cluster.*.*.*", "ResourceChanged"),
        ("CAPIBUS_EVENTS", "capibus.evt.lease.*.*.*", "ResourceChanged"),
        ("CAPIBUS_LIFECYCLE", "capibus.lifecycle.reconcile.*.*.*", "ReconcileCluster"),
    ]


def test_subscription_names_are_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        Routes("svc", events("a", CLUSTER, handle=on_event), events("a", LEASE, handle=on_event))


def test_nats_subject_matching() -> None:
    assert matches("capibus.status.>", "capibus.status.patch.cluster.1.ns.n")
    assert matches("capibus.evt.*.1.ns.n", "capibus.evt.cluster.1.ns.n")
    assert not matches("capibus.evt.*.1.ns.n", "capibus.evt.cluster.2.ns.n")
    assert not matches("capibus.evt.*", "capibus.evt.cluster.2")


# --- the system's map -------------------------------------------------------------------------


def test_the_map_names_every_consumer_of_every_subject(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["STREAM", "SUBJECT", "MODEL", "SERVICE", "SUBSCRIPTION"]
    rows = {tuple(line.split()[1:4]) for line in lines[1:]}
    assert ("capibus.status.patch.*.*.*.*", "PatchStatus", "writer") in rows
    assert ("capibus.evt.cluster.*.*.*", "ResourceChanged", "helm") in rows


def test_the_map_as_asyncapi(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--asyncapi"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["asyncapi"] == "3.0.0"
    addresses = {c["address"] for c in document["channels"].values()}
    assert "capibus.status.meta.*.*.*.*" in addresses
    assert "PatchStatus" in document["components"]["messages"]
    for operation in document["operations"].values():
        assert operation["action"] == "receive"
        assert operation["channel"]["$ref"].removeprefix("#/channels/") in document["channels"]
