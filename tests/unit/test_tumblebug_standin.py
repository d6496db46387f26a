"""The CB-Tumblebug stand-in's routes, driven through aiohttp's test client without sshd.

The requests are shaped as CB-Ladybug sends them (reference: its ``src/core/service/mcir.go``
and ``cluster.go``): MCIR get-or-create per connection with the ``<conn>-…`` names, one MCIS
with a control-plane subgroup of ``count`` VMs and one size-1 subgroup per worker, an NLB on
the control-plane subgroup, a worker added later, terminate then delete. The node farm is a
recorder (``NullFarm``), or one that fails, so what the stand-in asks of it is checked too.
"""

from __future__ import annotations

import base64
import fnmatch
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization

from shared import spider
from standins.sshnodes.node import NodeKnobs
from standins.tumblebug import render
from standins.tumblebug.farm import NullFarm
from standins.tumblebug.knobs import TumblebugKnobs
from standins.tumblebug.model import AddressPool, Vm
from standins.tumblebug.seed import CONNECTIONS
from standins.tumblebug.server import TumblebugServer
from standins.tumblebug.world import World

Json = dict[str, Any]
KNOBS = TumblebugKnobs(ssh=False, namespaces=("ns-1", "ns-2"))


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


AUTH = basic("default", "default")
AWS, GCP = "aws-ap-northeast-2", "gcp-asia-northeast3"
NS = "/tumblebug/ns/ns-1"


class FailingFarm(NullFarm):
    async def start(
        self,
        vm_name: str,
        address: str,
        authorized_public_key: str,
        *,
        knobs: NodeKnobs | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        raise OSError(f"cannot bind {address}:22")


@dataclass
class Tb:
    client: TestClient[Any, Any]
    world: World
    farm: NullFarm

    async def call(self, method: str, path: str, body: Json | None = None) -> tuple[int, Any]:
        response: ClientResponse = await self.client.request(method, path, json=body, headers=AUTH)
        return response.status, await response.json()

    async def ok(self, method: str, path: str, body: Json | None = None, status: int = 200) -> Any:
        got, answer = await self.call(method, path, body)
        assert got == status, answer
        return answer

    async def refused(self, method: str, path: str, body: Json | None, status: int) -> str:
        got, answer = await self.call(method, path, body)
        assert got == status, answer
        return str(answer["message"])

    async def standin(self, method: str, path: str, body: Json | None = None) -> Any:
        response = await self.client.request(method, "/_standin/" + path, json=body)
        assert response.status == 200, await response.text()
        return await response.json()


async def start(knobs: TumblebugKnobs = KNOBS, farm: NullFarm | None = None) -> Tb:
    farm = farm or NullFarm()
    world = World(knobs, farm)
    client: TestClient[Any, Any] = TestClient(TestServer(TumblebugServer(world, knobs).app()))
    await client.start_server()
    return Tb(client, world, farm)


@pytest.fixture
async def tb() -> AsyncIterator[Tb]:
    harness = await start()
    yield harness
    await harness.client.close()


async def mcir(tb: Tb, conn: str, spec: str = "t3.medium", ns: str = NS) -> Json:
    """Get-or-create the five MCIR of ``conn`` with CB-Ladybug's names; their ids."""
    ids = {
        "vNet": f"{conn}-vpc",
        "securityGroup": f"{conn}-sg",
        "sshKey": f"{conn}-sshkey",
        "image": f"{conn}-ubuntu1804",
        "spec": f"{conn}-{spec.replace('.', '-').lower()}-spec",
    }
    bodies: dict[str, Json] = {
        "vNet": {
            "cidrBlock": "192.168.10.0/24",
            "subnetInfoList": [{"Name": f"{conn}-subnet", "IPv4_CIDR": "192.168.10.0/24"}],
        },
        "securityGroup": {
            "vNetId": ids["vNet"],
            "firewallRules": [
                {"fromPort": "1", "toPort": "65535", "ipProtocol": p, "direction": "inbound"}
                for p in ("tcp", "udp")
            ],
        },
        "sshKey": {"username": "cb-user"},
        "image": {"cspImageId": "ami-0", "cspImageName": "Ubuntu, 18.04", "guestOS": "ubuntu"},
        "spec": {"cspSpecName": spec},
    }
    for kind, name in ids.items():
        status, _ = await tb.call("GET", f"{ns}/resources/{kind}/{name}")
        if status == 404:
            query = "?action=registerWithInfo" if kind == "image" else ""
            body = {"name": name, "connectionName": conn, **bodies[kind]}
            await tb.ok("POST", f"{ns}/resources/{kind}{query}", body, status=201)
    return ids


def vm_request(name: str, conn: str, ids: Json, size: str = "") -> Json:
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
        "vmUserPassword": "",
        "rootDiskType": "default",
        "rootDiskSize": "default",
    }


