"""The exporter's series: upstream's names, labels and values, from events (no network)."""

from __future__ import annotations

import itertools
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

from services.exporter import logic
from services.exporter.logic import SPECS, Series
from shared.kube import ResourceKind
from shared.messages import EventType, ObjectRef, ResourceChanged
from shared.metrics import render_families
from shared.resources import APP_TEMPLATE, CLUSTER, CLUSTER_TEMPLATE, HELM_RELEASE, MACHINE

Json = dict[str, Any]

CLUSTER_TEMPLATE_OBJ: Json = {
    "metadata": {"name": "kube-1-31"},
    "spec": {"values": {"kubernetesVersion": "1.31.2"}, "deprecated": True},
}
APP_TEMPLATE_OBJ: Json = {
    "metadata": {"name": "jupyterhub"},
    "spec": {"chart": {"repo": "https://charts.example", "name": "jupyterhub"}},
    "status": {
        "versions": [{"name": "4.0.1"}, {"name": "3.9.0"}],
        "lastSync": "2024-05-01T12:00:00+00:00",
    },
}
CLUSTER_OBJ: Json = {
    "metadata": {"name": "demo", "namespace": "az-t"},
    "spec": {"templateName": "kube-1-31"},
    "status": {
        "kubernetesVersion": "1.31.2",
        "phase": "Ready",
        "networkingPhase": "Provisioned",
        "controlPlanePhase": "Ready",
        "nodeCount": 2,
        "nodes": {
            "demo-cp-1": {"role": "control-plane", "phase": "Ready", "kubeletVersion": "v1.31.2"},
            "demo-md-0-x": {"role": "worker", "phase": "Provisioning", "nodeGroup": "md-0"},
        },
        "addonCount": 1,
        "addons": {"cni-calico": {"phase": "Deployed"}},
    },
}
APP_OBJ: Json = {
    "metadata": {
        "name": "notebook",
        "namespace": "az-t",
        "labels": {"azimuth.stackhpc.com/app-template": "jupyterhub"},
    },
    "spec": {
        "clusterName": "demo",
        "targetNamespace": "notebook",
        "releaseName": "notebook",
        "chart": {"repo": "https://charts.example", "name": "jupyterhub", "version": "4.0.1"},
    },
    "status": {"phase": "Deployed"},
}
CT = {"template_name": "kube-1-31"}
AT = {"template_name": "jupyterhub"}
CL = {"cluster_namespace": "az-t", "cluster_name": "demo"}
APP = {
    "app_namespace": "az-t",
    "app_name": "notebook",
    "app_template": "jupyterhub",
    "target_cluster": "demo",
}


_VERSIONS = itertools.count(1)


def event(
    kind: ResourceKind, obj: Json, how: EventType = "ADDED", version: str | None = None
) -> ResourceChanged:
    """The watcher's event for ``obj``; each at a newer resourceVersion unless one is given."""
    meta = obj["metadata"]
    return ResourceChanged(
        source="t",
        correlation_id="c",
        event=how,
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=meta.get("namespace"),
            name=meta["name"],
        ),
        resource_version=version or str(next(_VERSIONS)),
        object=obj,
    )


