"""The Ladybug REST API as a process against the real API server, with the CB-Tumblebug
stand-in as a process (no sshd: only its namespaces and spec catalogue are asked here).

The provisioner is played by the test: it writes what the real one would (the finalizer,
the status with nodes and ``observedGeneration``, the kubeconfig Secret, dropping the
finalizer on deletion), so these tests pin the API's side of the contract: what it writes,
what it waits for, and what it answers. A plain HTTP client calls it, as a user would.

One API process and one stand-in serve the module; each test uses its own cluster names.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.models.ladybug import FINALIZER, kubeconfig_secret_name
from shared.resources import LADYBUG_CLUSTER, NAMESPACE, SECRET
from testenv.harness import LocalStack, free_port
from tests.integration.support import ROOT, ServiceProcess, eventually
from tests.unit.test_ladybug_api import check_document

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

Json = dict[str, Any]
TOKEN = "integration-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TBNS = "ns-1"
KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\n"
SPEC = "t3.small"
CONNECTION = "aws-ap-northeast-2"


@dataclass
class Ladybug:
    url: str
    namespace: str
    api: ServiceProcess
    tumblebug: subprocess.Popen[bytes]

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=60, **kw)


def _start_tumblebug(log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    url_file = log_dir / "tumblebug.url"
    env = {**os.environ, "STANDIN_TUMBLEBUG_URL_FILE": str(url_file)}
    with (log_dir / "tumblebug.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "standins.tumblebug", "--no-ssh", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 20
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
    log_dir = tmp_path_factory.mktemp("ladybug-api")
    namespace = f"lb-{uuid.uuid4().hex[:6]}"
    tumblebug, tumblebug_url = _start_tumblebug(log_dir)
    port = free_port()
    api = ServiceProcess(
        "ladybug-api",
        {
            **stack.env(),
            "CAPIBUS_LADYBUG__NAMESPACE": namespace,
            "CAPIBUS_LADYBUG__API_HOST": "127.0.0.1",
            "CAPIBUS_LADYBUG__API_PORT": str(port),
            "CAPIBUS_LADYBUG__API_TOKEN": TOKEN,
            "CAPIBUS_LADYBUG__WAIT_TIMEOUT_SECONDS": "30",
            "TUMBLEBUG_URL": tumblebug_url,
        },
        log_dir,
        "api",
        "services.ladybug.api",
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:
        _await_healthy(url, api)
        yield Ladybug(url, namespace, api, tumblebug)
    finally:
        api.stop()
        tumblebug.terminate()
        tumblebug.wait(10)


@pytest.fixture
async def lb(ladybug: Ladybug, kube: KubeClient) -> Ladybug:
    """The module's API, with its Kubernetes namespace created (once) for the test."""
    try:
        await kube.get(NAMESPACE, None, ladybug.namespace)
    except KubeNotFound:
        await kube.create(NAMESPACE, {"metadata": {"name": ladybug.namespace}})
    return ladybug


# --- the provisioner, played ------------------------------------------------------------------


