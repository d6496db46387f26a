"""Faults on the real stack: crashes, restarts of NATS and Redis, handlers that fail.

Expected everywhere: nothing lost, nothing applied twice, convergence once the fault clears.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from shared import subjects
from shared.bus import Bus
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import PartitionLeases
from shared.errors import BusUnavailable, PermanentError, TemporaryError
from shared.messages import MessageDeadLettered, ObjectRef, PatchStatus
from shared.resources import CLUSTER
from shared.resp import Redis
from tests.integration.support import dead_letters, eventually
from tests.integration.test_writer import carried, journal, make_cluster, patch_for

pytestmark = pytest.mark.integration


async def publish_rounds(bus: Bus, refs: list[ObjectRef], rounds: range) -> list[PatchStatus]:
    sent = []
    for r in rounds:
        batch = [patch_for(ref, {"probe": r, f"r{r}": True}) for ref in refs]
        await bus.publish_many([(s, m, None) for s, m in batch])
        sent += [m for _, m in batch]
    return sent


async def all_written(
    bus: Bus, namespace: str, sent: list[PatchStatus], timeout: float = 60
) -> None:
    ids = {m.id for m in sent}
    await eventually(
        lambda: journal(bus, namespace),
        lambda e: carried(e) >= ids,
        timeout=timeout,
        what="every update written",
    )


async def test_writer_sigkill_mid_flow_loses_nothing(kube, bus, namespace, service) -> None:
    refs = [await make_cluster(kube, namespace, f"k{i}") for i in range(6)]
    first = service("writer", "first")
    sent = await publish_rounds(bus, refs, range(3))
    await eventually(lambda: journal(bus, namespace), lambda e: len(e) >= 1, what="first writes")
    first.kill()
    sent += await publish_rounds(bus, refs, range(3, 6))
    service("writer", "second")
    await all_written(bus, namespace, sent)
    for ref in refs:
        status = (await kube.get(CLUSTER, namespace, ref.name))["status"]
        assert status["probe"] == 5
        assert all(status[f"r{r}"] for r in range(6))


async def test_nats_restart_mid_flow(kube, bus, stack, namespace, service) -> None:
    refs = [await make_cluster(kube, namespace, f"n{i}") for i in range(4)]
    service("writer")
    sent = await publish_rounds(bus, refs, range(2))
    await all_written(bus, namespace, sent)
    stack.restart("nats")
    sent += await _publish_when_back(bus, refs, range(2, 4))
    await all_written(bus, namespace, sent)


async def _publish_when_back(bus: Bus, refs: list[ObjectRef], rounds: range) -> list[PatchStatus]:
    """Publishers see BusUnavailable (a TemporaryError) until JetStream is back: retry."""
    for _ in range(100):
        try:
            return await publish_rounds(bus, refs, rounds)
        except BusUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError("JetStream did not come back")


async def test_redis_restart_loses_leases_but_not_work(
    kube, bus, stack, namespace, service
) -> None:
    refs = [await make_cluster(kube, namespace, f"r{i}") for i in range(4)]
    writer = service("writer")
    sent = await publish_rounds(bus, refs, range(2))
    await all_written(bus, namespace, sent)
    stack.stop_component("redis")
    sent += await publish_rounds(bus, refs, range(2, 4))
    await asyncio.sleep(3)  # longer than the lease: the writer must have stopped consuming
    stack.start_component("redis")
    await all_written(bus, namespace, sent)
    assert "lost partition" in writer.log() or "cannot reach Redis" in writer.log()


# --- the consumption helper's guarantees, in process, against real NATS and Redis ----------


class Probe:
    """A subscription whose handler fails as scripted, recording every run."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.runs: list[list[str]] = []

    async def handle(self, batch: Batch[PatchStatus]) -> None:
        self.runs.append([m.id for m in batch.messages])
        if self.failures:
            raise self.failures.pop(0)


async def run_probe(
    bus: Bus, redis_client: Redis, probe: Probe, namespace: str, *, until: Any
) -> str:
    service = f"probe-{uuid.uuid4().hex[:6]}"
    leases = PartitionLeases(redis_client, service=service, member="m", partitions=16, ttl=2)
    subscription = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [f"capibus.status.patch.cluster.{p}.{namespace}.*"],
        model=PatchStatus,
        handle=probe.handle,
    )
    settings = ConsumerSettings(ack_wait=2, max_deliver=3, backoff_base=0.1, backoff_max=1.0)
    consumer = Consumer(
        bus=bus, leases=leases, service=service, subscriptions=[subscription], settings=settings
    )
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await eventually(until, bool, timeout=30, what="probe outcome")
    finally:
        stop.set()
        await task
    return service


