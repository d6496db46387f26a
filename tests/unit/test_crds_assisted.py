"""The OpenShift Assisted providers' kinds: the generated CRDs serve v1alpha1 with upstream's
(v0.2.0) names, columns, required fields, Cluster API's contract label, the status subresource
and, on the control plane, the scale subresource; the models read upstream-shaped objects.
And the peer kinds they drive have stand-in CRDs serving what ``shared.resources`` addresses."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from pydantic import Field, ValidationError

from shared import crdgen, models, resources
from shared.kube import ResourceKind
from shared.models import assisted, azimuth, metalstack
from shared.models.assisted import (
    OpenshiftAssistedConfig,
    OpenshiftAssistedConfigTemplate,
    OpenshiftAssistedControlPlane,
)

Json = dict[str, Any]
KINDS = (OpenshiftAssistedConfig, OpenshiftAssistedConfigTemplate, OpenshiftAssistedControlPlane)
CLUSTER_COLUMN = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
STANDIN_CRDS = Path(__file__).resolve().parents[2] / "standins" / "crds"


def _crd(kind: type[azimuth.CustomResource]) -> Json:
    rendered: Json = yaml.safe_load(crdgen.render_all()[f"{kind.resource.crd_name}.yaml"])
    return rendered


def _version(kind: type[azimuth.CustomResource]) -> Json:
    versions = _crd(kind)["spec"]["versions"]
    assert len(versions) == 1
    version: Json = versions[0]
    return version


def _node(kind: type[azimuth.CustomResource], *path: str) -> Json:
    node: Json = _version(kind)["schema"]["openAPIV3Schema"]
    for name in path:
        node = node["properties"][name]
    return node


# --------------------------------------------------------------------------------------------
# The CRDs
# --------------------------------------------------------------------------------------------


def test_the_three_kinds_are_generated_and_registered() -> None:
    names = {f"{kind.resource.crd_name}.yaml" for kind in KINDS}

    assert names <= set(crdgen.render_all())
    assert assisted.RESOURCES == KINDS
    # The Azimuth kinds, metal-stack's, then these (later providers' kinds follow).
    before = azimuth.RESOURCES + metalstack.RESOURCES
    assert models.RESOURCES[: len(before) + len(KINDS)] == before + KINDS
    assert {kind.resource.crd_name for kind in KINDS} == {
        "openshiftassistedconfigs.bootstrap.cluster.x-k8s.io",
        "openshiftassistedconfigtemplates.bootstrap.cluster.x-k8s.io",
        "openshiftassistedcontrolplanes.controlplane.cluster.x-k8s.io",
    }


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_envelope_version_scope_and_contract_label(kind: type[azimuth.CustomResource]) -> None:
    crd = _crd(kind)
    version = _version(kind)

    assert crd["metadata"]["labels"] == {"cluster.x-k8s.io/v1beta1": "v1alpha1"}
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["categories"] == ["cluster-api"]
    assert crd["spec"]["names"]["kind"] == kind.__name__
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)


@pytest.mark.parametrize(
    ("kind", "served_as"),
    [
        (OpenshiftAssistedConfig, resources.OPENSHIFT_ASSISTED_CONFIG),
        (OpenshiftAssistedConfigTemplate, resources.OPENSHIFT_ASSISTED_CONFIG_TEMPLATE),
        (OpenshiftAssistedControlPlane, resources.OPENSHIFT_ASSISTED_CONTROL_PLANE),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_crds_serve_what_shared_resources_addresses(
    kind: type[azimuth.CustomResource], served_as: ResourceKind
) -> None:
    crd = _crd(kind)

    assert (crd["spec"]["group"], _version(kind)["name"]) == (served_as.group, served_as.version)
    assert crd["spec"]["names"]["plural"] == served_as.plural
    assert crd["spec"]["names"]["kind"] == served_as.kind
    assert kind.model_fields["api_version"].default == served_as.api_version


def test_subresources_and_short_names_as_upstream() -> None:
    assert _version(OpenshiftAssistedConfig)["subresources"] == {"status": {}}
    assert _version(OpenshiftAssistedControlPlane)["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert "subresources" not in _version(OpenshiftAssistedConfigTemplate)
    assert "status" not in _node(OpenshiftAssistedConfigTemplate)["properties"]
    assert _crd(OpenshiftAssistedConfig)["spec"]["names"]["shortNames"] == ["oac"]
    assert "shortNames" not in _crd(OpenshiftAssistedControlPlane)["spec"]["names"]


def test_control_plane_printer_columns_are_upstreams_in_upstreams_order() -> None:
    served = _version(OpenshiftAssistedControlPlane)["additionalPrinterColumns"]

    assert [(c["name"], c["type"], c["jsonPath"], c.get("priority", 0)) for c in served] == [
        ("Cluster", "string", CLUSTER_COLUMN, 0),
        ("Initialized", "boolean", ".status.initialized", 0),
        ("API Server Available", "boolean", ".status.ready", 0),
        ("Desired", "integer", ".spec.replicas", 10),
        ("Replicas", "integer", ".status.replicas", 0),
        ("Ready", "integer", ".status.readyReplicas", 0),
        ("Updated", "integer", ".status.updatedReplicas", 0),
        ("Unavailable", "integer", ".status.unavailableReplicas", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        ("Version", "string", ".spec.version", 0),
    ]


def test_config_columns_end_with_age() -> None:
    served = _version(OpenshiftAssistedConfig)["additionalPrinterColumns"]

    assert [c["name"] for c in served] == ["Cluster", "Ready", "DataSecret", "Agent", "Age"]


def test_control_plane_spec_required_fields_and_limits() -> None:
    spec = _node(OpenshiftAssistedControlPlane, "spec")
    config = spec["properties"]["config"]
    template = spec["properties"]["machineTemplate"]

    assert spec["required"] == ["config", "machineTemplate", "version"]
    assert list(spec["properties"]) == [
        "config",
        "machineTemplate",
        "openshiftAssistedConfigSpec",
        "replicas",
        "version",
    ]
    assert config["required"] == ["baseDomain", "releaseImage"]
    assert list(config["properties"]) == [
        "apiVIPs",
        "ingressVIPs",
        "manifestsConfigMapRefs",
        "diskEncryption",
        "proxy",
        "mastersSchedulable",
        "sshAuthorizedKey",
        "clusterName",
        "baseDomain",
        "pullSecretRef",
        "releaseImage",
        "imageRegistryRef",
    ]
    assert config["properties"]["apiVIPs"]["maxItems"] == 2
    assert config["properties"]["ingressVIPs"]["maxItems"] == 2
    assert template["required"] == ["infrastructureRef"]
    assert template["properties"]["infrastructureRef"]["x-kubernetes-map-type"] == "atomic"
    assert spec["properties"]["version"]["pattern"] == azimuth.SEMVER_VERSION_PATTERN
    assert "default" not in str(spec)  # defaults are applied by the models, never by the server


def test_config_spec_is_the_same_schema_everywhere_it_is_embedded() -> None:
    own = _node(OpenshiftAssistedConfig, "spec")
    in_template = _node(OpenshiftAssistedConfigTemplate, "spec", "template", "spec")
    in_control_plane = _node(OpenshiftAssistedControlPlane, "spec", "openshiftAssistedConfigSpec")

    def bare(node: Json) -> Json:
        return {k: v for k, v in node.items() if k != "description"}

    assert bare(own) == bare(in_template) == bare(in_control_plane)
    assert list(own["properties"]) == [
        "proxy",
        "pullSecretRef",
        "additionalNTPSources",
        "sshAuthorizedKey",
        "nmStateConfigLabelSelector",
        "cpuArchitecture",
        "kernelArguments",
        "additionalTrustBundle",
        "osImageVersion",
    ]
    kernel = own["properties"]["kernelArguments"]["items"]["properties"]
    assert kernel["operation"]["enum"] == ["append", "replace", "delete"]
    assert _node(OpenshiftAssistedConfigTemplate, "spec")["required"] == ["template"]


def test_status_fields() -> None:
    config = _node(OpenshiftAssistedConfig, "status")["properties"]
    control_plane = _node(OpenshiftAssistedControlPlane, "status")["properties"]

    assert list(config) == [
        "infraEnvRef",
        "agentRef",
        "isoDownloadURL",
        "ready",
        "dataSecretName",
        "failureReason",
        "failureMessage",
        "observedGeneration",
        "conditions",
    ]
    assert list(control_plane) == [
        "clusterDeploymentRef",
        "selector",
        "replicas",
        "version",
        "updatedReplicas",
        "readyReplicas",
        "unavailableReplicas",
        "initialized",
        "ready",
        "failureReason",
        "failureMessage",
        "observedGeneration",
        "conditions",
    ]
    assert "required" not in _node(OpenshiftAssistedConfig, "status")
    assert "required" not in _node(OpenshiftAssistedControlPlane, "status")


@pytest.mark.parametrize("kind", [OpenshiftAssistedConfig, OpenshiftAssistedControlPlane])
def test_conditions_are_capi_shaped_and_keyed_by_type(kind: type[azimuth.CustomResource]) -> None:
    conditions = _node(kind, "status")["properties"]["conditions"]
    item = conditions["items"]

    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert list(item["properties"]) == [
        "type",
        "status",
        "severity",
        "reason",
        "message",
        "lastTransitionTime",
    ]
    assert item["required"] == ["type", "status", "lastTransitionTime"]


def test_constants() -> None:
    assert models.OPENSHIFT_ASSISTED_CONFIG_FINALIZER == (
        "openshiftassistedconfig.bootstrap.cluster.x-k8s.io/deprovision"
    )
    assert models.OPENSHIFT_ASSISTED_CONTROL_PLANE_FINALIZER == (
        "openshiftassistedcontrolplane.controlplane.cluster.x-k8s.io/deprovision"
    )
    assert assisted.OPENSHIFT_ASSISTED_CONFIG_LABEL == (
        "bootstrap.cluster.x-k8s.io/openshiftAssistedConfig"
    )
    assert [reason.value for reason in assisted.ConfigReason] == [
        "InfraEnvFailed",
        "PropagatingLiveISOURLFailed",
        "CreatingSecretFailed",
        "WaitingForLiveISOURL",
        "WaitingForInstallComplete",
        "WaitingForAssistedInstaller",
        "WaitingForClusterInfrastructure",
    ]


# --------------------------------------------------------------------------------------------
# The ResourceInfo options behind them
# --------------------------------------------------------------------------------------------


class _Probe(azimuth.CustomResource):
    """A kind for the generator only, with ResourceInfo's defaults."""

    resource: ClassVar[azimuth.ResourceInfo] = azimuth.ResourceInfo(
        kind="Probe",
        scope=azimuth.Scope.NAMESPACED,
        has_status=True,
        printer_columns=(azimuth.PrinterColumn("A", azimuth.PrinterColumnType.STRING, ".a"),),
    )

    spec: dict[str, Any]
    status: dict[str, Any] = Field(default_factory=dict)


