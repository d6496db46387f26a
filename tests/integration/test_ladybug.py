"""CB-Ladybug end to end: the REST API, the provisioner, the watcher and the writer as
processes against the real API server, NATS and Redis; the CB-Tumblebug stand-in as a process
whose VMs are real sshd processes on loopback addresses answering through the node emulator;
joined nodes registered in a second real API server playing the workload cluster.

A plain HTTP client calls the API as a user would. Kills are SIGKILL of the provisioner
process, mid-provisioning; what must hold afterwards is read from the stand-in (one MCIS
create) and from the leader's own command log (one ``kubeadm init``).

One set of processes serves the module; each test uses its own cluster names.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.bus import Bus
from shared.coordination import share
from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig
from shared.messages import PatchStatus
from shared.models.ladybug import kubeconfig_secret_name
from shared.resources import LADYBUG_CLUSTER, NAMESPACE, NODE, SECRET
from shared.subjects import PREFIX, STATUS, partition_of
from standins.tumblebug import spider_url
from testenv.harness import LocalStack, free_port
from tests.integration.support import ROOT, ServiceProcess, eventually, read_stream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Json = dict[str, Any]
TOKEN = "e2e-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TBNS = "ns-1"
CONNECTION = "aws-ap-northeast-2"
SPEC = "t3.medium"


@dataclass
class Ladybug:
    stack: LocalStack
    url: str
    tumblebug: str
    namespace: str
    nodes_dir: Path
    workload: Path
    log_dir: Path
    provisioners: list[ServiceProcess] = field(default_factory=list)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=120, headers=AUTH)

    def start_provisioner(self, replica: str = "", **env: str) -> ServiceProcess:
        proc = ServiceProcess(
            "ladybug",
            {
                **self.stack.env(),
                **_settings(),
                **env,
                "CAPIBUS_LADYBUG__NAMESPACE": self.namespace,
                "CAPIBUS_LADYBUG__SSH_RETRY_SECONDS": "0.5",
                "TUMBLEBUG_URL": self.tumblebug,
                "SPIDER_URL": spider_url(self.tumblebug),
            },
            self.log_dir,
            replica or uuid.uuid4().hex[:6],
            "services.ladybug.provisioner",
        ).start()
        self.provisioners.append(proc)
        return proc

    async def standin(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.tumblebug, timeout=10) as client:
            return (await client.get(f"/_standin/{path}")).json()

    async def fault(self, fault: Json) -> None:
        async with httpx.AsyncClient(base_url=self.tumblebug, timeout=10) as client:
            (await client.post("/_standin/faults", json=fault)).raise_for_status()

    async def clear_faults(self) -> None:
        async with httpx.AsyncClient(base_url=self.tumblebug, timeout=10) as client:
            (await client.delete("/_standin/faults")).raise_for_status()

    async def mcis(self) -> list[Json]:
        state = await self.standin("state")
        found: list[Json] = state["mcis"].get(TBNS, [])
        return found

    def commands(self, address: str) -> list[str]:
        """Every command the node on ``address`` answered (its emulator's log)."""
        logs = list(self.nodes_dir.glob(f"**/{address}/commands.log")) or [
            p
            for p in self.nodes_dir.glob("**/commands.log")
            if json.loads((p.parent / "node.json").read_text()).get("address") == address
        ]
        return [
            json.loads(line)["command"]
            for path in logs
            for line in path.read_text().splitlines()
            if line.strip()
        ]


def _settings() -> dict[str, str]:
    return {
        "CAPIBUS_LEASE_TTL": "2",
        "CAPIBUS_CONSUMER__ACK_WAIT": "5",
        "CAPIBUS_METRICS_PORT": "0",
    }


def _start_tumblebug(log_dir: Path, nodes_dir: Path, workload: Path) -> tuple[Any, str]:
    url_file = log_dir / "tumblebug.url"
    env = {**os.environ, "STANDIN_TUMBLEBUG_URL_FILE": str(url_file)}
    with (log_dir / "tumblebug.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "standins.tumblebug",
                "--port",
                "0",
                "--nodes-dir",
                str(nodes_dir),
                "--workload-kubeconfig",
                str(workload),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 30
    while not (url_file.exists() and url_file.read_text().strip()):
        assert proc.poll() is None, (log_dir / "tumblebug.log").read_text()
        assert time.monotonic() < deadline, "the Tumblebug stand-in did not start"
        time.sleep(0.1)
    return proc, url_file.read_text().strip()


def _await_healthy(url: str, api: ServiceProcess) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert api.proc is not None
        assert api.proc.poll() is None, api.log()
        try:
            if httpx.get(f"{url}/ladybug/healthy", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the Ladybug API did not start:\n{api.log()}")


@pytest.fixture(scope="module")
def ladybug(
    stack: LocalStack, crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ladybug]:
    log_dir = tmp_path_factory.mktemp("ladybug")
    nodes_dir = log_dir / "nodes"
    namespace = f"lb-{uuid.uuid4().hex[:6]}"
    workload = stack.workload()
    tumblebug, tumblebug_url = _start_tumblebug(log_dir, nodes_dir, workload)
    port = free_port()
    env = {**stack.env(), **_settings()}
    services = [
        ServiceProcess(
            "watcher", {**env, "CAPIBUS_WATCHER__KINDS": '["ladybugcluster"]'}, log_dir, "w"
        ).start(),
        ServiceProcess("writer", env, log_dir, "w").start(),
        ServiceProcess(
            "ladybug-api",
            {
                **env,
                "CAPIBUS_LADYBUG__NAMESPACE": namespace,
                "CAPIBUS_LADYBUG__API_HOST": "127.0.0.1",
                "CAPIBUS_LADYBUG__API_PORT": str(port),
                "CAPIBUS_LADYBUG__API_TOKEN": TOKEN,
                "CAPIBUS_LADYBUG__WAIT_TIMEOUT_SECONDS": "120",
                "TUMBLEBUG_URL": tumblebug_url,
            },
            log_dir,
            "api",
            "services.ladybug.api",
        ).start(),
    ]
    url = f"http://127.0.0.1:{port}"
    world = Ladybug(stack, url, tumblebug_url, namespace, nodes_dir, workload, log_dir)
    try:
        _await_healthy(url, services[-1])
        world.start_provisioner()
        yield world
    finally:
        for service in [*services, *world.provisioners]:
            service.stop()
        tumblebug.terminate()
        tumblebug.wait(30)


@pytest.fixture
async def lb(ladybug: Ladybug, kube: KubeClient) -> Ladybug:
    try:
        await kube.get(NAMESPACE, None, ladybug.namespace)
    except KubeNotFound:
        await kube.create(NAMESPACE, {"metadata": {"name": ladybug.namespace}})
    await ladybug.clear_faults()
    return ladybug


@pytest.fixture
async def workload_kube(ladybug: Ladybug) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(ladybug.workload), qps=None)
    yield client
    await client.aclose()


def new_name() -> str:
    return f"c{uuid.uuid4().hex[:6]}"


def cluster_request(name: str, *, control_planes: int = 1, workers: int = 2, **k8s: Any) -> Json:
    return {
        "name": name,
        "controlPlane": [{"connection": CONNECTION, "count": control_planes, "spec": SPEC}],
        "worker": [{"connection": CONNECTION, "count": workers, "spec": SPEC}],
        "config": {"kubernetes": k8s},
    }


async def node_names(workload_kube: KubeClient) -> set[str]:
    nodes, _ = await workload_kube.list(NODE)
    return {n["metadata"]["name"] for n in nodes}


async def read(kube: KubeClient, lb: Ladybug, name: str) -> Json | None:
    try:
        return await kube.get(LADYBUG_CLUSTER, lb.namespace, f"{TBNS}.{name}")
    except KubeNotFound:
        return None


def no_credential(body: Any) -> None:
    text = json.dumps(body)
    assert "credential" not in text
    assert "PRIVATE KEY" not in text


# --- the tests --------------------------------------------------------------------------------


async def test_create_add_remove_delete_through_the_rest_api(
    lb: Ladybug, kube: KubeClient, workload_kube: KubeClient
) -> None:
    name = new_name()
    async with lb.client() as client:
        created = await client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name))
        assert created.status_code == 200, created.text
        cluster = created.json()
        no_credential(cluster)
        assert cluster["status"]["phase"] == "Provisioned"
        assert cluster["clusterConfig"].startswith("apiVersion")
        nodes = [n["name"] for n in cluster["nodes"]]
        assert len(nodes) == 3
        assert set(nodes) <= await node_names(workload_kube)

        added = await client.post(
            f"/ladybug/ns/{TBNS}/clusters/{name}/nodes",
            json={"worker": [{"connection": CONNECTION, "count": 2, "spec": SPEC}]},
        )
        assert added.status_code == 200, added.text
        no_credential(added.json())
        everyone = [n["name"] for n in added.json()["items"]]
        assert len(everyone) == 5
        assert set(everyone) <= await node_names(workload_kube)

        victim = everyone[-1]
        removed = await client.delete(f"/ladybug/ns/{TBNS}/clusters/{name}/nodes/{victim}")
        assert removed.status_code == 200, removed.text
        listed = (await client.get(f"/ladybug/ns/{TBNS}/clusters/{name}/nodes")).json()
        assert victim not in [n["name"] for n in listed["items"]]
        assert victim not in await node_names(workload_kube)

        deleted = await client.delete(f"/ladybug/ns/{TBNS}/clusters/{name}")
        assert deleted.status_code == 200, deleted.text
    await eventually(
        lambda: read(kube, lb, name), lambda o: o is None, timeout=60, what=f"{name} gone"
    )
    assert name not in [m["name"] for m in await lb.mcis()]
    with pytest.raises(KubeNotFound):
        await kube.get(SECRET, lb.namespace, kubeconfig_secret_name(f"{TBNS}.{name}"))