async def cluster(tb: Tb, name: str = "k1", workers: int = 2, cp: int = 3) -> Json:
    aws, gcp = await mcir(tb, AWS), await mcir(tb, GCP, "e2-medium")
    vms = [vm_request("c-1-abcde", AWS, aws, str(cp))]
    vms += [vm_request(f"w-{i}-wxyz{i}", GCP, gcp) for i in range(1, workers + 1)]
    body = {
        "name": name,
        "label": "mcks",
        "systemLabel": "Managed by MCKS",
        "installMonAgent": "no",
        "vm": vms,
    }
    answer: Json = await tb.ok("POST", f"{NS}/mcis", body, status=201)
    return answer


# --- auth, namespaces, seeds -------------------------------------------------------------


async def test_basic_auth_guards_tumblebug_but_not_the_standin_routes(tb: Tb) -> None:
    bare = await tb.client.get(NS)
    assert bare.status == 401
    assert await bare.json() == {"message": "Unauthorized"}
    assert bare.headers["WWW-Authenticate"] == "basic realm=Restricted"
    wrong = await tb.client.get(NS, headers=basic("default", "nope"))
    assert wrong.status == 401
    assert (await tb.client.get("/_standin/state")).status == 200
    assert (await tb.client.get("/tumblebug/_standin/requests")).status == 200
    custom = await start(replace(KNOBS, username="u", password="p"))
    try:
        response = await custom.client.get(NS, headers=basic("u", "p"))
        assert response.status == 200
    finally:
        await custom.client.close()


async def test_namespaces_strict_and_compat(tb: Tb) -> None:
    assert await tb.ok("GET", NS) == {
        "id": "ns-1",
        "name": "ns-1",
        "description": "seeded by the stand-in",
    }
    assert await tb.refused("GET", "/tumblebug/ns/nope", None, 404) == "Not valid namespace"
    path = "/tumblebug/ns/nope/resources/vNet/x"
    assert await tb.refused("GET", path, None, 404) == "Not valid namespace"
    assert "lowercase letter" in await tb.refused("GET", "/tumblebug/ns/Bad/mcis", None, 404)
    armed = await tb.standin("POST", "faults", {"namespaceMode": "compat"})
    assert armed["namespaceMode"] == "compat"
    assert await tb.ok("GET", "/tumblebug/ns/nope") == {
        "message": "Failed to find the namespace nope"
    }
    # the middleware still guards every route under the namespace
    assert await tb.refused("GET", path, None, 404) == "Not valid namespace"
    created = await tb.ok("POST", "/tumblebug/ns", {"name": "nope"}, status=201)
    assert created["id"] == "nope"
    assert (await tb.ok("GET", "/tumblebug/ns/nope"))["id"] == "nope"
    assert "already exists" in await tb.refused("POST", "/tumblebug/ns", {"name": "nope"}, 500)
    names = [n["id"] for n in (await tb.ok("GET", "/tumblebug/ns"))["ns"]]
    assert names == ["ns-1", "ns-2", "nope"]


async def test_connections_regions_and_spec_lookups(tb: Tb) -> None:
    listed = (await tb.ok("GET", "/tumblebug/connConfig"))["connectionconfig"]
    assert {c["ProviderName"] for c in listed} == {"AWS", "GCP", "AZURE", "OPENSTACK", "IBM"}
    conn = await tb.ok("GET", f"/tumblebug/connConfig/{AWS}")
    assert conn["ConfigName"] == AWS
    assert conn["ProviderName"] == "AWS"
    region = await tb.ok("GET", f"/tumblebug/region/{conn['RegionName']}")
    assert region["KeyValueInfoList"] == [
        {"Key": "Region", "Value": "ap-northeast-2"},
        {"Key": "Zone", "Value": "ap-northeast-2a"},
    ]
    await tb.refused("GET", "/tumblebug/connConfig/nope", None, 404)
    await tb.refused("GET", "/tumblebug/region/nope", None, 404)
    spec = await tb.ok(
        "POST", "/tumblebug/lookupSpec", {"connectionName": AWS, "cspSpecName": "t3.small"}
    )
    assert spec["Name"] == "t3.small"
    assert (spec["Mem"], spec["VCpu"]["Count"]) == ("2048", "2")
    missing = {"connectionName": AWS, "cspSpecName": "x9.huge"}
    assert "not found" in await tb.refused("POST", "/tumblebug/lookupSpec", missing, 404)
    specs = (await tb.ok("POST", "/tumblebug/lookupSpecs", {"connectionName": GCP}))["vmspec"]
    assert all(isinstance(s["Mem"], str) and isinstance(s["VCpu"]["Count"], str) for s in specs)
    # every catalogue has a spec below 2 GiB and one with a single vCPU
    for connection in CONNECTIONS:
        assert any(int(s.mem_mib) < 2048 for s in connection.specs)
        assert any(s.vcpus == "1" and int(s.mem_mib) >= 2048 for s in connection.specs)
    images = await tb.ok(
        "POST", "/tumblebug/lookupImages", {"connectionName": "openstack-regionone"}
    )
    assert any(i["GuestOS"] == "Ubuntu 18.04" for i in images["image"])


