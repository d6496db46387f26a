"""The CB-Tumblebug stand-in as a real process, driven through ``shared.tumblebug``.

The first test runs it with ``--no-ssh`` and walks what CB-Ladybug does, through the real
adapter: namespace and connection checks, the spec lookup, MCIR get-or-create, one MCIS,
terminate and a delete that fails once (refine, then delete again). The second runs it with
the node farm: every VM of the MCIS is a real sshd on its loopback address, reached with the
sshKey's private key through ``shared.ssh``; terminating the MCIS takes the sshds away.
The farm's addresses are taken from ``127.0.77.0/24`` so no other test's nodes are in the way.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.ssh import MemoryHostKeys, SshClient, SshDenied, SshUnreachable
from shared.tumblebug import (
    TumblebugClient,
    TumblebugUnauthorized,
    TumblebugUnavailable,
    region_zone,
    spec_size,
)
from standins.tumblebug.keys import generate
from tests.integration.support import ROOT, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
NS = "ns-1"
AWS, GCP = "aws-ap-northeast-2", "gcp-asia-northeast3"
SSHD = Path("/usr/sbin/sshd")
Start = Callable[..., Awaitable[str]]


@pytest.fixture
async def tumblebug(tmp_path: Path) -> AsyncIterator[Start]:
    """Start ``python -m standins.tumblebug``; its URL is returned; SIGTERM must end it with 0."""
    started: list[tuple[asyncio.subprocess.Process, Path]] = []

    async def start(*args: str, **env: str) -> str:
        url_file = tmp_path / f"url-{len(started)}"
        log_path = tmp_path / f"tumblebug-{len(started)}.log"
        environ = {
            **os.environ,
            "STANDIN_TUMBLEBUG_URL_FILE": str(url_file),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with log_path.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "standins.tumblebug",
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
            timeout=15,
            interval=0.05,
            what="Tumblebug URL file",
        )
        return url

    yield start
    for proc, log_path in started:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
        output = await asyncio.to_thread(log_path.read_text)
        assert code == 0, output
        assert "tumblebug listening on http://127.0.0.1:" in output


async def ensure_mcir(tb: TumblebugClient, conn: str, spec: str) -> Json:
    """CB-Ladybug's get-or-create of one connection's MCIR; the ids."""
    ids = {
        "vNet": f"{conn}-vpc",
        "securityGroup": f"{conn}-sg",
        "sshKey": f"{conn}-sshkey",
        "image": f"{conn}-ubuntu1804",
        "spec": f"{conn}-{spec.replace('.', '-')}-spec",
    }
    if await tb.get_vnet(NS, ids["vNet"]) is None:
        subnets = [{"Name": f"{conn}-subnet", "IPv4_CIDR": "192.168.10.0/24"}]
        body = {"cidrBlock": "192.168.10.0/24", "subnetInfoList": subnets}
        await tb.create_vnet(NS, {"name": ids["vNet"], "connectionName": conn, **body})
    if await tb.get_security_group(NS, ids["securityGroup"]) is None:
        rules = [{"fromPort": "1", "toPort": "65535", "ipProtocol": "tcp", "direction": "inbound"}]
        body = {"vNetId": ids["vNet"], "firewallRules": rules}
        await tb.create_security_group(
            NS, {"name": ids["securityGroup"], "connectionName": conn, **body}
        )
    if await tb.get_ssh_key(NS, ids["sshKey"]) is None:
        body = {"name": ids["sshKey"], "connectionName": conn, "username": "cb-user"}
        await tb.create_ssh_key(NS, body)
    if await tb.get_image(NS, ids["image"]) is None:
        body = {"cspImageId": "img-0", "cspImageName": "Ubuntu, 18.04", "guestOS": "ubuntu"}
        await tb.register_image(NS, {"name": ids["image"], "connectionName": conn, **body})
    if await tb.get_spec(NS, ids["spec"]) is None:
        body = {"name": ids["spec"], "connectionName": conn, "cspSpecName": spec}
        await tb.create_spec(NS, body)
    return ids


def vm(name: str, conn: str, ids: Json, size: str = "") -> Json:
    return {
        "name": name,
        "subGroupSize": size,
        "connectionName": conn,
        "vNetId": ids["vNet"],
        "subnetId": f"{conn}-subnet",
        "securityGroupIds": [ids["securityGroup"]],
        "sshKeyId": ids["sshKey"],
        "imageId": ids["image"],
        "specId": ids["spec"],
        "vmUserAccount": "cb-user",
        "rootDiskType": "default",
        "rootDiskSize": "default",
    }


async def test_what_ladybug_does_through_the_adapter(tumblebug: Start) -> None:
    url = await tumblebug("--no-ssh", STANDIN_TUMBLEBUG_MCIS_DELETE_FAILS="1")
    root = url.removesuffix("/tumblebug")
    async with TumblebugClient(url) as tb, httpx.AsyncClient(base_url=root) as raw:
        assert (await tb.get_namespace(NS) or {})["id"] == NS
        assert await tb.get_namespace("missing") is None
        await raw.post("/_standin/faults", json={"namespaceMode": "compat"})
        assert await tb.get_namespace("missing") is None
        conn = await tb.get_connection_config(AWS)
        assert conn is not None
        assert conn["ProviderName"] == "AWS"
        region = await tb.get_region(conn["RegionName"])
        assert region is not None
        assert region_zone(region) == ("ap-northeast-2", "ap-northeast-2a")
        spec = await tb.lookup_spec(AWS, "t3.medium")
        assert spec is not None
        assert spec_size(spec) == (2, 4096)
        assert await tb.lookup_spec(AWS, "x9.huge") is None
        aws = await ensure_mcir(tb, AWS, "t3.medium")
        gcp = await ensure_mcir(tb, GCP, "e2-medium")
        assert await ensure_mcir(tb, AWS, "t3.medium") == aws
        key = await tb.get_ssh_key(NS, aws["sshKey"])
        assert key is not None
        assert "PRIVATE KEY" in key["privateKey"]

        assert await tb.get_mcis(NS, "k1") is None
        body = {
            "name": "k1",
            "label": "mcks",
            "systemLabel": "Managed by MCKS",
            "installMonAgent": "no",
            "vm": [vm("c-1-abcde", AWS, aws, "2"), vm("w-1-fghij", GCP, gcp)],
        }
        created = await tb.create_mcis(NS, body)
        names = [v["name"] for v in created["vm"]]
        assert names == ["c-1-abcde-1", "c-1-abcde-2", "w-1-fghij-1"]
        assert {v["status"] for v in created["vm"]} == {"Running"}
        ids = await tb.get_vm_ids(NS, "k1", "w-1-fghij-1")
        assert ids is not None
        assert ids["nameInCsp"] == "ns-1-w-1-fghij-1"
        # the armed fault comes first, then Tumblebug's own refusal of a running MCIS
        with pytest.raises(TumblebugUnavailable, match="injected fault"):
            await tb.delete_mcis(NS, "k1")
        with pytest.raises(TumblebugUnavailable, match="not Terminated"):
            await tb.delete_mcis(NS, "k1")
        await tb.control_mcis(NS, "k1", "terminate")
        await tb.control_mcis(NS, "k1", "refine")
        assert await tb.delete_mcis(NS, "k1") is True
        assert await tb.get_mcis(NS, "k1") is None

        counts = (await raw.get("/_standin/requests")).json()
        assert counts["mcis-delete"] == 3
        assert counts["mcis-create"] == 1
        assert counts["vnet-create"] == 2
    async with TumblebugClient(url, "default", "wrong") as stranger:
        with pytest.raises(TumblebugUnauthorized):
            await stranger.get_namespace(NS)


def farm_missing() -> str | None:
    if not SSHD.exists():
        return f"no {SSHD}: testenv/build.sh installs Debian's openssh-server"
    if os.geteuid() != 0:
        return "the node farm binds port 22 and needs root"
    return None


async def test_every_vm_is_a_real_sshd(tumblebug: Start, tmp_path: Path) -> None:
    reason = farm_missing()
    if reason:
        pytest.skip(reason)
    url = await tumblebug(
        "--nodes-dir",
        str(tmp_path / "nodes"),
        STANDIN_TUMBLEBUG_ADDRESS_START="127.0.77.2",
        STANDIN_TUMBLEBUG_ADDRESS_COUNT="16",
    )
    root = url.removesuffix("/tumblebug")
    ssh = SshClient(MemoryHostKeys(), connect_timeout=5)
    async with TumblebugClient(url) as tb, httpx.AsyncClient(base_url=root) as raw:
        aws = await ensure_mcir(tb, AWS, "t3.medium")
        gcp = await ensure_mcir(tb, GCP, "e2-medium")
        body = {"name": "k1", "vm": [vm("c-1-abcde", AWS, aws), vm("w-1-fghij", GCP, gcp)]}
        created = await tb.create_mcis(NS, body)
        addresses = {v["name"]: v["publicIP"] for v in created["vm"]}
        assert addresses == {"c-1-abcde-1": "127.0.77.2", "w-1-fghij-1": "127.0.77.3"}
        keys = {}
        for conn, ids in ((AWS, aws), (GCP, gcp)):
            found = await tb.get_ssh_key(NS, ids["sshKey"])
            assert found is not None
            keys[conn] = found["privateKey"]
        leader = await ssh.run(
            "127.0.77.2", "/bin/hostname", username="cb-user", private_key=keys[AWS]
        )
        assert leader == "c-1-abcde-1"
        worker = await ssh.run(
            "127.0.77.3", "/bin/hostname", username="cb-user", private_key=keys[GCP]
        )
        assert worker == "w-1-fghij-1"
        # the other connection's key, or a stranger's, opens nothing
        with pytest.raises(SshDenied):
            await ssh.run("127.0.77.2", "/bin/hostname", username="cb-user", private_key=keys[GCP])
        stranger = generate().private_key
        with pytest.raises(SshDenied):
            await ssh.run("127.0.77.3", "/bin/hostname", username="cb-user", private_key=stranger)
        state = (await raw.get("/_standin/state")).json()
        assert [v["sshd"] for v in state["mcis"][NS][0]["vms"]] == [True, True]
        # a node fault reaches a running VM's node at once: its next connection is dropped
        fault = {"vm": "w-1-*", "node": {"unreachable": 1}}
        armed = (await raw.post("/_standin/faults", json=fault)).json()
        assert armed["changedNow"] == ["w-1-fghij-1"]
        with pytest.raises(SshUnreachable):
            await ssh.run("127.0.77.3", "/bin/hostname", username="cb-user", private_key=keys[GCP])

        async def hostname_or_nothing() -> str:
            try:
                return await ssh.run(
                    "127.0.77.3", "/bin/hostname", username="cb-user", private_key=keys[GCP]
                )
            except SshUnreachable:
                return ""

        hostname = await eventually(
            hostname_or_nothing, bool, timeout=10, what="the node after its dropped connection"
        )
        assert hostname == "w-1-fghij-1"

        await tb.control_mcis(NS, "k1", "terminate")
        with pytest.raises(SshUnreachable):
            await ssh.run("127.0.77.2", "/bin/hostname", username="cb-user", private_key=keys[AWS])
        assert await tb.delete_mcis(NS, "k1") is True
        assert (await raw.get("/_standin/state")).json()["addressesInUse"] == []
