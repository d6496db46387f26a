"""metal-stack's Cluster API kinds: the generated CRDs serve v1alpha4 with upstream's field
names, Cluster API's contract label and the status subresource where upstream has one (not on
MetalStackFirewall); the models read what upstream's templates and controller write."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import yaml
from pydantic import Field, ValidationError

from shared import crdgen, models, resources
from shared.models import azimuth, metalstack
from shared.models.metalstack import (
    InstanceStatus,
    MetalStackCluster,
    MetalStackFirewall,
    MetalStackMachine,
    MetalStackMachineTemplate,
)

Json = dict[str, Any]
KINDS = (MetalStackCluster, MetalStackMachine, MetalStackMachineTemplate, MetalStackFirewall)
CLUSTER_COLUMN = r".metadata.labels.cluster\.x-k8s\.io/cluster-name"


def _crd(kind: type[azimuth.CustomResource]) -> Json:
    rendered: Json = yaml.safe_load(crdgen.render_all()[f"{kind.resource.crd_name}.yaml"])
    return rendered


def _version(kind: type[azimuth.CustomResource]) -> Json:
    versions = _crd(kind)["spec"]["versions"]
    assert len(versions) == 1
    version: Json = versions[0]
    return version


def _properties(kind: type[azimuth.CustomResource], *path: str) -> Json:
    node = _version(kind)["schema"]["openAPIV3Schema"]
    for name in path:
        node = node["properties"][name]
    properties: Json = node["properties"]
    return properties


# --------------------------------------------------------------------------------------------
# The CRDs
# --------------------------------------------------------------------------------------------


def test_the_four_kinds_are_generated_and_registered() -> None:
    names = {f"{kind.resource.crd_name}.yaml" for kind in KINDS}

    assert names <= set(crdgen.render_all())
    assert metalstack.RESOURCES == KINDS
    # The Azimuth kinds, then these (later providers' kinds follow).
    assert models.RESOURCES[: len(azimuth.RESOURCES) + len(KINDS)] == azimuth.RESOURCES + KINDS
    assert {kind.resource.crd_name for kind in KINDS} == {
        "metalstackclusters.infrastructure.cluster.x-k8s.io",
        "metalstackmachines.infrastructure.cluster.x-k8s.io",
        "metalstackmachinetemplates.infrastructure.cluster.x-k8s.io",
        "metalstackfirewalls.infrastructure.cluster.x-k8s.io",
    }


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_envelope_group_version_scope_and_contract_label(
    kind: type[azimuth.CustomResource],
) -> None:
    crd = _crd(kind)
    version = _version(kind)

    assert crd["metadata"]["labels"] == {"cluster.x-k8s.io/v1beta1": "v1alpha4"}
    assert crd["spec"]["group"] == "infrastructure.cluster.x-k8s.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["categories"] == ["cluster-api"]
    assert crd["spec"]["names"]["kind"] == kind.__name__
    assert crd["spec"]["names"]["plural"] == f"{kind.__name__.lower()}s"
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha4", True, True)


@pytest.mark.parametrize(
    ("kind", "served_as"),
    [
        (MetalStackCluster, resources.METALSTACK_CLUSTER),
        (MetalStackMachine, resources.METALSTACK_MACHINE),
        (MetalStackMachineTemplate, resources.METALSTACK_MACHINE_TEMPLATE),
        (MetalStackFirewall, resources.METALSTACK_FIREWALL),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_crds_serve_what_shared_resources_addresses(
    kind: type[azimuth.CustomResource], served_as: Any
) -> None:
    crd = _crd(kind)

    assert (crd["spec"]["group"], _version(kind)["name"]) == (served_as.group, served_as.version)
    assert crd["spec"]["names"]["plural"] == served_as.plural
    assert crd["spec"]["names"]["kind"] == served_as.kind
    has_subresource = "subresources" in _version(kind)
    if kind is not MetalStackMachineTemplate:
        assert has_subresource is served_as.status_subresource


def test_status_subresources_as_upstream() -> None:
    assert _version(MetalStackCluster)["subresources"] == {"status": {}}
    assert _version(MetalStackMachine)["subresources"] == {"status": {}}
    assert "subresources" not in _version(MetalStackMachineTemplate)
    assert "subresources" not in _version(MetalStackFirewall)
    # The firewall's status is in its schema all the same: it is written on the object.
    assert set(_properties(MetalStackFirewall, "status")) == {"ready", "conditions"}
    schema = _version(MetalStackMachineTemplate)["schema"]["openAPIV3Schema"]
    assert "status" not in schema["properties"]


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        (
            MetalStackCluster,
            [
                ("Cluster", CLUSTER_COLUMN),
                ("Ready", ".status.ready"),
                ("Network", ".spec.privateNetworkID"),
                ("Endpoint", ".spec.controlPlaneEndpoint.host"),
                ("Age", ".metadata.creationTimestamp"),
            ],
        ),
        (
            MetalStackMachine,
            [
                ("Cluster", CLUSTER_COLUMN),
                ("State", ".status.instanceStatus"),  # upstream's .status.instanceState is no field
                ("Ready", ".status.ready"),
                ("InstanceID", ".spec.providerID"),
                ("Machine", '.metadata.ownerReferences[?(@.kind=="Machine")].name'),
                ("Age", ".metadata.creationTimestamp"),
            ],
        ),
        (MetalStackMachineTemplate, [("Age", ".metadata.creationTimestamp")]),
        (
            MetalStackFirewall,
            [
                ("Cluster", CLUSTER_COLUMN),
                ("Ready", ".status.ready"),
                ("InstanceID", ".spec.providerID"),
                ("Age", ".metadata.creationTimestamp"),
            ],
        ),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_printer_columns(
    kind: type[azimuth.CustomResource], columns: list[tuple[str, str]]
) -> None:
    served = _version(kind)["additionalPrinterColumns"]

    assert [(c["name"], c["jsonPath"]) for c in served] == columns


def test_spec_fields_use_upstreams_json_names_and_required_lists() -> None:
    cluster = _version(MetalStackCluster)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    machine = _version(MetalStackMachine)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    firewall = _version(MetalStackFirewall)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = _version(MetalStackMachineTemplate)["schema"]["openAPIV3Schema"]["properties"]

    assert list(cluster["properties"]) == [
        "controlPlaneEndpoint",
        "projectID",
        "partition",
        "publicNetworkID",
        "privateNetworkID",
        "firewallSpec",
    ]
    assert cluster["required"] == ["publicNetworkID"]
    assert cluster["properties"]["controlPlaneEndpoint"]["required"] == ["host", "port"]
    assert cluster["properties"]["firewallSpec"]["required"] == ["machineType"]
    assert list(machine["properties"]) == ["image", "machineType", "providerID", "sshKeys", "tags"]
    assert machine["required"] == ["image", "machineType"]
    assert list(firewall["properties"]) == ["image", "machineType", "providerID", "sshKeys"]
    assert firewall["required"] == ["machineType"]
    inner = template["spec"]["properties"]["template"]["properties"]["spec"]
    assert inner == machine | {"description": inner["description"]}
    assert template["spec"]["required"] == ["template"]


def test_status_fields() -> None:
    cluster = _properties(MetalStackCluster, "status")
    machine = _properties(MetalStackMachine, "status")

    assert list(cluster) == [
        "ready",
        "controlPlaneIPAllocated",
        "failureReason",
        "failureMessage",
        "conditions",
    ]
    assert list(machine) == [
        "addresses",
        "errorReason",
        "errorMessage",
        "failureReason",
        "failureMessage",
        "instanceStatus",
        "lldp",
        "ready",
        "conditions",
    ]
    assert machine["instanceStatus"]["enum"] == [
        "new",
        "queued",
        "provisioning",
        "active",
        "errored",
        "off",
    ]
    assert machine["addresses"]["items"]["required"] == ["type", "address"]


@pytest.mark.parametrize("kind", [MetalStackCluster, MetalStackMachine, MetalStackFirewall])
def test_conditions_are_capi_shaped_and_keyed_by_type(kind: type[azimuth.CustomResource]) -> None:
    conditions = _properties(kind, "status")["conditions"]
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
    assert item["properties"]["lastTransitionTime"] == {
        "description": "When the condition last changed status.",
        "format": "date-time",
        "type": "string",
    }
    assert item["properties"]["severity"]["enum"] == ["Error", "Warning", "Info", ""]


def test_finalizer_constants() -> None:
    assert (
        models.METALSTACK_CLUSTER_FINALIZER == "metalstackcluster.infrastructure.cluster.x-k8s.io"
    )
    assert (
        models.METALSTACK_MACHINE_FINALIZER == "metalstackmachine.infrastructure.cluster.x-k8s.io"
    )
    assert (
        models.METALSTACK_FIREWALL_FINALIZER == "metalstackfirewall.infrastructure.cluster.x-k8s.io"
    )


# --------------------------------------------------------------------------------------------
# The ResourceInfo options behind them
# --------------------------------------------------------------------------------------------


class _Probe(azimuth.CustomResource):
    """A kind for the generator only, with ResourceInfo's defaults."""

    resource: ClassVar[azimuth.ResourceInfo] = azimuth.ResourceInfo(
        kind="Probe", scope=azimuth.Scope.NAMESPACED, has_status=True
    )

    spec: dict[str, Any]
    status: dict[str, Any] = Field(default_factory=dict)


