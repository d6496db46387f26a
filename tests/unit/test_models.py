"""The azimuth.stackhpc.com models parse what the portal and upstream write, apply upstream's
defaults at parse time, and enforce upstream's validators with the CEL rules' wording."""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from shared.models import (
    AddonPhase,
    AppTemplate,
    Cluster,
    ClusterPhase,
    ClusterTemplate,
    ConditionStatus,
    ControlPlanePhase,
    LeasePhase,
    NetworkingPhase,
    NodeGroupSpec,
    NodePhase,
    NodeRole,
)
from shared.models import azimuth as models


def _cluster(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "label": "demo",
        "templateName": "kube-1-31",
        "cloudCredentialsSecretName": "demo-cloud-credentials",
        "controlPlaneMachineSize": "m1.medium",
        "nodeGroups": [{"name": "md-0", "machineSize": "m1.large", "count": 2}],
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "azimuth.stackhpc.com/v1alpha1",
        "kind": "Cluster",
        "metadata": {
            "name": "demo",
            "namespace": "az-tenant",
            "uid": "0b5e",
            "resourceVersion": "42",
            "labels": {"azimuth.stackhpc.com/cluster-template": "kube-1-31"},
            "managedFields": [{"manager": "azimuth"}],
        },
        "spec": spec,
    }


def _errors(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[tuple[Any, ...], str]]:
    # Pydantic locates errors in validated *defaults* by Python name, others by alias.
    return [
        (tuple(to_camel(p) if isinstance(p, str) else p for p in err["loc"]), err["msg"])
        for err in exc.value.errors()
    ]


# --------------------------------------------------------------------------------------------
# Parsing whole objects
# --------------------------------------------------------------------------------------------


def test_full_cluster_object_parses_with_upstream_defaults() -> None:
    cluster = Cluster.model_validate(_cluster())

    assert cluster.metadata.name == "demo"
    assert cluster.metadata.resource_version == "42"
    assert cluster.spec.template_name == "kube-1-31"
    assert cluster.spec.paused is False
    assert cluster.spec.autohealing is True
    assert cluster.spec.zenith_identity_realm_name is None
    assert cluster.spec.node_groups[0].autoscale is False
    addons = cluster.spec.addons
    assert (addons.dashboard, addons.ingress, addons.monitoring) == (False, False, False)
    assert addons.monitoring_prometheus_volume_size == 10
    assert addons.monitoring_alertmanager_volume_size == 10
    assert addons.monitoring_loki_volume_size == 10
    assert cluster.status.phase is ClusterPhase.UNKNOWN
    assert cluster.status.nodes == {}
    assert cluster.status.conditions == []


def test_metadata_is_loose_and_keeps_unknown_keys() -> None:
    cluster = Cluster.model_validate(_cluster())

    dumped = cluster.model_dump(mode="json", exclude_defaults=True)

    assert dumped["metadata"]["managedFields"] == [{"manager": "azimuth"}]
    assert dumped["metadata"]["labels"] == {"azimuth.stackhpc.com/cluster-template": "kube-1-31"}


def test_dump_uses_api_names_and_snake_case_input_is_accepted() -> None:
    spec = {
        "label": "demo",
        "template_name": "t",
        "cloud_credentials_secret_name": "s",
        "control_plane_machine_size": "m1",
    }
    cluster = Cluster.model_validate({"spec": spec})

    dumped = cluster.model_dump(mode="json")

    assert dumped["apiVersion"] == "azimuth.stackhpc.com/v1alpha1"
    assert dumped["kind"] == "Cluster"
    assert dumped["spec"]["templateName"] == "t"
    assert dumped["spec"]["addons"]["ingressControllerLoadBalancerIp"] is None
    assert "controlPlanePhase" in dumped["status"]


def test_fresh_status_dumps_empty_when_defaults_are_excluded() -> None:
    # Upstream writes status with exclude_defaults, so readers see missing keys, not Unknown.
    assert Cluster.model_validate(_cluster()).status.model_dump(exclude_defaults=True) == {}


