"""Decoding never crashes: any body is a message or a ``BadMessage``, and in the consumer a
``BadMessage`` is a dead letter with its reason, never an exception out of the consumer.

Bodies are drawn from every kind of bad input a bus can carry: arbitrary bytes (invalid
UTF-8 included), arbitrary JSON (top-level arrays, numbers, strings), JSON of the right
``type`` with fields removed, retyped or added, huge strings, nesting deeper than the JSON
parser allows, and unicode everywhere. The consumer is driven through a ``shared.wiring``
route, as every service builds its subscriptions, with the fake bus of
``tests/unit/test_consumer_endings.py`` recording dead letters.

Every message model also round-trips, ``decode(encode(m)) == m``, for instances generated
from the model's own field types (``model_instances``: a small annotation → strategy
function, so a field added to a model is generated without touching this file).

A non-finite float (``inf``, ``nan``) has no JSON form: ``encode`` refuses a message holding
one (tested below), so the strategies draw finite floats only. Datetimes are drawn with
whole-minute UTC offsets: pydantic writes and reads offsets to the minute, and every producer
stamps UTC.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from shared import subjects
from shared.consumer import Batch, Consumer, ConsumerSettings
from shared.coordination import Lease
from shared.errors import BadMessage
from shared.messages import (
    DEAD_LETTER_PAYLOAD_LIMIT,
    Message,
    MessageDeadLettered,
    MetadataChanged,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    PrerequisiteChanged,
    RecheckObject,
    ReconcileCluster,
    ResourceChanged,
    ResourcesListed,
    StatusWritten,
    SyncAppTemplate,
    decode,
    decode_any,
    encode,
)
from shared.wiring import Routes, events, messages
from tests.fakes import FakeBus, FakeMsg, delivered

Json = dict[str, Any]

MODELS: tuple[type[Message], ...] = (
    ResourceChanged,
    ResourcesListed,
    PatchStatus,
    PatchMetadata,
    PrerequisiteChanged,
    ReconcileCluster,
    StatusWritten,
    MetadataChanged,
    MessageDeadLettered,
    SyncAppTemplate,
    RecheckObject,
)

# --- strategies ---------------------------------------------------------------------------

TEXT = st.text(max_size=12)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)
OFFSETS = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
DATETIMES = st.datetimes(timezones=st.none() | st.just(UTC) | OFFSETS)
SIMPLE: dict[Any, st.SearchStrategy[Any]] = {Any: JSON, str: TEXT, datetime: DATETIMES}


def strategy_for(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of a message field's type; free-form ``Any`` is JSON."""
    if annotation in SIMPLE:
        return SIMPLE[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_instances(annotation)
    return _generic(annotation)


def _generic(annotation: Any) -> st.SearchStrategy[Any]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy_for(arg) for arg in args))
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    if origin in (list, tuple):
        return st.lists(strategy_for(args[0]), max_size=3).map(origin)
    return st.sampled_from(args) if origin is Literal else st.from_type(annotation)