# --- MCIR --------------------------------------------------------------------------------


async def test_mcir_get_or_create(tb: Tb) -> None:
    missing = await tb.refused("GET", f"{NS}/resources/vNet/{AWS}-vpc", None, 404)
    assert missing == f"Failed to find vNet {AWS}-vpc"
    ids = await mcir(tb, AWS)
    vnet = await tb.ok("GET", f"{NS}/resources/vNet/{ids['vNet']}")
    assert vnet["subnetInfoList"][0]["Name"] == f"{AWS}-subnet"
    assert vnet["subnetInfoList"][0]["IPv4_CIDR"] == "192.168.10.0/24"
    sg = await tb.ok("GET", f"{NS}/resources/securityGroup/{ids['securityGroup']}")
    assert [r["IPProtocol"] for r in sg["firewallRules"]] == ["tcp", "udp"]
    spec = await tb.ok("GET", f"{NS}/resources/spec/{ids['spec']}")
    assert (spec["cspSpecName"], spec["numvCPU"], spec["memGiB"]) == ("t3.medium", 2, 4.0)
    # a second pass finds everything and creates nothing
    before = dict(await tb.standin("GET", "requests"))
    assert await mcir(tb, AWS) == ids
    after = await tb.standin("GET", "requests")
    assert all(after.get(k, 0) == v for k, v in before.items() if k.endswith("-create"))
    # the same names in another namespace are other objects
    await tb.refused("GET", f"/tumblebug/ns/ns-2/resources/vNet/{ids['vNet']}", None, 404)
    dup = {"name": ids["vNet"], "connectionName": AWS, "cidrBlock": "10.0.0.0/16"}
    assert "already exists" in await tb.refused("POST", f"{NS}/resources/vNet", dup, 500)
    listed = await tb.ok("GET", f"{NS}/resources/spec")
    assert [s["id"] for s in listed["spec"]] == [ids["spec"]]


async def test_mcir_refusals(tb: Tb) -> None:
    no_conn = {"name": "x-vpc", "connectionName": "nope", "cidrBlock": "10.0.0.0/16"}
    assert "nope" in await tb.refused("POST", f"{NS}/resources/vNet", no_conn, 500)
    unnamed = {"connectionName": AWS}
    message = await tb.refused("POST", f"{NS}/resources/sshKey", unnamed, 500)
    assert "'TbSshKeyReq.Name'" in message
    assert "'required' tag" in message
    sg = {"name": "x-sg", "connectionName": AWS, "vNetId": "missing-vpc"}
    assert "vNet missing-vpc" in await tb.refused("POST", f"{NS}/resources/securityGroup", sg, 500)
    spec = {"name": "x-spec", "connectionName": AWS, "cspSpecName": "e2-medium"}
    assert "e2-medium" in await tb.refused("POST", f"{NS}/resources/spec", spec, 500)
    image = {"name": "x-img", "connectionName": AWS, "cspImageId": "ami-1"}
    assert "action=" in await tb.refused("POST", f"{NS}/resources/image", image, 500)
    await tb.ok("POST", f"{NS}/resources/image?action=registerWithId", image, status=201)
    garbage = await tb.client.post(f"{NS}/resources/vNet", data=b"{", headers=AUTH)
    assert garbage.status == 400


async def test_ssh_key_is_a_real_pair_returned_on_every_get(tb: Tb) -> None:
    body = {"name": f"{AWS}-sshkey", "connectionName": AWS, "username": "cb-user"}
    created = await tb.ok("POST", f"{NS}/resources/sshKey", body, status=201)
    fetched = await tb.ok("GET", f"{NS}/resources/sshKey/{AWS}-sshkey")
    assert fetched["privateKey"] == created["privateKey"]
    assert created["username"] == "cb-user"
    private = serialization.load_pem_private_key(created["privateKey"].encode(), password=None)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert public.decode() == created["publicKey"]
    assert created["fingerprint"].startswith("SHA256:")
    other = await tb.ok(
        "POST", f"{NS}/resources/sshKey", {**body, "name": "other-sshkey"}, status=201
    )
    assert other["privateKey"] != created["privateKey"]