def scrape(series: Series) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by series name, parsed back from the OpenMetrics a scrape returns."""
    body, _ = render_families(series.families(), "application/openmetrics-text; version=1.0.0")
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in parse_om(body.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def full() -> Series:
    series = Series()
    series.apply(event(CLUSTER_TEMPLATE, CLUSTER_TEMPLATE_OBJ))
    series.apply(event(APP_TEMPLATE, APP_TEMPLATE_OBJ))
    series.apply(event(CLUSTER, CLUSTER_OBJ))
    series.apply(event(HELM_RELEASE, APP_OBJ))
    return series


def test_every_family_has_upstreams_name_labels_and_value() -> None:
    got = scrape(full())
    expected = {
        "azimuth_kube_clustertemplate_kube_version": [({**CT, "kube_version": "1.31.2"}, 1)],
        "azimuth_kube_clustertemplate_deprecated": [(CT, 1)],
        "azimuth_kube_apptemplate_info": [
            ({**AT, "chart_repo": "https://charts.example", "chart_name": "jupyterhub"}, 1)
        ],
        "azimuth_kube_apptemplate_last_sync": [(AT, 1714564800)],
        "azimuth_kube_apptemplate_latest_version": [({**AT, "version": "4.0.1"}, 1)],
        "azimuth_kube_apptemplate_version": [
            ({**AT, "version": "4.0.1"}, 1),
            ({**AT, "version": "3.9.0"}, 1),
        ],
        "azimuth_kube_cluster_template": [({**CL, "template": "kube-1-31"}, 1)],
        "azimuth_kube_cluster_kube_version": [({**CL, "kube_version": "1.31.2"}, 1)],
        "azimuth_kube_cluster_phase": [({**CL, "phase": "Ready"}, 1)],
        "azimuth_kube_cluster_networking_phase": [({**CL, "phase": "Provisioned"}, 1)],
        "azimuth_kube_cluster_control_plane_phase": [({**CL, "phase": "Ready"}, 1)],
        "azimuth_kube_cluster_node_count": [(CL, 2)],
        "azimuth_kube_cluster_node_phase": [
            (
                {**CL, "node": "demo-cp-1", "role": "control-plane", "group": "", "phase": "Ready"},
                1,
            ),
            (
                {**CL, "node": "demo-md-0-x", "role": "worker", "group": "md-0"}
                | {"phase": "Provisioning"},
                1,
            ),
        ],
        "azimuth_kube_cluster_node_kubelet_version": [
            (
                {**CL, "node": "demo-cp-1", "role": "control-plane", "group": ""}
                | {"kubelet_version": "v1.31.2"},
                1,
            ),
            (
                {**CL, "node": "demo-md-0-x", "role": "worker", "group": "md-0"}
                | {"kubelet_version": ""},
                1,
            ),
        ],
        "azimuth_kube_cluster_addon_count": [(CL, 1)],
        "azimuth_kube_cluster_addon_phase": [
            ({**CL, "addon": "cni-calico", "phase": "Deployed"}, 1)
        ],
        "azimuth_kube_app_info": [
            (
                {
                    **APP,
                    "target_namespace": "notebook",
                    "release_name": "notebook",
                    "chart_repo": "https://charts.example",
                    "chart_name": "jupyterhub",
                    "chart_version": "4.0.1",
                },
                1,
            )
        ],
        "azimuth_kube_app_phase": [({**APP, "phase": "Deployed"}, 1)],
    }
    assert set(expected) == {spec.name for spec in SPECS}
    assert got == expected


def test_missing_status_reads_as_upstreams_defaults() -> None:
    series = Series()
    series.apply(event(CLUSTER, {"metadata": CLUSTER_OBJ["metadata"], "spec": {}}))
    app = {"metadata": APP_OBJ["metadata"], "spec": {}}
    series.apply(event(HELM_RELEASE, app))
    series.apply(event(APP_TEMPLATE, {"metadata": {"name": "jupyterhub"}, "spec": {}}))
    series.apply(event(CLUSTER_TEMPLATE, {"metadata": {"name": "kube-1-31"}, "spec": {}}))
    got = scrape(series)
    assert got["azimuth_kube_cluster_phase"] == [({**CL, "phase": "Unknown"}, 1)]
    assert got["azimuth_kube_cluster_kube_version"] == [({**CL, "kube_version": ""}, 1)]
    assert got["azimuth_kube_cluster_template"] == [({**CL, "template": ""}, 1)]
    assert got["azimuth_kube_cluster_node_count"] == [(CL, 0)]
    assert "azimuth_kube_cluster_node_phase" not in got
    assert got["azimuth_kube_app_phase"] == [({**APP, "target_cluster": "", "phase": "Unknown"}, 1)]
    assert got["azimuth_kube_apptemplate_latest_version"] == [({**AT, "version": "0.0.0"}, 1)]
    assert got["azimuth_kube_apptemplate_last_sync"] == [(AT, 0)]
    assert "azimuth_kube_apptemplate_version" not in got
    assert got["azimuth_kube_clustertemplate_deprecated"] == [(CT, 0)]
    assert got["azimuth_kube_clustertemplate_kube_version"] == [({**CT, "kube_version": ""}, 1)]


def test_modified_replaces_and_deleted_removes() -> None:
    series = full()
    modified = {**CLUSTER_OBJ, "status": {**CLUSTER_OBJ["status"], "phase": "Upgrading"}}
    series.apply(event(CLUSTER, modified, "MODIFIED"))
    assert scrape(series)["azimuth_kube_cluster_phase"] == [({**CL, "phase": "Upgrading"}, 1)]
    series.apply(event(CLUSTER, modified, "DELETED"))
    series.apply(event(HELM_RELEASE, APP_OBJ, "DELETED"))
    got = scrape(series)
    assert not [
        name for name in got if name.startswith(("azimuth_kube_cluster_", "azimuth_kube_app_"))
    ]
    assert "azimuth_kube_clustertemplate_deprecated" in got
    assert len(series) == 2


def test_only_helmreleases_of_app_templates_are_apps() -> None:
    series = Series()
    addon = {**APP_OBJ, "metadata": {"name": "cni", "namespace": "az-t", "labels": {}}}
    series.apply(event(HELM_RELEASE, addon))
    assert len(series) == 0
    series.apply(event(HELM_RELEASE, APP_OBJ))
    unlabelled = {**APP_OBJ, "metadata": {**APP_OBJ["metadata"], "labels": {}}}
    series.apply(event(HELM_RELEASE, unlabelled, "MODIFIED"))
    assert len(series) == 0


def test_other_kinds_and_bad_values_do_not_break_a_scrape() -> None:
    series = Series()
    series.apply(event(MACHINE, {"metadata": {"name": "m", "namespace": "n"}}))
    broken = {
        "metadata": {"name": "jupyterhub"},
        "spec": {"chart": "not-an-object"},
        "status": {"lastSync": "yesterday", "versions": "many"},
    }
    series.apply(event(APP_TEMPLATE, broken))
    got = scrape(series)
    assert got["azimuth_kube_apptemplate_last_sync"] == [(AT, 0)]
    assert got["azimuth_kube_apptemplate_info"] == [({**AT, "chart_repo": "", "chart_name": ""}, 1)]


# --- the start-up list and the events after it ------------------------------------------------


def cluster(phase: str, version: str, name: str = "demo") -> Json:
    meta = {"name": name, "namespace": "az-t", "resourceVersion": version}
    return {"metadata": meta, "spec": {}, "status": {"phase": phase}}


def phases(series: Series) -> dict[str, str]:
    samples = scrape(series).get("azimuth_kube_cluster_phase", [])
    return {labels["cluster_name"]: labels["phase"] for labels, _ in samples}


def test_events_the_list_already_shows_do_not_override_it() -> None:
    series = Series()
    series.baseline(CLUSTER, [cluster("Ready", "150")], "200")
    assert phases(series) == {"demo": "Ready"}

    # Replayed from the stream: older than the list, for a listed object and for one deleted
    # before the list whose DELETED event aged out.
    assert not series.apply(event(CLUSTER, cluster("Pending", "120"), "MODIFIED", "120"))
    assert not series.apply(event(CLUSTER, cluster("Ready", "90", "gone"), "MODIFIED", "90"))
    assert phases(series) == {"demo": "Ready"}

    # After the list: applied, in order; a late older event does not undo a newer one.
    assert series.apply(event(CLUSTER, cluster("Upgrading", "210"), "MODIFIED", "210"))
    assert not series.apply(event(CLUSTER, cluster("Ready", "205"), "MODIFIED", "205"))
    assert phases(series) == {"demo": "Upgrading"}


def test_deletions_after_the_list_apply_and_stay() -> None:
    series = Series()
    series.baseline(CLUSTER, [cluster("Ready", "150")], "200")

    assert series.apply(event(CLUSTER, cluster("Ready", "220"), "DELETED", "220"))
    assert phases(series) == {}
    assert not series.apply(event(CLUSTER, cluster("Ready", "215"), "MODIFIED", "215"))
    assert phases(series) == {}
    # A new object of the same name comes later, at a newer version.
    assert series.apply(event(CLUSTER, cluster("Pending", "230"), "ADDED", "230"))
    assert phases(series) == {"demo": "Pending"}


def test_each_kind_has_its_own_list() -> None:
    series = Series()
    series.baseline(CLUSTER, [], "200")
    series.baseline(CLUSTER_TEMPLATE, [CLUSTER_TEMPLATE_OBJ], "100")
    # The stream's only trace of this quiet template aged out: the list alone shows it.
    assert "azimuth_kube_clustertemplate_deprecated" in scrape(series)
    # A kind that was not listed takes every event.
    assert series.apply(event(HELM_RELEASE, APP_OBJ, version="5"))
    assert not series.apply(event(CLUSTER, cluster("Ready", "150"), version="150"))
    assert len(series) == 2


def test_a_version_that_is_not_a_number_is_applied_in_stream_order() -> None:
    series = Series()
    series.baseline(CLUSTER, [cluster("Ready", "150")], "200")
    assert series.apply(event(CLUSTER, cluster("Failed", "x"), "MODIFIED", "opaque-1"))
    assert phases(series) == {"demo": "Failed"}


def test_tombstones_are_bounded_and_the_newest_still_hold() -> None:
    """10,000 Clusters more than the tombstones added and deleted: what is kept is bounded,
    and a late older event of a recent deletion still brings nothing back."""
    series = Series()
    count = logic.TOMBSTONES + 10_000
    for i in range(count):
        name = f"c{i}"
        series.apply(
            event(CLUSTER, cluster("Ready", str(3 * i + 1), name), "ADDED", str(3 * i + 1))
        )
        series.apply(
            event(CLUSTER, cluster("Ready", str(3 * i + 2), name), "DELETED", str(3 * i + 2))
        )
    assert len(series) == 0
    assert series.remembered() == logic.TOMBSTONES
    last = f"c{count - 1}"
    late = cluster("Ready", str(3 * count - 2), last)
    assert not series.apply(event(CLUSTER, late, "MODIFIED", str(3 * count - 2)))
    assert len(series) == 0