class _Scaled(_Probe):
    """The same kind with replicas, abbreviations and its own Age column."""

    resource: ClassVar[azimuth.ResourceInfo] = replace(
        _Probe.resource,
        short_names=("pr", "prb"),
        scale=azimuth.ScaleSubresource(".spec.n", ".status.n"),
        printer_columns=(
            azimuth.PrinterColumn("Age", azimuth.PrinterColumnType.DATE, ".metadata.created"),
            azimuth.PrinterColumn("A", azimuth.PrinterColumnType.STRING, ".a"),
        ),
    )


def test_defaults_add_no_short_names_no_scale_and_age_last() -> None:
    crd = crdgen.crd_for(_Probe)
    version = crd["spec"]["versions"][0]

    assert "shortNames" not in crd["spec"]["names"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["A", "Age"]


def test_scale_short_names_and_a_placed_age_column() -> None:
    crd = crdgen.crd_for(_Scaled)
    version = crd["spec"]["versions"][0]

    assert crd["spec"]["names"]["shortNames"] == ["pr", "prb"]
    assert list(crd["spec"]["names"]) == [
        "kind",
        "listKind",
        "plural",
        "singular",
        "shortNames",
        "categories",
    ]
    assert version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.n", "statusReplicasPath": ".status.n"},
    }
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Age", ".metadata.created"),
        ("A", ".a"),
    ]