class _WrittenInPlace(_Probe):
    """The same kind, its status written on the object, and labels on its CRD."""

    resource: ClassVar[azimuth.ResourceInfo] = replace(
        _Probe.resource, status_subresource=False, labels=(("a.example/x", "1"), ("b", "2"))
    )


def test_defaults_add_no_labels_and_a_status_subresource() -> None:
    crd = crdgen.crd_for(_Probe)

    assert crd["metadata"] == {"name": "probes.azimuth.stackhpc.com"}
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_status_without_subresource_and_crd_labels() -> None:
    crd = crdgen.crd_for(_WrittenInPlace)
    version = crd["spec"]["versions"][0]

    assert crd["metadata"] == {
        "name": "probes.azimuth.stackhpc.com",
        "labels": {"a.example/x": "1", "b": "2"},
    }
    assert "subresources" not in version
    assert "status" in version["schema"]["openAPIV3Schema"]["properties"]


# --------------------------------------------------------------------------------------------
# The models read upstream-shaped objects
# --------------------------------------------------------------------------------------------

# From upstream's templates/cluster-template.yaml, with the variables filled in, and a status
# as upstream's controller writes it.
UPSTREAM_CLUSTER: Json = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha4",
    "kind": "MetalStackCluster",
    "metadata": {
        "name": "demo",
        "namespace": "default",
        "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        "finalizers": ["metalstackcluster.infrastructure.cluster.x-k8s.io"],
    },
    "spec": {
        "controlPlaneEndpoint": {"host": "212.34.83.10", "port": 6443},
        "firewallSpec": {
            "image": "firewall-ubuntu-2.0",
            "machineType": "v1-small-x86",
            "providerID": "metalstack://2294c949-88f6-5390-8154-fa53d93a3313",
        },
        "partition": "vagrant",
        "projectID": "00000000-0000-0000-0000-000000000000",
        "publicNetworkID": "internet-vagrant-lab",
        "privateNetworkID": "10a7b6e2-0000-4000-8000-000000000001",
    },
    "status": {
        "ready": True,
        "controlPlaneIPAllocated": True,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Allocated",
                "message": "",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            },
            {
                "type": "FirewallReady",
                "status": "False",
                "severity": "Info",
                "reason": "WaitingForAllocation",
                "message": "waiting for the firewall to be allocated",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            },
        ],
    },
}
UPSTREAM_MACHINE: Json = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha4",
    "kind": "MetalStackMachine",
    "metadata": {
        "name": "demo-controlplane-abcde",
        "namespace": "default",
        "labels": {
            "cluster.x-k8s.io/cluster-name": "demo",
            "cluster.x-k8s.io/control-plane": "",
        },
        "ownerReferences": [
            {
                "apiVersion": "cluster.x-k8s.io/v1alpha4",
                "kind": "Machine",
                "name": "demo-controlplane-xyz12",
                "uid": "6b8d0d7e-0000-4000-8000-000000000002",
            }
        ],
    },
    "spec": {
        "image": "ubuntu-20.04",
        "machineType": "v1-small-x86",
        "providerID": "metalstack://2294c949-88f6-5390-8154-fa53d93a3314",
        "sshKeys": ["ssh-ed25519 AAAA demo"],
        "tags": ["team=infra"],
    },
    "status": {
        "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
        "failureReason": "CreateError",
        "failureMessage": "no machine available",
        "instanceStatus": "active",
        "lldp": True,
        "ready": True,
    },
}
UPSTREAM_TEMPLATE: Json = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha4",
    "kind": "MetalStackMachineTemplate",
    "metadata": {"name": "demo-worker-a", "namespace": "default"},
    "spec": {"template": {"spec": {"image": "ubuntu-20.04", "machineType": "c1-xlarge-x86"}}},
}
UPSTREAM_FIREWALL: Json = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha4",
    "kind": "MetalStackFirewall",
    "metadata": {
        "name": "demo",
        "namespace": "default",
        "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
    },
    "spec": {
        "image": "firewall-ubuntu-2.0",
        "machineType": "v1-small-x86",
        "sshKeys": ["ssh-ed25519 AAAA demo"],
    },
    "status": {"ready": True},
}


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        (MetalStackCluster, UPSTREAM_CLUSTER),
        (MetalStackMachine, UPSTREAM_MACHINE),
        (MetalStackMachineTemplate, UPSTREAM_TEMPLATE),
        (MetalStackFirewall, UPSTREAM_FIREWALL),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_upstream_objects_round_trip(kind: type[azimuth.CustomResource], obj: Json) -> None:
    parsed = kind.model_validate(copy.deepcopy(obj))

    assert parsed.model_dump(mode="json", exclude_unset=True) == obj