async def test_external_etcd_with_three_control_planes_behind_an_nlb(
    lb: Ladybug, workload_kube: KubeClient
) -> None:
    name = new_name()
    request = cluster_request(name, control_planes=3, workers=1, etcd="external")
    request["config"]["kubernetes"]["loadbalancer"] = "nlb"
    async with lb.client() as client:
        created = await client.post(f"/ladybug/ns/{TBNS}/clusters", json=request)
        assert created.status_code == 200, created.text
        cluster = created.json()
        assert [n["role"] for n in cluster["nodes"]].count("control-plane") == 3
        assert {n["name"] for n in cluster["nodes"]} <= await node_names(workload_kube)
        (mcis,) = [m for m in await lb.mcis() if m["name"] == name]
        assert mcis["nlbs"] == [cluster["cpGroup"]]
        await client.delete(f"/ladybug/ns/{TBNS}/clusters/{name}")


async def test_single_cloud_on_aws_names_nodes_by_hostname_and_sets_up_the_ccm(
    lb: Ladybug, workload_kube: KubeClient
) -> None:
    name = new_name()
    request = cluster_request(name, workers=1, networkCni="calico")
    request["serviceType"] = "single"
    request["controlPlane"][0]["role"] = "capibus-control-plane"
    request["worker"][0]["role"] = "capibus-worker"
    async with lb.client() as client:
        created = await client.post(f"/ladybug/ns/{TBNS}/clusters", json=request)
        assert created.status_code == 200, created.text
        cluster = created.json()
        assert cluster["serviceType"] == "single"
        # the Nodes carry the EC2 hostnames the instance metadata gave, not the VM names
        names = await node_names(workload_kube)
        joined = {n for n in names if n.endswith(".ap-northeast-2.compute.internal")}
        assert len(joined & names) >= 2
        assert not {n["name"] for n in cluster["nodes"]} & names
        spider = (await lb.standin("state"))["spider"]
        roles = sorted(spider["profiles"].values())
        assert roles.count("capibus-control-plane") >= 1
        assert roles.count("capibus-worker") >= 1
        owned = {"key": f"kubernetes.io/cluster/{name}", "value": "owned"}
        assert sum(owned in tags for tags in spider["tags"].values()) >= 2 + 2  # VMs, SG, subnet
        leader = next(n for n in cluster["nodes"] if n["name"] == cluster["cpLeader"])
        commands = lb.commands(leader["publicIp"])
        assert any("create secret generic cloud-config" in c for c in commands)
        assert any("apply -f /tmp/addons/ccm/aws/" in c for c in commands)
        assert not (lb.nodes_dir / "nodes" / leader["publicIp"] / "fs/tmp/cloud-config").exists()

        before = len(spider["profiles"])
        added = await client.post(
            f"/ladybug/ns/{TBNS}/clusters/{name}/nodes",
            json={
                "worker": [
                    {"connection": CONNECTION, "count": 1, "spec": SPEC, "role": "capibus-worker"}
                ]
            },
        )
        assert added.status_code == 200, added.text
        assert len((await lb.standin("state"))["spider"]["profiles"]) == before + 1
        other = await client.post(
            f"/ladybug/ns/{TBNS}/clusters/{name}/nodes",
            json={
                "worker": [{"connection": "gcp-asia-northeast3", "count": 1, "spec": "e2-small"}]
            },
        )
        assert other.status_code == 500
        assert "must be the same connection config" in other.json()["message"]
        deleted = await client.delete(f"/ladybug/ns/{TBNS}/clusters/{name}")
        assert deleted.status_code == 200, deleted.text


