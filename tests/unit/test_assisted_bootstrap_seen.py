"""What the bootstrap provider remembers between runs, and when it refuses to trust it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from services.baremetal.assisted_bootstrap.bootstrap import build, dependencies
from services.baremetal.assisted_bootstrap.seen import Seen
from services.baremetal.assisted_bootstrap.settings import AssistedBootstrapSettings
from shared.claims import Claim
from shared.messages import Condition, EventType, ResourceChanged
from shared.resources import OPENSHIFT_ASSISTED_CONFIG
from shared.seen import Forgetting, key_of, mark_of
from tests.fakes import FakeBus, FakeKube
from tests.unit.test_seen import event as changed

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
    return changed(obj, kind, kind_event)


def test_the_newest_version_seen_is_kept_and_a_read_is_the_newest() -> None:
    seen = Seen()
    assert seen.current(KEY) is None
    seen.note(KEY, config("5"))  # an event
    seen.note(KEY, config("7"))  # this replica's own write
    seen.note(KEY, config("6"))  # an event arriving late: it would undo the write in our view
    assert (seen.current(KEY) or {})["metadata"]["resourceVersion"] == "7"
    seen.note(KEY, config("abc"))  # not a number: never kept
    assert (seen.current(KEY) or {})["metadata"]["resourceVersion"] == "7"
    seen.note(KEY, config("4"), read=True)  # a read is what is there now
    assert (seen.current(KEY) or {})["metadata"]["resourceVersion"] == "4"
    seen.distrust(KEY)  # a run failed, or a DELETED event
    seen.note(KEY, config("100"))
    assert seen.current(KEY) is None  # until it is read
    seen.note(KEY, None, read=True)  # read: gone
    assert seen.current(KEY) is None
    seen.note(KEY, config("101"))
    assert seen.current(KEY) is not None


async def test_get_reads_only_what_it_does_not_know() -> None:
    kube = FakeKube()
    seen = Seen()
    stored = kube.put(OAC, config())
    found = await seen.get(kube, OAC, "ns", "c")
    assert found == stored
    assert await seen.get(kube, OAC, "ns", "c") == stored
    assert kube.reads == 1
    assert await seen.get(kube, OAC, "ns", "other") is None
    assert await seen.get(kube, OAC, "ns", "other") is None
    assert kube.reads == 2  # known not to be there, once read
    seen.note(key_of(OAC, "ns", "other"), config("9"))  # its ADDED event
    assert await seen.get(kube, OAC, "ns", "other") is not None
    seen.distrust(key_of(OAC, "ns", "other"))  # its DELETED event
    assert await seen.get(kube, OAC, "ns", "other") is None
    assert kube.reads == 3


def test_what_is_kept_of_a_kind_names_the_objects_in_doubt_too() -> None:
    seen = Seen()
    other = config("3")
    other["metadata"]["name"] = "d"
    seen.note(KEY, config("5"))
    seen.note(key_of(OAC, "ns", "d"), other)
    seen.note(key_of(OAC, "elsewhere", "c"), config("4"))
    seen.distrust(KEY)
    kept = sorted((o["metadata"]["name"], current) for o, current in seen.kept(OAC, "ns"))
    assert kept == [("c", False), ("d", True)]
    assert not seen.listed("configs/ns/c1")
    seen.list_done("configs/ns/c1")
    assert seen.listed("configs/ns/c1")
    seen.clear()
    assert not seen.listed("configs/ns/c1")
    assert seen.kept(OAC, "ns") == []


def test_what_is_kept_is_a_copy() -> None:
    seen = Seen()
    obj = config("5")
    seen.note(KEY, obj)
    obj["metadata"]["labels"]["changed"] = "yes"
    found = seen.current(KEY)
    assert found is not None
    assert "changed" not in found["metadata"]["labels"]
    found["metadata"]["labels"]["again"] = "yes"
    assert "again" not in (seen.current(KEY) or {})["metadata"]["labels"]


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
    for move in ("lost", "claimed"):
        seen.note(KEY, config("7"))
        seen.decide(KEY, config("7"), {}, [WAITING])
        seen.mark("m", True)
        seen.remember("f", {"x": 1})
        with seen.running(KEY):
            if move == "lost":
                await forgetting.lost(frozenset({3}))
            else:
                await forgetting.claimed(Claim(partition=3, token=2))
            assert seen.is_running(KEY)
        assert seen.current(KEY) is None
        assert not seen.nothing_new(OAC, KEY, event(config("7")))
        assert not seen.unchanged("m", True)
        assert seen.recall("f") is None


def test_the_consumer_makes_the_replica_forget_when_partitions_move() -> None:
    kube, bus = FakeKube(), FakeBus()
    settings = AssistedBootstrapSettings(replica="r1")
    deps = dependencies(settings, bus=bus, kube=kube)
    consumer = build(settings, deps, bus=bus, leases=None)  # type: ignore[arg-type]
    assert consumer.claims is not None
    assert isinstance(consumer.claims.follower, Forgetting)
    assert consumer.claims.follower.seen is deps.seen