def test_full_status_round_trips_and_keeps_unknown_keys() -> None:
    status = {
        "kubernetesVersion": "1.31.2",
        "kubeconfigSecretName": "demo-kubeconfig",
        "phase": "Ready",
        "leasePhase": "Active",
        "networkingPhase": "Provisioned",
        "controlPlanePhase": "Ready",
        "nodeCount": 1,
        "nodes": {
            "demo-control-plane-abcde": {
                "role": "control-plane",
                "phase": "Ready",
                "size": "m1.medium",
                "ip": "10.0.0.5",
                "ips": ["10.0.0.5"],
                "kubeletVersion": "1.31.2",
                "created": "2026-01-02T03:04:05Z",
            }
        },
        "addonCount": 1,
        "addons": {"cni-calico": {"phase": "Deployed", "revision": 3}},
        "services": {
            "monitoring-system-kube-prometheus-stack-client": {
                "subdomain": "abc123",
                "fqdn": "abc123.zenith.example.org",
                "label": "Monitoring",
                "iconUrl": "https://example.org/prometheus.png",
            }
        },
        "lastUpdated": "2026-01-02T03:04:05Z",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Reconciled",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
                "observedGeneration": 2,
            }
        ],
        "controlPlaneCertificateExpiryDate": "2027-01-01",
    }

    cluster = Cluster.model_validate({**_cluster(), "status": status})

    assert cluster.status.nodes["demo-control-plane-abcde"].role is NodeRole.CONTROL_PLANE
    assert cluster.status.addons["cni-calico"].phase is AddonPhase.DEPLOYED
    assert cluster.status.conditions[0].status is ConditionStatus.TRUE
    assert cluster.status.conditions[0].message == ""
    dumped = cluster.model_dump(mode="json", exclude_defaults=True)["status"]
    assert dumped["controlPlaneCertificateExpiryDate"] == "2027-01-01"
    assert dumped["nodes"]["demo-control-plane-abcde"]["kubeletVersion"] == "1.31.2"


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("cluster.x-k8s.io/v1beta1", "Cluster"), ("azimuth.stackhpc.com/v1alpha1", "AppTemplate")],
)
def test_objects_of_another_kind_are_rejected(api_version: str, kind: str) -> None:
    with pytest.raises(ValidationError):
        Cluster.model_validate({**_cluster(), "apiVersion": api_version, "kind": kind})


@pytest.mark.parametrize(
    "field", ["label", "templateName", "cloudCredentialsSecretName", "controlPlaneMachineSize"]
)
def test_required_spec_fields(field: str) -> None:
    obj = _cluster()
    del obj["spec"][field]

    with pytest.raises(ValidationError) as exc:
        Cluster.model_validate(obj)

    assert ("spec", field) in [loc for loc, _ in _errors(exc)]


def test_empty_strings_are_rejected_where_upstream_requires_min_length() -> None:
    with pytest.raises(ValidationError):
        Cluster.model_validate(_cluster(label=""))
    with pytest.raises(ValidationError):
        Cluster.model_validate(_cluster(leaseName=""))


def test_ingress_load_balancer_ip_must_be_ipv4() -> None:
    ok = Cluster.model_validate(_cluster(addons={"ingressControllerLoadBalancerIp": "192.0.2.7"}))
    assert str(ok.spec.addons.ingress_controller_load_balancer_ip) == "192.0.2.7"

    with pytest.raises(ValidationError):
        Cluster.model_validate(_cluster(addons={"ingressControllerLoadBalancerIp": "2001:db8::1"}))


def test_monitoring_volume_sizes_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        Cluster.model_validate(_cluster(addons={"monitoringLokiVolumeSize": 0}))


def test_status_rejects_unknown_phase_and_validates_assignment() -> None:
    with pytest.raises(ValidationError):
        Cluster.model_validate({**_cluster(), "status": {"phase": "Bogus"}})

    cluster = Cluster.model_validate(_cluster())
    cluster.status.phase = ClusterPhase.READY
    with pytest.raises(ValidationError):
        cluster.status.phase = "Bogus"  # type: ignore[assignment]


def test_service_icon_url_must_be_http() -> None:
    service = {"subdomain": "s", "fqdn": "s.example.org", "label": "S", "iconUrl": "ftp://x/y"}

    with pytest.raises(ValidationError):
        Cluster.model_validate({**_cluster(), "status": {"services": {"s": service}}})


def test_condition_status_must_be_a_kubernetes_value() -> None:
    condition = {
        "type": "Ready",
        "status": "Yes",
        "reason": "Reconciled",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }

    with pytest.raises(ValidationError):
        Cluster.model_validate({**_cluster(), "status": {"conditions": [condition]}})


# --------------------------------------------------------------------------------------------
# Node group validators (mirrored by the CEL rules in the CRD)
# --------------------------------------------------------------------------------------------


def test_count_is_required_when_not_autoscaling() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeGroupSpec.model_validate({"name": "md-0", "machineSize": "m1"})

    assert _errors(exc) == [(("count",), f"Value error, {models.COUNT_REQUIRED}")]


def test_count_error_is_located_inside_the_cluster() -> None:
    with pytest.raises(ValidationError) as exc:
        Cluster.model_validate(_cluster(nodeGroups=[{"name": "md-0", "machineSize": "m1"}]))

    assert [loc for loc, _ in _errors(exc)] == [("spec", "nodeGroups", 0, "count")]