async def test_a_bootstrap_failure_fails_the_cluster_and_leaves_no_mcis(
    lb: Ladybug, kube: KubeClient
) -> None:
    name = new_name()
    await lb.fault({"vm": "w-2-*", "node": {"bootstrap_fail": True}})
    async with lb.client() as client:
        created = await client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name))
    assert created.status_code == 500, created.text
    obj = await read(kube, lb, name)
    assert obj is not None
    assert obj["status"]["phase"] == "Failed"
    assert obj["status"]["reason"] == "SetupBoostrapFailedReason"
    await eventually(
        lb.mcis, lambda found: name not in [m["name"] for m in found], what="no MCIS left"
    )


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"vm": "c-1-*", "node": {"init_without_success": True}}, "InitControlPlaneFailedReason"),
        ({"vm": "w-*", "node": {"join_fail": True}}, "JoinWorkerFailedReason"),
        ({"vm": "w-1-*", "fault": "failed", "message": "no capacity"}, "AddNodeEntityFailedReason"),
        ({"vm": "w-1-*", "fault": "no-public-ip"}, "AddNodeEntityFailedReason"),
    ],
    ids=["init-without-success", "join-fails", "vm-failed", "no-public-ip"],
)
async def test_each_fault_fails_with_its_reason_and_leaves_no_mcis(
    lb: Ladybug, kube: KubeClient, fault: Json, reason: str
) -> None:
    name = new_name()
    await lb.fault(fault)
    async with lb.client() as client:
        created = await client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name))
        assert created.status_code == 500, created.text
        assert created.json()["kind"] == "Status"
        no_credential(created.json())
    obj = await read(kube, lb, name)
    assert obj is not None
    assert (obj["status"]["phase"], obj["status"]["reason"]) == ("Failed", reason)
    assert obj["status"]["message"]
    await eventually(
        lb.mcis, lambda found: name not in [m["name"] for m in found], what="no MCIS left"
    )