def test_parsed_fields_by_their_python_names() -> None:
    cluster = MetalStackCluster.model_validate(UPSTREAM_CLUSTER)
    machine = MetalStackMachine.model_validate(UPSTREAM_MACHINE)

    assert cluster.spec.project_id == "00000000-0000-0000-0000-000000000000"
    assert cluster.spec.public_network_id == "internet-vagrant-lab"
    assert cluster.spec.control_plane_endpoint.port == 6443
    assert cluster.spec.firewall_spec is not None
    assert cluster.spec.firewall_spec.provider_id == (
        f"{metalstack.PROVIDER_ID_PREFIX}2294c949-88f6-5390-8154-fa53d93a3313"
    )
    assert cluster.status.control_plane_ip_allocated is True
    assert cluster.status.conditions[1].severity is metalstack.ConditionSeverity.INFO
    assert machine.status.instance_status is InstanceStatus.ACTIVE
    assert machine.status.failure_reason == metalstack.MachineStatusError.CREATE_ERROR
    assert machine.metadata.labels[metalstack.CLUSTER_NAME_LABEL] == "demo"


def test_go_zero_values_and_missing_fields_parse_to_the_same_defaults() -> None:
    """Go serialises non-omitempty fields even when zero; a hand-written object omits them."""
    minimal = {"spec": {"publicNetworkID": "internet"}}
    zeroes = {
        "spec": {
            "controlPlaneEndpoint": {"host": "", "port": 0},
            "publicNetworkID": "internet",
        },
        "status": {"ready": False, "controlPlaneIPAllocated": False},
    }

    first = MetalStackCluster.model_validate(minimal)
    second = MetalStackCluster.model_validate(zeroes)

    assert first.spec == second.spec
    assert first.status == second.status
    assert first.spec.control_plane_endpoint.host == ""
    assert first.spec.firewall_spec is None
    assert first.model_dump(exclude_defaults=True) == {"spec": {"publicNetworkID": "internet"}}


