"""The harness's three-node JetStream cluster: an R3 stream outlives its leader's SIGKILL.

A stack of its own (``cluster_stack``: the session's has one nats-server). Messages are
published before the kill, while the leader is dead (each retried, under its id, until a new
leader answers) and after it is back; every one must be on the stream exactly once.
"""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.bus import Bus, Retention
from shared.errors import BusUnavailable
from shared.messages import ObjectRef, ReconcileCluster
from shared.subjects import StreamSpec
from testenv.harness import LocalStack, external_stack_configured

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(external_stack_configured(), reason="needs a stack the harness starts"),
]

STREAM = StreamSpec("CLUSTER_TEST", ("clustertest.>",), "the cluster test's own stream")
REF = ObjectRef(api_version="v1", kind="Cluster", namespace="ns", name="c")


async def publish(bus: Bus, count: int, start: int) -> list[str]:
    """Publish ``count`` messages; each is retried under its own id until stored."""
    ids = []
    for n in range(start, start + count):
        message = ReconcileCluster(source="test", correlation_id="c", ref=REF, reason=str(n))
        for _ in range(150):
            try:
                await bus.publish(f"clustertest.{n}", message)
                break
            except BusUnavailable:
                await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"message {n} never stored")
        ids.append(message.id)
    return ids


async def stored_ids(bus: Bus) -> list[str]:
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
    psub = await bus.js.pull_subscribe("clustertest.>", stream=STREAM.name, config=config)
    try:
        remaining = (await psub.consumer_info()).num_pending
        found: list[str] = []
        while remaining > 0:
            msgs = await psub.fetch(min(remaining, 500), timeout=5)
            found += [m.headers["Nats-Msg-Id"] for m in msgs]
            remaining -= len(msgs)
        return found
    finally:
        await psub.unsubscribe()


async def test_an_r3_stream_survives_its_leaders_sigkill(
    cluster_stack: LocalStack, cluster_bus: Bus
) -> None:
    assert cluster_stack.env()["CAPIBUS_RETENTION__REPLICAS"] == "3"
    await cluster_bus.ensure_stream(STREAM, Retention(replicas=cluster_stack.stream_replicas))
    info = await cluster_bus.js.stream_info(STREAM.name)
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert len(info.cluster.replicas or []) == 2
    sent = await publish(cluster_bus, 50, 0)
    leader = await cluster_stack.stream_leader(STREAM.name)
    cluster_stack.stop_component(leader)  # SIGKILL
    sent += await publish(cluster_bus, 50, 50)
    assert await cluster_stack.stream_leader(STREAM.name) != leader
    cluster_stack.start_component(leader)  # ready once it has caught up with its streams
    sent += await publish(cluster_bus, 50, 100)
    found = await stored_ids(cluster_bus)
    assert sorted(found) == sorted(sent)