@pytest.mark.parametrize("when", ["bootstrapping", "bootstrapped", "joining"])
async def test_a_provisioner_killed_mid_way_leaves_one_mcis_and_one_init(
    lb: Ladybug, kube: KubeClient, when: str
) -> None:
    name = new_name()
    async with lb.client() as client:
        request = asyncio.create_task(
            client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name, workers=3))
        )

        def reached(obj: Json | None) -> bool:
            nodes = ((obj or {}).get("status") or {}).get("nodes") or []
            if when == "bootstrapping":
                return bool(nodes)
            if when == "bootstrapped":
                return bool(nodes) and all(n.get("bootstrapped") for n in nodes)
            return any(n.get("joined") for n in nodes)

        await eventually(
            lambda: read(kube, lb, name), reached, timeout=60, interval=0.05, what=when
        )
        for proc in lb.provisioners:
            proc.kill()
        lb.provisioners.clear()
        lb.start_provisioner()
        response = await request
    assert response.status_code == 200, response.text
    cluster = response.json()
    assert cluster["status"]["phase"] == "Provisioned"
    requests = await lb.standin("requests")
    mine = [m for m in await lb.mcis() if m["name"] == name]
    assert len(mine) == 1
    assert requests.get("mcis-create", 0) >= 1
    leader = next(n for n in cluster["nodes"] if n["name"] == cluster["cpLeader"])
    inits = [c for c in lb.commands(leader["publicIp"]) if "k8s-init" in c]
    assert len(inits) == 1, inits
    async with lb.client() as client:
        await client.delete(f"/ladybug/ns/{TBNS}/clusters/{name}")


