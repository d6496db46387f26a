"""CB-Ladybug's pure rules: defaults, validation in upstream's order and words, naming, the
request → spec mapping and the resource → upstream JSON views."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.ladybug import logic
from shared.models.ladybug import LadybugCluster

pytestmark = pytest.mark.timeout(5)

Json = dict[str, Any]


def node_set(**overrides: Any) -> Json:
    return {"connection": "config-aws", "count": 1, "spec": "t3.medium", **overrides}


def request(**overrides: Any) -> Json:
    return {
        "name": "cluster-01",
        "controlPlane": [node_set()],
        "worker": [node_set(count=2)],
        **overrides,
    }


def k8s(**values: Any) -> Json:
    return {"config": {"kubernetes": values}}


def refusal(req: Json) -> str:
    with pytest.raises(logic.InvalidRequest) as caught:
        logic.validate_cluster(logic.with_defaults(req))
    return str(caught.value)


# --- defaults -------------------------------------------------------------------------------


def test_defaults_are_upstreams_plus_etcd_local_and_service_type_multi() -> None:
    req = logic.with_defaults(request())
    assert req["serviceType"] == "multi"
    assert req["config"]["installMonAgent"] == "no"
    assert req["config"]["kubernetes"] == {
        "version": "1.23.13",
        "podCidr": "10.244.0.0/16",
        "serviceCidr": "10.96.0.0/12",
        "serviceDnsDomain": "cluster.local",
        "loadbalancer": "haproxy",
        "etcd": "local",
        "networkCni": "kilo",
    }
    assert req["worker"][0]["rootDisk"] == {"type": "default", "size": "default"}
    logic.validate_cluster(req)


def test_defaults_keep_what_was_given_and_do_not_touch_the_request() -> None:
    original = request(serviceType="single", **k8s(networkCni="calico", etcd="external"))
    req = logic.with_defaults(original)
    assert req["serviceType"] == "single"
    assert req["config"]["kubernetes"]["networkCni"] == "calico"
    assert req["config"]["kubernetes"]["etcd"] == "external"
    assert "rootDisk" not in original["worker"][0]


# --- validation, in upstream's order --------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (request(controlPlane=[]), "Control plane node must be at least one"),
        (
            request(controlPlane=[node_set(), node_set()]),
            "Only one control plane node is supported",
        ),
        (request(worker=[]), "Worker node must be at least one"),
        (
            request(**k8s(networkCni="calico")),
            "Network-cni allows only canal or kilo in Multi-Cloud type",
        ),
        (
            request(serviceType="single", **k8s(networkCni="kilo")),
            "Network-cni allows only calico or flannel in Single-Cloud type",
        ),
        (request(serviceType="hybrid"), "serviceType allows only multi or single"),
        (request(**k8s(loadbalancer="f5")), "loadbalancer allows only haproxy or nlb"),
        (request(**k8s(etcd="remote")), "etcd allows only local or external"),
        (request(**k8s(etcd="external")), "External etcd must have 3,5,7 controlPlane count"),
        (request(name=""), "Cluster name is empty"),
        (
            request(name="Cluster"),
            "Cluster: The first character of name must be a lowercase letter, and all following "
            "characters must be a dash, lowercase letter, or digit, except the last character, "
            "which cannot be a dash.",
        ),
        (
            request(**k8s(podCidr="10.244.0.0")),
            "podCidr 10.244.0.0 : Type mismatch ex)10.244.0.0/16",
        ),
        (request(**k8s(serviceCidr="x/12")), "serviceCidr x/12 : Type mismatch ex)10.244.0.0/16"),
        (request(controlPlane=[node_set(connection="")]), "Connection is empty"),
        (request(worker=[node_set(spec="")]), "Machine specification is empty"),
    ],
)
def test_each_rule_has_upstreams_message(req: Json, message: str) -> None:
    assert refusal(req) == message


def test_the_first_broken_rule_answers() -> None:
    # no control plane and a bad name: the control plane rule comes first upstream
    assert refusal(request(controlPlane=[], name="X")) == "Control plane node must be at least one"
    # CNI before loadbalancer before etcd
    bad = request(**k8s(networkCni="calico", loadbalancer="f5", etcd="remote"))
    assert refusal(bad) == "Network-cni allows only canal or kilo in Multi-Cloud type"


@pytest.mark.parametrize("name", ["a", "cluster-01", "a1-b2"])
def test_dns_label_names_pass(name: str) -> None:
    logic.validate_name(name)


@pytest.mark.parametrize("name", ["1a", "a-", "a_b", "a.b", "-a"])
def test_other_names_fail(name: str) -> None:
    with pytest.raises(logic.InvalidRequest, match="The first character of name"):
        logic.validate_name(name)


def test_external_etcd_with_3_5_7_control_planes_passes() -> None:
    for count in (3, 5, 7):
        logic.validate_cluster(
            logic.with_defaults(
                request(controlPlane=[node_set(count=count)], **k8s(etcd="external"))
            )
        )


def test_service_level_refusals() -> None:
    def check(req: Json) -> str | None:
        return logic.service_refusal(logic.with_defaults(req))

    assert check(request()) is None
    assert check(request(controlPlane=[node_set(count=0)])) == (
        "Control-Plane count must be at least one."
    )
    assert check(request(worker=[node_set(count=0, connection="c2")])) == (
        "Worker count must be at least one. (connection=c2)"
    )
    single = request(serviceType="single", worker=[node_set(connection="other")])
    assert check(single) == "All nodes must be the same connection config. (connection=other)"


def test_add_node_validation() -> None:
    with pytest.raises(logic.InvalidRequest, match=r"^Control plane node is not supported$"):
        logic.validate_add_nodes({"controlPlane": [node_set()], "worker": [node_set()]})
    with pytest.raises(logic.InvalidRequest, match=r"^Worker node must be at least one$"):
        logic.validate_add_nodes({"worker": []})
    with pytest.raises(logic.InvalidRequest, match=r"^Connection is empty$"):
        logic.validate_add_nodes({"worker": [node_set(connection="")]})
    workers = logic.validate_add_nodes({"worker": [node_set(count=2)]})
    assert workers[0]["rootDisk"] == {"type": "default", "size": "default"}


def test_nlb_refusals() -> None:
    assert logic.nlb_refusal("haproxy", {"ProviderName": "IBM"}) is None
    assert logic.nlb_refusal("nlb", {"ProviderName": "IBM"}) == (
        "ibm does not yet supported nlb loadbalancer."
    )
    assert logic.nlb_refusal("nlb", {"ProviderName": "NCPVPC", "RegionName": "kr"}) == (
        "To use nlb in ncpvpc, must use SGN, JPN region"
    )
    assert logic.nlb_refusal("nlb", {"ProviderName": "NCPVPC", "RegionName": "sgn1"}) is None
    assert logic.nlb_refusal("nlb", {"ProviderName": "AWS"}) is None
    assert logic.nlb_refusal("nlb", None) is None


# --- naming and the spec ------------------------------------------------------------------------


def test_subgroup_names() -> None:
    rng = random.Random(1)
    name = logic.node_set_id("worker", 3, rng)
    assert name.startswith("w-3-")
    assert len(name) == len("w-3-") + 5
    assert set(name[4:]) <= set(logic.NAME_ALPHABET)
    assert logic.node_set_id("control-plane", 1, rng).startswith("c-1-")
    assert logic.name_index("w-12-abcde-1") == 12
    assert logic.name_index("leader") == 0


def test_spec_of_a_request() -> None:
    req = logic.with_defaults(
        request(
            controlPlane=[node_set(count=3)],
            worker=[node_set(count=2), node_set(connection="config-gcp", spec="e2")],
            label="l",
            description="d",
        )
    )
    obj = logic.cluster_object("ladybug", "ns-1", req, random.Random(7))
    assert obj["metadata"]["name"] == "ns-1.cluster-01"
    assert obj["metadata"]["namespace"] == "ladybug"
    assert obj["metadata"]["finalizers"] == ["ladybug.capibus.dev/cleanup"]
    assert obj["metadata"]["labels"] == {
        "ladybug.capibus.dev/namespace": "ns-1",
        "ladybug.capibus.dev/cluster": "cluster-01",
    }
    spec = obj["spec"]
    [cp] = spec["controlPlane"]
    assert cp["id"].startswith("c-1-")
    assert cp["count"] == 3
    assert [w["id"][:4] for w in spec["worker"]] == ["w-1-", "w-2-", "w-3-"]
    assert [w["count"] for w in spec["worker"]] == [1, 1, 1]
    assert spec["worker"][2]["connection"] == "config-gcp"
    assert spec["removeNodes"] == []
    assert spec["label"] == "l"
    assert spec["description"] == "d"
    assert spec["config"]["kubernetes"]["storageclass"] == {"nfs": {"server": "", "path": ""}}
    # the resource model (and so the CRD) accepts it as it is
    LadybugCluster.model_validate(obj)


def test_next_worker_index_counts_spec_and_nodes() -> None:
    obj = {
        "spec": {"worker": [{"id": "w-1-aaaaa"}, {"id": "w-4-bbbbb"}]},
        "status": {"nodes": [{"name": "w-6-ccccc-1", "role": "worker"}]},
    }
    assert logic.next_worker_index(obj) == 7
    assert logic.next_worker_index({}) == 1
    sets = logic.worker_sets([logic.node_set_defaults(node_set(count=2))], 7, random.Random(3))
    assert [s["id"][:4] for s in sets] == ["w-7-", "w-8-"]


# --- views ------------------------------------------------------------------------------------


def provisioned() -> Json:
    req = logic.with_defaults(request())
    obj = logic.cluster_object("ladybug", "ns-1", req, random.Random(1))
    obj["metadata"].update(generation=1, uid="u1", resourceVersion="5")
    obj["status"] = {
        "phase": "Provisioned",
        "mcis": "cluster-01",
        "k8sVersion": "1.23.13-00",
        "cpLeader": "c-1-aaaaa-1",
        "cpGroup": "c-1-aaaaa",
        "createdTime": "2024-01-02T03:04:05Z",
        "observedGeneration": 1,
        "nodes": [
            {
                "name": "c-1-aaaaa-1",
                "publicIp": "127.0.0.2",
                "privateIp": "10.0.0.2",
                "role": "control-plane",
                "spec": "t3.medium",
                "csp": "aws",
                "createdTime": "2024-01-02T03:04:05Z",
                "cspLabel": "topology.cloud-barista.github.io/csp=aws",
                "regionLabel": "topology.kubernetes.io/region=r",
                "zoneLabel": "topology.kubernetes.io/zone=z",
                "subGroup": "c-1-aaaaa",
                "bootstrapped": True,
                "joined": True,
                "credential": "must never show",
            }
        ],
    }
    return obj


def test_cluster_view_is_upstreams_shape_without_credentials() -> None:
    view = logic.cluster_view(provisioned(), kubeconfig="apiVersion: v1")
    assert list(view) == [
        "name",
        "kind",
        "status",
        "mcis",
        "namespace",
        "k8sVersion",
        "clusterConfig",
        "cpLeader",
        "cpGroup",
        "networkCni",
        "label",
        "installMonAgent",
        "loadbalancer",
        "etcd",
        "description",
        "createdTime",
        "serviceType",
        "nodes",
    ]
    assert view["status"] == {"phase": "Provisioned", "reason": "", "message": ""}
    assert view["clusterConfig"] == "apiVersion: v1"
    assert view["namespace"] == "ns-1"
    [node] = view["nodes"]
    assert list(node) == [
        "name",
        "kind",
        "publicIp",
        "privateIp",
        "role",
        "spec",
        "csp",
        "createdTime",
        "cspLabel",
        "regionLabel",
        "zoneLabel",
    ]
    assert "credential" not in str(view)


def test_phase_before_the_provisioner_and_while_deleting() -> None:
    obj = provisioned()
    del obj["status"]
    assert logic.phase(obj) == "Pending"
    assert logic.cluster_view(obj)["k8sVersion"] == "1.23.13-00"
    obj["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert logic.phase(obj) == "Deleting"


def test_settled_needs_the_generation_unless_failed() -> None:
    obj = provisioned()
    assert logic.settled(obj, 1)
    assert not logic.settled(obj, 2)
    obj["status"]["phase"] = "Failed"
    assert logic.settled(obj, 2)
    obj["status"]["phase"] = "Provisioning"
    assert not logic.settled(obj, 1)


def test_outcomes() -> None:
    obj = provisioned()
    assert logic.create_outcome(obj).ok
    assert logic.add_outcome(obj, ["c-1-aaaaa"]).ok
    missing = logic.add_outcome(obj, ["w-3-zzzzz"])
    assert not missing.ok
    assert missing.message == "Failed to add nodes. (subgroups=w-3-zzzzz)"
    obj["status"]["conditions"] = [
        {"type": "NodesAdded", "status": "False", "message": "Fail to worker-node join."}
    ]
    assert logic.add_outcome(obj, ["w-3-zzzzz"]).message == "Fail to worker-node join."
    assert not logic.remove_outcome(obj, "c-1-aaaaa-1").ok
    assert logic.remove_outcome(obj, "w-9-xxxxx-1").ok
    obj["status"].update(phase="Failed", reason="JoinWorkerFailedReason", message="join failed")
    outcome = logic.create_outcome(obj)
    assert (outcome.ok, outcome.message) == (False, "join failed")


def test_node_list_and_find() -> None:
    obj = provisioned()
    assert logic.node_list(None) == {"kind": "NodeList", "items": []}
    assert [n["name"] for n in logic.node_list(obj)["items"]] == ["c-1-aaaaa-1"]
    assert logic.find_node(obj, "c-1-aaaaa-1") is not None
    assert logic.find_node(obj, "nope") is None


# --- spec list ------------------------------------------------------------------------------


SPECS = [
    {"name": "small", "mem": "1024", "vcpu": {"count": "1", "clock": "2.5"}},
    {"name": "medium", "mem": "4096", "vcpu": {"count": "2", "clock": "2.5"}},
    # CB-Spider's names, as Tumblebug passes them through
    {"Name": "large", "Mem": "16384", "VCpu": {"Count": "8", "Clock": ""}},
]


def test_spec_bounds_and_filter() -> None:
    bounds = logic.spec_bounds("Y")
    assert (bounds.cpu_min, bounds.memory_min, bounds.cpu_max) == (2, 2, 99999)
    listed = logic.spec_list("config-aws", SPECS, bounds)
    assert listed["kind"] == "specList"
    assert listed["connectionName"] == "config-aws"
    assert [s["name"] for s in listed["items"]] == ["medium", "large"]
    assert listed["items"][0] == {
        "name": "medium",
        "memory": "4",
        "cpu": {"count": "2", "clock": "2.5"},
    }
    worker = logic.spec_bounds(None, cpu_max="4")
    assert [s["name"] for s in logic.spec_list("c", SPECS, worker)["items"]] == ["small", "medium"]
    with pytest.raises(logic.Refused, match=r"Failed to convert memory. \(memory=lots\)"):
        logic.spec_list("c", [{"name": "x", "mem": "lots", "vcpu": {"count": "1"}}], worker)


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        (
            logic.spec_bounds("Y", cpu_min="1"),
            "Kubernetes control plane node needs 2 cpu at least. (cpu-min=1)",
        ),
        (
            logic.spec_bounds("Y", memory_min="1"),
            "Kubernetes control plane node needs 2 memory at least. (memory-min=1)",
        ),
        (
            logic.spec_bounds("N", cpu_min="4", cpu_max="2"),
            "The cpu-max must be greater than or equal to the cpu-min. (cpu-min=4 cpu-max=2)",
        ),
        (
            logic.spec_bounds("N", memory_min="8", memory_max="x"),
            "The memory-max must be greater than or equal to the memory-min. "
            "(memory-min=8 memory-max=0)",
        ),
    ],
)
def test_spec_bound_refusals(bounds: logic.SpecBounds, message: str) -> None:
    assert logic.spec_bounds_refusal(bounds) == message
