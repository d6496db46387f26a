"""Discovery's pure rules: naming, labels, addon mapping and the status diff."""

import base64
import json
from typing import Any

from services.discovery import logic
from shared import mergepatch
from shared.mergepatch import apply
from shared.resources import HELM_RELEASE, MANIFESTS

Json = dict[str, Any]


def reservation(
    name: str,
    namespace: str = "apps",
    *,
    phase: str = "Ready",
    release: tuple[str, str] | None = ("apps", "jupyter"),
    **notes: str,
) -> Json:
    annotations = dict(notes)
    if release:
        annotations["meta.helm.sh/release-namespace"] = release[0]
        annotations["meta.helm.sh/release-name"] = release[1]
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "status": {"phase": phase, "subdomain": f"sd-{name}", "fqdn": f"sd-{name}.example.test"},
    }


def addon(name: str, release: tuple[str, str], *, chart: bool, kind: Any = HELM_RELEASE) -> Any:
    labels = {
        "addons.stackhpc.com/cluster": "demo",
        "addons.stackhpc.com/release-namespace": release[0],
        "addons.stackhpc.com/release-name": release[1],
    }
    if chart:
        labels["capi.stackhpc.com/cluster"] = "demo"
    return logic.Addon.of(kind, {"metadata": {"name": name, "namespace": "ns", "labels": labels}})


def test_service_name_keeps_a_name_that_starts_with_its_namespace() -> None:
    assert logic.service_name(reservation("apps-notebook")) == "apps-notebook"
    assert logic.service_name(reservation("notebook")) == "apps-notebook"


def test_label_from_annotation_else_capitalised_words_of_the_reservation_name() -> None:
    assert logic.service_label(reservation("jupyter-hub-client")) == "Jupyter Hub Client"
    named = reservation("x", **{"azimuth.stackhpc.com/service-label": " My Hub "})
    assert logic.service_label(named) == "My Hub"
    blank = reservation("dask-ui", **{"azimuth.stackhpc.com/service-label": "  "})
    assert logic.service_label(blank) == "Dask Ui"


def test_status_is_camel_case_without_absent_fields() -> None:
    plain = logic.service_status(reservation("hub"))
    assert plain == {"subdomain": "sd-hub", "fqdn": "sd-hub.example.test", "label": "Hub"}
    full = logic.service_status(
        reservation(
            "hub",
            **{
                "azimuth.stackhpc.com/service-icon-url": "https://icons.test/hub.png",
                "azimuth.stackhpc.com/service-description": "Notebooks",
            },
        )
    )
    assert full is not None
    assert (full["iconUrl"], full["description"]) == ("https://icons.test/hub.png", "Notebooks")


def test_an_icon_url_the_crd_would_reject_is_left_out() -> None:
    status = logic.service_status(
        reservation("hub", **{"azimuth.stackhpc.com/service-icon-url": "not a url"})
    )
    assert status is not None
    assert "iconUrl" not in status


def test_only_ready_reservations_from_a_helm_release_are_services() -> None:
    found = logic.services(
        [
            reservation("a"),
            reservation("b", phase="Pending"),
            reservation("c", release=None),
            {"metadata": {"name": "d", "namespace": "apps"}, "status": {"phase": "Ready"}},
        ]
    )
    assert [s.name for s in found] == ["apps-a"]
    assert found[0].release == ("apps", "jupyter")


def test_helm_release_wins_over_manifests_and_the_first_of_each_kind_owns() -> None:
    release = ("apps", "jupyter")
    first = addon("first", release, chart=False)
    second = addon("second", release, chart=False)
    manifests = addon("m", release, chart=True, kind=MANIFESTS)
    plan = logic.plan(logic.services([reservation("hub")]), [first, second, manifests])
    patched = {
        a.name: json.loads(p["metadata"]["annotations"][logic.SERVICES_ANNOTATION])
        for a, p in plan.annotations
    }
    assert set(patched) == {"first"}
    assert list(patched["first"]) == ["apps-hub"]
    # An app (no capi.stackhpc.com/cluster) keeps its services out of the Cluster's status.
    assert plan.cluster_services == {}


def test_chart_addon_services_reach_the_cluster_and_stale_annotations_are_emptied() -> None:
    chart = addon("demo-monitoring", ("monitoring", "kps"), chart=True)
    stale = logic.Addon(
        HELM_RELEASE,
        "ns",
        "old",
        {"addons.stackhpc.com/release-namespace": "x", "addons.stackhpc.com/release-name": "y"},
        {logic.SERVICES_ANNOTATION: json.dumps({"gone": {"fqdn": "f"}})},
    )
    found = logic.services([reservation("kps-client", "monitoring", release=("monitoring", "kps"))])
    plan = logic.plan(found, [chart, stale])
    assert set(plan.cluster_services) == {"monitoring-kps-client"}
    patches = {
        a.name: p["metadata"]["annotations"][logic.SERVICES_ANNOTATION] for a, p in plan.annotations
    }
    assert json.loads(patches["old"]) == {}
    assert set(json.loads(patches["demo-monitoring"])) == {"monitoring-kps-client"}


def test_an_addon_that_already_says_so_is_not_patched() -> None:
    status = logic.service_status(reservation("hub"))
    current = {logic.SERVICES_ANNOTATION: json.dumps({"apps-hub": status})}
    same = logic.Addon(
        HELM_RELEASE, "ns", "a", addon("a", ("apps", "jupyter"), chart=False).labels, current
    )
    assert logic.plan(logic.services([reservation("hub")]), [same]).annotations == []
    untouched = addon("b", ("apps", "other"), chart=False)  # no annotation, nothing to announce
    assert logic.annotation_patch(untouched, {}) is None
    garbled = logic.Addon(HELM_RELEASE, "ns", "c", {}, {logic.SERVICES_ANNOTATION: "{oops"})
    assert logic.annotation_patch(garbled, {}) is not None


def test_merge_diff_removes_with_null_and_is_exact() -> None:
    current = {"a": {"fqdn": "a", "iconUrl": "https://i"}, "b": {"fqdn": "b"}}
    wanted = {"a": {"fqdn": "a"}, "c": {"fqdn": "c"}}
    patch = mergepatch.diff(current, wanted)
    assert patch == {"a": {"iconUrl": None}, "b": None, "c": {"fqdn": "c"}}
    assert apply(current, patch) == wanted
    assert mergepatch.diff(wanted, wanted) == {}


def test_belief_folds_recent_patches_into_a_read() -> None:
    belief = logic.Belief(replay=30)
    belief.read({"services": {"a": {"fqdn": "a"}}}, now=0)
    belief.record({"a": None, "b": {"fqdn": "b"}}, now=1)
    # A read that predates the patch still counts it; a much later one does not.
    belief.read({"services": {"a": {"fqdn": "a"}}}, now=5)
    assert belief.services == {"b": {"fqdn": "b"}}
    belief.read({"services": {"a": {"fqdn": "a"}}}, now=100)
    assert belief.services == {"a": {"fqdn": "a"}}


def test_kubeconfig_secret_and_its_value() -> None:
    secret = {
        "metadata": {
            "name": "demo-kubeconfig",
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        },
        "data": {"value": base64.b64encode(b"apiVersion: v1").decode()},
    }
    assert logic.kubeconfig_owner(secret) == "demo"
    assert logic.kubeconfig_text(secret) == "apiVersion: v1"
    ca = {"metadata": {"name": "demo-ca", "labels": {"cluster.x-k8s.io/cluster-name": "demo"}}}
    assert logic.kubeconfig_owner(ca) is None
    assert logic.kubeconfig_text({"data": {"value": "***"}}) is None
