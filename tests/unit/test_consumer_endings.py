"""Every way a consumed message can end is recorded: the dead letter always fits, a message
that keeps killing its handler stops being run, and a dead letter that cannot be stored is
named in a log line and a metric."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from typing import Any

import pytest

from shared import subjects
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription, park
from shared.coordination import Lease
from shared.errors import BusUnavailable, KubeNotFound, MessageTooLarge, PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    DEAD_LETTER_PAYLOAD_LIMIT,
    Message,
    MessageDeadLettered,
    ObjectRef,
    ResourceChanged,
    encode,
)
from shared.oversize import fit
from shared.resources import HELM_RELEASE
from tests.fakes import FakeMsg, delivered
from tests.unit.test_metrics import handled, message

Json = dict[str, Any]


class Bus:
    """Stores dead letters, or fails to, as told."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.published: list[tuple[str, Message]] = []

    async def publish(self, subject: str, message: Message, *, msg_id: str | None = None) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.published.append((subject, message))


class Handler:
    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self.batches: list[Batch[Any]] = []

    async def __call__(self, batch: Batch[Any]) -> None:
        self.batches.append(batch)
        if self.failure:
            raise self.failure


async def consume(
    handler: Handler,
    *msgs: FakeMsg,
    bus: Bus | None = None,
    model: type[Message] = ResourceChanged,
    objects: Any = None,
) -> tuple[str, Bus]:
    bus = bus or Bus()
    service = f"svc-{uuid.uuid4().hex[:6]}"
    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=model,
        handle=handler,
    )
    consumer = Consumer(
        bus=bus,  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        service=service,
        subscriptions=[sub],
        settings=ConsumerSettings(backoff_base=0.01, max_deliver=3),
        objects=objects,
    )
    lease = Lease(partition=0, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)
    for msg in msgs:
        consumer.offer(sub, lease, msg)  # type: ignore[arg-type]
    await asyncio.wait_for(asyncio.gather(*(m.settled.wait() for m in msgs)), 5)
    return service, bus


def letters(bus: Bus) -> list[MessageDeadLettered]:
    return [m for _, m in bus.published if isinstance(m, MessageDeadLettered)]


async def test_a_dead_letter_of_a_huge_body_keeps_its_start_size_hash_and_address() -> None:
    body = b"\xff" + b"x" * (1 << 20)
    msg = message("a", data=body)
    _, bus = await consume(Handler(), msg)
    (letter,) = letters(bus)
    assert letter.reason == "BadMessage"
    assert letter.payload_truncated
    assert letter.payload_size == len(body)
    assert letter.payload_sha256 == hashlib.sha256(body).hexdigest()
    assert (letter.stream, letter.stream_sequence) == (
        subjects.STATUS.name,
        msg.metadata.sequence.stream,
    )
    assert len(encode(letter)) < 2 * DEAD_LETTER_PAYLOAD_LIMIT + 8192


async def test_a_small_body_is_kept_whole() -> None:
    msg = message("a", data=b"{not json")
    _, bus = await consume(Handler(), msg)
    (letter,) = letters(bus)
    assert (letter.payload, letter.payload_truncated) == ("{not json", False)


async def test_a_message_delivered_more_than_max_deliver_times_is_not_run_again() -> None:
    handler = Handler()
    service, bus = await consume(handler, message("a", deliveries=4))
    assert handler.batches == []
    (letter,) = letters(bus)
    assert letter.reason == "RetriesExhausted"
    assert "never settled" in letter.error
    assert handled(service, "dead_letter") == 1


async def test_a_dead_letter_that_cannot_be_stored_yet_is_retried() -> None:
    service, bus = await consume(
        Handler(PermanentError("no", reason="No")),
        message("a"),
        bus=Bus(BusUnavailable("down")),
    )
    assert letters(bus) == []
    assert handled(service, "retry") == 1


async def test_a_dead_letter_that_can_never_be_stored_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    msg = message("a")
    with caplog.at_level(logging.ERROR, logger="shared.consumer"):
        service, _ = await consume(
            Handler(PermanentError("no", reason="No")),
            msg,
            bus=Bus(MessageTooLarge("too big")),
        )
    assert handled(service, "dropped") == 1
    assert f"stream sequence {msg.metadata.sequence.stream}" in caplog.text


# --- trimmed resource events ---------------------------------------------------------------


def big_release() -> Json:
    return {
        "apiVersion": HELM_RELEASE.api_version,
        "kind": "HelmRelease",
        "metadata": {"name": "r", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {"values": {"blob": "v" * 50_000}},
        "status": {"phase": "Deployed"},
    }


def trimmed_event() -> FakeMsg:
    obj = big_release()
    change = ResourceChanged(
        source="watcher/t",
        correlation_id="c",
        event="ADDED",
        ref=ObjectRef(
            api_version=HELM_RELEASE.api_version,
            kind="HelmRelease",
            namespace="ns",
            name="r",
            uid="u",
        ),
        resource_version="5",
        object=obj,
    )
    small = fit(change, plural="helmreleases", limit=10_000)
    assert small.trimmed is not None
    return delivered(subjects.resource_event("helmrelease", 0, "ns", "r"), encode(small))


class Reader:
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        if name != "r":
            raise KubeNotFound(name)
        return big_release()


async def test_a_handler_sees_a_trimmed_object_whole() -> None:
    handler = Handler()
    await consume(handler, trimmed_event(), objects=Reader())
    (batch,) = handler.batches
    assert batch.latest.trimmed is None
    assert batch.latest.object["spec"] == big_release()["spec"]


async def test_a_trimmed_event_without_a_reader_is_a_dead_letter_not_a_guess() -> None:
    handler = Handler()
    _, bus = await consume(handler, trimmed_event())
    assert handler.batches == []
    (letter,) = letters(bus)
    assert letter.reason == "ObjectTrimmed"


def test_parked_objects_are_forgotten_once_their_delay_is_over() -> None:
    """10,000 objects parked one after another, each for a second: at most the ones whose
    delay is not over yet are kept."""
    parked: dict[tuple[str, str], float] = {}
    for i in range(10_000):
        park(parked, ("sub", f"ns/c{i}"), 1.0, now=i * 0.1)
    assert len(parked) <= 11
    assert parked[("sub", "ns/c9999")] == pytest.approx(1000.9)
