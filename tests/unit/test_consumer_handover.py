"""A partition let go while one of its handlers still runs keeps its lease until that handler
ends: renewed with the others every round, released only then.

Before, the balancing loop awaited each hand-over: a replica whose handlers ran for long
(helm installs) stopped renewing all its leases and heartbeating meanwhile, so a replica that
had just joined took every partition as if this one had died, and both acted on the same
objects (``bench/ANALYSIS.md``, w).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shared.consumer import Consumer, _ObjectQueue, _PartitionRunner
from shared.coordination import Lease
from tests.unit.test_consumer_lapse import consumer

pytestmark = pytest.mark.timeout(5)


class Leases:
    ttl = 0.3

    def __init__(self) -> None:
        self.members = ["me"]
        self.renewed: list[list[int]] = []
        self.released: list[int] = []
        self.heartbeats = 0

    async def heartbeat(self) -> list[str]:
        self.heartbeats += 1
        return self.members

    def desired(self, members: list[str]) -> set[int]:
        return {1, 2} if "me" in members else set()

    async def renew_all(self, leases: list[Lease]) -> list[bool]:
        self.renewed.append(sorted(lease.partition for lease in leases))
        for lease in leases:
            lease.deadline = time.monotonic() + self.ttl * 0.8
        return [True] * len(leases)

    async def release(self, lease: Lease) -> None:
        self.released.append(lease.partition)

    async def leave(self) -> None:
        self.members = []


def holding(c: Consumer, partition: int, busy: asyncio.Event | None = None) -> None:
    """``c`` holds ``partition``, with one handler running on it until ``busy`` is set."""
    lease = Lease(partition, 1, f"v{partition}", time.monotonic() + 10, 0)
    runner = _PartitionRunner(c, lease)
    c._partitions[partition] = runner
    if busy is not None:
        queue = _ObjectQueue(partition=partition)
        queue.task = asyncio.create_task(busy.wait())
        c._queues[("changes", f"ns.o{partition}")] = queue


async def test_a_partition_let_go_is_renewed_until_its_handlers_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_PartitionRunner, "stop", _stopped)
    leases = Leases()
    c = consumer(leases)  # type: ignore[arg-type]
    c.leases = leases  # type: ignore[assignment]
    finished = asyncio.Event()
    holding(c, 1)
    holding(c, 2, busy=finished)
    holding(c, 3)  # no longer ours after this round: handed over at once (nothing runs)

    await c._rebalance()
    assert c.owned == {1, 2}
    await asyncio.sleep(0.01)
    assert leases.released == [3]

    leases.members = ["other"]  # partitions 1 and 2 go too; 2 has a handler running
    await c._rebalance()
    await asyncio.sleep(0.01)
    assert c.owned == set()
    assert leases.released == [3, 1]
    for _ in range(3):  # rounds go on while it runs: the lease of 2 stays ours
        await c._rebalance()
    assert leases.renewed[-1] == [2]
    assert leases.heartbeats == 5

    finished.set()
    await asyncio.sleep(0.01)
    assert leases.released == [3, 1, 2]
    assert not c._handing


async def test_stopping_waits_for_running_handlers_renewing_their_leases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_PartitionRunner, "stop", _stopped)
    leases = Leases()
    c = consumer(leases)  # type: ignore[arg-type]
    c.leases = leases  # type: ignore[assignment]
    c.bus = _Bus()  # type: ignore[assignment]
    finished = asyncio.Event()
    holding(c, 1, busy=finished)
    stop = asyncio.Event()
    stop.set()
    running = asyncio.create_task(c.run(stop))
    await asyncio.sleep(0.5)  # longer than the TTL
    assert not running.done()
    assert leases.members == []  # left at once: others may ask for the partitions
    assert leases.renewed
    assert leases.renewed[-1] == [1]
    assert leases.released == []
    finished.set()
    await asyncio.wait_for(running, 1)
    assert leases.released == [1]


async def _stopped(self: _PartitionRunner) -> None:
    self._stop.set()


class _Bus:
    def add_reconnect_listener(self, listener: Any) -> Any:
        return lambda: None
