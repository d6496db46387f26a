import pytest

from shared.errors import BadMessage
from shared.messages import (
    ObjectRef,
    PatchStatus,
    ResourceChanged,
    decode,
    decode_any,
    encode,
    stable_id,
)

REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="t", name="c"
)


def test_round_trip_and_discriminated_decoding() -> None:
    message = PatchStatus(
        source="test", correlation_id="cluster:t/c", ref=REF, patch={"phase": "Ready"}
    )
    assert decode(encode(message), PatchStatus) == message
    assert decode_any(encode(message)) == message


def test_messages_are_frozen() -> None:
    message = PatchStatus(source="test", correlation_id="x", ref=REF, patch={})
    with pytest.raises(ValueError, match="frozen"):
        message.source = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"not json", "Invalid JSON"),
        (b'{"type": "PatchStatus"}', "source"),
        (b'{"type": "Nope", "source": "x", "correlation_id": "y"}', "does not match any"),
    ],
)
def test_bad_payloads_raise_bad_message_with_the_reason(payload: bytes, fragment: str) -> None:
    with pytest.raises(BadMessage, match=fragment):
        decode_any(payload)


def test_unknown_schema_version_is_rejected() -> None:
    message = PatchStatus(source="t", correlation_id="x", ref=REF, patch={})
    raw = encode(message).replace(b'"schema_version":1', b'"schema_version":2')
    with pytest.raises(BadMessage, match="schema_version"):
        decode(raw, PatchStatus)


def test_secret_payload_is_refused() -> None:
    ref = ObjectRef(api_version="v1", kind="Secret", namespace="t", name="s")
    with pytest.raises(ValueError, match="Secret data"):
        ResourceChanged(
            source="w",
            correlation_id="x",
            event="ADDED",
            ref=ref,
            resource_version="1",
            object={"metadata": {}, "data": {"k": "djE="}},
        )


def test_stable_ids_are_stable() -> None:
    assert stable_id("a", "b") == stable_id("a", "b") != stable_id("a", "c")
