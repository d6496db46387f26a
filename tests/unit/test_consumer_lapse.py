"""A partition whose lease lapsed locally, then was renewed, is pulled again.

The local deadline is 0.8 of the TTL while Redis keeps the key for all of it: a balancing
round late by between the two stops the pulls, yet renews the lease. Before, nothing started
the pulls again, and the partition's messages waited unseen while the replica held it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shared import subjects
from shared.consumer import Consumer, Subscription, _PartitionRunner
from shared.coordination import Lease
from shared.messages import ResourceChanged

pytestmark = pytest.mark.timeout(5)


class Leases:
    ttl = 10.0

    def __init__(self, renewed: bool) -> None:
        self.renewed = renewed

    async def renew_all(self, leases: list[Lease]) -> list[bool]:
        for lease in leases:
            if self.renewed:
                lease.deadline = time.monotonic() + self.ttl * 0.8
        return [self.renewed] * len(leases)

    async def release(self, lease: Lease) -> None:
        pass


def consumer(leases: Leases) -> Consumer:
    async def handle(batch: Any) -> None:
        pass

    sub = Subscription(
        name="changes",
        stream=subjects.EVENTS,
        filters=lambda p: [],
        model=ResourceChanged,
        handle=handle,
    )
    return Consumer(bus=None, leases=leases, service="svc", subscriptions=[sub])  # type: ignore[arg-type]


async def test_a_renewed_lapsed_lease_is_pulled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    pulls: list[bool] = []

    async def pull(
        self: _PartitionRunner, sub: Subscription[Any], *, resumed: bool = False
    ) -> None:
        pulls.append(resumed)
        if self.lease.valid():  # as the real loop: pulls until stopped while the lease holds
            await self._stop.wait()

    monkeypatch.setattr(_PartitionRunner, "_pull", pull)
    c = consumer(Leases(renewed=True))
    lapsed = Lease(partition=3, token=1, value="v", deadline=time.monotonic() - 1, usable_from=0)
    runner = _PartitionRunner(c, lapsed)
    c._partitions[3] = runner
    runner.start()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert pulls == [False]

    await c._renew_all()
    await asyncio.sleep(0)
    assert pulls == [False, True]
    assert lapsed.valid()

    await c._renew_all()  # pulling again: nothing to resume
    await asyncio.sleep(0)
    assert pulls == [False, True]
    await runner.stop()


async def test_a_lease_lost_in_redis_is_dropped_not_resumed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pulls: list[bool] = []

    async def pull(
        self: _PartitionRunner, sub: Subscription[Any], *, resumed: bool = False
    ) -> None:
        pulls.append(resumed)

    monkeypatch.setattr(_PartitionRunner, "_pull", pull)
    c = consumer(Leases(renewed=False))
    lapsed = Lease(partition=3, token=1, value="v", deadline=time.monotonic() - 1, usable_from=0)
    runner = _PartitionRunner(c, lapsed)
    c._partitions[3] = runner
    c._runners[(3, 1)] = runner
    runner.start()
    await asyncio.sleep(0)
    await c._renew_all()
    assert pulls == [False]
    assert 3 not in c.owned


class BlockingPull:
    """A pull subscription whose server holds every request until it expires."""

    def __init__(self) -> None:
        self.requests = 0

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.requests += 1
        await asyncio.sleep(timeout)
        raise TimeoutError


async def test_a_long_poll_ends_at_once_when_woken_and_on_stop() -> None:
    c = consumer(Leases(renewed=True))
    lease = Lease(partition=1, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)
    runner = _PartitionRunner(c, lease)
    psub = BlockingPull()
    poll = asyncio.create_task(runner._long_poll(psub))
    await asyncio.sleep(0.05)
    assert not poll.done()  # waiting at the server: no request after the first
    c._partitions[1] = runner
    c._reconnected()  # the server forgot the request: ask again
    assert await asyncio.wait_for(poll, 1) == []
    assert not runner._wake.is_set()  # cleared for the next poll
    poll = asyncio.create_task(runner._long_poll(psub))
    await asyncio.sleep(0.05)
    await runner.stop()
    assert await asyncio.wait_for(poll, 1) == []
    assert psub.requests == 2
