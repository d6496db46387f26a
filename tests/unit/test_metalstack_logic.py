"""The metal-stack provider's pure rules: what it asks metal-api for, and how it reads answers."""

import json
import urllib.parse
from typing import Any

from services.baremetal.metalstack import logic
from services.baremetal.metalstack.logic import ClusterPlace
from shared.resources import (
    CAPI_CLUSTER,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
    cluster_key,
)

MSC: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "c1", "uid": "msc-uid"},
    "spec": {
        "projectID": "p1",
        "partition": "vagrant",
        "publicNetworkID": "internet-vagrant-lab",
        "privateNetworkID": "net-1",
        "controlPlaneEndpoint": {"host": "185.1.2.10", "port": 6443},
    },
}


def msm(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c1-md-x", "uid": "msm-uid"},
        "spec": {"image": "ubuntu-cloud-init-20.04", "machineType": "v1-small-x86", **spec},
    }


def request(obj: dict[str, Any], *, control_plane: bool) -> dict[str, Any]:
    return logic.machine_request(
        obj,
        ClusterPlace.of(MSC),
        private_network="net-1",
        user_data="#cloud-config",
        control_plane=control_plane,
        control_plane_ip="185.1.2.10",
    )


def test_a_worker_is_allocated_in_both_networks_with_upstreams_tags_and_ours() -> None:
    body = request(msm(sshKeys=["ssh-ed25519 AAAA"], tags=["team=a"]), control_plane=False)
    assert body["name"] == body["hostname"] == "c1-md-x"
    assert (body["imageid"], body["sizeid"]) == ("ubuntu-cloud-init-20.04", "v1-small-x86")
    assert (body["partitionid"], body["projectid"]) == ("vagrant", "p1")
    assert body["networks"] == [
        {"networkid": "internet-vagrant-lab", "autoacquire": True},
        {"networkid": "net-1", "autoacquire": True},
    ]
    assert body["tags"] == [
        "cluster.metal-stack.io/id=msc-uid",
        "metal-stack.infrastructure.cluster.x-k8s.io/machine-resource=msm-uid",
        "team=a",
        "cluster.x-k8s.io/control-plane=false",
    ]
    assert body["ssh_pub_keys"] == ["ssh-ed25519 AAAA"]
    assert body["user_data"] == "#cloud-config"
    assert "ips" not in body
    assert "uuid" not in body


def test_a_control_plane_machine_carries_the_api_address_and_a_pinned_one_its_uuid() -> None:
    body = request(msm(providerID="metalstack://m-42"), control_plane=True)
    assert body["ips"] == ["185.1.2.10"]
    assert body["uuid"] == "m-42"
    assert body["tags"][-1] == "cluster.x-k8s.io/control-plane=true"


def test_provider_ids_parse_only_with_a_scheme_and_an_id() -> None:
    assert logic.machine_id("metalstack://abc") == "abc"
    assert logic.machine_id("metalstack:///abc") == "abc"
    assert logic.machine_id("abc") is None
    assert logic.machine_id("metalstack://") is None
    assert logic.machine_id(None) is None
    assert logic.provider_id("abc") == "metalstack://abc"


def test_addresses_name_the_hostname_then_the_first_ip_of_each_network() -> None:
    machine = {
        "allocation": {
            "hostname": "c1-md-x",
            "networks": [
                {"private": False, "ips": ["185.1.2.11", "185.1.2.12"]},
                {"private": True, "ips": ["10.0.0.5"]},
                {"private": True, "ips": []},
            ],
        }
    }
    assert logic.addresses(machine) == [
        {"type": "Hostname", "address": "c1-md-x"},
        {"type": "ExternalIP", "address": "185.1.2.11"},
        {"type": "InternalIP", "address": "10.0.0.5"},
    ]


