"""The Ladybug REST API through its composition root, with an in-memory API server that
watches, a fake Tumblebug, and a fake provisioner playing the real one's part on the
LadybugCluster (status, finalizer, kubeconfig Secret), driven over httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.ladybug.api.app import create_app
from services.ladybug.api.bootstrap import NoCredentials, dependencies
from services.ladybug.api.ports import KnownNamespaces
from services.ladybug.api.settings import LadybugApiSettings
from shared.errors import KubeNotFound, TemporaryError
from shared.kube import ResourceKind, WatchEvent
from shared.models.ladybug import FINALIZER, kubeconfig_secret_name
from shared.resources import LADYBUG_CLUSTER, SECRET
from tests.fakes import FakeKube

pytestmark = pytest.mark.timeout(10)

Json = dict[str, Any]
K8S_NS = "ladybug"
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KUBECONFIG = "apiVersion: v1\nkind: Config\n"


# --- fakes --------------------------------------------------------------------------------


class WatchingKube(FakeKube):
    """``FakeKube`` with the API server's watch, generations and graceful deletion: a spec
    change bumps ``generation``, deleting an object with finalizers only marks it, and every
    change is an event a ``watch`` from an earlier resourceVersion sees."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, WatchEvent]] = []
        self._wake = asyncio.Event()

    def _record(self, kind: ResourceKind, type_: str, obj: Json) -> None:
        self.events.append((kind.token, WatchEvent(type=type_, object=copy.deepcopy(obj))))  # type: ignore[arg-type]
        self._wake.set()
        self._wake = asyncio.Event()

    def put(self, kind: ResourceKind, obj: Json) -> Json:
        stored = super().put(kind, obj)
        self._record(kind, "ADDED", stored)
        return stored

    def _store(self, kind: ResourceKind, obj: Json) -> Json:
        stored = super()._store(kind, obj)
        meta = stored["metadata"]
        gone = self.stored(kind, meta.get("namespace"), meta["name"]) is None
        self._record(kind, "DELETED" if gone else "MODIFIED", stored)
        return stored

    async def patch_json(
        self, kind: ResourceKind, namespace: str | None, name: str, ops: Any, **kw: Any
    ) -> Json:
        before = copy.deepcopy(self._existing(kind, namespace, name).get("spec"))
        patched = await super().patch_json(kind, namespace, name, ops, **kw)
        if patched.get("spec") != before:
            stored = self._existing(kind, namespace, name)
            stored["metadata"]["generation"] += 1
            patched = self._store(kind, stored)
        return patched

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        current = self._existing(kind, namespace, name)
        if current["metadata"].get("finalizers"):
            self._called("delete", kind, namespace, name)
            marked = copy.deepcopy(current)
            marked["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
            marked["metadata"]["generation"] += 1
            return self._store(kind, marked)
        deleted = await super().delete(kind, namespace, name)
        self._record(kind, "DELETED", deleted)
        return deleted

    async def watch(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        since = int(resource_version)
        seen = 0
        while True:
            wake = self._wake
            for token, event in self.events[seen:]:
                seen += 1
                if token != kind.token or int(event.resource_version) <= since:
                    continue
                if namespace and event.object["metadata"].get("namespace") != namespace:
                    continue
                yield event
            await wake.wait()


class FakeTumblebug:
    def __init__(self) -> None:
        self.namespaces = {"ns-1"}
        self.connections: dict[str, Json] = {
            "config-aws": {"ConfigName": "config-aws", "ProviderName": "AWS"},
            "config-ibm": {"ConfigName": "config-ibm", "ProviderName": "IBM"},
        }
        self.specs: list[Json] = [
            {"name": "t3.small", "mem": "2048", "vcpu": {"count": "2", "clock": "2.5"}},
            {"name": "t3.micro", "mem": "1024", "vcpu": {"count": "1", "clock": "2.5"}},
        ]
        self.down = False
        self.calls = 0
        self.namespace_checks = 0

    def _call(self) -> None:
        self.calls += 1
        if self.down:
            raise TemporaryError("Tumblebug unavailable: connection refused")

    async def get_namespace(self, namespace: str) -> Json | None:
        self._call()
        self.namespace_checks += 1
        return {"id": namespace} if namespace in self.namespaces else None

    async def get_connection_config(self, name: str) -> Json | None:
        self._call()
        return self.connections.get(name)

    async def lookup_specs(self, connection: str) -> list[Json]:
        self._call()
        return self.specs


class FakeProvisioner:
    """Plays the provisioner on the watch: finalizer first, then the outcome ``mode`` says
    (``provision``, ``fail``, ``stall``); later generations add or remove nodes (``nodes``:
    ``ok`` or ``fail``); deletion drops the finalizer (unless ``hold``)."""

    def __init__(self, kube: WatchingKube) -> None:
        self.kube = kube
        self.mode = "provision"
        self.nodes = "ok"
        self.hold = False

    async def run(self) -> None:
        seen = 0
        while True:
            wake = self.kube._wake
            while seen < len(self.kube.events):
                token, event = self.kube.events[seen]
                seen += 1
                if token == LADYBUG_CLUSTER.token and event.type != "DELETED":
                    await self.react(event.object["metadata"]["name"])
            await wake.wait()

    async def react(self, name: str) -> None:
        obj = self.kube.stored(LADYBUG_CLUSTER, K8S_NS, name)
        if obj is None:
            return
        meta, status = obj["metadata"], obj.get("status") or {}
        if meta.get("deletionTimestamp"):
            if not self.hold and meta.get("finalizers"):
                await self._merge(name, {"metadata": {"finalizers": None}})
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            await self._merge(name, {"metadata": {"finalizers": [FINALIZER]}})
            return
        if (status.get("observedGeneration") or 0) >= meta["generation"] or self.mode == "stall":
            return
        if not status.get("phase"):
            await self._first(obj)
        elif status["phase"] == "Provisioned":
            await self._change_nodes(obj)

    async def _first(self, obj: Json) -> None:
        name, generation = obj["metadata"]["name"], obj["metadata"]["generation"]
        if self.mode == "fail":
            failed = {
                "phase": "Failed",
                "reason": "JoinWorkerFailedReason",
                "message": "Fail to worker-node join. (node=w-1-xxxxx-1)",
                "observedGeneration": generation,
            }
            await self._status(name, failed)
            return
        spec = obj["spec"]
        [cp] = spec["controlPlane"]
        nodes = [_node(f"{cp['id']}-{i}", "control-plane") for i in range(1, cp["count"] + 1)]
        nodes += [_node(f"{w['id']}-1", "worker") for w in spec["worker"]]
        await self.kube.create(SECRET, _kubeconfig_secret(name))
        status = {
            "phase": "Provisioned",
            "mcis": spec["name"],
            "k8sVersion": "1.23.13-00",
            "cpLeader": nodes[0]["name"],
            "cpGroup": cp["id"],
            "createdTime": "2024-01-02T03:04:05Z",
            "observedGeneration": generation,
            "nodes": nodes,
        }
        await self._status(name, status)

    async def _change_nodes(self, obj: Json) -> None:
        name, generation = obj["metadata"]["name"], obj["metadata"]["generation"]
        nodes = obj["status"]["nodes"]
        if self.nodes == "fail":
            condition = {"type": "NodesReady", "status": "False", "message": "join failed"}
            update = {"observedGeneration": generation, "conditions": [condition]}
            await self._status(name, update)
            return
        have = {n["subGroup"] for n in nodes}
        added = [
            _node(f"{w['id']}-1", "worker") for w in obj["spec"]["worker"] if w["id"] not in have
        ]
        removed = set(obj["spec"].get("removeNodes") or [])
        kept = [n for n in nodes if n["name"] not in removed] + added
        await self._status(name, {"observedGeneration": generation, "nodes": kept})

    async def _merge(self, name: str, patch: Json) -> None:
        with contextlib.suppress(KubeNotFound):
            await self.kube.patch_merge(LADYBUG_CLUSTER, K8S_NS, name, patch)

    async def _status(self, name: str, status: Json) -> None:
        await self.kube.patch_merge(
            LADYBUG_CLUSTER, K8S_NS, name, {"status": status}, subresource="status"
        )


def _node(name: str, role: str) -> Json:
    return {
        "name": name,
        "publicIp": "127.0.0.2",
        "privateIp": "10.0.0.2",
        "role": role,
        "spec": "t3.small",
        "csp": "aws",
        "createdTime": "2024-01-02T03:04:05Z",
        "cspLabel": "topology.cloud-barista.github.io/csp=aws",
        "regionLabel": "topology.kubernetes.io/region=us-east-1",
        "zoneLabel": "topology.kubernetes.io/zone=us-east-1a",
        "subGroup": name.rsplit("-", 1)[0],
        "bootstrapped": True,
        "joined": True,
    }


def _kubeconfig_secret(name: str) -> Json:
    tbns, cluster = name.split(".", 1)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": kubeconfig_secret_name(name),
            "namespace": K8S_NS,
            "labels": {
                "ladybug.capibus.dev/namespace": tbns,
                "ladybug.capibus.dev/cluster": cluster,
            },
        },
        "data": {"value": base64.b64encode(KUBECONFIG.encode()).decode()},
    }