# --------------------------------------------------------------------------------------------
# The models read upstream-shaped objects
# --------------------------------------------------------------------------------------------

T = "2026-01-02T03:04:05Z"
# A control plane as upstream's examples write it, with a status as its controllers write it.
UPSTREAM_CONTROL_PLANE: Json = {
    "apiVersion": "controlplane.cluster.x-k8s.io/v1alpha1",
    "kind": "OpenshiftAssistedControlPlane",
    "metadata": {
        "name": "demo-control-plane",
        "namespace": "default",
        "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        "finalizers": ["openshiftassistedcontrolplane.controlplane.cluster.x-k8s.io/deprovision"],
    },
    "spec": {
        "config": {
            "apiVIPs": ["192.168.222.40"],
            "ingressVIPs": ["192.168.222.41"],
            "baseDomain": "lab.home",
            "clusterName": "demo",
            "pullSecretRef": {"name": "pull-secret"},
            "releaseImage": "quay.io/openshift-release-dev/ocp-release:4.16.0-x86_64",
            "sshAuthorizedKey": "ssh-ed25519 AAAA demo",
            "diskEncryption": {"enableOn": "all", "mode": "tpmv2"},
            "manifestsConfigMapRefs": [{"name": "extra-manifests"}],
        },
        "machineTemplate": {
            "infrastructureRef": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "Metal3MachineTemplate",
                "name": "demo-control-plane",
            },
            "nodeDrainTimeout": "10m0s",
        },
        "openshiftAssistedConfigSpec": {
            "cpuArchitecture": "x86_64",
            "pullSecretRef": {"name": "pull-secret"},
            "sshAuthorizedKey": "ssh-ed25519 AAAA demo",
            "nmStateConfigLabelSelector": {"matchLabels": {"cluster": "demo"}},
            "kernelArguments": [{"operation": "append", "value": "rd.net.timeout.carrier=60"}],
            "additionalNTPSources": ["ntp.example.com"],
        },
        "replicas": 3,
        "version": "4.16.0",
    },
    "status": {
        "clusterDeploymentRef": {
            "apiVersion": "hive.openshift.io/v1",
            "kind": "ClusterDeployment",
            "name": "demo-control-plane",
            "namespace": "default",
        },
        "selector": "cluster.x-k8s.io/cluster-name=demo,cluster.x-k8s.io/control-plane",
        "replicas": 3,
        "updatedReplicas": 3,
        "readyReplicas": 0,
        "unavailableReplicas": 3,
        "initialized": True,
        "ready": False,
        "conditions": [
            {"type": "MachinesCreated", "status": "True", "lastTransitionTime": T},
        ],
    },
}
UPSTREAM_CONFIG: Json = {
    "apiVersion": "bootstrap.cluster.x-k8s.io/v1alpha1",
    "kind": "OpenshiftAssistedConfig",
    "metadata": {
        "name": "demo-control-plane-x7k2p",
        "namespace": "default",
        "labels": {
            "cluster.x-k8s.io/cluster-name": "demo",
            "cluster.x-k8s.io/control-plane": "",
        },
    },
    "spec": {"cpuArchitecture": "x86_64", "pullSecretRef": {"name": "pull-secret"}},
    "status": {
        "infraEnvRef": {
            "apiVersion": "agent-install.openshift.io/v1beta1",
            "kind": "InfraEnv",
            "name": "demo-control-plane",
            "namespace": "default",
        },
        "agentRef": {"name": "3b2cc7b8-0000-4000-8000-000000000001"},
        "isoDownloadURL": "https://image-service.example/images/u?arch=x86_64&type=full-iso",
        "ready": True,
        "dataSecretName": "demo-control-plane-x7k2p",
        "observedGeneration": 1,
        "conditions": [
            {"type": "DataSecretAvailable", "status": "True", "lastTransitionTime": T},
            {"type": "Ready", "status": "True", "lastTransitionTime": T},
        ],
    },
}
UPSTREAM_TEMPLATE: Json = {
    "apiVersion": "bootstrap.cluster.x-k8s.io/v1alpha1",
    "kind": "OpenshiftAssistedConfigTemplate",
    "metadata": {"name": "demo-workers", "namespace": "default"},
    "spec": {
        "template": {
            "metadata": {"labels": {"role": "worker"}},
            "spec": {"pullSecretRef": {"name": "pull-secret"}, "sshAuthorizedKey": "k"},
        }
    },
}


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        (OpenshiftAssistedControlPlane, UPSTREAM_CONTROL_PLANE),
        (OpenshiftAssistedConfig, UPSTREAM_CONFIG),
        (OpenshiftAssistedConfigTemplate, UPSTREAM_TEMPLATE),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_upstream_objects_round_trip(kind: type[azimuth.CustomResource], obj: Json) -> None:
    parsed = kind.model_validate(copy.deepcopy(obj))

    assert parsed.model_dump(mode="json", exclude_unset=True) == obj


