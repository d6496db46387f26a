"""A delivery lost on its way, on the real JetStream: the server counts the message delivered,
the consumer never sees it, the newer messages of its object run, and the server sends it
again once ``ack_wait`` has passed. It must then run with those newer messages behind it
(``shared.consumer``: lost deliveries), so the result is stream order's.

The loss is made on our side of the wire: the pull subscription drops the first delivery of
one message, as a reply sent to a request the client has given up on is dropped. JetStream,
its bookkeeping and its redelivery are the real server's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import nats.errors
import pytest

from shared.bus import Bus, Retention
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import PartitionLeases
from shared.mergepatch import apply
from shared.messages import ObjectRef, PatchStatus, decode
from shared.resp import Redis
from shared.subjects import StreamSpec

pytestmark = pytest.mark.integration

Json = dict[str, Any]


class LosingPull:
    """A pull subscription that loses the first delivery of the messages ``lose`` picks."""

    def __init__(self, psub: Any, lose: Callable[[Any], bool]) -> None:
        self._psub = psub
        self._lose = lose

    async def fetch(self, batch: int = 1, timeout: float = 5.0) -> list[Any]:
        msgs = await self._psub.fetch(batch, timeout=timeout)
        kept = [m for m in msgs if not (m.metadata.num_delivered == 1 and self._lose(m))]
        if not kept:
            raise nats.errors.TimeoutError
        return kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._psub, name)


class LosingBus:
    """The real bus, whose pull subscriptions lose what ``lose`` picks."""

    def __init__(self, bus: Bus, lose: Callable[[Any], bool]) -> None:
        self._bus = bus
        self._lose = lose

    async def durable_pull(self, stream: str, config: Any) -> LosingPull:
        return LosingPull(await self._bus.durable_pull(stream, config), self._lose)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)


class Status:
    """Applies each run's patches in turn, as the writer does."""

    def __init__(self) -> None:
        self.status: Json = {}
        self.runs: list[list[int]] = []
        self.replayed = asyncio.Event()

    async def handle(self, batch: Batch[PatchStatus]) -> None:
        for message in batch.messages:
            self.status = apply(self.status, message.patch)
        self.runs.append([m.patch["n"] for m in batch.messages])
        if batch.replayed:
            self.replayed.set()


def patch(n: int, body: Json) -> PatchStatus:
    ref = ObjectRef(api_version="v1", kind="Cluster", namespace="ns", name="c")
    return PatchStatus(source="test", correlation_id="late", ref=ref, patch={"n": n, **body})


@pytest.mark.timeout(60)
async def test_a_lost_delivery_runs_again_under_the_newer_messages_of_its_object(
    bus: Bus, redis_client: Redis
) -> None:
    tag = uuid.uuid4().hex[:8]
    spec = StreamSpec(f"LATE_{tag}", (f"late{tag}.>",), "the late messages test's stream")
    await bus.ensure_stream(spec, Retention())

    def first_patch(msg: Any) -> bool:
        return bool(decode(msg.data, PatchStatus).patch["n"] == 1)

    status = Status()
    service = f"late-{tag}"
    consumer = Consumer(
        bus=LosingBus(bus, first_patch),
        leases=PartitionLeases(redis_client, service=service, member="m", partitions=1, ttl=3),
        service=service,
        subscriptions=[
            Subscription(
                name="status",
                stream=spec,
                filters=lambda _partition: [f"late{tag}.>"],
                model=PatchStatus,
                handle=status.handle,
            )
        ],
        settings=ConsumerSettings(ack_wait=2, fetch_timeout=5),
    )
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    try:
        subject = f"late{tag}.0.ns.c"
        # 1 sets a node and the phase; 2 moves the phase on; 3 only adds an addon.
        for n, body in (
            (1, {"phase": "Provisioning", "nodes": {"a": {"phase": "Ready"}}}),
            (2, {"phase": "Ready"}),
            (3, {"addons": {"x": "Deployed"}}),
        ):
            await bus.publish(subject, patch(n, body))
        await asyncio.wait_for(status.replayed.wait(), 30)
    finally:
        stop.set()
        await running
    # 1 was lost, so 2 and 3 ran first; 1 came back and ran with them after it.
    assert status.runs[-1] == [1, 2, 3]
    assert [n for run in status.runs[:-1] for n in run] == [2, 3]
    assert status.status == {
        "n": 3,
        "phase": "Ready",  # not set back by the late 1
        "nodes": {"a": {"phase": "Ready"}},  # and 1's own change is not lost
        "addons": {"x": "Deployed"},
    }
