"""CB-Ladybug's LadybugCluster: the generated CRD serves ladybug.capibus.dev/v1alpha1 with the
status subresource, short name ``lbc`` and the agreed printer columns; the model carries the
create request after defaults and upstream's status fields without a node credential; the
bus and the status writer know the kind, and each LadybugCluster is its own story."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from shared import crdgen, models, resources, status
from shared.models import ladybug
from shared.models.ladybug import (
    LadybugCluster,
    LadybugClusterSpec,
    LadybugNode,
    LadybugPhase,
    LadybugReason,
    NodeRole,
    NodeSet,
)

Json = dict[str, Any]

#: What the API writes for a create request with every default taken.
MINIMAL: Json = {
    "apiVersion": "ladybug.capibus.dev/v1alpha1",
    "kind": "LadybugCluster",
    "metadata": {
        "name": "ns1.cluster1",
        "namespace": "ladybug",
        "labels": {
            "ladybug.capibus.dev/namespace": "ns1",
            "ladybug.capibus.dev/cluster": "cluster1",
        },
    },
    "spec": {
        "namespace": "ns1",
        "name": "cluster1",
        "controlPlane": [{"id": "c-1-abcde", "connection": "aws-seoul", "spec": "t3.medium"}],
        "worker": [{"id": "w-1-fghij", "connection": "gcp-tokyo", "spec": "n1-standard-2"}],
    },
}

FULL: Json = {
    **MINIMAL,
    "spec": {
        "namespace": "ns1",
        "name": "cluster1",
        "controlPlane": [
            {
                "id": "c-1-abcde",
                "connection": "aws-seoul",
                "count": 3,
                "spec": "t3.medium",
                "rootDisk": {"type": "gp2", "size": "50"},
                "role": "",
            }
        ],
        "worker": [
            {"id": "w-1-fghij", "connection": "gcp-tokyo", "count": 1, "spec": "n1-standard-2"},
            {"id": "w-2-klmno", "connection": "aws-seoul", "count": 1, "spec": "t3.medium"},
        ],
        "removeNodes": ["w-1-fghij-1"],
        "serviceType": "multi",
        "config": {
            "installMonAgent": "no",
            "kubernetes": {
                "version": "1.23.13",
                "networkCni": "canal",
                "podCidr": "10.244.0.0/16",
                "serviceCidr": "10.96.0.0/12",
                "serviceDnsDomain": "cluster.local",
                "storageclass": {"nfs": {"server": "10.0.0.5", "path": "/nfs"}},
                "loadbalancer": "nlb",
                "etcd": "external",
            },
        },
        "label": "demo",
        "description": "a test cluster",
    },
    "status": {
        "phase": "Provisioned",
        "reason": "",
        "message": "",
        "mcis": "cluster1",
        "k8sVersion": "1.23.13-00",
        "cpLeader": "c-1-abcde-1",
        "cpGroup": "c-1-abcde",
        "createdTime": "2024-05-01T10:00:00Z",
        "observedGeneration": 3,
        "nodes": [
            {
                "name": "c-1-abcde-1",
                "publicIp": "127.0.0.2",
                "privateIp": "192.168.10.2",
                "role": "control-plane",
                "spec": "t3.medium",
                "csp": "aws",
                "createdTime": "2024-05-01T09:58:00Z",
                "cspLabel": "topology.cloud-barista.github.io/csp=aws",
                "regionLabel": "topology.kubernetes.io/region=ap-northeast-2",
                "zoneLabel": "topology.kubernetes.io/zone=ap-northeast-2a",
                "subGroup": "c-1-abcde",
                "bootstrapped": True,
                "joined": True,
            }
        ],
        "conditions": [
            {
                "type": "Bootstrapped",
                "status": "True",
                "lastTransitionTime": "2024-05-01T09:59:00Z",
            }
        ],
    },
}


def _crd() -> Json:
    rendered: Json = yaml.safe_load(crdgen.render_all()[f"{LadybugCluster.resource.crd_name}.yaml"])
    return rendered


def _version() -> Json:
    versions = _crd()["spec"]["versions"]
    assert len(versions) == 1
    version: Json = versions[0]
    return version


def _schema(*path: str) -> Json:
    node: Json = _version()["schema"]["openAPIV3Schema"]
    for name in path:
        node = node["properties"][name]
    return node


# --------------------------------------------------------------------------------------------
# The CRD
# --------------------------------------------------------------------------------------------


def test_generated_and_registered_after_the_other_providers() -> None:
    assert (LadybugCluster,) == ladybug.RESOURCES
    assert models.RESOURCES[-1] is LadybugCluster
    assert models.LadybugCluster is LadybugCluster
    assert LadybugCluster.resource.crd_name == "ladybugclusters.ladybug.capibus.dev"
    assert "ladybugclusters.ladybug.capibus.dev.yaml" in crdgen.render_all()


def test_envelope_names_and_subresource() -> None:
    crd = _crd()
    version = _version()

    assert crd["spec"]["group"] == "ladybug.capibus.dev"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "kind": "LadybugCluster",
        "listKind": "LadybugClusterList",
        "plural": "ladybugclusters",
        "singular": "ladybugcluster",
        "shortNames": ["lbc"],
        "categories": ["ladybug"],
    }
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = [(c["name"], c["jsonPath"]) for c in _version()["additionalPrinterColumns"]]
    assert columns == [
        ("TB-Namespace", ".spec.namespace"),
        ("Cluster", ".spec.name"),
        ("Phase", ".status.phase"),
        ("Reason", ".status.reason"),
        ("Leader", ".status.cpLeader"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_the_crd_serves_what_shared_resources_addresses() -> None:
    kind = resources.LADYBUG_CLUSTER
    crd = _crd()
    assert (crd["spec"]["group"], _version()["name"]) == (kind.group, kind.version)
    assert crd["spec"]["names"]["plural"] == kind.plural
    assert crd["spec"]["names"]["kind"] == kind.kind
    assert kind.status_subresource
    assert kind.api_version == ladybug.API_VERSION


def test_spec_and_status_fields_are_the_agreed_names() -> None:
    assert set(_schema("spec")["properties"]) == {
        "namespace",
        "name",
        "controlPlane",
        "worker",
        "removeNodes",
        "serviceType",
        "config",
        "label",
        "description",
    }
    node_set = _schema("spec", "controlPlane")["items"]["properties"]
    assert set(node_set) == {"id", "connection", "count", "spec", "rootDisk", "role"}
    assert set(node_set["rootDisk"]["properties"]) == {"type", "size"}
    assert set(_schema("spec", "config", "kubernetes")["properties"]) == {
        "version",
        "networkCni",
        "podCidr",
        "serviceCidr",
        "serviceDnsDomain",
        "storageclass",
        "loadbalancer",
        "etcd",
    }
    assert set(_schema("status")["properties"]) == {
        "phase",
        "reason",
        "message",
        "mcis",
        "k8sVersion",
        "cpLeader",
        "cpGroup",
        "createdTime",
        "observedGeneration",
        "nodes",
        "conditions",
    }


def test_no_credential_anywhere_in_the_schema() -> None:
    nodes = _schema("status", "nodes")
    assert set(nodes["items"]["properties"]) == {
        "name",
        "publicIp",
        "privateIp",
        "role",
        "spec",
        "csp",
        "createdTime",
        "cspLabel",
        "regionLabel",
        "zoneLabel",
        "subGroup",
        "bootstrapped",
        "joined",
        "hostname",
        "cloudPrepared",
    }
    text = crdgen.render_all()["ladybugclusters.ladybug.capibus.dev.yaml"]
    assert "credential" not in text
    assert "privateKey" not in text


def test_enums_and_list_maps() -> None:
    kubernetes = _schema("spec", "config", "kubernetes")["properties"]
    assert kubernetes["loadbalancer"]["enum"] == ["haproxy", "nlb"]
    assert kubernetes["etcd"]["enum"] == ["local", "external"]
    assert kubernetes["networkCni"]["enum"] == ["canal", "kilo", "flannel", "calico"]
    assert _schema("spec", "serviceType")["enum"] == ["multi", "single"]
    assert _schema("status", "phase")["enum"] == [p.value for p in LadybugPhase]
    nodes = _schema("status", "nodes")
    assert nodes["x-kubernetes-list-type"] == "map"
    assert nodes["x-kubernetes-list-map-keys"] == ["name"]
    assert "enum" not in _schema("status", "reason")


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


def test_the_minimal_object_gets_upstreams_defaults_and_the_decided_ones() -> None:
    cluster = LadybugCluster.model_validate(MINIMAL)
    spec = cluster.spec
    kubernetes = spec.config.kubernetes

    assert spec.service_type == "multi"  # upstream has no default; bootstrap needs one
    assert kubernetes.etcd == "local"  # upstream never sets it (its default branch is a bug)
    assert (kubernetes.version, kubernetes.network_cni, kubernetes.loadbalancer) == (
        "1.23.13",
        "kilo",
        "haproxy",
    )
    assert (kubernetes.pod_cidr, kubernetes.service_cidr, kubernetes.service_dns_domain) == (
        "10.244.0.0/16",
        "10.96.0.0/12",
        "cluster.local",
    )
    assert spec.config.install_mon_agent == "no"
    assert spec.control_plane[0].count == 1
    assert (spec.control_plane[0].root_disk.type, spec.control_plane[0].root_disk.size) == (
        "default",
        "default",
    )
    assert spec.remove_nodes == []
    assert cluster.status.phase is None
    assert cluster.status.nodes == []


def test_a_full_object_round_trips_with_the_wire_names() -> None:
    cluster = LadybugCluster.model_validate(FULL)
    dumped = cluster.model_dump(mode="json", exclude_defaults=True)

    assert dumped["spec"]["controlPlane"][0]["rootDisk"] == {"type": "gp2", "size": "50"}
    assert dumped["spec"]["config"]["kubernetes"]["storageclass"]["nfs"]["server"] == "10.0.0.5"
    assert dumped["status"]["cpLeader"] == "c-1-abcde-1"
    assert dumped["status"]["k8sVersion"] == "1.23.13-00"
    assert dumped["status"]["createdTime"] == "2024-05-01T10:00:00Z"
    assert dumped["status"]["nodes"][0]["publicIp"] == "127.0.0.2"
    assert dumped["status"]["nodes"][0]["subGroup"] == "c-1-abcde"
    assert LadybugCluster.model_validate(dumped) == cluster


def test_python_names_build_what_the_api_writes() -> None:
    spec = LadybugClusterSpec(
        namespace="ns1",
        name="cluster1",
        control_plane=[NodeSet(id="c-1-abcde", connection="aws-seoul", spec="t3.medium")],
        worker=[NodeSet(id="w-1-fghij", connection="gcp-tokyo", spec="n1-standard-2")],
    )
    cluster = LadybugCluster(spec=spec)
    assert cluster.model_dump(mode="json", exclude_defaults=True) == {
        "spec": {
            "namespace": "ns1",
            "name": "cluster1",
            "controlPlane": [{"id": "c-1-abcde", "connection": "aws-seoul", "spec": "t3.medium"}],
            "worker": [{"id": "w-1-fghij", "connection": "gcp-tokyo", "spec": "n1-standard-2"}],
        }
    }
    node = LadybugNode(name="w-1-fghij-1", role=NodeRole.WORKER)
    assert node.model_dump(exclude_defaults=True) == {"name": "w-1-fghij-1", "role": "worker"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "namespace"), None),
        (("spec", "serviceType"), "hybrid"),
        (("spec", "controlPlane", 0, "id"), None),
        (("spec", "controlPlane", 0, "connection"), ""),
        (("spec", "controlPlane", 0, "count"), 0),
        (("spec", "config", "kubernetes", "etcd"), "remote"),
        (("status", "phase"), "Running"),
        (("status", "nodes", 0, "role"), "master"),
    ],
    ids=["namespace", "service-type", "nodeset-id", "connection", "count", "etcd", "phase", "role"],
)
def test_required_fields_and_enums_are_enforced(path: tuple[str | int, ...], value: Any) -> None:
    bad = copy.deepcopy(FULL)
    node: Any = bad
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value

    with pytest.raises(ValidationError):
        LadybugCluster.model_validate(bad)


def test_naming_helpers_and_constants() -> None:
    assert ladybug.object_name("ns1", "cluster1") == "ns1.cluster1"
    assert ladybug.sshkey_secret_name("ns1", "aws-seoul") == "ladybug-sshkey.ns1.aws-seoul"
    assert ladybug.kubeconfig_secret_name("ns1.cluster1") == "ns1.cluster1.kubeconfig"
    assert ladybug.FINALIZER == "ladybug.capibus.dev/cleanup"
    assert ladybug.DEFAULT_NAMESPACE == "ladybug"
    assert LadybugReason("SetupBoostrapFailedReason").name == "SETUP_BOOTSTRAP_FAILED"  # sic
    assert len(LadybugReason) == 22


# --------------------------------------------------------------------------------------------
# The bus and the status writer
# --------------------------------------------------------------------------------------------


def test_the_watcher_publishes_it_and_the_writer_writes_its_status() -> None:
    assert resources.KINDS["ladybugcluster"] is resources.LADYBUG_CLUSTER
    assert resources.LADYBUG_CLUSTER in status.WRITTEN


def test_each_ladybug_cluster_is_its_own_story() -> None:
    kind = resources.LADYBUG_CLUSTER
    obj = copy.deepcopy(MINIMAL)
    other = copy.deepcopy(MINIMAL)
    other["metadata"]["name"] = "ns1.cluster2"
    other["metadata"]["labels"]["ladybug.capibus.dev/cluster"] = "cluster2"

    assert resources.cluster_key(kind, obj) == "ladybug/ns1.cluster1"
    assert resources.cluster_key(kind, other) == "ladybug/ns1.cluster2"
    assert resources.correlation_id(kind, obj) == "ladybugcluster:ladybug/ns1.cluster1"
    assert not set(obj["metadata"]["labels"]) & set(resources.CLUSTER_LABELS)
    # Even a label another provider reads does not pull it into someone else's story.
    obj["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = "cluster1"
    assert resources.cluster_key(kind, obj) == "ladybug/ns1.cluster1"