def test_python_names_build_objects_that_dump_upstreams_names() -> None:
    machine = MetalStackMachine(
        spec=metalstack.MetalStackMachineSpec(
            image="ubuntu-20.04", machine_type="v1-small-x86", provider_id="metalstack://m1"
        )
    )

    assert machine.model_dump(exclude_defaults=True) == {
        "spec": {
            "image": "ubuntu-20.04",
            "machineType": "v1-small-x86",
            "providerID": "metalstack://m1",
        }
    }


@pytest.mark.parametrize(
    ("kind", "obj", "path", "value"),
    [
        (MetalStackCluster, UPSTREAM_CLUSTER, ("spec", "publicNetworkID"), None),
        (MetalStackMachine, UPSTREAM_MACHINE, ("spec", "image"), None),
        (MetalStackMachine, UPSTREAM_MACHINE, ("status", "instanceStatus"), "running"),
        (MetalStackFirewall, UPSTREAM_FIREWALL, ("spec", "machineType"), None),
        (MetalStackMachineTemplate, UPSTREAM_TEMPLATE, ("spec", "template"), None),
    ],
    ids=["cluster-network", "machine-image", "machine-state", "firewall-size", "template"],
)
def test_required_fields_and_enums_are_enforced(
    kind: type[azimuth.CustomResource], obj: Json, path: tuple[str, str], value: str | None
) -> None:
    bad = copy.deepcopy(obj)
    if value is None:
        del bad[path[0]][path[1]]
    else:
        bad[path[0]][path[1]] = value

    with pytest.raises(ValidationError):
        kind.model_validate(bad)