def test_a_node_matches_only_its_own_machine_id_never_by_substring() -> None:
    def node(uuid: str) -> dict[str, Any]:
        info = {"systemUUID": uuid}
        return {"metadata": {"name": uuid or "blank"}, "status": {"nodeInfo": info}}

    nodes = [node(""), node("m-4"), node("m-42")]
    assert logic.node_for(nodes, "m-42") == nodes[2]
    assert logic.node_for(nodes, "m-420") is None


def test_the_firewall_ignition_enables_the_controller_and_writes_the_kubeconfig_0600() -> None:
    body = logic.firewall_request(
        {"metadata": {"name": "c1", "uid": "fw-uid"}, "spec": {"machineType": "s", "image": "fw"}},
        ClusterPlace.of(MSC),
        private_network="net-1",
        kubeconfig="apiVersion: v1\nkind: Config\n",
    )
    assert body["hostname"] == "c1-firewall"
    assert body["description"] == "c1 created by Cluster API provider MetalStack"
    ignition = json.loads(body["user_data"])
    assert ignition["systemd"]["units"] == [
        {"name": "firewall-controller.service", "enabled": True}
    ]
    (file,) = ignition["storage"]["files"]
    assert (file["path"], file["mode"], file["filesystem"]) == (
        "/etc/firewall-controller/.kubeconfig",
        0o600,
        "root",
    )
    source = file["contents"]["source"].removeprefix("data:,")
    assert urllib.parse.unquote(source) == "apiVersion: v1\nkind: Config\n"


def test_a_firewall_runs_once_it_phoned_home_or_metal_api_says_succeeded() -> None:
    def events(*names: str) -> dict[str, Any]:
        return {"events": {"log": [{"event": n} for n in names]}, "allocation": {}}

    assert logic.phoned_home(events("Phoned Home", "Booting New Kernel"))
    assert not logic.phoned_home(events("Booting New Kernel", "Installing"))
    assert not logic.phoned_home(events())
    assert logic.phoned_home({"allocation": {"succeeded": True}})


def test_paused_by_the_cluster_spec_or_an_annotation_on_either_object() -> None:
    cluster = {"kind": "Cluster", "metadata": {}, "spec": {}}
    assert not logic.paused(cluster, MSC)
    assert logic.paused({**cluster, "spec": {"paused": True}}, MSC)
    annotated = {"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}}
    assert logic.paused(cluster, annotated)


def test_owners_are_found_by_kind_and_group_in_any_version() -> None:
    obj = {
        "metadata": {
            "ownerReferences": [
                {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m"},
                {"apiVersion": "other.io/v1", "kind": "Cluster", "name": "x"},
            ]
        }
    }
    assert logic.owner_name(obj, "Machine") == "m"
    assert logic.owner_name(obj, "Cluster") is None


def test_control_plane_machines_are_marked_by_the_labels_presence() -> None:
    assert logic.is_control_plane({"metadata": {"labels": {logic.CONTROL_PLANE_LABEL: ""}}})
    assert not logic.is_control_plane({"metadata": {"labels": {}}})


def test_every_object_of_a_metal_stack_cluster_hashes_with_its_capi_cluster() -> None:
    capi_owner = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c1"}
    labelled = {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}}
    objects = [
        (CAPI_CLUSTER, {"metadata": {"namespace": "ns", "name": "c1"}}),
        (
            METALSTACK_CLUSTER,
            {"metadata": {"namespace": "ns", "name": "infra-c1", "ownerReferences": [capi_owner]}},
        ),
        (METALSTACK_MACHINE, {"metadata": {"namespace": "ns", "name": "m-0", **labelled}}),
        (METALSTACK_FIREWALL, {"metadata": {"namespace": "ns", "name": "infra-c1", **labelled}}),
        (SECRET, {"metadata": {"namespace": "ns", "name": "c1-kubeconfig", **labelled}}),
    ]
    assert {cluster_key(kind, obj) for kind, obj in objects} == {"ns/c1"}
