"""A message whose acknowledgement was lost comes back after ``ack_wait``, behind the object's
newer messages: the consumer that handled it acks it again instead of running it (found by
the fault soak: an old event of a CAPI Cluster, redelivered after a NATS leader change,
set the Azimuth Cluster's ``networkingPhase`` back to Unknown)."""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import replace
from typing import Any

from shared import subjects
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import Lease
from shared.messages import PatchStatus
from tests.fakes import FakeMsg
from tests.unit.test_metrics import message


class Handler:
    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    async def __call__(self, batch: Batch[Any]) -> None:
        self.runs.append([m.patch["n"] for m in batch.messages])


def consumer(
    handler: Handler, ack_wait: float = 30.0, model: type[PatchStatus] = PatchStatus
) -> tuple[Consumer, Subscription[Any]]:
    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=model,
        handle=handler,
    )
    made = Consumer(
        bus=None,  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        service=f"svc-{uuid.uuid4().hex[:6]}",
        subscriptions=[sub],
        settings=ConsumerSettings(ack_wait=ack_wait),
    )
    return made, sub


#: never lapses: a deadline taken at import lapsed in a full run, where the unit tests start
#: some 20 minutes after collection
LEASE = Lease(partition=0, token=1, value="v", deadline=math.inf, usable_from=0)


def numbered(n: int) -> FakeMsg:
    """A status patch for object ``a`` saying ``n``."""
    msg = message("a")
    body = PatchStatus.model_validate_json(msg.data)
    data = body.model_copy(update={"patch": {"n": n}}).model_dump_json().encode()
    return replace(msg, data=data)


def again(msg: FakeMsg) -> FakeMsg:
    """``msg`` delivered once more (same stream sequence), not yet settled."""
    metadata = replace(msg.metadata, num_delivered=msg.metadata.num_delivered + 1)
    return replace(msg, metadata=metadata, settled=asyncio.Event(), how="")


async def offered(made: Consumer, sub: Subscription[Any], *msgs: FakeMsg) -> None:
    for msg in msgs:
        made.offer(sub, LEASE, msg)  # type: ignore[arg-type]
        await asyncio.wait_for(msg.settled.wait(), 5)


async def test_a_message_acked_here_whose_ack_was_lost_is_acked_again_not_run() -> None:
    handler = Handler()
    made, sub = consumer(handler)
    old, new = numbered(1), numbered(2)
    await offered(made, sub, old, new)
    redelivered = again(old)
    await offered(made, sub, redelivered)
    assert handler.runs == [[1], [2]]
    assert redelivered.how == "ack"


async def test_a_redelivered_message_never_handled_here_is_run() -> None:
    handler = Handler()
    made, sub = consumer(handler)
    elsewhere = numbered(1)  # delivered to a replica that crashed before settling it
    await offered(made, sub, again(elsewhere))
    assert handler.runs == [[1]]


async def test_the_memory_of_acks_lasts_two_ack_waits() -> None:
    handler = Handler()
    made, sub = consumer(handler, ack_wait=0.05)
    first = numbered(1)
    await offered(made, sub, first)
    await asyncio.sleep(0.2)
    await offered(made, sub, again(first))
    assert handler.runs == [[1], [1]]