# --- MCIS --------------------------------------------------------------------------------


async def test_mcis_create_names_subgroups_and_boots_every_vm(tb: Tb) -> None:
    answer = await cluster(tb)
    names = [vm["name"] for vm in answer["vm"]]
    assert names == ["c-1-abcde-1", "c-1-abcde-2", "c-1-abcde-3", "w-1-wxyz1-1", "w-2-wxyz2-1"]
    assert [vm["subGroupId"] for vm in answer["vm"]] == ["c-1-abcde"] * 3 + [
        "w-1-wxyz1",
        "w-2-wxyz2",
    ]
    assert answer["status"] == "Running:5 (R:5/5)"
    assert (answer["label"], answer["systemLabel"]) == ("mcks", "Managed by MCKS")
    publics = [vm["publicIP"] for vm in answer["vm"]]
    assert publics == [f"127.0.0.{n}" for n in range(2, 7)]
    privates = [vm["privateIP"] for vm in answer["vm"]]
    assert len(set(privates)) == 5
    assert all(p.startswith("10.0.") for p in privates)
    leader, worker = answer["vm"][0], answer["vm"][3]
    assert leader["status"] == "Running"
    assert leader["systemMessage"] == ""
    assert leader["region"] == {"Region": "ap-northeast-2", "Zone": "ap-northeast-2a"}
    assert worker["region"] == {"Region": "asia-northeast3", "Zone": "asia-northeast3-a"}
    assert leader["cspViewVmDetail"]["VMSpecName"] == "t3.medium"
    assert worker["cspViewVmDetail"]["VMSpecName"] == "e2-medium"
    assert leader["vmUserAccount"] == "cb-user"
    assert leader["sshPort"] == "22"
    # every VM got an sshd that accepts its connection's key
    keys = {
        conn: (await tb.ok("GET", f"{NS}/resources/sshKey/{conn}-sshkey"))["publicKey"]
        for conn in (AWS, GCP)
    }
    assert tb.farm.running == {
        "127.0.0.2": ("c-1-abcde-1", keys[AWS]),
        "127.0.0.3": ("c-1-abcde-2", keys[AWS]),
        "127.0.0.4": ("c-1-abcde-3", keys[AWS]),
        "127.0.0.5": ("w-1-wxyz1-1", keys[GCP]),
        "127.0.0.6": ("w-2-wxyz2-1", keys[GCP]),
    }
    got = await tb.ok("GET", f"{NS}/mcis/k1")
    assert [vm["name"] for vm in got["vm"]] == names
    vm = await tb.ok("GET", f"{NS}/mcis/k1/vm/w-1-wxyz1-1")
    assert vm["publicIP"] == "127.0.0.5"
    ids = await tb.ok("GET", f"{NS}/mcis/k1/vm/w-1-wxyz1-1?option=idsInDetail")
    assert ids["idInTb"] == "w-1-wxyz1-1"
    assert ids["nameInCsp"] == "ns-1-w-1-wxyz1-1"
    assert "does not exist" in await tb.refused("GET", f"{NS}/mcis/k1/vm/nope", None, 404)
    assert "does not exist" in await tb.refused("GET", f"{NS}/mcis/nope", None, 404)
    listed = await tb.ok("GET", f"{NS}/mcis")
    assert [m["name"] for m in listed["mcis"]] == ["k1"]
    spec = await tb.ok("GET", f"{NS}/resources/spec/{AWS}-t3-medium-spec")
    assert "/ns/ns-1/mcis/k1/vm/c-1-abcde-1" in spec["associatedObjectList"]


