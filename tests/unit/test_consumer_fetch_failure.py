"""A pull subscription whose fetch failed is replaced, and the old one unsubscribed: left
behind it would collect whatever the server still answers into it, unread, one more per
failure (a JetStream cluster electing consumer leaders fails fetches for seconds)."""

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
