"""The consumer at JetStream's limits, on the real server: ``max_ack_pending`` and the
delivery limit (``ConsumerTuning``: 1000 and 8 by default, small here).

A consumer whose unacknowledged messages reach ``max_ack_pending`` gets nothing more until it
settles some: slow handlers (slower than ``ack_wait``, kept alive with ``in_progress``) must
still see every message through, once each. A message whose handler keeps failing is given up
after ``max_deliver`` deliveries, with a dead letter saying why, and is not run again.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from shared.bus import Bus, Retention
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import PartitionLeases
from shared.messages import MessageDeadLettered, ObjectRef, ReconcileCluster
from shared.resp import Redis
from shared.subjects import StreamSpec
from tests.integration.support import dead_letters, eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(bus: Bus) -> AsyncIterator[tuple[StreamSpec, str]]:
    tag = uuid.uuid4().hex[:8]
    prefix = f"climits{tag}"
    spec = StreamSpec(f"CLIMITS_{tag}", (f"{prefix}.>",), "the consumer limits test's stream")
    await bus.ensure_stream(spec, Retention(max_age_seconds=3600))
    yield spec, prefix
    await bus.js.delete_stream(spec.name)


def message(name: str) -> ReconcileCluster:
    ref = ObjectRef(api_version="v1", kind="Cluster", namespace="ns", name=name)
    return ReconcileCluster(source="test", correlation_id="climits", ref=ref, reason=name)


async def run_until(
    bus: Bus,
    redis_client: Redis,
    stream: tuple[StreamSpec, str],
    *,
    handle: Callable[[Batch[ReconcileCluster]], Awaitable[None]],
    settings: ConsumerSettings,
    done: Callable[[], Awaitable[object]],
) -> str:
    """Run one consumer of ``stream`` until ``done`` answers something true; its service."""
    spec, prefix = stream
    service = f"climits-{uuid.uuid4().hex[:6]}"
    subscription = Subscription(
        name="work",
        stream=spec,
        filters=lambda _partition: [f"{prefix}.>"],
        model=ReconcileCluster,
        handle=handle,
    )
    leases = PartitionLeases(redis_client, service=service, member="m", partitions=1, ttl=3)
    consumer = Consumer(
        bus=bus, leases=leases, service=service, subscriptions=[subscription], settings=settings
    )
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await eventually(done, bool, timeout=90, what="the consumer's outcome")
    finally:
        stop.set()
        await task
    return service


class Slow:
    """A handler that takes ``seconds`` per run (``slowest`` for the first few objects)."""

    def __init__(self, seconds: float, slowest: float, slow_names: set[str]) -> None:
        self.seconds, self.slowest, self.slow_names = seconds, slowest, slow_names
        self.runs: list[str] = []
        self.running = 0
        self.most = 0

    async def handle(self, batch: Batch[ReconcileCluster]) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            slow = batch.latest.reason in self.slow_names
            await asyncio.sleep(self.slowest if slow else self.seconds)
            self.runs += [m.reason for m in batch.messages]
        finally:
            self.running -= 1


async def test_a_consumer_at_max_ack_pending_with_slow_handlers_keeps_making_progress(
    bus: Bus, redis_client: Redis, stream: tuple[StreamSpec, str]
) -> None:
    spec, prefix = stream
    names = [f"o{n}" for n in range(30)]
    # The first three fill every slot for longer than ack_wait.
    handler = Slow(0.1, 3.0, set(names[:3]))
    for name in names:
        await bus.publish(f"{prefix}.0.ns.{name}", message(name))
    settings = ConsumerSettings(
        ack_wait=2, max_ack_pending=3, fetch_batch=10, fetch_timeout=5, backoff_base=0.1
    )

    async def all_handled() -> bool:
        return set(handler.runs) >= set(names)

    await run_until(
        bus, redis_client, stream, handle=handler.handle, settings=settings, done=all_handled
    )
    assert sorted(handler.runs) == sorted(names)  # each once: nothing redelivered, none lost
    assert handler.most <= 3  # the server delivered no more than max_ack_pending at once
    info = (await bus.js.consumers_info(spec.name))[0]
    assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)


class Failing:
    def __init__(self) -> None:
        self.runs = 0

    async def handle(self, batch: Batch[ReconcileCluster]) -> None:
        self.runs += 1
        raise RuntimeError("the handler keeps failing")


async def test_a_message_that_uses_up_its_deliveries_is_dead_lettered_with_the_reason(
    bus: Bus, redis_client: Redis, stream: tuple[StreamSpec, str]
) -> None:
    spec, prefix = stream
    subject = f"{prefix}.0.ns.doomed"
    doomed = message("doomed")
    published = await bus.publish(subject, doomed)
    handler = Failing()
    settings = ConsumerSettings(
        ack_wait=2, max_deliver=3, fetch_timeout=5, backoff_base=0.1, backoff_max=0.3
    )

    async def dead() -> list[MessageDeadLettered]:
        return await dead_letters(bus, subject)

    service = await run_until(
        bus, redis_client, stream, handle=handler.handle, settings=settings, done=dead
    )
    (letter,) = await dead()
    assert letter.reason == "RetriesExhausted"
    assert letter.error == "RuntimeError: the handler keeps failing"
    assert (letter.service, letter.deliveries) == (service, 3)
    assert (letter.stream, letter.stream_sequence) == (spec.name, published.sequence)
    assert letter.original_id == doomed.id
    assert handler.runs == 3
    # Settled for good (term): the server never delivers it again.
    info = (await bus.js.consumers_info(spec.name))[0]
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
    counts = collections.Counter(m.original_id for m in await dead())
    assert counts == {doomed.id: 1}