# --- fixtures -----------------------------------------------------------------------------


class World:
    def __init__(self, client: httpx.AsyncClient, kube: WatchingKube, tb: FakeTumblebug) -> None:
        self.client = client
        self.kube = kube
        self.tumblebug = tb
        self.provisioner = FakeProvisioner(kube)

    def cluster(self, name: str = "cluster-01", tbns: str = "ns-1") -> Json | None:
        return self.kube.stored(LADYBUG_CLUSTER, K8S_NS, f"{tbns}.{name}")


def settings(**env: str) -> LadybugApiSettings:
    values = {"api_token": TOKEN, "api_username": "admin", "api_password": "pw", **env}
    return LadybugApiSettings.model_validate({"ladybug": values})


@pytest.fixture
async def world() -> AsyncIterator[World]:
    kube, tb = WatchingKube(), FakeTumblebug()
    deps = dependencies(
        settings(wait_timeout_seconds="2"), kube=kube, tumblebug=tb, rng=random.Random(5)
    )
    transport = httpx.ASGITransport(app=create_app(deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://ladybug") as client:
        w = World(client, kube, tb)
        task = asyncio.create_task(w.provisioner.run())
        try:
            yield w
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def cluster_request(**overrides: Any) -> Json:
    return {
        "name": "cluster-01",
        "controlPlane": [{"connection": "config-aws", "count": 1, "spec": "t3.small"}],
        "worker": [{"connection": "config-aws", "count": 2, "spec": "t3.small"}],
        **overrides,
    }


async def create(w: World, *, ns: str = "ns-1", **overrides: Any) -> httpx.Response:
    return await w.client.post(
        f"/ladybug/ns/{ns}/clusters", json=cluster_request(**overrides), headers=AUTH
    )


def assert_status(response: httpx.Response, code: int, message: str, *, body_code: int = 0) -> None:
    assert response.status_code == code, response.text
    assert response.json() == {"kind": "Status", "code": body_code or code, "message": message}


def no_credential(value: Any) -> bool:
    return "credential" not in str(value)


# --- health, auth, namespace --------------------------------------------------------------


async def test_healthy_is_open_text(world: World) -> None:
    response = await world.client.get("/ladybug/healthy")
    assert response.status_code == 200
    assert response.text == "cb-barista cb-ladybug"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic " + base64.b64encode(b"admin:wrong").decode()},
        {"Authorization": "Basic !!!"},
    ],
)
async def test_every_route_but_healthy_needs_credentials(
    world: World, headers: dict[str, str]
) -> None:
    for method, path in [
        ("GET", "/ladybug/ns/ns-1/clusters"),
        ("POST", "/ladybug/ns/ns-1/clusters"),
        ("DELETE", "/ladybug/ns/ns-1/clusters/c"),
        ("GET", "/ladybug/ns/ns-1/clusters/c/nodes/n"),
        ("GET", "/ladybug/mcir/connections/config-aws/specs"),
    ]:
        response = await world.client.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (method, path)
        assert response.json()["kind"] == "Status"
        assert "WWW-Authenticate" in response.headers
    assert world.cluster() is None