async def test_mcis_create_checks_every_reference_first(tb: Tb) -> None:
    aws = await mcir(tb, AWS)
    good = vm_request("c-1-abcde", AWS, aws, "1")
    cases: list[tuple[Json, str]] = [
        ({"sshKeyId": "nope"}, "Failed to get the SshKey nope from " + AWS),
        ({"imageId": "nope"}, "Failed to get the Image nope"),
        ({"specId": "nope"}, "Failed to get the spec nope"),
        ({"vNetId": "nope"}, "Failed to get the vNet nope"),
        ({"securityGroupIds": ["ok", "nope"]}, "Failed to get the SecurityGroup"),
        ({"subnetId": "nope"}, "subnet nope"),
        ({"connectionName": "nope"}, "nope"),
        ({"connectionName": GCP}, "belongs to"),
        ({"sshKeyId": ""}, "'TbVmReq.SshKeyId'"),
    ]
    for change, fragment in cases:
        body = {"name": "k1", "vm": [good, {**good, "name": "w-1-abcde", **change}]}
        message = await tb.refused("POST", f"{NS}/mcis", body, 500)
        assert fragment in message, (change, message)
    await mcir(tb, GCP, "e2-medium")
    state = await tb.standin("GET", "state")
    assert state["mcis"]["ns-1"] == []
    assert state["addressesInUse"] == []
    assert tb.farm.running == {}
    assert "'TbMcisReq.Name'" in await tb.refused("POST", f"{NS}/mcis", {"vm": [good]}, 500)
    bad_name = {"name": "K1", "vm": [good]}
    assert "lowercase" in await tb.refused("POST", f"{NS}/mcis", bad_name, 500)
    await tb.ok("POST", f"{NS}/mcis", {"name": "k1", "vm": [good]}, status=201)
    again = await tb.refused("POST", f"{NS}/mcis", {"name": "k1", "vm": [good]}, 500)
    assert again == "The mcis k1 already exists."


async def test_subgroup_size_rules(tb: Tb) -> None:
    aws = await mcir(tb, AWS)
    vms = [
        vm_request("a", AWS, aws, ""),
        vm_request("B", AWS, aws, "0"),
        vm_request("c", AWS, aws, "2"),
    ]
    answer = await tb.ok("POST", f"{NS}/mcis", {"name": "m", "vm": vms}, status=201)
    assert [vm["name"] for vm in answer["vm"]] == ["a-1", "b-1", "c-1", "c-2"]
    assert [vm["subGroupId"] for vm in answer["vm"]] == ["a", "b", "c", "c"]


async def test_vm_add_appends_a_subgroup_or_grows_one(tb: Tb) -> None:
    await cluster(tb, workers=1, cp=1)
    gcp = await mcir(tb, GCP, "e2-medium")
    added = await tb.ok("POST", f"{NS}/mcis/k1/vm", vm_request("w-2-zzzzz", GCP, gcp), status=201)
    assert added["newVmList"] == ["w-2-zzzzz-1"]
    assert [vm["name"] for vm in added["vm"]] == ["c-1-abcde-1", "w-1-wxyz1-1", "w-2-zzzzz-1"]
    new = added["vm"][-1]
    assert (new["status"], new["subGroupId"], new["publicIP"]) == (
        "Running",
        "w-2-zzzzz",
        "127.0.0.4",
    )
    grown = await tb.ok("POST", f"{NS}/mcis/k1/vm", vm_request("w-2-zzzzz", GCP, gcp), status=201)
    assert grown["newVmList"] == ["w-2-zzzzz-2"]
    missing = await tb.refused("POST", f"{NS}/mcis/nope/vm", vm_request("w", GCP, gcp), 500)
    assert missing == "The mcis nope does not exist."


async def test_delete_needs_terminate_and_addresses_are_recycled(tb: Tb) -> None:
    await cluster(tb)
    refused = await tb.refused("DELETE", f"{NS}/mcis/k1", None, 500)
    assert refused.startswith("MCIS k1 is Running:5 (R:5/5) and not Terminated")
    assert await tb.ok("GET", f"{NS}/control/mcis/k1?action=terminate") == {
        "message": "Terminated the MCIS"
    }
    assert tb.farm.running == {}
    got = await tb.ok("GET", f"{NS}/mcis/k1")
    assert got["status"] == "Terminated:5 (R:0/5)"
    assert {vm["status"] for vm in got["vm"]} == {"Terminated"}
    deleted = await tb.ok("DELETE", f"{NS}/mcis/k1")
    assert deleted["output"][-1] == "MCIS: k1 [Done]"
    assert "VM: c-1-abcde-1 [Done]" in deleted["output"]
    await tb.refused("GET", f"{NS}/mcis/k1", None, 404)
    assert "does not exist" in await tb.refused("DELETE", f"{NS}/mcis/k1", None, 500)
    # MCIR stay, now used by nothing; the freed addresses are handed out again
    spec = await tb.ok("GET", f"{NS}/resources/spec/{AWS}-t3-medium-spec")
    assert spec["associatedObjectList"] == []
    again = await cluster(tb, "k2", workers=1, cp=1)
    assert [vm["publicIP"] for vm in again["vm"]] == ["127.0.0.2", "127.0.0.3"]
    bad = await tb.refused("GET", f"{NS}/control/mcis/k2?action=explode", None, 400)
    assert "'action' should be one of these" in bad
    assert "does not exist" in await tb.refused(
        "GET", f"{NS}/control/mcis/no?action=refine", None, 500
    )


