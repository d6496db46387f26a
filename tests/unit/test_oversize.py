"""The rule for objects too large for one message: what is left out, and how it comes back."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import KubeNotFound, MessageTooLarge
from shared.kube import ResourceKind
from shared.messages import ResourceChanged, encode
from shared.oversize import complete, complete_all, fit, kind_of, limit_for
from shared.resources import HELM_RELEASE, SECRET, ref_to

Json = dict[str, Any]
LIMIT = 20_000


def event(obj: Json, *, kind: ResourceKind = HELM_RELEASE, event: str = "MODIFIED") -> Any:
    meta = obj["metadata"]
    return ResourceChanged(
        source="watcher/test",
        correlation_id="cluster:ns/demo",
        event=event,  # type: ignore[arg-type]
        ref=ref_to(kind, obj),
        resource_version=meta["resourceVersion"],
        object=obj,
    )


def release(*, values: int = 10, status: int = 10, annotations: int = 0) -> Json:
    return {
        "apiVersion": HELM_RELEASE.api_version,
        "kind": "HelmRelease",
        "metadata": {
            "name": "demo-addon",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "7",
            "labels": {"capi.stackhpc.com/cluster": "demo"},
            "annotations": {"note": "n" * annotations},
        },
        "spec": {"clusterName": "demo", "values": {"blob": "v" * values}},
        "status": {"phase": "Deployed", "revision": 2, "notes": "s" * status},
    }


def test_a_message_that_fits_is_left_alone() -> None:
    message = event(release())
    assert fit(message, plural="helmreleases", limit=LIMIT) is message


def test_the_largest_field_goes_first_and_the_rest_stays() -> None:
    message = event(release(values=30_000))
    fitted = fit(message, plural="helmreleases", limit=LIMIT)
    assert fitted.trimmed is not None
    assert fitted.trimmed.fields == ("spec",)
    assert fitted.trimmed.size == len(encode(message))
    assert fitted.trimmed.plural == "helmreleases"
    assert fitted.object["status"]["phase"] == "Deployed"
    assert fitted.object["metadata"] == message.object["metadata"]
    assert len(encode(fitted)) <= LIMIT


def test_fields_go_biggest_first_until_it_fits() -> None:
    fitted = fit(event(release(values=22_000, status=21_000)), plural="hr", limit=LIMIT)
    assert fitted.trimmed is not None
    assert fitted.trimmed.fields == ("spec", "status")
    assert set(fitted.object) == {"apiVersion", "kind", "metadata"}


def test_annotations_go_last_and_identity_always_stays() -> None:
    fitted = fit(event(release(annotations=30_000)), plural="hr", limit=LIMIT)
    assert fitted.trimmed is not None
    assert fitted.trimmed.fields[-1] == "metadata.annotations"
    meta = fitted.object["metadata"]
    assert "annotations" not in meta
    assert meta["labels"] == {"capi.stackhpc.com/cluster": "demo"}
    assert (meta["name"], meta["uid"]) == ("demo-addon", "u-1")
    assert fitted.object["apiVersion"] == HELM_RELEASE.api_version


def test_an_identity_larger_than_the_limit_is_refused() -> None:
    with pytest.raises(MessageTooLarge):
        fit(event(release(values=30_000)), plural="hr", limit=200)


def test_the_limit_keeps_room_for_headers_and_subject() -> None:
    assert 0 < limit_for(1 << 20) < 1 << 20


class Reader:
    def __init__(self, *objects: Json) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.asked: list[tuple[str, str | None, str]] = []

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self.asked.append((kind.path(namespace, name), namespace, name))
        if name not in self.objects:
            raise KubeNotFound(name)
        return self.objects[name]


async def test_a_trimmed_event_is_made_whole_from_the_api_server() -> None:
    whole = release(values=30_000)
    trimmed = fit(event(whole), plural="helmreleases", limit=LIMIT)
    reader = Reader({**whole, "metadata": {**whole["metadata"], "managedFields": [{}]}})
    completed = await complete(trimmed, objects=reader)
    assert completed.trimmed is None
    assert completed.object["spec"] == whole["spec"]
    assert "managedFields" not in completed.object["metadata"]
    assert (
        reader.asked[0][0]
        == "/apis/addons.stackhpc.com/v1alpha1/namespaces/ns/helmreleases/demo-addon"
    )


async def test_an_object_gone_or_replaced_stays_trimmed() -> None:
    trimmed = fit(event(release(values=30_000)), plural="helmreleases", limit=LIMIT)
    assert (await complete(trimmed, objects=Reader())).trimmed is not None
    other = release()
    other["metadata"]["uid"] = "u-2"
    assert (await complete(trimmed, objects=Reader(other))).trimmed is not None


async def test_deletions_and_whole_events_are_not_read_back() -> None:
    reader = Reader(release())
    deleted = fit(event(release(values=30_000), event="DELETED"), plural="hr", limit=LIMIT)
    whole = event(release())
    assert await complete(deleted, objects=reader) is deleted
    assert await complete_all((whole,), objects=reader) == (whole,)
    assert reader.asked == []


async def test_a_secret_read_back_never_carries_its_data() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "demo-kubeconfig",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "3",
            "annotations": {"big": "a" * 30_000},
        },
    }
    trimmed = fit(event(secret, kind=SECRET), plural="secrets", limit=LIMIT)
    reader = Reader({**secret, "data": {"value": "c2VjcmV0"}, "stringData": {"x": "y"}})
    completed = await complete(trimmed, objects=reader)
    assert completed.trimmed is None
    assert not {"data", "stringData"} & completed.object.keys()
    assert kind_of(trimmed).path("ns", "x") == "/api/v1/namespaces/ns/secrets/x"


async def test_a_batch_reads_each_trimmed_object_once() -> None:
    whole = release(values=30_000)
    first = fit(event(whole), plural="helmreleases", limit=LIMIT)
    second = first.model_copy(update={"resource_version": "8"})
    reader = Reader(whole)
    completed = await complete_all((first, second), objects=reader)
    assert [m.trimmed for m in completed] == [None, None]  # type: ignore[attr-defined]
    assert len(reader.asked) == 1