async def test_bearer_and_basic_both_pass(world: World) -> None:
    basic = {"Authorization": "Basic " + base64.b64encode(b"admin:pw").decode()}
    for headers in (AUTH, basic):
        response = await world.client.get("/ladybug/ns/ns-1/clusters", headers=headers)
        assert response.status_code == 200
        assert response.json() == {"kind": "ClusterList", "items": []}


def test_the_api_is_never_open() -> None:
    with pytest.raises(NoCredentials):
        dependencies(
            LadybugApiSettings.model_validate({"ladybug": {}}),
            kube=WatchingKube(),
            tumblebug=FakeTumblebug(),
        )


async def test_an_empty_namespace_is_upstreams_401(world: World) -> None:
    for method in ("GET", "POST"):
        response = await world.client.request(method, "/ladybug/ns//clusters", headers=AUTH)
        assert_status(response, 401, "'Namespace' is a mandatory parameter.")


async def test_an_unknown_namespace_gets_each_routes_code(world: World) -> None:
    message = "Could not be found a namespace. (namespace=ns-x)"
    base = "/ladybug/ns/ns-x/clusters"
    assert_status(await world.client.get(base, headers=AUTH), 400, message)
    assert_status(await create(world, ns="ns-x"), 500, message)
    assert_status(await world.client.get(f"{base}/c", headers=AUTH), 404, message)
    assert_status(await world.client.delete(f"{base}/c", headers=AUTH), 500, message)
    assert_status(await world.client.get(f"{base}/c/nodes", headers=AUTH), 400, message)
    assert_status(await world.client.get(f"{base}/c/nodes/n", headers=AUTH), 404, message)
    add = {"worker": [{"connection": "config-aws", "count": 1, "spec": "t3.small"}]}
    assert_status(await world.client.post(f"{base}/c/nodes", json=add, headers=AUTH), 500, message)
    assert_status(await world.client.delete(f"{base}/c/nodes/n", headers=AUTH), 500, message)