def test_parsed_fields_by_their_python_names() -> None:
    control_plane = OpenshiftAssistedControlPlane.model_validate(UPSTREAM_CONTROL_PLANE)
    config = OpenshiftAssistedConfig.model_validate(UPSTREAM_CONFIG)

    assert control_plane.spec.config.api_vips == ["192.168.222.40"]
    assert control_plane.spec.config.base_domain == "lab.home"
    assert control_plane.spec.machine_template.infrastructure_ref.kind == "Metal3MachineTemplate"
    assert control_plane.spec.openshift_assisted_config_spec.additional_ntp_sources == [
        "ntp.example.com"
    ]
    assert control_plane.status.cluster_deployment_ref is not None
    assert control_plane.status.initialized is True
    assert config.status.iso_download_url.startswith("https://image-service.example/")
    assert config.status.agent_ref is not None
    assert config.status.data_secret_name == "demo-control-plane-x7k2p"


def test_missing_fields_parse_to_upstreams_zero_values_and_defaults() -> None:
    config = OpenshiftAssistedConfig.model_validate({"spec": {}})
    control_plane = OpenshiftAssistedControlPlane.model_validate(
        {
            "spec": {
                "config": {"baseDomain": "lab.home", "releaseImage": "r"},
                "machineTemplate": {"infrastructureRef": {"name": "m"}},
                "version": "4.16.0",
            }
        }
    )

    assert config.spec.cpu_architecture == "x86_64"
    assert config.spec.nm_state_config_label_selector == assisted.LabelSelector()
    assert config.status.ready is False
    assert config.status.data_secret_name is None
    assert control_plane.spec.replicas == 0
    assert control_plane.spec.config.cluster_name == ""
    assert control_plane.status.version is None
    assert config.model_dump(exclude_defaults=True) == {}


