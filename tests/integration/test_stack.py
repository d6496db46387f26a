"""The local stack is real: each program answers the way the services will use it.

Polling with a deadline is fine here (the GC works asynchronously); production code waits on
watches instead.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import nats
import pytest
import redis.asyncio

from testenv.harness import LocalStack

pytestmark = pytest.mark.integration

GC_DEADLINE = 60.0


@pytest.fixture
def kube(stack: LocalStack) -> Iterator[httpx.Client]:
    ep = stack.endpoints
    headers = {"Authorization": f"Bearer {ep.token}"}
    with httpx.Client(
        base_url=ep.api_url, verify=ep.ssl_context(), headers=headers, timeout=10.0
    ) as client:
        yield client


@pytest.fixture
def managed(stack: LocalStack) -> LocalStack:
    if not stack.managed:
        pytest.skip("restarts need a stack started by the harness, not an external one")
    return stack


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _configmap(name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if owner is not None:
        ref = {key: owner["metadata"][key] for key in ("name", "uid")}
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", **ref}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}}


def test_env_points_at_the_stack(stack: LocalStack) -> None:
    env = stack.env()
    assert set(env) == {"KUBECONFIG", "NATS_URL", "REDIS_URL", "CAPIBUS_CREDENTIALS__DIR"}
    assert stack.endpoints.kubeconfig.is_file()
    assert stack.endpoints.api_url.startswith("https://127.0.0.1:")


def test_version_is_the_pinned_release(kube: httpx.Client) -> None:
    response = kube.get("/version")
    response.raise_for_status()
    assert response.json()["gitVersion"].startswith("v1.34.")


def test_namespace_can_be_created(kube: httpx.Client) -> None:
    name = _unique("ns")
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    assert kube.post("/api/v1/namespaces", json=body).status_code == 201
    assert kube.get(f"/api/v1/namespaces/{name}").json()["status"]["phase"] == "Active"
    assert kube.delete(f"/api/v1/namespaces/{name}").status_code == 200


def test_garbage_collector_deletes_dependents(kube: httpx.Client) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    owner = kube.post(path, json=_configmap(_unique("owner"))).raise_for_status().json()
    dependent_name = _unique("dependent")
    kube.post(path, json=_configmap(dependent_name, owner)).raise_for_status()
    kube.delete(f"{path}/{owner['metadata']['name']}").raise_for_status()
    deadline = time.monotonic() + GC_DEADLINE
    while kube.get(f"{path}/{dependent_name}").status_code != 404:
        assert time.monotonic() < deadline, "the garbage collector left the dependent"
        time.sleep(0.2)


async def test_jetstream_answers(stack: LocalStack) -> None:
    nc = await nats.connect(stack.endpoints.nats_url)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()


async def test_redis_answers_ping(stack: LocalStack) -> None:
    client = redis.asyncio.from_url(stack.endpoints.redis_url)
    try:
        assert await client.ping()
    finally:
        await client.aclose()


async def _publish(url: str, stream: str, count: int) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        for i in range(count):
            await js.publish(f"{stream}.msg", f"m{i}".encode())
    finally:
        await nc.close()


async def _stored_messages(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(stream)
        return int(info.state.messages)
    finally:
        await nc.close()


@pytest.mark.parametrize("graceful", [False, True], ids=["sigkill", "sigterm"])
async def test_nats_restart_keeps_stream(managed: LocalStack, graceful: bool) -> None:
    url, stream = managed.endpoints.nats_url, _unique("KEEP").replace("-", "_")
    await _publish(url, stream, 3)
    await asyncio.to_thread(managed.restart, "nats", graceful=graceful)
    assert managed.endpoints.nats_url == url
    assert await _stored_messages(url, stream) == 3


async def test_redis_restart_comes_back(managed: LocalStack) -> None:
    url = managed.endpoints.redis_url
    await asyncio.to_thread(managed.restart, "redis")
    client = redis.asyncio.from_url(url)
    try:
        assert await client.ping()
    finally:
        await client.aclose()


def test_component_can_stay_down(managed: LocalStack) -> None:
    port = urlsplit(managed.endpoints.redis_url).port
    managed.stop_component("redis")
    try:
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
    finally:
        managed.start_component("redis")
    assert managed.log_path("redis").is_file()
