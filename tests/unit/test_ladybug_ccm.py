"""Single-cloud Ladybug clusters: cloud hostnames and the cloud controller manager.

The fakes and the rig are ``test_ladybug_provisioner``'s (day-2 changes as in
``test_ladybug_provisioner_nodes``); CB-Spider is its ``FakeSpider``, which answers region and
connection info encrypted as Spider does.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from services.ladybug import logic
from services.ladybug.provisioner import cloud
from shared import spider
from shared.models.ladybug import NodeSet
from shared.tumblebug import TumblebugRefused, TumblebugUnavailable
from tests.fakes import FakeBus
from tests.unit.test_ladybug_provisioner import (
    OPENSTACK_INFO,
    Crash,
    FakeNode,
    FakeSpider,
    FakeTumblebug,
    Farm,
    Json,
    Rig,
    assert_failed,
    create,
    leader_cluster,
    make_deps,
)
from tests.unit.test_ladybug_provisioner_nodes import GenerationalKube, add_workers, remove


@pytest.fixture
def rig() -> Rig:
    kube, bus, tb, farm, sp = GenerationalKube(), FakeBus(), FakeTumblebug(), Farm(), FakeSpider()
    tb.farm = farm
    return Rig(kube, bus, tb, farm, make_deps(kube, bus, tb, farm, sp), spider=sp)


def single(
    connection: str = "aws-conn", *, roles: tuple[str, str] = ("cp", "wk"), **k: str
) -> Json:
    return logic.with_defaults(
        {
            "name": "c1",
            "serviceType": "single",
            "controlPlane": [
                {"connection": connection, "count": 1, "spec": "t3.medium", "role": roles[0]}
            ],
            "worker": [
                {"connection": connection, "count": 2, "spec": "t3.medium", "role": roles[1]}
            ],
            "config": {"kubernetes": {"networkCni": "calico", **k}},
        }
    )


def hostnames(rig: Rig) -> dict[str, str]:
    return {name: node["hostname"] for name, node in rig.nodes().items()}


# --- the pure rules ------------------------------------------------------------------------


def test_cloud_configs_render_like_upstreams_template() -> None:
    assert cloud.aws_config({"Zone": "ap-northeast-2a", "Region": "x"}) == (
        "[Global]\nZone=ap-northeast-2a\n"
    )
    text = cloud.openstack_config(OPENSTACK_INFO, subnet="subnet-1")
    assert text == (
        "[Global]\nauth-url=http://keystone:5000/v3\ndomain-name=Default\n"
        "password=s3cr'et\ntenant-id=p-1\nusername=admin\n\n[LoadBalancer]\nsubnet-id=subnet-1\n"
    )
    assert cloud.ncpvpc_config().startswith("[Global]\naccess-key=\ncluster-name=\n")
    with pytest.raises(ValueError, match="Password is missing"):
        cloud.openstack_config(
            {k: v for k, v in OPENSTACK_INFO.items() if k != "Password"}, subnet=""
        )


def test_roles_must_be_set_and_equal() -> None:
    def sets(*roles: str) -> list[NodeSet]:
        return [NodeSet(id=f"w-{i}", connection="c", spec="s", role=r) for i, r in enumerate(roles)]

    assert cloud.role_of(sets("a", "a")) == "a"
    for bad in (sets("a", "b"), sets(""), sets()):
        with pytest.raises(ValueError, match="role should be assigned"):
            cloud.role_of(bad)


def test_hostnames_are_checked_and_lowered() -> None:
    assert cloud.hostname("IP-10-0-0-1.ec2.internal\n") == "ip-10-0-0-1.ec2.internal"
    for bad in ("", "<html>404</html>", "a b", "-x"):
        assert cloud.hostname(bad) is None


def test_spider_values_round_trip_and_refusals_are_read() -> None:
    sealed = spider.conceal("p@ss'word", b"0123456789abcdef")
    assert sealed != "p@ss'word"
    assert spider.reveal(sealed) == "p@ss'word"
    answer = {"FID": "createTags", "OKeyValueList": [{"Key": "Result", "Value": "true"}]}
    assert spider.outputs(answer) == {"Result": "true"}
    lower = {"oKeyValueList": [{"key": "Zone", "value": "z"}]}
    assert spider.outputs(lower) == {"Zone": "z"}
    refused = {
        "OKeyValueList": [{"Key": "Result", "Value": "false"}, {"Key": "Reason", "Value": "no"}]
    }
    with pytest.raises(spider.TumblebugRefused, match="Reason: no"):
        spider.outputs(refused)


# --- create ----------------------------------------------------------------------------------


async def test_aws_nodes_are_named_by_their_cloud_hostname_and_the_ccm_is_installed(
    rig: Rig,
) -> None:
    create(rig, single())
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned", status
    names = hostnames(rig)
    assert all(
        h.startswith("ip-192-168-0-") and h.endswith(".compute.internal") for h in names.values()
    )
    cluster = leader_cluster(rig)
    assert set(cluster.members) == set(names.values())
    assert all(cluster.labels[h]["kubernetes.io/cluster"] == "c1" for h in names.values())
    # bootstrap.sh named each node by its hostname
    boots = rig.farm.commands("/tmp/bootstrap.sh")
    assert {c.split()[3] for _, c in boots} == set(names.values())
    # IAM: the control plane's role on the control plane, the workers' on the workers
    assert sorted(rig.spider.of(spider.ASSOCIATE_IAM_INSTANCE_PROFILE)) == sorted(
        [("i-0010", "cp"), ("i-0011", "wk"), ("i-0012", "wk")]
    )
    tags = rig.spider.of(spider.CREATE_TAGS)
    assert {t[0] for t in tags} == {"i-0010", "i-0011", "i-0012", "sg-1", "subnet-1"}
    assert {t[1] for t in tags} == {'{"key":"kubernetes.io/cluster/c1","value":"owned"}'}
    assert all(n["cloudPrepared"] for n in rig.nodes().values())
    # the cloud config became the Secret, and left the node again
    assert cluster.secrets == ["cloud-config"]
    leader = rig.farm.by_name(status["cpLeader"])
    assert cloud.CLOUD_CONFIG not in leader.files
    assert cluster.applied[-2:] == cloud.manifest_paths("aws")
    assert all(leader.files[p] for p in cloud.manifest_paths("aws"))


async def test_openstack_hostnames_come_from_tumblebug_and_the_password_stays_off_the_record(
    rig: Rig,
) -> None:
    create(rig, single("os-conn", roles=("", "")))
    uploaded: dict[str, bytes] = {}
    original = rig.farm.answer

    def keep(node: FakeNode, command: str) -> str:
        if command.startswith("sudo kubectl create secret"):
            uploaded.update(node.files)
        return original(node, command)

    rig.farm.answer = keep  # type: ignore[method-assign]
    await rig.settle()

    assert rig.status()["phase"] == "Provisioned"
    assert set(hostnames(rig).values()) == {f"ns01-{n}" for n in rig.nodes()}
    assert rig.tb.count("get_vm_ids") == 3
    assert not rig.spider.of(spider.ASSOCIATE_IAM_INSTANCE_PROFILE)
    config = uploaded[cloud.CLOUD_CONFIG].decode()
    assert "password=s3cr'et" in config
    assert "subnet-id=subnet-1" in config
    assert len(leader_cluster(rig).applied) == 1 + len(cloud.manifest_paths("openstack"))
    # the password reached the node's file and nothing else
    for _, message in rig.bus.published:
        assert "s3cr'et" not in message.model_dump_json()
    assert not any("s3cr'et" in command for _, command in rig.farm.log)


async def test_ncp_gets_its_empty_config_and_no_ccm(rig: Rig) -> None:
    create(rig, single("ncp-conn", roles=("", "")))
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    assert all(h.startswith("ns01-") for h in hostnames(rig).values())
    cluster = leader_cluster(rig)
    assert cluster.secrets == []
    leader = rig.farm.by_name(rig.status()["cpLeader"])
    assert leader.files[cloud.CLOUD_CONFIG].decode().startswith("[Global]\naccess-key=\n")


async def test_a_csp_without_known_hostnames_is_refused_before_anything_is_made(rig: Rig) -> None:
    create(rig, single("gcp-conn"))
    await rig.settle()
    status = await assert_failed(rig, "SetupCCMFailedReason")
    assert "supports only aws, openstack, ncpvpc" in status["message"]
    assert rig.tb.count("create_mcis") == 0


async def test_aws_without_roles_is_refused_before_anything_is_made(rig: Rig) -> None:
    create(rig, single(roles=("cp", "")))
    await rig.settle()
    status = await assert_failed(rig, "SetupCCMFailedReason")
    assert status["message"] == cloud.ROLE_MISSING
    assert rig.tb.count("create_mcis") == 0


async def test_spider_refusing_fails_the_cluster_and_cleans_up(rig: Rig) -> None:
    rig.spider.refuse[spider.CREATE_TAGS] = "UnauthorizedOperation"
    create(rig, single())
    await rig.settle()
    status = await assert_failed(rig, "SetupCCMFailedReason")
    assert "UnauthorizedOperation" in status["message"]


async def test_spider_away_is_waited_for_and_nothing_is_done_twice(rig: Rig) -> None:
    create(rig, single())
    rig.spider.faults.append(TumblebugUnavailable("Spider: connection refused"))
    with pytest.raises(TumblebugUnavailable):
        await rig.settle()
    rig.fresh()
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    assert len(rig.spider.of(spider.ASSOCIATE_IAM_INSTANCE_PROFILE)) == 3
    assert sum(rig.farm.inits.values()) == 1


async def test_a_resumed_install_keeps_the_secret_and_prepares_no_node_twice(rig: Rig) -> None:
    create(rig, single())
    rig.farm.crash_before["apply -f /tmp/addons/ccm/aws/aws-cloud"] = 0
    with pytest.raises(Exception, match="apply"):
        await rig.settle()
    rig.fresh()
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    assert len(rig.spider.of(spider.ASSOCIATE_IAM_INSTANCE_PROFILE)) == 3
    assert leader_cluster(rig).secrets == ["cloud-config"]


# --- day 2 -----------------------------------------------------------------------------------


async def test_added_aws_workers_get_their_profile_and_tags_and_leave_by_hostname(
    rig: Rig,
) -> None:
    create(rig, single())
    await rig.settle()
    before = len(rig.spider.of(spider.ASSOCIATE_IAM_INSTANCE_PROFILE))

    def with_role(obj: Json) -> None:
        obj["spec"]["worker"][-1]["role"] = "wk"

    _, ids = add_workers(rig, 1)
    with_role(rig.obj())
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned", status
    assert not status["reason"], status
    new = f"{ids[0]}-1"
    assert rig.nodes()[new]["cloudPrepared"]
    assert len(rig.spider.of(spider.ASSOCIATE_IAM_INSTANCE_PROFILE)) == before + 1
    hostname = rig.nodes()[new]["hostname"]
    assert hostname in leader_cluster(rig).members

    remove(rig, new)
    await rig.settle()
    assert new not in rig.nodes()
    assert hostname in leader_cluster(rig).drained
    assert hostname not in leader_cluster(rig).members


async def test_added_aws_workers_without_a_role_are_refused(rig: Rig) -> None:
    create(rig, single())
    await rig.settle()
    add_workers(rig, 1)
    await rig.settle()
    status = rig.status()
    assert status["phase"] == "Provisioned"
    assert status["reason"] == "SetupCCMFailedReason"
    assert rig.tb.count("add_vm") == 0


async def test_a_profile_associated_by_a_run_that_died_counts_as_done(rig: Rig) -> None:
    create(rig, single())
    original = rig.spider.anycall
    died = []

    async def dies_after_aws_answered(
        connection: str, function: str, inputs: Sequence[tuple[str, str]] = ()
    ) -> dict[str, str]:
        answer = await original(connection, function, inputs)
        if function == spider.ASSOCIATE_IAM_INSTANCE_PROFILE and not died:
            died.append(inputs)
            raise Crash("after AWS answered")
        if function == spider.ASSOCIATE_IAM_INSTANCE_PROFILE and inputs == died[0]:
            raise TumblebugRefused(
                "Reason: IncorrectState: There is an existing association",
                message="Reason: IncorrectState: There is an existing association",
            )
        return answer

    rig.spider.anycall = dies_after_aws_answered  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await rig.settle()
    rig.fresh()
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    assert all(n["cloudPrepared"] for n in rig.nodes().values())
