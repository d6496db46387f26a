"""The app Platforms' pure rules (H18): which releases, which services, which document."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from services.identity import apps, logic
from shared.messages import ObjectRef, ResourceChanged
from shared.resources import HELM_RELEASE, PLATFORM, cluster_key

Json = dict[str, Any]
APP_LABELS = {"azimuth.stackhpc.com/app-template": "jupyterhub", "addons.stackhpc.com/cluster": "c"}
CLUSTER: Json = {"metadata": {"name": "c", "namespace": "ns", "uid": "u-c"}, "spec": {}}
READY_REALM: Json = {"metadata": {"name": "ns"}, "status": {"phase": "Ready"}}
WEB = {"subdomain": "abc", "fqdn": "abc.example.org", "label": "Web", "iconUrl": "https://i"}


def release(labels: Json = APP_LABELS, services: Any = None, **meta: Any) -> Json:
    annotations = {}
    if services is not None:
        text = services if isinstance(services, str) else json.dumps(services)
        annotations["azimuth.stackhpc.com/services"] = text
    return {
        "metadata": {
            "name": "hub",
            "namespace": "ns",
            "uid": "u-hub",
            "labels": dict(labels),
            "annotations": annotations,
            **meta,
        }
    }


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (APP_LABELS, "c"),
        ({"addons.stackhpc.com/cluster": "c", "capi.stackhpc.com/cluster": "c"}, None),
        ({"azimuth.stackhpc.com/app-template": "jupyterhub"}, None),
        ({}, None),
    ],
)
def test_only_app_releases_belong_to_an_app(labels: Json, expected: str | None) -> None:
    assert apps.app_cluster(release(labels)) == expected


def test_the_annotation_keeps_subdomain_and_fqdn_sorted() -> None:
    other = {"subdomain": "def", "fqdn": "def.example.org"}
    found = apps.zenith_services(release(services={"web": WEB, "api": other}))
    assert found == apps.Services(
        {"api": other, "web": {"subdomain": "abc", "fqdn": "abc.example.org"}}
    )
    assert list(found.services) == ["api", "web"]


@pytest.mark.parametrize(
    ("annotation", "services", "problem"),
    [
        (None, {}, None),
        ("", {}, None),
        ("{not json", {}, "is not JSON"),
        ("[1, 2]", {}, "is not a JSON object"),
        (
            {"web": WEB, "bad": {"subdomain": "x"}},
            {"web": {"subdomain": "abc", "fqdn": "abc.example.org"}},
            "['bad']",
        ),
        ({"odd": "text"}, {}, "['odd']"),
    ],
)
def test_a_bad_annotation_is_no_services_and_says_why(
    annotation: Any, services: Json, problem: str | None
) -> None:
    found = apps.zenith_services(release(services=annotation))
    assert found.services == services
    if problem is None:
        assert found.problem is None
    else:
        assert found.problem is not None
        assert problem in found.problem


def step(platform: Json | None = None, realms: list[Json] | None = None, **kw: Any) -> Any:
    return apps.next_step(
        release(),
        cluster=kw.get("cluster", CLUSTER),
        realms=[READY_REALM] if realms is None else realms,
        platform=platform,
        name="kubeapp-hub",
        services=kw.get("services", {"web": {"subdomain": "abc", "fqdn": "abc.example.org"}}),
    )


def test_the_platform_document_is_owned_by_the_release() -> None:
    applied = step()
    assert isinstance(applied, logic.Apply)
    assert applied.kind == PLATFORM
    assert applied.document == {
        "apiVersion": "identity.azimuth.stackhpc.com/v1alpha1",
        "kind": "Platform",
        "metadata": {
            "name": "kubeapp-hub",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/managed-by": "azimuth-capi-operator",
                "addons.stackhpc.com/cluster": "c",
            },
            "ownerReferences": [
                {
                    "apiVersion": "addons.stackhpc.com/v1alpha1",
                    "kind": "HelmRelease",
                    "name": "hub",
                    "uid": "u-hub",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "realmName": "ns",
            "zenithServices": {"web": {"subdomain": "abc", "fqdn": "abc.example.org"}},
        },
    }
    stored = copy.deepcopy(applied.document)
    stored["status"] = {"phase": "Ready"}
    assert step(stored) == logic.Verdict(True, "Ready", "Platform kubeapp-hub is current")


def test_the_platform_lands_in_its_clusters_partition() -> None:
    applied = step()
    assert isinstance(applied, logic.Apply)
    # Its events are handled where the release's and the Cluster's are: one replica per app.
    assert cluster_key(PLATFORM, applied.document) == "ns/c"
    assert cluster_key(HELM_RELEASE, release()) == "ns/c"


def test_a_platform_without_the_cluster_label_is_applied_again() -> None:
    applied = step()
    assert isinstance(applied, logic.Apply)
    older = copy.deepcopy(applied.document)  # as written before the label was added
    del older["metadata"]["labels"]["addons.stackhpc.com/cluster"]
    again = step(older)
    assert isinstance(again, logic.Apply)
    assert again.document["metadata"]["labels"]["addons.stackhpc.com/cluster"] == "c"


def test_no_services_omit_the_key_and_removed_ones_are_applied_again() -> None:
    with_services = step()
    assert isinstance(with_services, logic.Apply)
    bare = step(services={})
    assert isinstance(bare, logic.Apply)
    assert bare.document["spec"] == {"realmName": "ns"}
    assert isinstance(step(with_services.document, services={}), logic.Apply)


def test_the_apps_realm_is_the_clusters() -> None:
    chosen = {"metadata": {"name": "chosen"}, "status": {"phase": "Ready"}}
    cluster = {**CLUSTER, "spec": {"zenithIdentityRealmName": "chosen"}}
    applied = step(cluster=cluster, realms=[READY_REALM, chosen])
    assert isinstance(applied, logic.Apply)
    assert applied.document["spec"]["realmName"] == "chosen"


@pytest.mark.parametrize(
    ("realms", "reason"),
    [([], "RealmNotFound"), ([{"metadata": {"name": "ns"}}], "RealmNotReady")],
)
def test_without_a_usable_realm_the_app_waits(realms: list[Json], reason: str) -> None:
    waiting = step(realms=realms)
    assert isinstance(waiting, logic.Verdict)
    assert (waiting.ready, waiting.reason) == (False, reason)


def event(kind: Any, name: str, obj: Json) -> ResourceChanged:
    return ResourceChanged(
        source="t",
        correlation_id="x",
        event="MODIFIED",
        ref=ObjectRef(api_version=kind.api_version, kind=kind.kind, namespace="ns", name=name),
        resource_version="1",
        object=obj,
    )


def test_events_that_concern_an_app() -> None:
    owned = {"metadata": {"ownerReferences": [apps.release_owner(release())]}}
    cluster_platform = {"metadata": {"ownerReferences": [logic.owner_reference(CLUSTER)]}}
    messages = [
        event(HELM_RELEASE, "hub", release()),
        event(HELM_RELEASE, "addon", release({"capi.stackhpc.com/cluster": "c"})),
        event(
            PLATFORM,
            "kubeapp-other",
            {"metadata": {"ownerReferences": [{**apps.release_owner(release()), "name": "other"}]}},
        ),
        event(PLATFORM, "kube-c", cluster_platform),
        event(HELM_RELEASE, "hub", release()),
        event(PLATFORM, "kubeapp-hub", owned),
    ]
    assert apps.releases_touched(messages) == [("ns", "hub"), ("ns", "other")]