def test_zero_count_is_allowed_but_negative_is_not() -> None:
    assert NodeGroupSpec.model_validate({"name": "a", "machineSize": "m", "count": 0}).count == 0
    with pytest.raises(ValidationError):
        NodeGroupSpec.model_validate({"name": "a", "machineSize": "m", "count": -1})


def test_min_and_max_count_are_required_when_autoscaling() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeGroupSpec.model_validate({"name": "a", "machineSize": "m", "autoscale": True})

    assert _errors(exc) == [
        (("minCount",), f"Value error, {models.MIN_COUNT_REQUIRED}"),
        (("maxCount",), f"Value error, {models.MAX_COUNT_REQUIRED}"),
    ]


def test_max_count_must_not_be_below_min_count_when_autoscaling() -> None:
    group = {"name": "a", "machineSize": "m", "autoscale": True, "minCount": 3, "maxCount": 2}

    with pytest.raises(ValidationError) as exc:
        NodeGroupSpec.model_validate(group)

    assert _errors(exc) == [(("maxCount",), f"Value error, {models.MAX_COUNT_BELOW_MIN}")]


def test_autoscaling_group_with_equal_bounds_needs_no_count() -> None:
    group = NodeGroupSpec.model_validate(
        {"name": "a", "machineSize": "m", "autoscale": True, "minCount": 2, "maxCount": 2}
    )

    assert (group.count, group.min_count, group.max_count) == (None, 2, 2)


def test_bounds_are_not_compared_when_not_autoscaling() -> None:
    # Upstream only checks the bounds of autoscaling groups; the CEL rule matches that.
    group = {"name": "a", "machineSize": "m", "count": 1, "minCount": 5, "maxCount": 2}

    assert NodeGroupSpec.model_validate(group).max_count == 2


def test_min_count_must_be_at_least_one() -> None:
    group = {"name": "a", "machineSize": "m", "autoscale": True, "minCount": 0, "maxCount": 2}

    with pytest.raises(ValidationError):
        NodeGroupSpec.model_validate(group)


# --------------------------------------------------------------------------------------------
# Enums: exactly upstream's values, in upstream's order
# --------------------------------------------------------------------------------------------

UPSTREAM_ENUMS: list[tuple[type[StrEnum], list[str]]] = [
    (
        ClusterPhase,
        [
            "Pending",
            "Reconciling",
            "Upgrading",
            "Ready",
            "Deleting",
            "Unhealthy",
            "Failed",
            "Unknown",
        ],
    ),
    (
        LeasePhase,
        [
            "Creating",
            "Pending",
            "Starting",
            "Active",
            "Updating",
            "Terminating",
            "Terminated",
            "Deleting",
            "Error",
            "Unknown",
        ],
    ),
    (
        NetworkingPhase,
        ["Pending", "Provisioning", "Provisioned", "Deleting", "Failed", "Unknown"],
    ),
    (
        ControlPlanePhase,
        [
            "Pending",
            "ScalingUp",
            "ScalingDown",
            "Upgrading",
            "Ready",
            "Deleting",
            "Unhealthy",
            "Failed",
            "Unknown",
        ],
    ),
    (
        NodePhase,
        [
            "Pending",
            "Provisioning",
            "Ready",
            "Deleting",
            "Deleted",
            "Unhealthy",
            "Failed",
            "Unknown",
        ],
    ),
    (
        AddonPhase,
        [
            "Unknown",
            "Pending",
            "Preparing",
            "Deployed",
            "Failed",
            "Installing",
            "Upgrading",
            "Uninstalling",
        ],
    ),
    (NodeRole, ["control-plane", "worker", "Unknown"]),
]


@pytest.mark.parametrize(
    ("enum", "values"), UPSTREAM_ENUMS, ids=lambda v: getattr(v, "__name__", "")
)
def test_enum_values_match_upstream(enum: type[StrEnum], values: list[str]) -> None:
    assert [member.value for member in enum] == values


def test_enum_members_are_the_wire_strings() -> None:
    assert f"{ClusterPhase.READY}" == "Ready"
    assert isinstance(ClusterPhase.READY, str)
    assert NodeRole("control-plane") is NodeRole.CONTROL_PLANE


# --------------------------------------------------------------------------------------------
# ClusterTemplate and AppTemplate
# --------------------------------------------------------------------------------------------


