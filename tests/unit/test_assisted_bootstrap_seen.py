"""What the bootstrap provider remembers between runs, and when it refuses to trust it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from services.baremetal.assisted_bootstrap.seen import Forgetting, Seen, key_of, mark_of
from shared.claims import Claim
from shared.messages import Condition, EventType, ObjectRef, RecheckObject, ResourceChanged
from shared.resources import OPENSHIFT_ASSISTED_CONFIG, SECRET

Json = dict[str, Any]
OAC = OPENSHIFT_ASSISTED_CONFIG
KEY = key_of(OAC, "ns", "c")
WAITING = Condition(type="DataSecretAvailable", status="False", reason="WaitingForLiveISOURL")

pytestmark = pytest.mark.timeout(5)


def config(version: str = "5", **status: Any) -> Json:
    return {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u1",
            "generation": 1,
            "resourceVersion": version,
            "labels": {"a": "b"},
        },
        "spec": {"x": 1},
        "status": status,
    }


def event(obj: Json, kind: Any = OAC, kind_event: EventType = "MODIFIED") -> ResourceChanged:
    meta = obj["metadata"]
    return ResourceChanged(
        source="t",
        correlation_id="t",
        event=kind_event,
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid"),
        ),
        resource_version=meta.get("resourceVersion", "0"),
        object=obj,
    )


def test_an_own_event_is_trusted_when_at_least_as_new_as_anything_seen() -> None:
    seen = Seen()
    assert seen.carried(OAC, KEY, event(config("5"))) == config("5")
    seen.note(KEY, config("7"))  # this replica's own write
    assert seen.carried(OAC, KEY, event(config("6"))) is None  # would undo it in our view
    assert seen.carried(OAC, KEY, event(config("7"))) is not None
    assert seen.carried(OAC, KEY, event(config("abc"))) is None  # not a number: never
    assert seen.carried(OAC, KEY, event(config("9"), kind_event="DELETED")) is None
    assert seen.carried(SECRET, KEY, event(config("9"), SECRET)) is None  # another kind
    cause = RecheckObject(
        source="t",
        correlation_id="t",
        ref=ObjectRef(api_version="v1", kind="X", name="c"),
        reason="t",
    )
    assert seen.carried(OAC, KEY, cause) is None
    seen.distrust(KEY)  # a run failed
    assert seen.carried(OAC, KEY, event(config("100"))) is None


def test_the_carried_object_is_a_copy() -> None:
    message = event(config("5"))
    found = Seen().carried(OAC, KEY, message)
    assert found is not None
    found["metadata"]["labels"]["changed"] = "yes"
    assert "changed" not in message.object["metadata"]["labels"]


def test_an_own_event_brings_nothing_new_only_beside_what_was_decided() -> None:
    seen = Seen()
    assert not seen.nothing_new(OAC, KEY, event(config("5")))  # nothing decided yet
    seen.decide(
        KEY, config("5"), {"infraEnvRef": {"name": "p"}, "observedGeneration": 1}, [WAITING]
    )
    assert seen.nothing_new(OAC, KEY, event(config("4")))
    assert seen.nothing_new(OAC, KEY, event(config("5")))

    written = config("6", infraEnvRef={"name": "p"}, conditions=[WAITING.model_dump()])
    assert seen.nothing_new(OAC, KEY, event(written))  # the writer's write of the decision
    other = copy.deepcopy(written)
    other["status"]["conditions"].append({"type": "AgentBound", "status": "True"})
    assert seen.nothing_new(OAC, KEY, event(other))  # someone else's condition beside it

    lost = config("6", conditions=[WAITING.model_dump()])
    assert not seen.nothing_new(OAC, KEY, event(lost))  # the status lacks a field asked for
    changed = copy.deepcopy(written)
    changed["metadata"]["generation"] = 2
    assert not seen.nothing_new(OAC, KEY, event(changed))  # the spec changed
    relabelled = copy.deepcopy(written)
    relabelled["metadata"]["labels"] = {}
    assert not seen.nothing_new(OAC, KEY, event(relabelled))
    assert not seen.nothing_new(OAC, KEY, event(written, kind_event="DELETED"))
    seen.distrust(KEY)
    assert not seen.nothing_new(OAC, KEY, event(written))


def test_the_decided_reason_is_known_until_the_object_is_forgotten() -> None:
    seen = Seen()
    seen.decide(KEY, config("5"), {}, [WAITING])
    assert seen.decided_reason(KEY, "DataSecretAvailable") == "WaitingForLiveISOURL"
    assert seen.decided_reason(KEY, "Ready") is None
    seen.forget(KEY)
    assert seen.decided_reason(KEY, "DataSecretAvailable") is None


def test_a_run_is_in_flight_until_it_ends_however_it_ends() -> None:
    seen = Seen()
    with seen.running(KEY):
        with seen.running(KEY):
            assert seen.is_running(KEY)
        assert seen.is_running(KEY)
    assert not seen.is_running(KEY)
    with pytest.raises(RuntimeError), seen.running(KEY):
        raise RuntimeError("boom")
    assert not seen.is_running(KEY)


def test_marks_say_what_a_mapping_looked_at_until_the_object_goes() -> None:
    seen = Seen()
    mark = mark_of(OAC, event(config()))
    assert mark == "openshiftassistedconfig/u1"
    assert not seen.unchanged(mark, True)  # never seen: it maps
    seen.mark(mark, True)
    assert seen.unchanged(mark, True)
    assert not seen.unchanged(mark, False)
    seen.mark(mark, None)  # gone
    assert not seen.unchanged(mark, True)
    assert not seen.unchanged(None, True)


def test_facts_are_kept_by_uid_until_dropped() -> None:
    seen = Seen()
    seen.remember("m1", {"spec": {"clusterName": "c1"}})
    found = seen.recall("m1")
    assert found == {"spec": {"clusterName": "c1"}}
    found["spec"]["clusterName"] = "other"
    assert seen.recall("m1") == {"spec": {"clusterName": "c1"}}
    seen.drop("m1")
    assert seen.recall("m1") is None
    assert seen.recall(None) is None


async def test_partitions_moving_make_the_replica_forget_all_but_its_runs() -> None:
    seen = Seen()
    forgetting = Forgetting(seen)
    for lose in (forgetting.lost(frozenset({3})), forgetting.claimed(Claim(partition=3, token=2))):
        seen.note(KEY, config("7"))
        seen.decide(KEY, config("7"), {}, [WAITING])
        seen.mark("m", True)
        seen.remember("f", {"x": 1})
        seen.offer(KEY, config("8"))
        with seen.running(KEY):
            await lose
            assert seen.is_running(KEY)
        assert seen.carried(OAC, KEY, event(config("6"))) is not None  # no version known
        assert not seen.nothing_new(OAC, KEY, event(config("7")))
        assert not seen.unchanged("m", True)
        assert seen.recall("f") is None
        assert seen.offered(KEY) is None


def test_an_offer_is_taken_once_when_fresh_enough() -> None:
    seen = Seen()
    seen.offer(KEY, config("5"))
    assert seen.offered(KEY) == config("5")
    assert seen.offered(KEY) is None
    seen.note(KEY, config("9"))
    seen.offer(KEY, config("5"))
    assert seen.offered(KEY) is None  # older than this replica's own write
    seen.offer(KEY, config("10"))
    seen.withdraw([KEY])
    assert seen.offered(KEY) is None