async def test_delete_options(tb: Tb) -> None:
    await cluster(tb, "k1", workers=1, cp=1)
    assert (await tb.ok("DELETE", f"{NS}/mcis/k1?option=terminate"))["output"][
        -1
    ] == "MCIS: k1 [Done]"
    await cluster(tb, "k2", workers=1, cp=1)
    await tb.ok("DELETE", f"{NS}/mcis/k2?option=force")
    assert tb.farm.running == {}


async def test_vm_delete_terminates_first(tb: Tb) -> None:
    await cluster(tb, workers=2, cp=1)
    assert await tb.ok("DELETE", f"{NS}/mcis/k1/vm/w-1-wxyz1-1") == {
        "message": "Deleted the VM info"
    }
    assert "127.0.0.3" not in tb.farm.running
    got = await tb.ok("GET", f"{NS}/mcis/k1")
    assert [vm["name"] for vm in got["vm"]] == ["c-1-abcde-1", "w-2-wxyz2-1"]
    missing = await tb.refused("DELETE", f"{NS}/mcis/k1/vm/w-1-wxyz1-1", None, 500)
    assert missing == "Failed to delete the VM info"
    state = await tb.standin("GET", "state")
    assert list(state["mcis"]["ns-1"][0]["subGroups"]) == ["c-1-abcde", "w-2-wxyz2"]
    assert state["addressesInUse"] == ["127.0.0.2", "127.0.0.4"]


async def test_nlb_is_stored_on_the_control_plane_subgroup(tb: Tb) -> None:
    await cluster(tb, workers=1, cp=3)
    path = f"{NS}/mcis/k1/nlb"
    assert (
        await tb.refused("GET", path + "/c-1-abcde", None, 404)
        == "Failed to find the NLB c-1-abcde"
    )
    body: Json = {
        "name": "c-1-abcde",
        "connectionName": AWS,
        "vNetId": f"{AWS}-vpc",
        "type": "PUBLIC",
        "scope": "REGION",
        "listener": {"protocol": "TCP", "port": "6443"},
        "targetGroup": {"protocol": "TCP", "port": "6443", "mcis": "k1", "subGroupId": "c-1-abcde"},
        "healthChecker": {
            "protocol": "TCP",
            "port": "22",
            "interval": "default",
            "threshold": "default",
            "timeout": "-1",
        },
    }
    created = await tb.ok("POST", path, body, status=201)
    assert created["targetGroup"]["vms"] == ["c-1-abcde-1", "c-1-abcde-2", "c-1-abcde-3"]
    assert created["healthChecker"]["timeout"] == -1
    assert created["healthChecker"]["interval"] == 10
    assert (await tb.ok("GET", path + "/c-1-abcde"))["id"] == "c-1-abcde"
    assert "already exists" in await tb.refused("POST", path, body, 500)
    empty = {**body, "targetGroup": {**body["targetGroup"], "subGroupId": "nope"}}
    assert "no VMs" in await tb.refused("POST", path, empty, 500)
    await tb.ok("GET", f"{NS}/control/mcis/k1?action=terminate")
    deleted = await tb.ok("DELETE", f"{NS}/mcis/k1")
    assert "NLB: c-1-abcde [Done]" in deleted["output"]


# --- faults ------------------------------------------------------------------------------


async def test_vm_faults_failed_and_no_public_ip(tb: Tb) -> None:
    await tb.standin("POST", "faults", {"vm": "w-1-*", "fault": "failed", "message": "quota"})
    await tb.standin("POST", "faults", {"vm": "w-2-*", "fault": "no-public-ip", "count": 1})
    answer = await cluster(tb, workers=3, cp=1)
    by_name = {vm["name"]: vm for vm in answer["vm"]}
    failed, bare, fine = by_name["w-1-wxyz1-1"], by_name["w-2-wxyz2-1"], by_name["w-3-wxyz3-1"]
    assert (failed["status"], failed["systemMessage"], failed["publicIP"]) == (
        "Failed",
        "quota",
        "",
    )
    assert bare["status"] == "Running"
    assert bare["publicIP"] == ""
    assert bare["privateIP"]
    assert fine["publicIP"] == "127.0.0.3"
    assert answer["status"].startswith("Partial-Failed:1")
    assert set(tb.farm.running) == {"127.0.0.2", "127.0.0.3"}
    faults = await tb.standin("GET", "faults")
    assert faults["vmFaults"] == [
        {"fault": "failed", "vm": "w-1-*", "count": -1, "message": "quota"}
    ]
    # refine drops the Failed VM, as upstream's refine does
    assert (await tb.ok("GET", f"{NS}/control/mcis/k1?action=refine"))[
        "message"
    ] == "Refined the MCIS"
    names = [vm["name"] for vm in (await tb.ok("GET", f"{NS}/mcis/k1"))["vm"]]
    assert "w-1-wxyz1-1" not in names
    cleared = await tb.standin("DELETE", "faults")
    assert cleared["vmFaults"] == []
    assert cleared["routes"] == {}


