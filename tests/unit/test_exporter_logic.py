"""The exporter's series: upstream's names, labels and values, from events (no network)."""

from __future__ import annotations

from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

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


def event(kind: ResourceKind, obj: Json, how: EventType = "ADDED") -> ResourceChanged:
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
        resource_version="1",
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
