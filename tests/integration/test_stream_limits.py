"""Nothing unconsumed is discarded at a stream's limit (``shared.bus``: the publisher's guard).

A stream of 20 messages at most, its only consumer stopped, and a publisher with 60 messages
that retries whatever is refused: the publisher is held back near the limit, and once the
consumer runs again every message is handled exactly once; only consumed history ages out.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest

from shared.bus import HIGH_WATER, Bus, Retention
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import PartitionLeases
from shared.errors import StreamFull
from shared.messages import ObjectRef, ReconcileCluster
from shared.metrics import REGISTRY
from shared.resp import Redis
from shared.subjects import StreamSpec
from tests.integration.support import eventually

pytestmark = pytest.mark.integration

LIMIT = 20
T = TypeVar("T")


class Recorder:
    """The handler: every message id it ran, in order; with ``echo``, each run also publishes
    to the stream it consumes (on a subject nobody consumes), as lifecycle handlers do."""

    def __init__(self, echo: tuple[Bus, str] | None) -> None:
        self.ids: list[str] = []
        self.echo = echo

    async def handle(self, batch: Batch[ReconcileCluster]) -> None:
        if self.echo is not None:
            bus, prefix = self.echo
            echo = ReconcileCluster(
                source="echo", correlation_id="limits", ref=batch.latest.ref, reason="echo"
            )
            await bus.publish(f"{prefix}.echo.0.ns.{batch.latest.ref.name}", echo)
        self.ids += [m.id for m in batch.messages]


class Running:
    """The stream's one durable consumer, started and stopped at will."""

    def __init__(
        self, bus: Bus, redis_client: Redis, spec: StreamSpec, prefix: str, *, echo: bool
    ) -> None:
        service = f"limits-{uuid.uuid4().hex[:6]}"
        self.recorder = Recorder((bus, prefix) if echo else None)
        subscription = Subscription(
            name="work",
            stream=spec,
            filters=lambda _partition: [f"{prefix}.work.>"],
            model=ReconcileCluster,
            handle=self.recorder.handle,
        )
        leases = PartitionLeases(redis_client, service=service, member="m", partitions=1, ttl=2)
        settings = ConsumerSettings(ack_wait=5, fetch_timeout=2, backoff_base=0.1)
        self.consumer = Consumer(
            bus=bus, leases=leases, service=service, subscriptions=[subscription], settings=settings
        )
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.consumer.run(self.stop))

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await self.task


@pytest.fixture
async def small_stream(bus: Bus) -> AsyncIterator[tuple[StreamSpec, str]]:
    tag = uuid.uuid4().hex[:8]
    prefix = f"limits{tag}"
    spec = StreamSpec(f"LIMITS_{tag}", (f"{prefix}.>",), "a stream of 20 messages at most")
    await bus.ensure_stream(spec, Retention(max_msgs=LIMIT, max_age_seconds=3600))
    yield spec, prefix
    await bus.js.delete_stream(spec.name)


def message(n: int) -> ReconcileCluster:
    ref = ObjectRef(api_version="v1", kind="Cluster", namespace="ns", name=f"o{n}")
    return ReconcileCluster(source="test", correlation_id="limits", ref=ref, reason=str(n))


class Publisher:
    """Publishes ``count`` messages in order, each retried while the stream refuses it."""

    def __init__(self, bus: Bus, prefix: str, count: int) -> None:
        self.bus, self.prefix, self.count = bus, prefix, count
        self.sent: list[str] = []
        self.refused = 0

    async def run(self) -> None:
        for n in range(self.count):
            msg = message(n)
            while True:
                try:
                    await self.bus.publish(f"{self.prefix}.work.0.ns.o{n}", msg)
                    break
                except StreamFull:
                    self.refused += 1
                    await asyncio.sleep(0.1)
            self.sent.append(msg.id)


@pytest.mark.parametrize("echo", [False, True], ids=["plain", "handlers-publish-to-it"])
async def test_a_stopped_consumer_loses_nothing_when_its_stream_reaches_its_limit(
    bus: Bus, redis_client: Redis, small_stream: tuple[StreamSpec, str], echo: bool
) -> None:
    """With ``echo``, the consumer's handlers publish to the stream they consume: held back
    like any publisher, they could never finish, so the consumer could never catch up."""
    spec, prefix = small_stream
    running = Running(bus, redis_client, spec, prefix, echo=echo)
    # The durable consumer exists and is caught up before it stops.
    first = message(-1)
    running.start()
    await bus.publish(f"{prefix}.work.0.ns.first", first)
    await eventually(
        lambda: _value(running.recorder.ids), lambda ids: first.id in ids, what="first handled"
    )
    await running.halt()

    publisher = Publisher(bus, prefix, 3 * LIMIT)
    publishing = asyncio.create_task(publisher.run())
    await eventually(lambda: _value(publisher.refused), bool, what="the publisher held back")
    await asyncio.sleep(1)  # it stays held back: nobody consumes
    assert len(publisher.sent) < LIMIT
    state = (await bus.js.stream_info(spec.name)).state
    assert state.messages >= HIGH_WATER * LIMIT
    assert state.first_seq == 1  # nothing discarded
    assert REGISTRY.get_sample_value("capibus_stream_held_back", {"stream": spec.name}) == 1

    running.start()
    await asyncio.wait_for(publishing, 60)
    everything = {first.id, *publisher.sent}
    await eventually(
        lambda: _value(running.recorder.ids),
        lambda ids: set(ids) >= everything,
        timeout=60,
        what="every message handled",
    )
    await running.halt()
    counts = collections.Counter(running.recorder.ids)
    assert [m for m, c in counts.items() if c > 1] == []
    assert set(counts) == everything
    state = (await bus.js.stream_info(spec.name)).state
    assert state.first_seq > 1  # consumed history aged out to make room
    assert state.messages <= LIMIT
    assert REGISTRY.get_sample_value("capibus_stream_held_back", {"stream": spec.name}) == 0


async def _value(value: T) -> T:
    return value
