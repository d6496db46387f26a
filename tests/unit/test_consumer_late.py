"""A message delivered but never received (its pull answered into a request the client had
given up) comes back after ``ack_wait``, behind newer messages of its object that ran
meanwhile. Run alone it would undo them; the consumer runs it again with what came after it,
so the result is the one stream order gives."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from shared.messages import PatchStatus
from tests.unit.test_consumer_lost_ack import Handler, again, consumer, numbered, offered
from tests.unit.test_metrics import value


class Snapshot(PatchStatus):
    """A model whose newest message describes its object (an event, a reconcile request)."""

    partial: ClassVar[bool] = False


async def test_a_late_partial_message_runs_again_under_every_newer_one() -> None:
    handler = Handler()
    made, sub = consumer(handler)
    lost, second, third = numbered(1), numbered(2), numbered(3)
    await offered(made, sub, second, third)
    late = again(lost)
    await offered(made, sub, late)
    assert handler.runs == [[2], [3], [1, 2, 3]]
    assert late.how == "ack"
    assert value("capibus_late_messages_total", service=made.service, subscription="status") == 1


async def test_a_late_message_of_a_snapshot_model_runs_under_the_newest_only() -> None:
    handler = Handler()
    made, sub = consumer(handler, model=Snapshot)
    lost, second, third = numbered(1), numbered(2), numbered(3)
    await offered(made, sub, second, third)
    await offered(made, sub, again(lost))
    assert handler.runs == [[2], [3], [1, 3]]


async def test_a_redelivery_newer_than_what_ran_is_not_late() -> None:
    handler = Handler()
    made, sub = consumer(handler)
    first, crashed = numbered(1), numbered(2)
    await offered(made, sub, first)
    await offered(made, sub, again(crashed))
    assert handler.runs == [[1], [2]]


async def test_what_ran_is_remembered_for_two_ack_waits() -> None:
    handler = Handler()
    made, sub = consumer(handler, ack_wait=0.05)
    lost, second = numbered(1), numbered(2)
    await offered(made, sub, second)
    await asyncio.sleep(0.2)
    await offered(made, sub, again(lost))
    assert handler.runs == [[2], [1]]


async def test_a_late_message_that_ran_is_replayed_under_an_even_later_one() -> None:
    handler = Handler()
    made, sub = consumer(handler)
    first, second, third = numbered(1), numbered(2), numbered(3)
    await offered(made, sub, third)
    await offered(made, sub, again(second))
    await offered(made, sub, again(first))
    assert handler.runs == [[3], [2, 3], [1, 2, 3]]
