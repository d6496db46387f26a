"""A wake (reconnect, consumer leader advisory, stop) never drops messages a poll already took.

Seen in ``tests/integration/test_outage.py`` on a loaded host: the writer's poll of
``writer-status-p8`` got stream sequence 1 (num_pending 2) and was asking for the two behind
it when a leader advisory for another of its consumers woke every poll. The wake cancelled
the fetch, and with it sequences 1 and 2, delivered but never offered; the next poll got 3
(the identity service's IdentityReady True), which was written and acked; 30 s later
(``ack_wait``) JetStream delivered 1 and 2 again, and the writer wrote them over it: the
Cluster stayed at IdentityReady False/WaitingForPlatform.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from shared import subjects
from shared.consumer import Consumer, Subscription, _PartitionRunner
from shared.coordination import Lease
from shared.messages import PatchStatus

pytestmark = pytest.mark.timeout(5)


class Leases:
    ttl = 10.0


def _msg(sequence: int, pending: int) -> Any:
    meta = SimpleNamespace(num_pending=pending, sequence=SimpleNamespace(stream=sequence))
    return SimpleNamespace(metadata=meta)


class SlowServer:
    """A pull subscription holding stream sequences 1..3: the first answers at once, the
    request for the rest is answered late (a loaded host)."""

    def __init__(self) -> None:
        self.asked_rest = asyncio.Event()
        self.answer_rest = asyncio.Event()
        self.next = 1

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        if self.next > 3:
            await asyncio.sleep(timeout)
            raise TimeoutError
        if batch > 1:
            self.asked_rest.set()
            await self.answer_rest.wait()
        taken = [_msg(s, 3 - s) for s in range(self.next, min(self.next + batch, 4))]
        self.next += len(taken)
        return taken


def runner() -> _PartitionRunner:
    async def handle(batch: Any) -> None:
        pass

    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=PatchStatus,
        handle=handle,
    )
    c = Consumer(bus=None, leases=Leases(), service="writer", subscriptions=[sub])  # type: ignore[arg-type]
    lease = Lease(partition=8, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)
    r = _PartitionRunner(c, lease)
    c._partitions[8] = r
    return r


async def test_a_wake_while_the_rest_of_a_batch_is_fetched_keeps_every_message() -> None:
    r = runner()
    psub = SlowServer()
    poll = asyncio.create_task(r._long_poll(psub))
    await asyncio.wait_for(psub.asked_rest.wait(), 1)
    r.consumer._reconnected()  # a leader advisory: every poll asked again
    await asyncio.sleep(0.01)
    psub.answer_rest.set()
    taken = await asyncio.wait_for(poll, 1)
    assert [m.metadata.sequence.stream for m in taken] == [1, 2, 3]
    assert not r._wake.is_set()


async def test_a_wake_before_any_message_still_ends_the_poll_at_once() -> None:
    r = runner()
    psub = SlowServer()
    psub.next = 4  # nothing left: the server holds the request
    poll = asyncio.create_task(r._long_poll(psub))
    await asyncio.sleep(0.05)
    r.consumer._reconnected()
    assert await asyncio.wait_for(poll, 1) == []
    assert not r._wake.is_set()