def _cluster_template(**values: Any) -> dict[str, Any]:
    return {
        "apiVersion": "azimuth.stackhpc.com/v1alpha1",
        "kind": "ClusterTemplate",
        "metadata": {"name": "kube-1-31"},
        "spec": {
            "label": "Kubernetes 1.31",
            "description": "A Kubernetes 1.31 cluster.",
            "values": {"kubernetesVersion": "1.31.2", "machineImageId": "img-1", **values},
        },
    }


def test_cluster_template_passes_extra_values_through() -> None:
    template = ClusterTemplate.model_validate(
        _cluster_template(controlPlane={"machineCount": 3}, etcd={"blockDevice": {"size": 5}})
    )

    assert template.spec.deprecated is False
    assert template.spec.tags == []
    values = template.spec.values.model_dump()
    assert values["kubernetesVersion"] == "1.31.2"
    assert values["controlPlane"] == {"machineCount": 3}
    assert values["etcd"] == {"blockDevice": {"size": 5}}


def test_cluster_template_requires_kubernetes_version_and_image() -> None:
    obj = _cluster_template()
    del obj["spec"]["values"]["machineImageId"]

    with pytest.raises(ValidationError):
        ClusterTemplate.model_validate(obj)


def test_cluster_template_tags_must_not_be_empty_strings() -> None:
    obj = _cluster_template()
    obj["spec"]["tags"] = [""]

    with pytest.raises(ValidationError):
        ClusterTemplate.model_validate(obj)


def _app_template(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "azimuth.stackhpc.com/v1alpha1",
        "kind": "AppTemplate",
        "metadata": {"name": "jupyterhub"},
        "spec": {
            "chart": {"repo": "https://charts.example.org", "name": "azimuth-jupyterhub"},
            **spec,
        },
    }


def test_app_template_defaults() -> None:
    template = AppTemplate.model_validate(_app_template())

    spec = template.spec
    assert (spec.label, spec.logo, spec.description) == ("", "", "")
    assert spec.version_range == ">=0.0.0"
    assert (spec.keep_versions, spec.sync_frequency) == (5, 86400)
    assert spec.default_values == {}
    assert template.status.versions == []
    assert template.status.last_sync is None


@pytest.mark.parametrize("name", ["Jupyter", "jupyter_hub", "", "a/b"])
def test_app_template_chart_name_pattern(name: str) -> None:
    obj = _app_template()
    obj["spec"]["chart"]["name"] = name

    with pytest.raises(ValidationError):
        AppTemplate.model_validate(obj)


def test_app_template_chart_repo_must_be_http() -> None:
    obj = _app_template()
    obj["spec"]["chart"]["repo"] = "oci://registry.example.org/charts"

    with pytest.raises(ValidationError):
        AppTemplate.model_validate(obj)


@pytest.mark.parametrize("version_range", [">=0.0.0", ">=1.2.0,<2.0.0", "==v1.0.0-rc.1", "!=1.0.0"])
def test_app_template_accepts_semver_ranges(version_range: str) -> None:
    template = AppTemplate.model_validate(_app_template(versionRange=version_range))

    assert template.spec.version_range == version_range


@pytest.mark.parametrize("version_range", ["1.0.0", "^1.0.0", ">=1.0", ">=1.0.0, <2.0.0", ""])
def test_app_template_rejects_other_ranges(version_range: str) -> None:
    with pytest.raises(ValidationError):
        AppTemplate.model_validate(_app_template(versionRange=version_range))


@pytest.mark.parametrize("field", ["keepVersions", "syncFrequency"])
def test_app_template_counts_must_be_positive(field: str) -> None:
    with pytest.raises(ValidationError):
        AppTemplate.model_validate(_app_template(**{field: 0}))


def test_app_template_status_versions() -> None:
    status = {
        "label": "JupyterHub",
        "versions": [
            {"name": "1.2.3", "valuesSchema": {"type": "object"}},
            {"name": "v1.2.2-rc.1+build.5"},
        ],
        "lastSync": "2026-01-02T03:04:05Z",
        "somethingNew": True,
    }

    template = AppTemplate.model_validate({**_app_template(), "status": status})

    assert template.status.versions[0].values_schema == {"type": "object"}
    assert template.status.versions[1].ui_schema == {}
    assert template.model_dump()["status"]["somethingNew"] is True

    bad = copy.deepcopy(status)
    bad["versions"] = [{"name": "latest"}]
    with pytest.raises(ValidationError):
        AppTemplate.model_validate({**_app_template(), "status": bad})


def test_resource_declarations() -> None:
    assert Cluster.resource.crd_name == "clusters.azimuth.stackhpc.com"
    assert ClusterTemplate.resource.plural == "clustertemplates"
    assert AppTemplate.resource.singular == "apptemplate"
    assert (Cluster, ClusterTemplate, AppTemplate) == models.RESOURCES