class Provisioner:
    """Writes what the real provisioner would, one step at a time, when a test says so."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    async def read(self, cluster: str) -> Json | None:
        try:
            return await self.kube.get(LADYBUG_CLUSTER, self.namespace, f"{TBNS}.{cluster}")
        except KubeNotFound:
            return None

    async def appeared(self, cluster: str, *, generation: int = 1) -> Json:
        """The object once it exists at ``generation`` (or later)."""
        found = await eventually(
            lambda: self.read(cluster),
            lambda o: o is not None and o["metadata"]["generation"] >= generation,
            what=f"{cluster} at generation {generation}",
        )
        assert found is not None
        return found

    async def provision(self, cluster: str) -> Json:
        obj = await self.appeared(cluster)
        name = obj["metadata"]["name"]
        await self._merge(name, {"metadata": {"finalizers": [FINALIZER]}})
        await self.kube.create(SECRET, self._kubeconfig(name, cluster))
        spec = obj["spec"]
        [cp] = spec["controlPlane"]
        nodes = [node(f"{cp['id']}-{i}", "control-plane") for i in range(1, cp["count"] + 1)]
        nodes += [node(f"{w['id']}-1", "worker") for w in spec["worker"]]
        return await self.status(
            name,
            {
                "phase": "Provisioned",
                "mcis": cluster,
                "k8sVersion": "1.23.13-00",
                "cpLeader": nodes[0]["name"],
                "cpGroup": cp["id"],
                "createdTime": "2024-01-02T03:04:05Z",
                "observedGeneration": obj["metadata"]["generation"],
                "nodes": nodes,
            },
        )

    async def fail(self, cluster: str) -> Json:
        obj = await self.appeared(cluster)
        name = obj["metadata"]["name"]
        await self._merge(name, {"metadata": {"finalizers": [FINALIZER]}})
        failed = {
            "phase": "Failed",
            "reason": "SetupBoostrapFailedReason",
            "message": "Bootstrap failed. (cause='stand-in knob')",
            "observedGeneration": obj["metadata"]["generation"],
        }
        return await self.status(name, failed)

    async def converge_nodes(self, cluster: str, generation: int) -> Json:
        obj = await self.appeared(cluster, generation=generation)
        nodes = obj["status"]["nodes"]
        have = {n["name"].rsplit("-", 1)[0] for n in nodes}
        added = [
            node(f"{w['id']}-1", "worker") for w in obj["spec"]["worker"] if w["id"] not in have
        ]
        removed = set(obj["spec"].get("removeNodes") or [])
        kept = [n for n in nodes if n["name"] not in removed] + added
        status = {"observedGeneration": generation, "nodes": kept}
        return await self.status(obj["metadata"]["name"], status)

    async def finish_deletion(self, cluster: str) -> None:
        name = f"{TBNS}.{cluster}"
        await eventually(
            lambda: self.kube.get(LADYBUG_CLUSTER, self.namespace, name),
            lambda o: bool(o["metadata"].get("deletionTimestamp")),
            what=f"{name} being deleted",
        )
        with contextlib.suppress(KubeNotFound):  # a cluster that failed never had one
            await self.kube.delete(SECRET, self.namespace, kubeconfig_secret_name(name))
        await self._merge(name, {"metadata": {"finalizers": None}})

    async def status(self, name: str, status: Json) -> Json:
        return await self.kube.patch_merge(
            LADYBUG_CLUSTER, self.namespace, name, {"status": status}, subresource="status"
        )

    async def _merge(self, name: str, patch: Json) -> None:
        await self.kube.patch_merge(LADYBUG_CLUSTER, self.namespace, name, patch)

    def _kubeconfig(self, name: str, cluster: str) -> Json:
        return {
            "metadata": {
                "name": kubeconfig_secret_name(name),
                "namespace": self.namespace,
                "labels": {
                    "ladybug.capibus.dev/namespace": TBNS,
                    "ladybug.capibus.dev/cluster": cluster,
                },
            },
            "data": {"value": base64.b64encode(KUBECONFIG.encode()).decode()},
        }


def node(name: str, role: str) -> Json:
    return {
        "name": name,
        "publicIp": "127.0.0.9",
        "privateIp": "10.0.0.9",
        "role": role,
        "spec": SPEC,
        "csp": "aws",
        "createdTime": "2024-01-02T03:04:05Z",
        "cspLabel": "topology.cloud-barista.github.io/csp=aws",
        "regionLabel": "topology.kubernetes.io/region=ap-northeast-2",
        "zoneLabel": "topology.kubernetes.io/zone=ap-northeast-2a",
        "subGroup": name.rsplit("-", 1)[0],
        "bootstrapped": True,
        "joined": True,
    }


@pytest.fixture
def provisioner(lb: Ladybug, kube: KubeClient) -> Provisioner:
    return Provisioner(kube, lb.namespace)


def new_name() -> str:
    return f"c{uuid.uuid4().hex[:6]}"


def cluster_request(name: str, **overrides: Any) -> Json:
    return {
        "name": name,
        "controlPlane": [{"connection": CONNECTION, "count": 1, "spec": SPEC}],
        "worker": [{"connection": CONNECTION, "count": 2, "spec": SPEC}],
        **overrides,
    }


async def provisioned(lb: Ladybug, provisioner: Provisioner, name: str) -> Json:
    async with lb.client(headers=AUTH) as client:
        request = asyncio.create_task(
            client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name))
        )
        await provisioner.provision(name)
        response = await request
    assert response.status_code == 200, response.text
    body: Json = response.json()
    return body


# --- tests ------------------------------------------------------------------------------------


async def test_health_auth_and_the_openapi_document(lb: Ladybug) -> None:
    async with lb.client() as client:
        healthy = await client.get("/ladybug/healthy")
        assert (healthy.status_code, healthy.text) == (200, "cb-barista cb-ladybug")
        refused = await client.get(f"/ladybug/ns/{TBNS}/clusters")
        assert refused.status_code == 401
        assert refused.json()["kind"] == "Status"
        check_document((await client.get("/ladybug/swagger/doc.json")).json())
        empty = await client.get("/ladybug/ns//clusters", headers=AUTH)
        assert empty.status_code == 401
        assert empty.json()["message"] == "'Namespace' is a mandatory parameter."


async def test_create_waits_for_the_provisioner_and_answers_the_cluster(
    lb: Ladybug, provisioner: Provisioner, kube: KubeClient
) -> None:
    name = new_name()
    cluster = await provisioned(lb, provisioner, name)
    assert cluster["status"]["phase"] == "Provisioned"
    assert cluster["clusterConfig"] == KUBECONFIG
    assert [n["role"] for n in cluster["nodes"]] == ["control-plane", "worker", "worker"]
    assert "credential" not in str(cluster)
    obj = await kube.get(LADYBUG_CLUSTER, lb.namespace, f"{TBNS}.{name}")
    assert obj["spec"]["config"]["kubernetes"]["etcd"] == "local"
    assert obj["spec"]["serviceType"] == "multi"
    async with lb.client(headers=AUTH) as client:
        listed = (await client.get(f"/ladybug/ns/{TBNS}/clusters")).json()
        assert cluster in listed["items"]
        got = (await client.get(f"/ladybug/ns/{TBNS}/clusters/{name}")).json()
        assert got == cluster


async def test_validation_and_an_unknown_namespace(lb: Ladybug) -> None:
    async with lb.client(headers=AUTH) as client:
        bad = await client.post(
            f"/ladybug/ns/{TBNS}/clusters", json=cluster_request("Bad_Name", worker=[])
        )
        assert bad.status_code == 400
        assert bad.json()["message"] == "Worker node must be at least one"
        unknown = await client.post("/ladybug/ns/ns-x/clusters", json=cluster_request("c"))
        assert unknown.status_code == 500
        assert unknown.json()["message"] == "Could not be found a namespace. (namespace=ns-x)"
        gone = await client.delete(f"/ladybug/ns/{TBNS}/clusters/nope")
        assert gone.status_code == 200
        assert gone.json()["code"] == 404


async def test_async_create_then_failure_then_create_again(
    lb: Ladybug, provisioner: Provisioner, kube: KubeClient
) -> None:
    name = new_name()
    async with lb.client(headers=AUTH) as client:
        accepted = await client.post(
            f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name), params={"async": "true"}
        )
        assert accepted.status_code == 202
        assert accepted.headers["Location"] == f"/ladybug/ns/{TBNS}/clusters/{name}"
        pending = (await client.get(accepted.headers["Location"])).json()
        assert pending["status"]["phase"] == "Pending"
        await provisioner.fail(name)
        failed = (await client.get(accepted.headers["Location"])).json()
        assert failed["status"]["reason"] == "SetupBoostrapFailedReason"
        # a create over a Failed cluster deletes it first, then creates it anew
        first_uid = (await kube.get(LADYBUG_CLUSTER, lb.namespace, f"{TBNS}.{name}"))["metadata"][
            "uid"
        ]
        again = asyncio.create_task(
            client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name))
        )
        await provisioner.finish_deletion(name)
        await eventually(
            lambda: provisioner.read(name),
            lambda o: o is not None and o["metadata"]["uid"] != first_uid,
            what="the new cluster",
        )
        await provisioner.provision(name)
        response = await again
        assert response.status_code == 200, response.text


async def test_concurrent_creates_one_wins(lb: Ladybug, provisioner: Provisioner) -> None:
    name = new_name()
    async with lb.client(headers=AUTH) as client:
        requests = [
            asyncio.create_task(
                client.post(f"/ladybug/ns/{TBNS}/clusters", json=cluster_request(name))
            )
            for _ in range(2)
        ]
        done, _ = await asyncio.wait(requests, return_when=asyncio.FIRST_COMPLETED)
        [loser] = done
        assert loser.result().status_code == 500
        assert loser.result().json()["message"] == (
            f"The cluster '{name}' already exists. (namespace={TBNS})"
        )
        await provisioner.provision(name)
        winner = next(r for r in requests if r not in done)
        assert (await winner).status_code == 200


async def test_add_and_remove_nodes_then_delete(
    lb: Ladybug, provisioner: Provisioner, kube: KubeClient
) -> None:
    name = new_name()
    cluster = await provisioned(lb, provisioner, name)
    path = f"/ladybug/ns/{TBNS}/clusters/{name}"
    async with lb.client(headers=AUTH) as client:
        add = asyncio.create_task(
            client.post(
                f"{path}/nodes",
                json={"worker": [{"connection": CONNECTION, "count": 2, "spec": SPEC}]},
            )
        )
        await provisioner.converge_nodes(name, 2)
        added = await add
        assert added.status_code == 200, added.text
        assert len(added.json()["items"]) == 5
        obj = await kube.get(LADYBUG_CLUSTER, lb.namespace, f"{TBNS}.{name}")
        assert [w["id"].split("-")[1] for w in obj["spec"]["worker"]] == ["1", "2", "3", "4"]

        leader = await client.delete(f"{path}/nodes/{cluster['cpLeader']}")
        assert leader.status_code == 500
        assert leader.json()["message"] == "Could not be delete a control-plane leader node."
        unknown = await client.delete(f"{path}/nodes/nope")
        assert unknown.status_code == 404
        worker = cluster["nodes"][1]["name"]
        remove = asyncio.create_task(client.delete(f"{path}/nodes/{worker}"))
        await provisioner.converge_nodes(name, 3)
        removed = await remove
        assert removed.status_code == 200, removed.text
        assert removed.json()["message"] == f"Node '{worker}' has been deleted"
        nodes = (await client.get(f"{path}/nodes")).json()["items"]
        assert worker not in [n["name"] for n in nodes]

        delete = asyncio.create_task(client.delete(path))
        await provisioner.finish_deletion(name)
        deleted = await delete
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {
            "kind": "Status",
            "code": 200,
            "message": f"Cluster '{name}' has been deleted",
        }
        with pytest.raises(KubeNotFound):
            await kube.get(LADYBUG_CLUSTER, lb.namespace, f"{TBNS}.{name}")


async def test_spec_list_from_tumblebug(lb: Ladybug) -> None:
    async with lb.client(headers=AUTH) as client:
        response = await client.get(
            f"/ladybug/mcir/connections/{CONNECTION}/specs", params={"control-plane": "Y"}
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["kind"] == "specList"
    assert body["connectionName"] == CONNECTION
    assert body["items"]
    assert all(int(s["cpu"]["count"]) >= 2 and int(s["memory"]) >= 2 for s in body["items"])
