"""The metal-api stand-in as a real process, driven through ``shared.metalapi``.

HMAC is on, as against a real metal-api: every call here is signed by the client and checked
by the stand-in. The last test registers Nodes in the stack's API server, which plays the
workload cluster.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.metalapi import (
    MetalApiClient,
    MetalApiConfig,
    MetalApiUnauthorized,
    MetalApiUnavailable,
    MetalApiUnprocessable,
    hmac_headers,
)
from shared.resources import NODE
from testenv.harness import LocalStack
from tests.integration.support import ROOT, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
KEY = "integration-hmac-key"
PROJECT = "00000000-0000-0000-0000-000000000000"
INTERNET = "internet-vagrant-lab"
Start = Callable[..., Awaitable[str]]


@pytest.fixture
async def metalapi(tmp_path: Path) -> AsyncIterator[Start]:
    """Start ``python -m standins.metalapi``; its URL is returned; SIGTERM must end it with 0."""
    started: list[tuple[asyncio.subprocess.Process, Path]] = []

    async def start(*args: str, **env: str) -> str:
        url_file = tmp_path / f"url-{len(started)}"
        log_path = tmp_path / f"metalapi-{len(started)}.log"
        environ = {
            **os.environ,
            "STANDIN_METALAPI_URL_FILE": str(url_file),
            "STANDIN_METALAPI_HMAC": KEY,
            "STANDIN_METALAPI_PROVISIONING_DELAY": "0.1",
            "STANDIN_METALAPI_REBOOT_DELAY": "0.1",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with log_path.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "standins.metalapi",
                *args,
                cwd=ROOT,
                env=environ,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        started.append((proc, log_path))
        url: str = await eventually(
            lambda: asyncio.sleep(0, url_file.read_text().strip() if url_file.exists() else ""),
            bool,
            timeout=10,
            interval=0.05,
            what="metal-api URL file",
        )
        return url

    yield start
    for proc, log_path in started:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 10)
        output = await asyncio.to_thread(log_path.read_text)
        assert code == 0, output
        assert "metal-api listening on http://127.0.0.1:" in output


def machine_request(network_id: str, hostname: str, **extra: Any) -> Json:
    return {
        "name": hostname,
        "hostname": hostname,
        "projectid": PROJECT,
        "partitionid": "vagrant",
        "sizeid": "v1-small-x86",
        "imageid": "ubuntu-cloud-init-20.04",
        "ssh_pub_keys": [],
        "tags": ["cluster.metal-stack.io/id=it"],
        "networks": [
            {"networkid": INTERNET, "autoacquire": True},
            {"networkid": network_id, "autoacquire": True},
        ],
        **extra,
    }


async def last_event(api: MetalApiClient, machine_id: str) -> str:
    machine = await api.get_machine(machine_id)
    log = machine["events"]["log"]
    return str(log[0]["event"]) if log else ""


async def test_network_ip_machine_lifecycle(metalapi: Start) -> None:
    url = await metalapi()
    async with MetalApiClient(MetalApiConfig(url, hmac=KEY)) as api:
        network = await api.allocate_network(
            name="vagrant",
            description="it",
            partition_id="vagrant",
            project_id=PROJECT,
            labels={"cluster.metal-stack.io/id": "it"},
        )
        assert network["parentnetworkid"] == "tenant-super-network-vagrant"
        cp = await api.allocate_ip(network_id=INTERNET, project_id=PROJECT, name="it-cp")
        assert cp["type"] == "ephemeral"
        request = machine_request(network["id"], "it-cp-0", ips=[cp["ipaddress"]])
        machine = await api.allocate_machine(request)
        networks = {n["networktype"]: n for n in machine["allocation"]["networks"]}
        assert networks["external"]["ips"] == [cp["ipaddress"]]
        assert networks["privateprimaryunshared"]["private"] is True
        await eventually(
            lambda: last_event(api, machine["id"]), lambda e: e == "Phoned Home", timeout=5
        )
        found = await api.find_machines(project_id=PROJECT, tags=["cluster.metal-stack.io/id=it"])
        assert [m["id"] for m in found] == [machine["id"]]
        with pytest.raises(MetalApiUnprocessable, match="still in use"):
            await api.free_network(network["id"])

        freed = await api.free_machine(machine["id"])
        assert freed["allocation"] is None
        await eventually(
            lambda: last_event(api, machine["id"]), lambda e: e == "Waiting", timeout=5
        )
        assert await api.find_ips(project_id=PROJECT) == []  # the CP IP went with the machine
        await api.free_network(network["id"])
        assert await api.find_networks(id=network["id"]) == []
    async with httpx.AsyncClient(base_url=url) as raw:
        state = (await raw.get("/_standin/state")).json()
    assert len(state["machines"]["waiting"]) == 32
    assert state["ips"] == []


class StaleClock(httpx.AsyncBaseTransport):
    """Re-signs every request as a client whose clock is 20 s behind would."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        past = datetime.now(UTC) - timedelta(seconds=20)
        request.headers.update(hmac_headers(KEY, request.method, now=past))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_stale_date_or_a_wrong_key_is_unauthorized(metalapi: Start) -> None:
    url = await metalapi()
    async with MetalApiClient(MetalApiConfig(url, hmac=KEY), transport=StaleClock()) as api:
        with pytest.raises(MetalApiUnauthorized, match="too old"):
            await api.list_machines()
    async with MetalApiClient(MetalApiConfig(url, hmac="not-the-key")) as api:
        with pytest.raises(MetalApiUnauthorized, match="Wrong HMAC"):
            await api.list_machines()
    async with MetalApiClient(MetalApiConfig(url, hmac=KEY)) as api:
        assert len(await api.list_machines()) == 32


