"""The Ladybug provisioner's day-2 flows: add nodes, remove nodes, delete; and host keys.

The fakes and the rig are ``test_ladybug_provisioner``'s. A spec change is made as the REST
API makes it (``services.ladybug.logic``: worker NodeSets appended with fresh ids, names
appended to ``removeNodes``), and bumps ``metadata.generation`` as the API server does.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from services.ladybug import logic
from services.ladybug.provisioner.steps import HOST_KEYS_KEY, host_keys_secret_name
from shared.errors import TemporaryError
from shared.kube import ResourceKind
from shared.messages import PatchStatus
from shared.models.ladybug import kubeconfig_secret_name, sshkey_secret_name
from shared.resources import LADYBUG_CLUSTER
from shared.tumblebug import TumblebugUnavailable
from tests.fakes import FakeBus
from tests.unit.test_ladybug_provisioner import (
    K8S_NS,
    TBNS,
    Crash,
    FakeSpider,
    FakeTumblebug,
    Farm,
    FinalizingKube,
    Json,
    Rig,
    create,
    leader_cluster,
    make_deps,
    request,
)

RNG = random.Random(7)


class GenerationalKube(FinalizingKube):
    """Bumps ``metadata.generation`` when the spec changes, as the API server does."""

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        before = copy.deepcopy((self.stored(kind, namespace, name) or {}).get("spec"))
        written = await super().patch_merge(kind, namespace, name, patch, subresource=subresource)
        stored = self.stored(kind, namespace, name)
        if stored is not None and stored.get("spec") != before:
            stored["metadata"]["generation"] += 1
            written["metadata"]["generation"] = stored["metadata"]["generation"]
        return written


@pytest.fixture
def rig() -> Rig:
    kube, bus, tb, farm, sp = GenerationalKube(), FakeBus(), FakeTumblebug(), Farm(), FakeSpider()
    tb.farm = farm
    return Rig(kube, bus, tb, farm, make_deps(kube, bus, tb, farm, sp), spider=sp)


async def provisioned(rig: Rig, req: Json | None = None) -> None:
    create(rig, req)
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"


def change_spec(rig: Rig, change: Any) -> int:
    """Apply ``change`` to the stored spec as the REST API would; the new generation."""
    obj = rig.obj()
    change(obj)
    obj["metadata"]["generation"] += 1
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1000)
    return int(obj["metadata"]["generation"])


def add_workers(rig: Rig, count: int, connection: str = "aws-conn") -> tuple[int, list[str]]:
    worker = logic.node_set_defaults(
        {"connection": connection, "count": count, "spec": "t3.medium"}
    )
    added: list[str] = []

    def append(obj: Json) -> None:
        sets = logic.worker_sets([worker], logic.next_worker_index(obj), RNG)
        added.extend(s["id"] for s in sets)
        obj["spec"]["worker"] += sets

    return change_spec(rig, append), added


def remove(rig: Rig, name: str) -> int:
    return change_spec(rig, lambda obj: obj["spec"]["removeNodes"].append(name))


# --- add --------------------------------------------------------------------------------------


async def test_add_two_workers(rig: Rig) -> None:
    await provisioned(rig)
    before = set(rig.nodes())
    probes = len(rig.farm.commands("systemctl is-enabled"))
    generation, ids = add_workers(rig, 2)

    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned"
    assert status["observedGeneration"] == generation
    assert (status["reason"], status["message"]) == ("", "")
    nodes = rig.nodes()
    new = {f"{i}-1" for i in ids}
    assert set(nodes) == before | new
    assert all(nodes[n]["bootstrapped"] and nodes[n]["joined"] for n in new)
    assert rig.tb.count("add_vm") == 2
    assert rig.tb.count("create_mcis") == 1
    assert set(leader_cluster(rig).members) == set(nodes)
    assert len(rig.farm.commands("kubeadm token create")) == 1
    # the new VMs were made by this run: none is asked whether it is bootstrapped
    assert len(rig.farm.commands("systemctl is-enabled")) == probes
    assert all(leader_cluster(rig).labels[n]["kubernetes.io/cluster"] == "c1" for n in new)
    assert logic.add_outcome(rig.obj(), ids).ok


async def test_an_add_that_fails_cleans_up_its_vms_and_forgets_them(rig: Rig) -> None:
    await provisioned(rig)
    before = set(rig.nodes())
    rig.farm.fail_always["worker join"] = 1
    _, ids = add_workers(rig, 2)

    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned"
    assert status["reason"] == "JoinWorkerFailedReason"
    assert status["message"].startswith("Fail to worker-node join.")
    assert set(rig.nodes()) == before
    mcis = rig.tb.mcis[(TBNS, "c1")]
    assert {vm["name"] for vm in mcis["vm"]} == before
    spec_ids = {w["id"] for w in rig.obj()["spec"]["worker"]}
    assert not spec_ids & set(ids)
    assert status["observedGeneration"] == rig.obj()["metadata"]["generation"]
    outcome = logic.add_outcome(rig.obj(), ids)
    assert not outcome.ok
    assert outcome.message == status["message"]

    # the next request starts clean: its nodes join, the failed ones are not tried again
    del rig.farm.fail_always["worker join"]
    generation, more = add_workers(rig, 1)
    await rig.settle()
    status = rig.status()
    assert status["observedGeneration"] == generation
    assert (status["reason"], status["message"]) == ("", "")
    assert set(rig.nodes()) == before | {f"{more[0]}-1"}


async def test_a_vm_refused_midway_takes_the_vms_made_before_with_it(rig: Rig) -> None:
    await provisioned(rig)
    before = set(rig.nodes())
    calls = 0
    original = rig.tb.add_vm

    async def second_refused(namespace: str, mcis: str, body: Json) -> Json:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise TumblebugUnavailable("500", status=500, message="out of capacity")
        return await original(namespace, mcis, body)

    rig.tb.add_vm = second_refused  # type: ignore[method-assign]
    add_workers(rig, 2)
    await rig.settle()

    status = rig.status()
    assert status["reason"] == "CreateMCISFailedReason"
    assert "out of capacity" in status["message"]
    assert {vm["name"] for vm in rig.tb.mcis[(TBNS, "c1")]["vm"]} == before


async def test_an_add_resumed_after_a_crash_makes_one_vm_per_nodeset(rig: Rig) -> None:
    await provisioned(rig)
    rig.farm.crash_before["/tmp/bootstrap.sh"] = 1
    generation, ids = add_workers(rig, 2)
    with pytest.raises(Crash):
        await rig.once()
    rig.fresh()
    await rig.settle()

    assert rig.status()["observedGeneration"] == generation
    assert rig.tb.count("add_vm") == 2
    assert all(rig.nodes()[f"{i}-1"]["joined"] for i in ids)
    assert all(count == 1 for count in rig.farm.joins.values())


# --- remove -----------------------------------------------------------------------------------


async def test_remove_a_worker(rig: Rig) -> None:
    await provisioned(rig)
    worker = next(n for n, v in rig.nodes().items() if v["role"] == "worker")
    generation = remove(rig, worker)

    await rig.settle()

    status = rig.status()
    assert status["observedGeneration"] == generation
    assert worker not in rig.nodes()
    cluster = leader_cluster(rig)
    assert cluster.drained == [worker]
    assert worker not in cluster.members
    assert worker not in {vm["name"] for vm in rig.tb.mcis[(TBNS, "c1")]["vm"]}
    assert logic.remove_outcome(rig.obj(), worker).ok
    # and it is not added back by the next change
    add_workers(rig, 1)
    await rig.settle()
    assert worker not in rig.nodes()


async def test_the_leader_is_never_removed_but_another_control_plane_is(rig: Rig) -> None:
    await provisioned(rig, request(control_planes=3, workers=1))
    leader = rig.status()["cpLeader"]
    other = next(n for n, v in rig.nodes().items() if v["role"] == "control-plane" and n != leader)
    remove(rig, leader)
    remove(rig, other)
    await rig.settle()

    assert leader in rig.nodes()
    assert other not in rig.nodes()
    assert rig.status()["phase"] == "Provisioned"


async def test_a_drain_that_fails_keeps_the_node_and_says_why(rig: Rig) -> None:
    await provisioned(rig)
    worker = next(n for n, v in rig.nodes().items() if v["role"] == "worker")
    rig.farm.fail_always["drain"] = 1
    remove(rig, worker)
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned"
    assert status["reason"] == "RemoveNodeFailedReason"
    assert worker in status["message"]
    assert worker in rig.nodes()
    assert not logic.remove_outcome(rig.obj(), worker).ok


# --- delete -----------------------------------------------------------------------------------


async def delete(rig: Rig) -> None:
    await rig.kube.delete(LADYBUG_CLUSTER, K8S_NS, rig.obj()["metadata"]["name"])


async def test_delete_a_provisioned_cluster(rig: Rig) -> None:
    await provisioned(rig)
    name = rig.obj()["metadata"]["name"]
    cluster = leader_cluster(rig)
    await delete(rig)

    await rig.once()

    assert rig.kube.stored(LADYBUG_CLUSTER, K8S_NS, name) is None
    assert rig.tb.mcis == {}
    assert rig.tb.count("control_terminate") == 1
    assert cluster.deleted_all == 1
    assert rig.secret(kubeconfig_secret_name(name)) is None
    assert rig.secret(host_keys_secret_name(name)) is None
    # the sshKey (like the MCIR it belongs to) stays for the namespace's next cluster
    assert rig.secret(sshkey_secret_name(TBNS, "aws-conn")) is not None
    assert any(m.patch.get("phase") == "Deleting" for m in rig.bus.of(PatchStatus))


@pytest.mark.parametrize("gone", ["mcis", "namespace"])
async def test_deletion_completes_when_tumblebug_knows_nothing(rig: Rig, gone: str) -> None:
    await provisioned(rig)
    name = rig.obj()["metadata"]["name"]
    if gone == "mcis":
        rig.tb.mcis.clear()
    else:
        rig.tb.namespaces.clear()
    await delete(rig)
    await rig.once()
    assert rig.kube.stored(LADYBUG_CLUSTER, K8S_NS, name) is None


async def test_a_refused_delete_keeps_the_cluster_deleting_with_the_reason(rig: Rig) -> None:
    await provisioned(rig)
    refusal = TumblebugUnavailable("500", status=500, message="CSP is busy")
    rig.tb.fail("delete_mcis", refusal, copy.copy(refusal))
    await delete(rig)
    with pytest.raises(TemporaryError):
        await rig.once()

    status = rig.status()
    assert status["phase"] == "Deleting"
    assert status["reason"] == "DeleteMCISFailedReason"
    assert "CSP is busy" in status["message"]
    assert rig.tb.count("control_refine") == 1
    await rig.once()
    assert rig.kube.of_kind(LADYBUG_CLUSTER) == []


async def test_deleting_a_cluster_that_failed_on_a_foreign_mcis_leaves_it(rig: Rig) -> None:
    rig.tb.mcis[(TBNS, "c1")] = {"name": "c1", "description": "someone's", "vm": []}
    create(rig)
    await rig.settle()
    assert rig.status()["reason"] == "AlreadyExistMCISFailedReason"
    await delete(rig)
    await rig.once()
    assert rig.kube.of_kind(LADYBUG_CLUSTER) == []
    assert (TBNS, "c1") in rig.tb.mcis


async def test_delete_of_a_cluster_never_provisioned(rig: Rig) -> None:
    rig.tb.namespaces.clear()
    create(rig)
    await rig.settle()
    await delete(rig)
    await rig.once()
    assert rig.kube.of_kind(LADYBUG_CLUSTER) == []


# --- host keys --------------------------------------------------------------------------------


async def test_host_keys_are_remembered_per_cluster_and_checked(rig: Rig) -> None:
    await provisioned(rig)
    name = rig.obj()["metadata"]["name"]
    secret = rig.secret(host_keys_secret_name(name))
    assert secret is not None
    assert HOST_KEYS_KEY in secret["data"]

    # a node that shows another key than the one first seen is not talked to
    leader = rig.farm.by_name(rig.status()["cpLeader"])
    leader.host_key = "ssh-ed25519 SOMEONE-ELSE"
    add_workers(rig, 1)
    await rig.settle()
    status = rig.status()
    assert status["reason"] == "SetupBoostrapFailedReason"
    assert "host key" in status["message"]
