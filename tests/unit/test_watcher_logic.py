from typing import Any

from services.watcher.handlers import Scope, relist
from services.watcher.logic import (
    Change,
    Known,
    change_from_watch,
    changes_from_list,
    dedupe_id,
    remember,
    to_message,
)
from shared import subjects
from shared.messages import ResourceChanged
from shared.resources import CLUSTER, MACHINE, SECRET
from tests.fakes import FakeBus, FakeKube


def obj(name: str, uid: str, rv: str, ns: str = "t", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv, **meta}}


def known(o: dict[str, Any], deleted: bool = False) -> Known:
    m = o["metadata"]
    return Known(uid=m["uid"], resource_version=m["resourceVersion"], deleted=deleted, object=o)


def test_list_against_empty_memory_adds_everything() -> None:
    changes = changes_from_list({}, [obj("a", "1", "5"), obj("b", "2", "6")], "10")
    assert [(c.event, c.resource_version) for c in changes] == [("ADDED", "5"), ("ADDED", "6")]


def test_list_publishes_only_what_changed_and_what_vanished() -> None:
    memory = {
        "t/a": known(obj("a", "1", "5")),
        "t/b": known(obj("b", "2", "6")),
        "t/gone": known(obj("gone", "3", "7")),
        "t/old": known(obj("old", "4", "8"), deleted=True),
    }
    changes = changes_from_list(memory, [obj("a", "1", "5"), obj("b", "2", "9")], "12")
    assert [(c.event, c.object["metadata"]["name"], c.resource_version) for c in changes] == [
        ("MODIFIED", "b", "9"),
        ("DELETED", "gone", "12"),
    ]


def test_recreated_name_is_a_deletion_then_an_addition() -> None:
    memory = {"t/a": known(obj("a", "old-uid", "5"))}
    changes = changes_from_list(memory, [obj("a", "new-uid", "9")], "10")
    assert [(c.event, c.uid) for c in changes] == [("DELETED", "old-uid"), ("ADDED", "new-uid")]


def test_watch_event_already_in_stream_is_skipped() -> None:
    memory = {"t/a": known(obj("a", "1", "5"))}
    assert change_from_watch(memory, "MODIFIED", obj("a", "1", "5")) is None
    change = change_from_watch(memory, "MODIFIED", obj("a", "1", "6"))
    assert change is not None
    assert change.dedupe_id == "1:6:MODIFIED"


def test_deletion_id_does_not_depend_on_who_saw_it() -> None:
    assert dedupe_id("u", "5", "DELETED") == dedupe_id("u", "99", "DELETED") == "u:DELETED"


def test_related_objects_share_their_cluster_partition_and_story() -> None:
    cluster = obj("demo", "c1", "1")
    machine = obj("demo-md-0-abc", "m1", "2", labels={"cluster.x-k8s.io/cluster-name": "demo"})
    changes = changes_from_list({}, [cluster], "3") + changes_from_list({}, [machine], "3")
    (s1, m1, _), (s2, m2, _) = (
        to_message(CLUSTER, changes[0], partitions=16, source="w"),
        to_message(MACHINE, changes[1], partitions=16, source="w"),
    )
    assert s1.split(".")[3] == s2.split(".")[3]
    assert m1.correlation_id == m2.correlation_id == "cluster:t/demo"
    assert s2 == subjects.resource_event("machine", int(s2.split(".")[3]), "t", "demo-md-0-abc")


async def test_secret_data_never_reaches_a_message() -> None:
    kube, bus = FakeKube(), FakeBus()
    secret = obj(
        "demo-kubeconfig",
        "s1",
        "4",
        annotations={
            "kubectl.kubernetes.io/last-applied-configuration": '{"data":{"v":"c2VjcmV0"}}'
        },
    )
    kube.put(SECRET, {**secret, "data": {"value": "c2VjcmV0"}})
    scope = Scope(kind=SECRET, source="w", partitions=4)
    await relist(scope=scope, known={}, kube=kube, bus=bus)
    (message,) = bus.of(ResourceChanged)
    assert "data" not in message.object
    assert "c2VjcmV0" not in message.model_dump_json()


def test_memory_forgets_deleted_objects() -> None:
    """10,000 objects added then deleted leave nothing behind (no tombstones)."""
    memory: dict[str, Known] = {}
    objects = [obj(f"c{i}", f"u{i}", str(i + 1)) for i in range(10_000)]
    for o in objects:
        remember(memory, Change("ADDED", o, o["metadata"]["resourceVersion"]))
    assert len(memory) == 10_000
    for o in objects:
        remember(memory, Change("DELETED", o, "20000"))
    assert memory == {}


def test_an_object_forgotten_after_deletion_is_new_again() -> None:
    memory: dict[str, Known] = {}
    first = obj("a", "old-uid", "5")
    remember(memory, Change("ADDED", first, "5"))
    remember(memory, Change("DELETED", first, "7"))
    assert changes_from_list(memory, [], "8") == []
    changes = changes_from_list(memory, [obj("a", "new-uid", "9")], "10")
    assert [(c.event, c.uid) for c in changes] == [("ADDED", "new-uid")]