def _without(obj: Json, *path: str) -> Json:
    bad = copy.deepcopy(obj)
    node = bad
    for name in path[:-1]:
        node = node[name]
    del node[path[-1]]
    return bad


def _with(obj: Json, value: Any, *path: str) -> Json:
    bad = copy.deepcopy(obj)
    node = bad
    for name in path[:-1]:
        node = node[name]
    node[path[-1]] = value
    return bad


@pytest.mark.parametrize(
    ("kind", "bad"),
    [
        (OpenshiftAssistedControlPlane, _without(UPSTREAM_CONTROL_PLANE, "spec", "version")),
        (
            OpenshiftAssistedControlPlane,
            _without(UPSTREAM_CONTROL_PLANE, "spec", "config", "baseDomain"),
        ),
        (
            OpenshiftAssistedControlPlane,
            _without(UPSTREAM_CONTROL_PLANE, "spec", "machineTemplate", "infrastructureRef"),
        ),
        (OpenshiftAssistedControlPlane, _with(UPSTREAM_CONTROL_PLANE, "4.16", "spec", "version")),
        (
            OpenshiftAssistedControlPlane,
            _with(UPSTREAM_CONTROL_PLANE, ["a", "b", "c"], "spec", "config", "apiVIPs"),
        ),
        (
            OpenshiftAssistedConfig,
            _with(UPSTREAM_CONFIG, [{"operation": "prepend"}], "spec", "kernelArguments"),
        ),
        (OpenshiftAssistedConfigTemplate, _without(UPSTREAM_TEMPLATE, "spec", "template")),
    ],
    ids=[
        "no-version",
        "no-base-domain",
        "no-infrastructure-ref",
        "not-semver",
        "three-api-vips",
        "kernel-operation",
        "template",
    ],
)
def test_required_fields_limits_and_enums_are_enforced(
    kind: type[azimuth.CustomResource], bad: Json
) -> None:
    with pytest.raises(ValidationError):
        kind.model_validate(bad)