async def test_a_namespace_seen_to_exist_is_not_asked_again_for_a_moment() -> None:
    now = [100.0]
    known = KnownNamespaces(5.0, clock=lambda: now[0])
    assert not known.known("ns-1")
    known.seen("ns-1")
    assert known.known("ns-1")
    now[0] += 5.1
    assert not known.known("ns-1")
    never = KnownNamespaces(0.0)
    never.seen("ns-1")
    assert not never.known("ns-1")


async def test_polling_a_cluster_asks_tumblebug_for_its_namespace_once(world: World) -> None:
    await create(world)
    before = world.tumblebug.namespace_checks
    for _ in range(5):
        response = await world.client.get("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
        assert response.status_code == 200
    assert world.tumblebug.namespace_checks == before
    # an unknown one is asked every time: a namespace made a moment later is seen at once
    for _ in range(2):
        await world.client.get("/ladybug/ns/ns-2/clusters", headers=AUTH)
    world.tumblebug.namespaces.add("ns-2")
    assert (await world.client.get("/ladybug/ns/ns-2/clusters", headers=AUTH)).status_code == 200


async def test_tumblebug_down_is_a_clear_503(world: World) -> None:
    world.tumblebug.down = True
    response = await world.client.get("/ladybug/ns/ns-1/clusters", headers=AUTH)
    assert_status(response, 503, "Tumblebug unavailable: connection refused")


# --- create -------------------------------------------------------------------------------


async def test_create_waits_for_the_provisioned_cluster(world: World) -> None:
    response = await create(world)
    assert response.status_code == 200, response.text
    cluster = response.json()
    assert cluster["kind"] == "Cluster"
    assert cluster["name"] == "cluster-01"
    assert cluster["namespace"] == "ns-1"
    assert cluster["status"] == {"phase": "Provisioned", "reason": "", "message": ""}
    assert cluster["clusterConfig"] == KUBECONFIG
    assert cluster["etcd"] == "local"
    assert cluster["serviceType"] == "multi"
    assert cluster["loadbalancer"] == "haproxy"
    assert cluster["networkCni"] == "kilo"
    assert cluster["k8sVersion"] == "1.23.13-00"
    assert [n["role"] for n in cluster["nodes"]] == ["control-plane", "worker", "worker"]
    assert cluster["cpLeader"] == cluster["nodes"][0]["name"]
    assert no_credential(response.text)
    # the stored object: the request after defaults, subgroup ids chosen by the API
    obj = world.cluster()
    assert obj is not None
    spec = obj["spec"]
    assert spec["controlPlane"][0]["id"].startswith("c-1-")
    assert [w["id"][:4] for w in spec["worker"]] == ["w-1-", "w-2-"]
    assert obj["metadata"]["labels"]["ladybug.capibus.dev/cluster"] == "cluster-01"
    # and GET answers the same
    got = await world.client.get("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
    assert got.json() == cluster
    listed = await world.client.get("/ladybug/ns/ns-1/clusters", headers=AUTH)
    assert listed.json() == {"kind": "ClusterList", "items": [cluster]}


async def test_create_validation_is_400_with_upstreams_message(world: World) -> None:
    response = await create(world, worker=[])
    assert_status(response, 400, "Worker node must be at least one")
    response = await create(world, config={"kubernetes": {"etcd": "external"}})
    assert_status(response, 400, "External etcd must have 3,5,7 controlPlane count")
    assert world.cluster() is None


async def test_a_body_that_does_not_bind_is_400(world: World) -> None:
    response = await create(world, worker=[{"connection": "c", "count": "many", "spec": "s"}])
    assert response.status_code == 400
    body = response.json()
    assert body["kind"] == "Status"
    assert "worker.0.count" in body["message"]


async def test_nulls_are_zero_values_as_in_go(world: World) -> None:
    response = await create(world, label=None, config={"kubernetes": None})
    assert response.status_code == 200, response.text


async def test_service_refusals_are_500(world: World) -> None:
    response = await create(
        world, controlPlane=[{"connection": "config-aws", "count": 0, "spec": "t3.small"}]
    )
    assert_status(response, 500, "Control-Plane count must be at least one.")
    response = await create(
        world,
        controlPlane=[{"connection": "config-ibm", "count": 1, "spec": "t3.small"}],
        config={"kubernetes": {"loadbalancer": "nlb"}},
    )
    assert_status(response, 500, "ibm does not yet supported nlb loadbalancer.")
    assert world.cluster() is None


async def test_a_failed_create_is_500_with_the_reason_and_keeps_the_cluster(world: World) -> None:
    world.provisioner.mode = "fail"
    response = await create(world)
    assert_status(response, 500, "Fail to worker-node join. (node=w-1-xxxxx-1)")
    got = await world.client.get("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
    assert got.json()["status"] == {
        "phase": "Failed",
        "reason": "JoinWorkerFailedReason",
        "message": "Fail to worker-node join. (node=w-1-xxxxx-1)",
    }


async def test_create_over_an_existing_cluster_is_refused(world: World) -> None:
    assert (await create(world)).status_code == 200
    response = await create(world)
    assert_status(response, 500, "The cluster 'cluster-01' already exists. (namespace=ns-1)")


async def test_create_over_a_failed_cluster_deletes_it_first(world: World) -> None:
    world.provisioner.mode = "fail"
    assert (await create(world)).status_code == 500
    failed = world.cluster()
    assert failed is not None
    world.provisioner.mode = "provision"
    response = await create(world)
    assert response.status_code == 200, response.text
    again = world.cluster()
    assert again is not None
    assert again["metadata"]["uid"] != failed["metadata"]["uid"]
    assert ("delete", "LadybugCluster", K8S_NS, "ns-1.cluster-01") in world.kube.calls


async def test_concurrent_creates_of_one_name_one_wins(world: World) -> None:
    first, second = await asyncio.gather(create(world), create(world))
    codes = sorted([first.status_code, second.status_code])
    assert codes == [200, 500]
    loser = first if first.status_code == 500 else second
    assert loser.json()["message"] == "The cluster 'cluster-01' already exists. (namespace=ns-1)"


async def test_async_create_answers_202_with_location(world: World) -> None:
    world.provisioner.mode = "stall"
    for extra in ({"params": {"async": "true"}}, {"headers": {"Prefer": "respond-async"}}):
        name = f"c-{len(world.kube.of_kind(LADYBUG_CLUSTER))}"
        response = await world.client.post(
            "/ladybug/ns/ns-1/clusters",
            json=cluster_request(name=name),
            headers={**AUTH, **extra.get("headers", {})},
            params=extra.get("params"),
        )
        assert response.status_code == 202, response.text
        assert response.headers["Location"] == f"/ladybug/ns/ns-1/clusters/{name}"
        assert response.json()["status"]["phase"] == "Pending"


async def test_a_create_that_outlives_the_timeout_is_504_with_the_phase(world: World) -> None:
    world.provisioner.mode = "stall"
    response = await create(world)
    assert response.status_code == 504
    message = response.json()["message"]
    assert "cluster 'cluster-01' (phase=Pending)" in message
    assert world.cluster() is not None


# --- delete -------------------------------------------------------------------------------


async def test_delete_of_an_unknown_cluster_is_http_200_with_body_code_404(world: World) -> None:
    response = await world.client.delete("/ladybug/ns/ns-1/clusters/nope", headers=AUTH)
    assert_status(
        response, 200, "Could not be found cluster 'nope'. (namespace=ns-1)", body_code=404
    )


async def test_delete_waits_until_the_cluster_is_gone(world: World) -> None:
    assert (await create(world)).status_code == 200
    response = await world.client.delete("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
    assert_status(response, 200, "Cluster 'cluster-01' has been deleted")
    assert world.cluster() is None
    got = await world.client.get("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
    assert_status(got, 404, "Could not be found a cluster 'cluster-01' (namespace=ns-1)")


async def test_delete_held_by_the_provisioner_times_out_as_deleting(world: World) -> None:
    assert (await create(world)).status_code == 200
    world.provisioner.hold = True
    response = await world.client.delete("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
    assert response.status_code == 504
    assert "(phase=Deleting)" in response.json()["message"]
    again = await world.client.delete("/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH)
    assert_status(again, 409, "The cluster 'cluster-01' is already being deleted.")


async def test_delete_asynchronously_answers_202_with_the_location(world: World) -> None:
    assert (await create(world)).status_code == 200
    world.provisioner.hold = True
    asynchronous = await world.client.delete(
        "/ladybug/ns/ns-1/clusters/cluster-01", headers=AUTH, params={"async": "true"}
    )
    assert asynchronous.status_code == 202
    assert asynchronous.headers["Location"] == "/ladybug/ns/ns-1/clusters/cluster-01"


# --- nodes --------------------------------------------------------------------------------


WORKER = {"connection": "config-aws", "count": 2, "spec": "t3.small"}


async def test_add_nodes_appends_node_sets_and_answers_all_nodes(world: World) -> None:
    assert (await create(world)).status_code == 200
    response = await world.client.post(
        "/ladybug/ns/ns-1/clusters/cluster-01/nodes", json={"worker": [WORKER]}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["kind"] == "NodeList"
    assert len(body["items"]) == 5
    assert no_credential(response.text)
    obj = world.cluster()
    assert obj is not None
    assert [w["id"][:4] for w in obj["spec"]["worker"]] == ["w-1-", "w-2-", "w-3-", "w-4-"]
    assert obj["metadata"]["generation"] == 2


async def test_add_nodes_validation_and_phase(world: World) -> None:
    path = "/ladybug/ns/ns-1/clusters/cluster-01/nodes"
    response = await world.client.post(
        path, json={"controlPlane": [WORKER], "worker": [WORKER]}, headers=AUTH
    )
    assert_status(response, 400, "Control plane node is not supported")
    response = await world.client.post(path, json={"worker": [WORKER]}, headers=AUTH)
    assert_status(response, 500, "Could not be found a cluster 'cluster-01'. (namespace=ns-1)")
    world.provisioner.mode = "fail"
    await create(world)
    response = await world.client.post(path, json={"worker": [WORKER]}, headers=AUTH)
    assert_status(response, 500, "Unable to add a node. status is 'Failed'.")


async def test_a_single_cloud_clusters_new_workers_stay_on_its_connection(world: World) -> None:
    single = {"serviceType": "single", "config": {"kubernetes": {"networkCni": "calico"}}}
    assert (await create(world, **single)).status_code == 200
    path = "/ladybug/ns/ns-1/clusters/cluster-01/nodes"
    other = {**WORKER, "connection": "config-gcp"}
    response = await world.client.post(path, json={"worker": [other]}, headers=AUTH)
    assert_status(
        response, 500, "The new node must be the same connection config. (connection=config-gcp)"
    )


async def test_add_nodes_that_fail_answer_500_with_the_reason(world: World) -> None:
    assert (await create(world)).status_code == 200
    world.provisioner.nodes = "fail"
    response = await world.client.post(
        "/ladybug/ns/ns-1/clusters/cluster-01/nodes", json={"worker": [WORKER]}, headers=AUTH
    )
    assert_status(response, 500, "join failed")


async def test_remove_node(world: World) -> None:
    cluster = (await create(world)).json()
    leader, worker = cluster["cpLeader"], cluster["nodes"][2]["name"]
    path = "/ladybug/ns/ns-1/clusters/cluster-01/nodes"
    response = await world.client.delete(f"{path}/{leader}", headers=AUTH)
    assert_status(response, 500, "Could not be delete a control-plane leader node.")
    response = await world.client.delete(f"{path}/nope", headers=AUTH)
    assert_status(response, 404, "Could not be found a node-entity 'nope'")
    response = await world.client.delete(f"{path}/{worker}", headers=AUTH)
    assert_status(response, 200, f"Node '{worker}' has been deleted")
    obj = world.cluster()
    assert obj is not None
    assert obj["spec"]["removeNodes"] == [worker]
    listed = (await world.client.get(path, headers=AUTH)).json()
    assert worker not in [n["name"] for n in listed["items"]]
    assert len(listed["items"]) == 2


async def test_node_reads(world: World) -> None:
    path = "/ladybug/ns/ns-1/clusters/cluster-01/nodes"
    empty = await world.client.get(path, headers=AUTH)
    assert empty.json() == {"kind": "NodeList", "items": []}
    cluster = (await create(world)).json()
    name = cluster["nodes"][1]["name"]
    node = (await world.client.get(f"{path}/{name}", headers=AUTH)).json()
    assert node == cluster["nodes"][1]
    assert node["kind"] == "Node"
    missing = await world.client.get(f"{path}/nope", headers=AUTH)
    assert_status(
        missing, 404, "Could not be found a node 'nope' (namespace=ns-1, cluster=cluster-01)"
    )


# --- specs --------------------------------------------------------------------------------


async def test_spec_list(world: World) -> None:
    path = "/ladybug/mcir/connections/config-aws/specs"
    response = await world.client.get(path, params={"control-plane": "Y"}, headers=AUTH)
    assert response.json() == {
        "kind": "specList",
        "connectionName": "config-aws",
        "items": [{"name": "t3.small", "memory": "2", "cpu": {"count": "2", "clock": "2.5"}}],
    }
    everything = await world.client.get(path, headers=AUTH)
    assert len(everything.json()["items"]) == 2
    refused = await world.client.get(
        path, params={"control-plane": "Y", "cpu-min": "1"}, headers=AUTH
    )
    assert_status(refused, 404, "Kubernetes control plane node needs 2 cpu at least. (cpu-min=1)")
    world.tumblebug.down = True
    assert (await world.client.get(path, headers=AUTH)).status_code == 503


# --- the OpenAPI document -----------------------------------------------------------------

ROUTES = {
    ("get", "/ladybug/healthy"),
    ("get", "/ladybug/mcir/connections/{connection}/specs"),
    ("get", "/ladybug/ns/{namespace}/clusters"),
    ("post", "/ladybug/ns/{namespace}/clusters"),
    ("get", "/ladybug/ns/{namespace}/clusters/{cluster}"),
    ("delete", "/ladybug/ns/{namespace}/clusters/{cluster}"),
    ("get", "/ladybug/ns/{namespace}/clusters/{cluster}/nodes"),
    ("post", "/ladybug/ns/{namespace}/clusters/{cluster}/nodes"),
    ("get", "/ladybug/ns/{namespace}/clusters/{cluster}/nodes/{node}"),
    ("delete", "/ladybug/ns/{namespace}/clusters/{cluster}/nodes/{node}"),
}


def check_document(document: Json) -> None:
    """Structural OpenAPI 3 checks: version, info, every route with responses, every
    ``$ref`` resolving, path parameters declared, schemas for upstream's shapes."""
    assert document["openapi"].startswith("3.")
    assert document["info"]["title"]
    assert document["info"]["version"]
    operations = {(method, path) for path, item in document["paths"].items() for method in item}
    assert operations == ROUTES
    schemas = document["components"]["schemas"]
    for name in ("ClusterReq", "NodeSetReq", "NodeReq", "Cluster", "Node", "Status", "SpecList"):
        assert name in schemas
    assert "credential" not in schemas["Node"]["properties"]
    assert {"publicIp", "privateIp", "cspLabel"} <= set(schemas["Node"]["properties"])
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert operation["responses"], (method, path)
            assert "422" not in operation["responses"]
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            wanted = {part[1:-1] for part in path.split("/") if part.startswith("{")}
            assert declared == wanted, (method, path)
    for ref in _refs(document):
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in schemas, ref
    assert set(document["components"]["securitySchemes"]) == {"HTTPBearer", "HTTPBasic"}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


async def test_the_openapi_document_lists_every_route(world: World) -> None:
    documents = [
        (await world.client.get(path)).json()
        for path in ("/ladybug/swagger/doc.json", "/swagger/doc.json", "/openapi.json")
    ]
    assert documents[0] == documents[1] == documents[2]
    check_document(documents[0])
    page = await world.client.get("/ladybug/swagger/index.html")
    assert page.status_code == 200
    assert "swagger" in page.text.lower()


def test_settings_take_upstreams_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUMBLEBUG_URL", "http://tb:1323/tumblebug")
    monkeypatch.setenv("BASIC_AUTH_USERNAME", "tbuser")
    monkeypatch.setenv("BASE_URL", "/mcks/")
    loaded = LadybugApiSettings()
    assert loaded.ladybug.tumblebug_url == "http://tb:1323/tumblebug"
    assert loaded.ladybug.tumblebug_username == "tbuser"
    assert loaded.ladybug.base_path == "/mcks"
    assert loaded.ladybug.api_port == 1470
    assert loaded.ladybug.namespace == "ladybug"