def ref(namespace: str) -> ObjectRef:
    return ObjectRef(api_version=CLUSTER.api_version, kind="Cluster", namespace=namespace, name="p")


async def test_unexpected_exception_is_redelivered_never_acked(
    bus, redis_client, namespace
) -> None:
    probe = Probe(RuntimeError("boom"))
    subject, message = patch_for(ref(namespace), {"networkingPhase": "Provisioned"})
    await bus.publish(subject, message)

    async def handled_twice() -> bool:
        return len(probe.runs) >= 2

    await run_probe(bus, redis_client, probe, namespace, until=handled_twice)
    assert probe.runs[:2] == [[message.id], [message.id]]


class Outage(Probe):
    """A handler whose dependency is down for ``seconds`` from the first run, then back."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.began: float | None = None
        self.done = False

    async def handle(self, batch: Batch[PatchStatus]) -> None:
        self.runs.append([m.id for m in batch.messages])
        self.began = self.began or time.monotonic()
        if time.monotonic() - self.began < self.seconds:
            raise TemporaryError("the API server is down")
        self.done = True


async def test_a_dependency_down_longer_than_every_delivery_heals_without_a_dead_letter(
    bus, redis_client, namespace
) -> None:
    # With max_deliver=3 and this backoff, giving up after the deliveries would take ~1 s.
    probe = Outage(seconds=6)
    subject, message = patch_for(ref(namespace), {"networkingPhase": "Provisioned"})
    await bus.publish(subject, message)

    async def healed() -> bool:
        return probe.done

    await run_probe(bus, redis_client, probe, namespace, until=healed)
    assert len(probe.runs) > 3
    assert all(run == [message.id] for run in probe.runs)
    assert await dead_letters(bus, subject) == []


async def test_permanent_error_is_dead_lettered_at_once(bus, redis_client, namespace) -> None:
    probe = Probe(PermanentError("template missing", reason="TemplateMissing"))
    subject, message = patch_for(ref(namespace), {"networkingPhase": "Provisioned"})
    await bus.publish(subject, message)

    async def dead() -> list[MessageDeadLettered]:
        return await dead_letters(bus, subject)

    await run_probe(bus, redis_client, probe, namespace, until=dead)
    letter, *_ = await dead()
    assert letter.reason == "TemplateMissing"
    assert letter.original_id == message.id
    assert len(probe.runs) == 1


async def test_burst_for_one_object_coalesces_into_at_most_two_runs(
    bus, redis_client, namespace
) -> None:
    gate = asyncio.Event()
    probe = Probe()
    original = probe.handle

    async def slow(batch: Batch[PatchStatus]) -> None:
        await original(batch)
        if len(probe.runs) == 1:
            await gate.wait()

    probe.handle = slow  # type: ignore[method-assign]
    first = patch_for(ref(namespace), {"n": 0})
    await bus.publish(*first)

    async def burst_then_release() -> bool:
        if probe.runs and not gate.is_set():
            await bus.publish_many(
                [(*patch_for(ref(namespace), {"n": i}), None) for i in range(1, 30)]
            )
            await asyncio.sleep(0.5)
            gate.set()
        return sum(len(r) for r in probe.runs) >= 30

    await run_probe(bus, redis_client, probe, namespace, until=burst_then_release)
    assert len(probe.runs) == 2
    assert len(probe.runs[1]) == 29


async def test_one_round_trip_renews_every_lease_and_finds_the_lost_one(
    redis_client: Redis,
) -> None:
    service = f"renew-{uuid.uuid4().hex[:6]}"
    leases = PartitionLeases(redis_client, service=service, member="m", partitions=4, ttl=5)
    held = [await leases.acquire(p) for p in range(3)]
    assert all(held)
    mine = [lease for lease in held if lease is not None]
    # another member took partition 1 meanwhile (its key expired and was taken)
    await redis_client.execute("SET", f"capibus:{service}:partition:1", "other:99", "PX", 5000)
    before = [lease.deadline for lease in mine]
    assert await leases.renew_all(mine) == [True, False, True]
    assert set(leases.held) == {0, 2}
    assert mine[0].deadline > before[0]
    assert await leases.renew_all([]) == []
