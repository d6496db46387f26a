"""Deadline timers: a nudge at the timeout, none for settled phases, one per deadline."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from services.writer.deadlines import DeadlineTimers
from shared.messages import Message, ObjectRef, PatchClusterStatus

REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="t", name="c", uid="u1"
)


def timers(sent: list[tuple[str, Message]], timeout: float) -> DeadlineTimers:
    async def publish(subject: str, message: Message) -> Any:
        sent.append((subject, message))

    return DeadlineTimers(publish=publish, timeout_seconds=timeout, partitions=4, source="w")


def stamp(seconds_ago: float) -> str:
    moment = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_waiting_cluster_is_nudged_at_its_deadline() -> None:
    sent: list[tuple[str, Message]] = []
    deadlines = timers(sent, timeout=60)
    deadlines.arm(REF, {"phase": "Reconciling", "lastUpdated": stamp(58)})
    await asyncio.sleep(0.3)
    assert sent == []  # not before: the stamp has one-second precision
    await asyncio.sleep(2.5)
    ((subject, nudge),) = sent
    assert isinstance(nudge, PatchClusterStatus)
    assert nudge.patch == {}
    assert subject.startswith("capibus.status.cluster.")
    assert subject.endswith(".t.c")


async def test_settled_phases_and_rearming_cancel_the_timer() -> None:
    sent: list[tuple[str, Message]] = []
    deadlines = timers(sent, timeout=0.1)
    deadlines.arm(REF, {"phase": "Reconciling", "lastUpdated": stamp(0)})
    deadlines.arm(REF, {"phase": "Ready"})
    await asyncio.sleep(1.2)
    assert sent == []
