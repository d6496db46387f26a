"""``shared.seen``'s own part: a distrusted view let go, marks per kind, the gathering that
drops own events bringing nothing new. The memories a subclass shares are exercised through
the bootstrap provider's (``test_assisted_bootstrap_seen``)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest

from shared.kube import ResourceKind
from shared.messages import EventType, ObjectRef, ResourceChanged
from shared.ports import KubeReader
from shared.reconcile import Target
from shared.resources import CAPI_CLUSTER, CONFIG_MAP
from shared.seen import Forgetting, Marks, Seen, gather, key_of, mark_of
from tests.fakes import FakeKube

Json = dict[str, Any]
KEY = key_of(CONFIG_MAP, "ns", "c")

pytestmark = pytest.mark.timeout(5)


def obj(name: str = "c", version: str = "5", *, uid: str = "u1", **labels: str) -> Json:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "generation": 1,
            "resourceVersion": version,
            "labels": labels,
        }
    }


def event(found: Json, kind: ResourceKind, kind_event: EventType = "MODIFIED") -> ResourceChanged:
    """An event of ``found`` (``test_assisted_bootstrap_seen`` makes its own with it)."""
    meta = found["metadata"]
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
        object=found,
    )


async def test_a_distrusted_object_is_read_again_and_its_view_let_go() -> None:
    kube, seen = FakeKube(), Seen()
    seen.note(KEY, obj(version="5"))
    seen.decide(KEY, obj(version="5"))
    seen.distrust(KEY)
    assert seen._latest == {}  # nothing kept that no run may use
    assert not seen.nothing_new(CONFIG_MAP, KEY, event(obj(version="5"), CONFIG_MAP))
    seen.note(KEY, obj(version="6"))  # an event: not trusted until read
    assert seen.current(KEY) is None
    stored = kube.put(CONFIG_MAP, obj(version="7"))
    assert await seen.get(kube, CONFIG_MAP, "ns", "c") == stored
    assert await seen.get(kube, CONFIG_MAP, "ns", "c") == stored
    assert kube.reads == 1


async def test_partitions_moving_make_the_replica_forget_everything() -> None:
    seen = Seen()
    seen.note(KEY, obj())
    seen.decide(KEY, obj())
    seen.mark("m", True)
    await Forgetting(seen).lost(frozenset({1}))
    assert seen.current(KEY) is None
    assert seen.decided_reason(KEY, "Ready") is None
    assert not seen.unchanged("m", True)


def _labels(message: ResourceChanged) -> Hashable:
    return tuple(sorted((message.object["metadata"].get("labels") or {}).items()))


MARKS = Marks({CAPI_CLUSTER: _labels})


def test_marks_map_what_changed_and_every_deletion() -> None:
    seen = Seen()
    first = event(obj(a="1"), CAPI_CLUSTER)
    assert MARKS.kind_of(first) == CAPI_CLUSTER
    assert MARKS.kind_of(event(obj(), CONFIG_MAP)) is None
    assert not MARKS.unchanged(seen, CAPI_CLUSTER, first)  # never seen: it maps
    MARKS.record(seen, [first, event(obj(uid="u2"), CONFIG_MAP)])
    assert MARKS.unchanged(seen, CAPI_CLUSTER, event(obj(version="6", a="1"), CAPI_CLUSTER))
    assert not MARKS.unchanged(seen, CAPI_CLUSTER, event(obj(a="2"), CAPI_CLUSTER))
    gone = event(obj(a="1"), CAPI_CLUSTER, "DELETED")
    assert not MARKS.unchanged(seen, CAPI_CLUSTER, gone)
    MARKS.record(seen, [gone])  # takes its mark with it
    assert not MARKS.unchanged(seen, CAPI_CLUSTER, first)
    assert not seen.unchanged(mark_of(CONFIG_MAP, event(obj(uid="u2"), CONFIG_MAP)), ())


async def _wakes_itself_and_d(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return [Target(CONFIG_MAP, "ns", message.ref.name), Target(CONFIG_MAP, "ns", "d")]


async def test_gather_drops_only_targets_woken_by_an_own_event_that_brings_nothing_new() -> None:
    kube, seen = FakeKube(), Seen()
    mappers = {CONFIG_MAP: _wakes_itself_and_d}
    own, d = Target(CONFIG_MAP, "ns", "c"), Target(CONFIG_MAP, "ns", "d")
    message = event(obj(version="5"), CONFIG_MAP)
    assert await gather([message], kube, mappers, seen) == {own: message, d: message}
    seen.decide(KEY, obj(version="5"))
    seen.decide(key_of(CONFIG_MAP, "ns", "d"), obj("d", "5"))
    assert await gather([message], kube, mappers, seen) == {d: message}  # d: not its own
    newer = event(obj(version="6", changed="yes"), CONFIG_MAP)
    assert await gather([newer], kube, mappers, seen) == {own: newer, d: newer}
