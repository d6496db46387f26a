"""Long polls on a three-node JetStream cluster: a killed consumer leader takes the pull
requests it held with it, and the consumer asks again as soon as a new leader is elected
(``shared.bus``: lost pulls), not when its 120 s poll would have expired.

A stack of its own (``cluster_stack``: the session's has one nats-server). The bus is
connected to a node that does not lead the consumer, so no reconnect ends the poll: only the
leader advisory can.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from shared.bus import Bus, Retention
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import PartitionLeases
from shared.errors import BusUnavailable
from shared.messages import ObjectRef, ReconcileCluster
from shared.resp import Redis
from shared.subjects import StreamSpec
from testenv.harness import LocalStack, external_stack_configured

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(external_stack_configured(), reason="needs a stack the harness starts"),
]

#: far longer than any test waits: only an ended poll delivers in time
FETCH_TIMEOUT = 120.0


@pytest.fixture
async def cluster_redis(cluster_stack: LocalStack) -> AsyncIterator[Redis]:
    client = Redis.from_url(cluster_stack.endpoints.redis_url)
    yield client
    await client.aclose()


class Recorder:
    def __init__(self) -> None:
        self.handled: dict[str, float] = {}
        self.arrived = asyncio.Event()

    async def handle(self, batch: Batch[ReconcileCluster]) -> None:
        for m in batch.messages:
            self.handled.setdefault(m.reason, time.monotonic())
        self.arrived.set()


def message(reason: str) -> ReconcileCluster:
    ref = ObjectRef(api_version="v1", kind="Cluster", namespace="ns", name=reason)
    return ReconcileCluster(source="test", correlation_id="pulls", ref=ref, reason=reason)


async def publish(bus: Bus, subject: str, reason: str) -> None:
    """Retried while the stream elects a new leader of its own."""
    for _ in range(150):
        try:
            await bus.publish(subject, message(reason))
            return
        except BusUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError(f"{reason} never stored")


async def consumer_leader(bus: Bus, stream: str, durable: str) -> str:
    info = await bus.js.consumer_info(stream, durable)
    assert info.cluster is not None
    assert info.cluster.leader
    return str(info.cluster.leader)


async def lead_elsewhere(bus: Bus, stream: str, durable: str, avoid: str) -> str:
    """Move the consumer's leadership off ``avoid`` (the node the bus is connected to)."""
    for _ in range(10):
        leader = await consumer_leader(bus, stream, durable)
        if leader != avoid:
            return leader
        await bus.nc.request(f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{durable}", b"", 5)
        await asyncio.sleep(1)
    raise AssertionError(f"{durable} stays led by {avoid}")


async def test_a_killed_consumer_leader_does_not_leave_the_partition_idle(
    cluster_stack: LocalStack, cluster_bus: Bus, cluster_redis: Redis
) -> None:
    tag = uuid.uuid4().hex[:8]
    spec = StreamSpec(f"PULLS_{tag}", (f"pulls{tag}.>",), "the lost pulls test's stream")
    await cluster_bus.ensure_stream(spec, Retention(replicas=cluster_stack.stream_replicas))
    service = f"pulls-{tag}"
    recorder = Recorder()
    subscription = Subscription(
        name="work",
        stream=spec,
        filters=lambda _partition: [f"pulls{tag}.>"],
        model=ReconcileCluster,
        handle=recorder.handle,
    )
    consumer = Consumer(
        bus=cluster_bus,
        leases=PartitionLeases(cluster_redis, service=service, member="m", partitions=1, ttl=3),
        service=service,
        subscriptions=[subscription],
        settings=ConsumerSettings(ack_wait=5, fetch_timeout=FETCH_TIMEOUT),
    )
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    stopped: list[str] = []
    try:
        await publish(cluster_bus, f"pulls{tag}.0.ns.before", "before")
        await asyncio.wait_for(recorder.arrived.wait(), 30)
        durable = f"{service}-work-p0"
        connected = str(cluster_bus.nc._server_info.get("server_name"))
        leader = await lead_elsewhere(cluster_bus, spec.name, durable, avoid=connected)
        await asyncio.sleep(2)  # the poll is held at the leader again
        cluster_stack.stop_component(leader)  # SIGKILL
        stopped.append(leader)
        killed = time.monotonic()
        await publish(cluster_bus, f"pulls{tag}.0.ns.after", "after")
        for _ in range(300):
            if "after" in recorder.handled:
                break
            await asyncio.sleep(0.1)
        assert "after" in recorder.handled, "not handled within 30 s of the kill"
        took = recorder.handled["after"] - killed
        print(f"handled {took:.1f}s after the consumer leader's SIGKILL")
        assert cluster_bus.nc.stats["reconnects"] == 0  # the advisory ended the poll
        assert await consumer_leader(cluster_bus, spec.name, durable) != leader
    finally:
        stop.set()
        await running
        for name in stopped:
            cluster_stack.start_component(name)