async def test_a_fault_is_unavailable_then_heals(metalapi: Start) -> None:
    url = await metalapi()
    async with (
        MetalApiClient(MetalApiConfig(url, hmac=KEY)) as api,
        httpx.AsyncClient(base_url=url) as raw,
    ):
        network = await api.allocate_network(
            name="vagrant", description="f", partition_id="vagrant", project_id=PROJECT, labels={}
        )
        fault = {"route": "machine-allocate", "status": 500, "count": 2, "message": "db down"}
        assert (await raw.post("/_standin/faults", json=fault)).status_code == 200
        for _ in range(2):
            with pytest.raises(MetalApiUnavailable, match="db down"):
                await api.allocate_machine(machine_request(network["id"], "f-0"))
        machine = await api.allocate_machine(machine_request(network["id"], "f-0"))
        assert machine["allocation"]["hostname"] == "f-0"
        counts = (await raw.get("/_standin/requests")).json()
    assert counts["machine-allocate"] == 3


async def node(kube: KubeClient, name: str) -> Json | None:
    try:
        return await kube.get(NODE, None, name)
    except KubeNotFound:
        return None


async def test_a_machine_that_phones_home_registers_a_node(
    metalapi: Start, stack: LocalStack, kube: KubeClient
) -> None:
    url = await metalapi("--workload-kubeconfig", str(stack.endpoints.kubeconfig))
    hostname = f"it-{uuid.uuid4().hex[:8]}"
    async with MetalApiClient(MetalApiConfig(url, hmac=KEY)) as api:
        network = await api.allocate_network(
            name="vagrant", description="n", partition_id="vagrant", project_id=PROJECT, labels={}
        )
        machine = await api.allocate_machine(machine_request(network["id"], hostname))
        found = await eventually(
            lambda: node(kube, hostname),
            # The API server defaults a new Node's nodeInfo to empty strings: wait for the
            # registrar's status write, not for the Node.
            lambda n: bool(n and ((n.get("status") or {}).get("nodeInfo") or {}).get("systemUUID")),
            timeout=10,
            what=f"Node {hostname}",
        )
        assert found is not None
        assert found["status"]["nodeInfo"]["systemUUID"] == machine["id"]
        assert not (found.get("spec") or {}).get("providerID")
        await api.free_machine(machine["id"])
        await eventually(lambda: node(kube, hostname), lambda n: n is None, timeout=10)