async def test_mcis_delete_fails_once_then_refine_and_retry(tb: Tb) -> None:
    await cluster(tb, workers=1, cp=1)
    await tb.standin("POST", "faults", {"route": "mcis-delete"})
    await tb.ok("GET", f"{NS}/control/mcis/k1?action=terminate")
    assert "injected fault" in await tb.refused("DELETE", f"{NS}/mcis/k1", None, 500)
    await tb.ok("GET", f"{NS}/control/mcis/k1?action=refine")
    await tb.ok("DELETE", f"{NS}/mcis/k1")
    counts = await tb.standin("GET", "requests")
    assert counts["mcis-delete"] == 2
    assert counts["mcis-control"] == 2
    assert counts["mcis-create"] == 1
    assert counts["sshkey-get"] == 2


async def test_node_faults_reach_the_farm_at_boot_or_at_once(tb: Tb) -> None:
    armed = await tb.standin("POST", "faults", {"vm": "w-*", "node": {"join_fail": True}})
    assert armed["changedNow"] == []
    assert armed["vmFaults"] == [
        {"fault": "node", "vm": "w-*", "count": -1, "node": {"join_fail": True}}
    ]
    await cluster(tb, workers=2, cp=1)
    assert tb.farm.knobs == {
        "127.0.0.3": NodeKnobs(join_fail=True),
        "127.0.0.4": NodeKnobs(join_fail=True),
    }
    fault = {"vm": "c-1-*", "node": {"unreachable": 3, "bootstrap_fail": True}, "count": 1}
    armed = await tb.standin("POST", "faults", fault)
    assert armed["changedNow"] == ["c-1-abcde-1"]
    assert tb.farm.knobs["127.0.0.2"] == NodeKnobs(bootstrap_fail=True, unreachable=3)
    # used up on the running VM: nothing is left armed for c-1-*
    assert [f["vm"] for f in armed["vmFaults"]] == ["w-*"]
    for bad in ({"vm": "*", "node": {}}, {"vm": "*", "node": "x"}, {"vm": "*", "node": {"x": 1}}):
        assert (await tb.client.post("/_standin/faults", json=bad)).status == 422


async def test_fault_knob_refusals(tb: Tb) -> None:
    for body in ({"route": "nope"}, {"vm": "*", "fault": "melt"}, {"namespaceMode": "x"}, {}):
        response = await tb.client.post("/_standin/faults", json=body)
        assert response.status == 422, body
    await tb.standin("POST", "faults", {"route": "ns-get", "status": 503, "count": 2})
    for _ in range(2):
        await tb.refused("GET", NS, None, 503)
    await tb.ok("GET", NS)


async def test_env_knobs_arm_faults_at_start() -> None:
    knobs = replace(KNOBS, failed_vms=("c-*",), mcis_delete_fails=1, namespace_mode="compat")
    harness = await start(knobs)
    try:
        answer = await cluster(harness, workers=1, cp=1)
        assert [vm["status"] for vm in answer["vm"]] == ["Failed", "Running"]
        assert answer["vm"][0]["systemMessage"] == knobs.failed_message
        assert "message" in await harness.ok("GET", "/tumblebug/ns/unknown")
        await harness.ok("GET", f"{NS}/control/mcis/k1?action=terminate")
        assert "injected" in await harness.refused("DELETE", f"{NS}/mcis/k1", None, 500)
        # a Failed VM next to Terminated ones is Partial-Failed: only refine clears the way
        assert "Partial-Failed" in await harness.refused("DELETE", f"{NS}/mcis/k1", None, 500)
        await harness.ok("GET", f"{NS}/control/mcis/k1?action=refine")
        await harness.ok("DELETE", f"{NS}/mcis/k1")
    finally:
        await harness.client.close()


async def test_a_node_that_does_not_boot_is_a_failed_vm() -> None:
    harness = await start(farm=FailingFarm())
    try:
        answer = await cluster(harness, workers=1, cp=1)
        vm = answer["vm"][0]
        assert vm["status"] == "Failed"
        assert "cannot bind 127.0.0.2:22" in vm["systemMessage"]
        assert (await harness.standin("GET", "state"))["addressesInUse"] == []
    finally:
        await harness.client.close()


