"""Deliveries a message spends waiting behind an older message of its object are no failures.

While an object's message is handed back after an unexpected exception, the object's newer
messages go back with it (``nak`` with the same delay) without running, so they never
overtake it. Each such hand-back is a delivery; counted against ``max_deliver``, the newer
message would be dead-lettered as "never settled" without its handler ever having run.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from shared import subjects
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import Lease
from shared.messages import Message, MessageDeadLettered, ObjectRef, PatchStatus, encode
from tests.fakes import FakeMetadata, FakeMsg, FakeSequence

MAX_DELIVER = 3


class Bus:
    def __init__(self) -> None:
        self.published: list[Message] = []

    async def publish(self, subject: str, message: Message, *, msg_id: str | None = None) -> None:
        self.published.append(message)


class Handler:
    """Fails every run whose newest message is the bad one."""

    def __init__(self) -> None:
        self.runs: list[list[str]] = []

    async def __call__(self, batch: Batch[PatchStatus]) -> None:
        self.runs.append([str(m.patch["n"]) for m in batch.messages])
        if batch.latest.patch["n"] == "bad":
            raise RuntimeError("cannot handle the bad one")


def delivery(n: str, sequence: int, deliveries: int) -> FakeMsg:
    ref = ObjectRef(api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", name="x")
    body = PatchStatus(source="t", correlation_id="c", ref=ref, patch={"n": n})
    return FakeMsg(
        subject=subjects.cluster_status(0, "ns", "x"),
        data=encode(body),
        metadata=FakeMetadata(FakeSequence(sequence), deliveries),
    )


async def test_a_message_handed_back_behind_an_older_one_still_gets_its_runs() -> None:
    handler = Handler()
    bus = Bus()
    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=PatchStatus,
        handle=handler,
    )
    consumer = Consumer(
        bus=bus,  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        service=f"svc-{uuid.uuid4().hex[:6]}",
        subscriptions=[sub],
        settings=ConsumerSettings(backoff_base=0.05, backoff_max=0.05, max_deliver=MAX_DELIVER),
    )
    lease = Lease(partition=0, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)

    async def offer(msg: FakeMsg) -> str:
        consumer.offer(sub, lease, msg)  # type: ignore[arg-type]
        await asyncio.wait_for(msg.settled.wait(), 5)
        return msg.how

    # JetStream redelivers both, the older first, each time the delay is over.
    for deliveries in range(1, MAX_DELIVER + 1):
        assert await offer(delivery("bad", 1, deliveries)) in ("nak", "term")
        assert await offer(delivery("good", 2, deliveries)) == "nak"  # waits behind it
        await asyncio.sleep(0.1)
    assert await offer(delivery("good", 2, MAX_DELIVER + 1)) == "ack"

    assert handler.runs == [["bad"]] * MAX_DELIVER + [["good"]]
    letters = [m for m in bus.published if isinstance(m, MessageDeadLettered)]
    assert [(letter.stream_sequence, letter.reason) for letter in letters] == [
        (1, "RetriesExhausted")
    ]