# --------------------------------------------------------------------------------------------
# The peer kinds' stand-in CRDs
# --------------------------------------------------------------------------------------------

#: each peer kind, and whether it has a status subresource (upstream's Metal3MachineTemplate
#: has no status)
PEERS = {
    resources.INFRA_ENV: True,
    resources.AGENT: True,
    resources.CLUSTER_DEPLOYMENT: True,
    resources.CLUSTER_IMAGE_SET: True,
    resources.AGENT_CLUSTER_INSTALL: True,
    resources.METAL3_CLUSTER: True,
    resources.METAL3_MACHINE: True,
    resources.METAL3_MACHINE_TEMPLATE: False,
    resources.BARE_METAL_HOST: True,
    resources.MACHINE_SET: True,
}


def _standin(kind: ResourceKind) -> Json:
    path = STANDIN_CRDS / f"{kind.plural}.{kind.group}.yaml"
    document: Json = yaml.safe_load(path.read_text(encoding="utf-8"))
    return document


@pytest.mark.parametrize(("kind", "has_status"), list(PEERS.items()), ids=[k.kind for k in PEERS])
def test_peer_standin_crds_serve_what_shared_resources_addresses(
    kind: ResourceKind, has_status: bool
) -> None:
    crd = _standin(kind)
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]

    assert crd["metadata"]["name"] == f"{kind.plural}.{kind.group}"
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/part-of": "capibus-standins"}
    assert crd["spec"]["group"] == kind.group
    assert crd["spec"]["names"]["kind"] == kind.kind
    assert crd["spec"]["names"]["plural"] == kind.plural
    assert crd["spec"]["scope"] == ("Namespaced" if kind.namespaced else "Cluster")
    assert (version["name"], version["served"], version["storage"]) == (kind.version, True, True)
    assert ("status" in version.get("subresources", {})) is has_status
    # Stand-ins write upstream's whole shapes: nothing beyond what is typed may be pruned.
    assert schema["spec"]["x-kubernetes-preserve-unknown-fields"] is True


def test_peer_fields_the_providers_use_are_typed() -> None:
    def spec(kind: ResourceKind, *path: str) -> Json:
        (version,) = _standin(kind)["spec"]["versions"]
        node: Json = version["schema"]["openAPIV3Schema"]
        for name in path:
            node = node["properties"][name]
        return node

    infra_env = spec(resources.INFRA_ENV, "status", "isoDownloadURL")
    mac = spec(resources.AGENT, "status", "inventory", "interfaces")["items"]
    state = spec(resources.AGENT_CLUSTER_INSTALL, "status", "debugInfo", "state")
    image = spec(resources.METAL3_MACHINE, "spec", "image", "format")
    template = spec(resources.METAL3_MACHINE_TEMPLATE, "spec", "template", "spec", "image")
    boot_mac = spec(resources.BARE_METAL_HOST, "spec", "bootMACAddress")

    assert infra_env == {"type": "string"}
    assert mac["properties"]["macAddress"] == {"type": "string"}
    assert state == {"type": "string"}
    assert "live-iso" in image["enum"]
    assert "live-iso" in template["properties"]["format"]["enum"]
    assert boot_mac == {"type": "string"}
    assert spec(resources.AGENT, "spec", "approved") == {"type": "boolean"}
    assert spec(resources.AGENT, "spec", "nodeLabels")["additionalProperties"] == {"type": "string"}
    assert spec(resources.CLUSTER_DEPLOYMENT, "spec", "clusterInstallRef")["properties"].keys() == {
        "group",
        "version",
        "kind",
        "name",
    }
    assert spec(resources.AGENT_CLUSTER_INSTALL, "spec", "apiVIPs")["maxItems"] == 2


def test_machine_set_scales_like_cluster_apis() -> None:
    (version,) = _standin(resources.MACHINE_SET)["spec"]["versions"]

    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