async def test_two_replicas_share_ten_clusters_without_handling_one_twice(
    lb: Ladybug, bus: Bus
) -> None:
    # two fresh replicas, with leases long enough that a busy two-CPU test machine does not
    # let them lapse (which would move partitions, legitimately, between runs)
    for proc in lb.provisioners:
        proc.stop()
    lb.provisioners.clear()
    first = lb.start_provisioner("lb-a", CAPIBUS_LEASE_TTL="10")
    await eventually(lambda: _owned(first), lambda n: n == 16, timeout=60, what="16 partitions")
    second = lb.start_provisioner("lb-b", CAPIBUS_LEASE_TTL="10")
    # the placement gives each of the two replicas 8 of the 16 partitions
    seconds = share("lb-b", 16, ["lb-a", "lb-b"])
    await eventually(
        lambda: _owned(second), lambda n: n == len(seconds), timeout=60, what="a share"
    )
    await asyncio.sleep(2)  # the first one's hand-over of those
    # five clusters for each replica
    theirs: dict[bool, list[str]] = {True: [], False: []}
    while min(len(v) for v in theirs.values()) < 5:
        name = new_name()
        side = theirs[partition_of(f"{lb.namespace}/{TBNS}.{name}", 16) in seconds]
        if len(side) < 5:
            side.append(name)
    names = theirs[True] + theirs[False]
    async with lb.client() as client:
        answers = await asyncio.gather(
            *(
                client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(n, workers=1))
                for n in names
            )
        )
        assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
        mine = [m["name"] for m in await lb.mcis()]
        assert all(mine.count(n) == 1 for n in names)
        # who reported each cluster's status: exactly one replica per cluster
        patches = await read_stream(bus, STATUS.name, f"{PREFIX}.status.patch.ladybugcluster.>")
        sources: dict[str, set[str]] = {}
        for _, message in patches:
            if isinstance(message, PatchStatus) and message.ref.name.startswith(f"{TBNS}."):
                sources.setdefault(message.ref.name, set()).add(message.source)
        assert all(len(sources[f"{TBNS}.{n}"]) == 1 for n in names), sources
        assert len({s for n in names for s in sources[f"{TBNS}.{n}"]}) == 2, sources
        deleted = await asyncio.gather(
            *(client.delete(f"/ladybug/ns/{TBNS}/clusters/{n}") for n in names)
        )
        assert [d.status_code for d in deleted] == [200] * 10


async def _owned(replica: ServiceProcess) -> int:
    """How many partitions ``replica`` claimed so far, from its log."""
    return sum("owns partition" in line for line in replica.log().splitlines())