async def test_spider_anycall_stub(tb: Tb) -> None:
    body = {
        "connectionName": AWS,
        "reqInfo": {"fId": "getRegionInfo", "iKeyValueList": [{"key": "k", "value": "v"}]},
    }
    answer = await tb.ok("POST", "/spider/anycall", body)
    assert answer["FID"] == "getRegionInfo"
    sealed = {p["Key"]: p["Value"] for p in answer["OKeyValueList"]}
    assert sealed["Region"] != "ap-northeast-2"  # encrypted, as Spider sends it
    assert spider.outputs(answer) == sealed
    assert spider.reveal(sealed["Region"]) == "ap-northeast-2"

    def call(fid: str, connection: str = AWS, **inputs: str) -> Json:
        pairs = [{"key": k, "value": v} for k, v in inputs.items()]
        return {"connectionName": connection, "reqInfo": {"fId": fid, "iKeyValueList": pairs}}

    info = await tb.ok("POST", "/spider/anycall", call("getConnectionInfo", "openstack-regionone"))
    revealed = {p["Key"]: spider.reveal(p["Value"]) for p in info["OKeyValueList"]}
    assert set(revealed) == {"IdentityEndpoint", "Username", "Password", "ProjectID", "DomainName"}
    assert "unsupported" in await tb.refused(
        "POST", "/spider/anycall", call("getConnectionInfo"), 500
    )
    profile = call("associateIamInstanceProfile", InstanceId="i-1", Role="r")
    assert spider.outputs(await tb.ok("POST", "/spider/anycall", profile)) == {"Result": "true"}
    again = await tb.ok("POST", "/spider/anycall", profile)
    with pytest.raises(spider.TumblebugRefused, match="IncorrectState"):
        spider.outputs(again)
    tag = call(
        "createTags", ResourceId="sg-1", Tag='{"key":"kubernetes.io/cluster/c","value":"owned"}'
    )
    await tb.ok("POST", "/spider/anycall", tag)
    state = await tb.standin("GET", "state")
    assert state["spider"]["profiles"] == {"i-1": "r"}
    assert state["spider"]["tags"]["sg-1"] == [{"key": "kubernetes.io/cluster/c", "value": "owned"}]


# --- pure parts --------------------------------------------------------------------------


def test_knobs_from_env() -> None:
    env = {
        "STANDIN_TUMBLEBUG_NAMESPACES": "a, b",
        "STANDIN_TUMBLEBUG_NAMESPACE_MODE": "COMPAT",
        "STANDIN_TUMBLEBUG_SSH": "0",
        "STANDIN_TUMBLEBUG_FAILED_VMS": "w-*",
        "STANDIN_TUMBLEBUG_MCIS_DELETE_FAILS": "2",
        "API_USERNAME": "tb",
    }
    knobs = TumblebugKnobs.from_env(env)
    assert knobs.namespaces == ("a", "b")
    assert knobs.namespace_mode == "compat"
    assert not knobs.ssh
    assert knobs.failed_vms == ("w-*",)
    assert knobs.mcis_delete_fails == 2
    assert (knobs.username, knobs.password) == ("tb", "default")
    with pytest.raises(ValueError, match="NAMESPACE_MODE"):
        TumblebugKnobs.from_env({"STANDIN_TUMBLEBUG_NAMESPACE_MODE": "lax"})


def test_mcis_status_summary() -> None:
    def vms(*statuses: str) -> list[Vm]:
        return [
            Vm(f"v-{i}", "v", CONNECTIONS[0], {}, "", "", status=s) for i, s in enumerate(statuses)
        ]

    assert render.mcis_status(vms("Running", "Running")) == "Running:2 (R:2/2)"
    assert render.mcis_status(vms("Running", "Terminated")) == "Partial-Running:1 (R:1/2)"
    assert render.mcis_status(vms("Failed", "Running", "Running")) == "Partial-Failed:1 (R:2/3)"
    assert render.mcis_status(vms("Failed")) == "Failed:1 (R:0/1)"
    assert render.mcis_status([]) == "Failed:0 (R:0/0)"


def test_address_pool_hands_out_the_lowest_free() -> None:
    pool = AddressPool("127.0.0.254", 3)
    assert [pool.take() for _ in range(3)] == ["127.0.0.254", "127.0.0.255", "127.0.1.0"]
    with pytest.raises(Exception, match="in use"):
        pool.take()
    pool.release("127.0.0.255")
    assert pool.take() == "127.0.0.255"
    assert fnmatch.fnmatchcase("w-1-abcde-1", "w-*")
