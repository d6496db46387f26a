"""Pulling through a disturbance: a pull subscription whose fetch failed is replaced, and the
old one unsubscribed (left behind it would collect whatever the server still answers into it,
unread, one more per failure: a JetStream cluster electing consumer leaders fails fetches for
seconds); and for a while afterwards no poll waits longer than ``ack_wait``."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.js.errors
import pytest

from shared.consumer import Consumer, ConsumerSettings, _PartitionRunner
from tests.unit.test_consumer_takeover import Leases, claimed
from tests.unit.test_consumer_takeover import consumer as takeover_consumer

pytestmark = pytest.mark.timeout(5)


class Pull:
    """A consumer with nothing to deliver: each fetch fails at once, or waits its timeout."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.bus.fetched(timeout)
        if self.bus.failing:
            raise nats.js.errors.ServiceUnavailableError
        await asyncio.sleep(timeout)
        raise TimeoutError

    async def unsubscribe(self) -> None:
        self.bus.log.append("unsubscribe")


class Bus:
    def __init__(self, *, failing: bool) -> None:
        self.failing = failing
        self.log: list[str] = []
        self.timeouts: list[float] = []
        self._polled = asyncio.Event()

    async def durable_pull(self, stream: str, config: Any) -> Pull:
        self.log.append("subscribe")
        return Pull(self)

    def fetched(self, timeout: float) -> None:
        self.log.append("fetch")
        self.timeouts.append(timeout)
        self._polled.set()

    async def polls(self, count: int) -> None:
        """Until ``count`` fetches were made."""
        while len(self.timeouts) < count:
            self._polled.clear()
            await self._polled.wait()


def running(bus: Bus, settings: ConsumerSettings) -> _PartitionRunner:
    c: Consumer = takeover_consumer(Leases(), pending=0, ack_wait=1)
    c.bus = bus  # type: ignore[assignment]
    c.settings = settings
    return claimed(c, handed_over=True)


async def test_a_failed_fetch_unsubscribes_before_subscribing_again() -> None:
    bus = Bus(failing=True)
    runner = running(bus, ConsumerSettings(ack_wait=1, fetch_timeout=0.05, backoff_base=0.01))
    await bus.polls(3)
    await runner.stop()
    assert bus.log[:6] == ["subscribe", "fetch", "unsubscribe"] * 2
    assert bus.log.count("subscribe") == bus.log.count("unsubscribe")


async def test_after_a_disturbance_polls_wait_no_longer_than_an_ack_wait() -> None:
    """An answer lost on its way is sent again only to a request asked after ``ack_wait``."""
    bus = Bus(failing=False)
    runner = running(bus, ConsumerSettings(ack_wait=0.1, fetch_timeout=60))
    await bus.polls(1)
    runner.wake()  # a new consumer leader, say
    await bus.polls(3)
    await runner.stop()
    assert bus.timeouts == [60, 0.1, 0.1]
