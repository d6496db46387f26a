"""A partition taken over from a vanished holder is not handed over while that holder's
in-flight messages are still out: the next owner would pull newer messages first.

Found by the fault soak (seed 101, ``--quick``): writer-a was SIGKILLed with a status patch in
flight; writer-b claimed its partitions and began waiting one ack wait for that patch; the
restarted writer-a rejoined 10 s later and writer-b handed the partitions back, so writer-a
saw a clean hand-over, pulled the two newer patches of the Cluster at once and wrote them,
and the old patch, redelivered after its ack wait, was written last: the node went back to
Pending while its Machine was Running.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from shared import subjects
from shared.consumer import Consumer, ConsumerSettings, Subscription, _PartitionRunner
from shared.coordination import Lease
from shared.messages import ResourceChanged

pytestmark = pytest.mark.timeout(5)


class Leases:
    ttl = 10.0

    def __init__(self) -> None:
        self.released: list[int] = []

    async def release(self, lease: Lease) -> None:
        self.released.append(lease.partition)


class Pull:
    """A durable consumer with ``pending`` messages delivered elsewhere and not acked."""

    def __init__(self, pending: int) -> None:
        self.pending = pending

    async def consumer_info(self) -> Any:
        return SimpleNamespace(num_ack_pending=self.pending)

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        await asyncio.sleep(timeout)
        raise TimeoutError

    async def unsubscribe(self) -> None:
        pass


class Bus:
    def __init__(self, pending: int) -> None:
        self.pending = pending

    async def durable_pull(self, stream: str, config: Any) -> Pull:
        return Pull(self.pending)


async def handle(batch: Any) -> None:
    pass


def consumer(leases: Leases, *, pending: int, ack_wait: float) -> Consumer:
    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=ResourceChanged,
        handle=handle,
    )
    return Consumer(
        bus=Bus(pending),  # type: ignore[arg-type]
        leases=leases,  # type: ignore[arg-type]
        service="svc",
        subscriptions=[sub],
        settings=ConsumerSettings(ack_wait=ack_wait, fetch_timeout=0.05),
    )


def claimed(c: Consumer, *, handed_over: bool) -> _PartitionRunner:
    lease = Lease(
        partition=3,
        token=1,
        value="m:1",
        deadline=time.monotonic() + 60,
        usable_from=0,
        handed_over=handed_over,
    )
    runner = _PartitionRunner(c, lease)
    c._partitions[3] = runner
    c._runners[(3, 1)] = runner
    runner.start()
    return runner


async def test_a_takeover_still_waiting_for_in_flight_messages_is_not_handed_over() -> None:
    leases = Leases()
    c = consumer(leases, pending=1, ack_wait=60)
    runner = claimed(c, handed_over=False)
    await asyncio.sleep(0.05)
    assert not runner.settled
    await c._drop(3)
    assert leases.released == []  # the key expires: the next owner waits for them too


async def test_a_takeover_is_handed_over_once_the_in_flight_messages_are_back() -> None:
    leases = Leases()
    c = consumer(leases, pending=1, ack_wait=0.05)
    runner = claimed(c, handed_over=False)
    await asyncio.sleep(0.2)
    assert runner.settled
    await c._drop(3)
    assert leases.released == [3]


async def test_a_takeover_with_nothing_in_flight_and_a_hand_over_are_settled_at_once() -> None:
    for handed_over, pending in ((False, 0), (True, 1)):
        leases = Leases()
        c = consumer(leases, pending=pending, ack_wait=60)
        runner = claimed(c, handed_over=handed_over)
        await asyncio.sleep(0.05)
        assert runner.settled
        await c._drop(3)
        assert leases.released == [3]