def model_instances(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Instances of ``model`` with every field drawn, optional ones sometimes left out."""
    required = {
        n: strategy_for(f.annotation) for n, f in model.model_fields.items() if f.is_required()
    }
    optional = {
        n: strategy_for(f.annotation) for n, f in model.model_fields.items() if not f.is_required()
    }
    return (
        st.fixed_dictionaries(required, optional=optional)
        .map(lambda fields: _valid(model, fields))
        .filter(lambda built: built is not None)
    )


def _valid(model: type[BaseModel], fields: Json) -> BaseModel | None:
    """``model(**fields)``, or None when a model rule refuses them (a Secret with data)."""
    try:
        return model(**fields)
    except ValidationError:
        return None


ANY_MESSAGE = st.one_of(*(model_instances(model) for model in MODELS))


def mutated(body: Json, data: st.DataObject) -> Json:
    """``body`` (a message as JSON) with one field removed, retyped, added or its type
    swapped for another message's."""
    how = data.draw(st.sampled_from(["remove", "retype", "add", "swap"]))
    field = data.draw(st.sampled_from(sorted(body)))
    changed = dict(body)
    if how == "remove":
        del changed[field]
    elif how == "retype":
        changed[field] = data.draw(JSON)
    elif how == "add":
        changed[data.draw(TEXT)] = data.draw(JSON)
    else:
        changed["type"] = data.draw(st.sampled_from([m.__name__ for m in MODELS]) | TEXT)
    return changed


def huge(minimum: int) -> st.SearchStrategy[str]:
    """One character (any plane) repeated: long strings without drawing each character."""
    return st.builds(lambda c, n: c * n, st.characters(), st.integers(minimum, minimum * 3))


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Anything a producer, a person with ``nats pub`` or a broken client could send."""
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "valid", "huge", "deep"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(150, 5000))
        return ("[" * depth + "]" * depth).encode()
    message = draw(st.sampled_from([PatchStatus, ResourceChanged]).flatmap(model_instances))
    body = json.loads(encode(message))
    if kind == "mutated":
        body = mutated(body, draw(st.data()))
    elif kind == "huge":
        body["source"] = draw(huge(DEAD_LETTER_PAYLOAD_LIMIT // 2))
    return json.dumps(body, ensure_ascii=draw(st.booleans())).encode()


# --- decode and decode_any ------------------------------------------------------------------

ANY_BYTES = st.binary(max_size=300) | bodies()


def outcome(decoding: Callable[[], Message]) -> Message | BadMessage:
    try:
        return decoding()
    except BadMessage as exc:
        return exc


@given(ANY_BYTES, st.sampled_from(MODELS))
@example(data=b"\xff\xfe", model=PatchStatus)
@example(data=b"[" * 100_000, model=PatchStatus)
@example(data=b'{"a": 1e400}', model=PatchStatus)
def test_decode_is_a_message_or_a_bad_message(data: bytes, model: type[Message]) -> None:
    result = outcome(lambda: decode(data, model))
    if isinstance(result, BadMessage):
        assert str(result).startswith(f"not a valid {model.__name__}: ")
    else:
        assert isinstance(result, model)


@given(ANY_BYTES)
def test_decode_any_is_a_message_or_a_bad_message(data: bytes) -> None:
    result = outcome(lambda: decode_any(data))
    if isinstance(result, BadMessage):
        assert str(result).startswith("not a capibus message: ")
    else:
        assert type(result) in MODELS


@given(ANY_MESSAGE)
def test_every_message_round_trips(message: Message) -> None:
    body = encode(message)
    assert decode(body, type(message)) == message
    assert decode_any(body) == message


@given(ANY_MESSAGE, ANY_MESSAGE)
def test_a_message_of_another_type_is_refused_not_misread(message: Message, other: Message) -> None:
    if type(other) is type(message):
        return
    with pytest.raises(BadMessage):
        decode(encode(message), type(other))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_number_is_refused_naming_its_field(value: float) -> None:
    # Pydantic alone would write null, which a PatchStatus reads as "remove this key".
    ref = ObjectRef(api_version="v1", kind="Cluster", name="c")
    message = PatchStatus(source="t", correlation_id="c", ref=ref, patch={"a": [1, value]})
    with pytest.raises(BadMessage, match=r"PatchStatus: .* at patch\.a\.1 has no JSON form"):
        encode(message)


def test_the_words_nan_and_infinity_in_text_are_only_text() -> None:
    ref = ObjectRef(api_version="v1", kind="Cluster", name="c")
    message = PatchStatus(source="t", correlation_id="c", ref=ref, patch={"NaN": "Infinity"})
    assert decode_any(encode(message)) == message


# --- the consumer ---------------------------------------------------------------------------


class DeadLetters:
    """The consumer's bus: keeps dead letters (the only thing a consumer publishes)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, Message]] = []

    async def publish(self, subject: str, message: Message, *, msg_id: str | None = None) -> None:
        self.published.append((subject, message))


class Handled:
    """The handler's side: every batch it ran."""

    def __init__(self) -> None:
        self.batches: list[Batch[Any]] = []

    async def __call__(self, batch: Batch[Any], deps: object) -> None:
        self.batches.append(batch)


async def consume(route_model: type[Message], msg: FakeMsg) -> tuple[Handled, DeadLetters]:
    """Offer ``msg`` to a consumer built from a ``shared.wiring`` route of ``route_model``."""
    handled, bus = Handled(), DeadLetters()
    if route_model is ResourceChanged:
        route = events("events", handle=handled)
    else:
        route = messages("status", route_model, subjects.STATUS, lambda p: "x", handle=handled)
    consumer = Consumer(
        bus=bus,  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        service="props",
        subscriptions=Routes("props", route).bind(object()),
        settings=ConsumerSettings(backoff_base=0.01, max_deliver=3),
    )
    lease = Lease(partition=0, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)
    consumer.offer(consumer.subscriptions[0], lease, msg)  # type: ignore[arg-type]
    await asyncio.wait_for(msg.settled.wait(), 5)
    return handled, bus


def expected_ending(body: bytes, model: type[Message]) -> str:
    """What the consumer must do with ``body``: run it, or dead-letter it and why."""
    try:
        message = decode(body, model)
    except BadMessage:
        return "BadMessage"
    trimmed = isinstance(message, ResourceChanged) and message.trimmed is not None
    # A trimmed event needs the API server to be made whole; this consumer has no reader.
    return "ObjectTrimmed" if trimmed else "ran"


@given(ANY_BYTES, st.sampled_from([PatchStatus, ResourceChanged]))
@example(body=b"\xff" + b"x" * (DEAD_LETTER_PAYLOAD_LIMIT + 10), model=PatchStatus)
@example(body="é".encode() * DEAD_LETTER_PAYLOAD_LIMIT, model=ResourceChanged)
@example(body=b"[" * 100_000, model=ResourceChanged)
@example(body=b"\x00" * (DEAD_LETTER_PAYLOAD_LIMIT + 1), model=PatchStatus)
@example(
    body=json.dumps(
        {
            "type": "ResourceChanged",
            "source": "t",
            "correlation_id": "c",
            "event": "ADDED",
            "ref": {"api_version": "v1", "kind": "Secret", "name": "s"},
            "resource_version": "1",
            "object": {"data": {"password": "aHVudGVyMg=="}},
        }
    ).encode(),
    model=ResourceChanged,
)
async def test_the_consumer_runs_a_message_or_dead_letters_it_with_the_reason(
    body: bytes, model: type[Message]
) -> None:
    msg = delivered(subjects.cluster_status(0, "ns", "c"), body)
    handled, bus = await consume(model, msg)
    ending = expected_ending(body, model)
    if ending == "ran":
        assert msg.how == "ack"
        assert bus.published == []
        ((message,),) = [batch.messages for batch in handled.batches]
        # A body without an id or a time gets fresh ones at each decoding.
        fresh = {"id", "time"}
        assert message.model_dump(exclude=fresh) == decode(body, model).model_dump(exclude=fresh)
        return
    assert msg.how == "term"
    assert handled.batches == []
    ((subject, letter),) = bus.published
    assert subject == subjects.dead_letter("props", msg.subject)
    assert isinstance(letter, MessageDeadLettered)
    assert letter.reason == ending
    assert letter.payload_size == len(body)
    assert letter.payload_sha256 == hashlib.sha256(body).hexdigest()
    assert letter.payload_truncated == (len(body) > DEAD_LETTER_PAYLOAD_LIMIT)
    # The entry is itself a good message, within NATS's default maximum payload (1 MiB)
    # whatever the original: even a kept body of control characters, each escaped in six.
    assert decode_any(encode(letter)) == letter
    assert len(encode(letter)) < FakeBus.max_payload
