"""Pulling through a disturbance: a pull subscription whose fetch failed is replaced, and the
old one unsubscribed (left behind it would collect whatever the server still answers into it,
unread, one more per failure: a JetStream cluster electing consumer leaders fails fetches for
seconds); and for a while afterwards no poll waits longer than ``ack_wait``."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.js.errors
import pytest

from shared.consumer import Consumer, ConsumerSettings
from tests.unit.test_consumer_takeover import Leases, claimed
from tests.unit.test_consumer_takeover import consumer as takeover_consumer

pytestmark = pytest.mark.timeout(5)


class FailingPull:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def consumer_info(self) -> Any:
        raise nats.js.errors.ServiceUnavailableError

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.log.append("fetch")
        raise nats.js.errors.ServiceUnavailableError

    async def unsubscribe(self) -> None:
        self.log.append("unsubscribe")


class Bus:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.thrice = asyncio.Event()

    async def durable_pull(self, stream: str, config: Any) -> FailingPull:
        self.log.append("subscribe")
        if self.log.count("subscribe") == 3:
            self.thrice.set()
        return FailingPull(self.log)


async def test_a_failed_fetch_unsubscribes_before_subscribing_again() -> None:
    c: Consumer = takeover_consumer(Leases(), pending=0, ack_wait=1)
    bus = Bus()
    c.bus = bus  # type: ignore[assignment]
    c.settings = ConsumerSettings(ack_wait=1, fetch_timeout=0.05, backoff_base=0.01)
    runner = claimed(c, handed_over=True)
    await bus.thrice.wait()
    await runner.stop()
    assert bus.log[:6] == ["subscribe", "fetch", "unsubscribe"] * 2
    assert bus.log.count("subscribe") == bus.log.count("unsubscribe")


class QuietPull:
    """A consumer with nothing to deliver: each poll waits its whole timeout."""

    def __init__(self, timeouts: list[float], polled: asyncio.Event) -> None:
        self.timeouts = timeouts
        self.polled = polled

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.timeouts.append(timeout)
        self.polled.set()
        await asyncio.sleep(timeout)
        raise TimeoutError

    async def unsubscribe(self) -> None:
        pass


class QuietBus:
    def __init__(self) -> None:
        self.timeouts: list[float] = []
        self.polled = asyncio.Event()

    async def durable_pull(self, stream: str, config: Any) -> QuietPull:
        return QuietPull(self.timeouts, self.polled)


async def test_after_a_disturbance_polls_wait_no_longer_than_an_ack_wait() -> None:
    """An answer lost on its way is sent again only to a request asked after ``ack_wait``."""
    c: Consumer = takeover_consumer(Leases(), pending=0, ack_wait=1)
    bus = QuietBus()
    c.bus = bus  # type: ignore[assignment]
    c.settings = ConsumerSettings(ack_wait=0.1, fetch_timeout=60)
    runner = claimed(c, handed_over=True)
    await bus.polled.wait()
    bus.polled.clear()
    runner.wake()  # a new consumer leader, say
    await bus.polled.wait()
    bus.polled.clear()
    await bus.polled.wait()
    await runner.stop()
    assert bus.timeouts == [60, 0.1, 0.1]
