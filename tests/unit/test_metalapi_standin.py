"""The metal-api stand-in's rules, its HMAC check, its HTTP face and its node registrar.

The rules are metal-api's (``standins/metalapi`` cites where each comes from); these tests
pin the ones a provider can run into: carving, the 422 on freeing a network in use, IP
types and ownership, every allocation check, the ephemeral-IP release on free, the
provisioning steps and the reboot. The HTTP tests drive an in-process server through the
real client, ``shared.metalapi``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from shared.errors import KubeConflict, KubeNotFound, KubeUnavailable
from shared.metalapi import (
    MetalApiClient,
    MetalApiConfig,
    MetalApiUnauthorized,
    MetalApiUnavailable,
    hmac_headers,
)
from standins.metalapi import machines
from standins.metalapi.allocation import authorized_key
from standins.metalapi.auth import AuthError, verify
from standins.metalapi.knobs import MetalApiKnobs
from standins.metalapi.lifecycle import Lifecycle
from standins.metalapi.model import MetalError
from standins.metalapi.registrar import NodeRegistrar
from standins.metalapi.server import MetalApiServer
from standins.metalapi.world import World

Json = dict[str, Any]
P, OTHER = "00000000-0000-0000-0000-000000000000", "11111111-1111-1111-1111-111111111111"
INTERNET = "internet-vagrant-lab"
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL43TruXsXd/MpVbdNdpYw4T7MN7bcZWftgAop8IWH0l me@x"
KNOBS = MetalApiKnobs(
    pool_size=4, seed=7, projects=(P, OTHER), provisioning_delay=0, reboot_delay=0
)


def world(**knobs: Any) -> World:
    return World.seeded(replace(KNOBS, **knobs))


def network(w: World, project: str = P) -> str:
    return w.allocate_network({"projectid": project, "partitionid": "vagrant", "name": "n"}).id


def request(network_id: str, **extra: Any) -> Json:
    body: Json = {
        "name": "m1",
        "hostname": "m1",
        "projectid": P,
        "partitionid": "vagrant",
        "sizeid": "v1-small-x86",
        "imageid": "ubuntu-cloud-init-20.04",
        "ssh_pub_keys": [ED25519],
        "tags": ["cluster.metal-stack.io/id=c1", "cluster.metal-stack.io/id=c1", "x"],
        "networks": [
            {"networkid": INTERNET, "autoacquire": True},
            {"networkid": network_id, "autoacquire": True},
        ],
    }
    return {**body, **extra}


def refused(status: int, fragment: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(MetalError) as caught:
        call(*args, **kwargs)
    assert caught.value.status == status
    assert fragment in caught.value.message


# --- networks and IPs ------------------------------------------------------------------------


def test_networks_are_carved_children_until_the_super_network_is_full() -> None:
    w = world(super_prefix="10.0.0.0/21")
    first, second = (w.allocate_network({"projectid": P, "partitionid": "vagrant"}) for _ in "ab")
    assert (first.prefixes, second.prefixes) == (["10.0.0.0/22"], ["10.0.4.0/22"])
    assert first.parent_network_id == second.parent_network_id == "tenant-super-network-vagrant"
    assert first.vrf != second.vrf
    refused(422, "no prefix found", w.allocate_network, {"projectid": P, "partitionid": "vagrant"})
    refused(422, "projectid should not be empty", w.allocate_network, {"partitionid": "vagrant"})
    refused(404, "project", w.allocate_network, {"projectid": "nope", "partitionid": "vagrant"})
    refused(404, "partition", w.allocate_network, {"projectid": P, "partitionid": "nope"})


def test_a_network_in_use_is_not_freed_and_its_prefix_returns_when_it_is() -> None:
    w = world()
    net = network(w)
    ip = w.allocate_ip({"networkid": net, "projectid": P})
    refused(422, "cannot release child prefix 10.0.0.0/22 because IPs", w.free_network, net)
    w.free_ip(ip.ipaddress)
    w.free_network(net)
    assert network(w) != net
    assert w.networks[network(w)].prefixes == ["10.0.4.0/22"]
    refused(422, "is no child prefix", w.free_network, INTERNET)
    refused(404, "no network", w.free_network, "gone")


def test_ip_allocation_rules() -> None:
    w = world()
    first = w.allocate_ip({"networkid": INTERNET, "projectid": P, "type": ""})
    assert (first.ipaddress, first.type) == ("185.1.2.1", "ephemeral")
    static = w.allocate_ip({"networkid": INTERNET, "projectid": P, "type": "static"}, "185.1.2.9")
    assert (static.ipaddress, static.type) == ("185.1.2.9", "static")
    body = {"networkid": INTERNET, "projectid": P}
    refused(409, "ip already allocated", w.allocate_ip, body, "185.1.2.9")
    refused(409, "ip already allocated", w.allocate_ip, body, "185.1.2.0")  # network address
    refused(422, "not contained", w.allocate_ip, body, "10.9.9.9")
    private = network(w)
    refused(422, "network is not shared", w.allocate_ip, {"networkid": private, "projectid": OTHER})
    refused(422, "networkid should not be empty", w.allocate_ip, {"projectid": P})
    refused(404, "no network", w.allocate_ip, {"networkid": "gone", "projectid": P})
    tagged = w.allocate_ip({**body, "tags": ["a=b"], "machineid": "m"})
    assert tagged.tags == ["a=b", "machine.metal-stack.io/id=m"]
    refused(422, "machine scope", w.free_ip, tagged.ipaddress)
    assert [i.ipaddress for i in w.find_ips({"tags": ["a=b"], "machineid": "m"})] == ["185.1.2.2"]


# --- allocation ------------------------------------------------------------------------------


def test_allocation_builds_networks_and_tags_auto_ips() -> None:
    w = world()
    net = network(w)
    machine = machines.allocate(w, request(net))
    allocation = machine.allocation
    assert allocation is not None
    assert machine.tags == ["cluster.metal-stack.io/id=c1", "x"]
    types = [(n.network_id, n.network_type, n.private, n.ips) for n in allocation.networks]
    assert types == [
        (INTERNET, "external", False, ["185.1.2.1"]),
        (net, "privateprimaryunshared", True, ["10.0.0.1"]),
    ]
    for address in ("185.1.2.1", "10.0.0.1"):
        ip = w.ips[address]
        assert (ip.type, ip.description, ip.name) == ("ephemeral", "autoassigned", "m1")
        assert ip.tags == [f"machine.metal-stack.io/id={machine.id}"]
    assert len([m for m in w.machines.values() if m.waiting]) == 3


def test_given_ips_are_attached_and_switch_autoacquire_off() -> None:
    w = world()
    net = network(w)
    cp = w.allocate_ip({"networkid": INTERNET, "projectid": P, "name": "cp"}, "185.1.2.50")
    machine = machines.allocate(w, request(net, ips=[cp.ipaddress]))
    assert machine.allocation is not None
    assert machine.allocation.networks[0].ips == ["185.1.2.50"]
    assert cp.machine_ids() == [machine.id]
    assert sorted(w.ips) == ["10.0.0.1", "185.1.2.50"]


@pytest.mark.parametrize(
    ("change", "status", "fragment"),
    [
        ({"projectid": ""}, 422, "project id must be specified"),
        ({"partitionid": ""}, 422, "a partition id must be specified"),
        ({"sizeid": ""}, 422, "a size id must be specified"),
        ({"ips": ["not-an-ip"]}, 422, '"not-an-ip" is not a valid IP address'),
        ({"ssh_pub_keys": ["ssh-ed25519 nope"]}, 422, "invalid public SSH key"),
        ({"imageid": "nope"}, 404, "no image for id:nope"),
        ({"imageid": "firewall-ubuntu-2.0"}, 422, "not usable for a machine"),
        ({"sizeid": "nope"}, 404, "size cannot be found"),
        ({"partitionid": "nope"}, 404, "partition cannot be found"),
        ({"projectid": "nope"}, 404, "project"),
        ({"uuid": "nope"}, 404, "machine cannot be found"),
        ({"networks": [{"networkid": INTERNET}]}, 422, "no private network given"),
        ({"networks": [{"networkid": "gone"}]}, 404, "no network"),
        ({"networks": [{"networkid": "tenant-super-network-vagrant"}]}, 422, "private super"),
        ({"networks": [{"networkid": INTERNET, "autoacquire": False}]}, 422, "missing ip(s)"),
        ({"ips": ["185.1.2.77"]}, 404, "no ip"),
    ],
)
def test_allocation_refusals(change: Json, status: int, fragment: str) -> None:
    w = world()
    refused(status, fragment, machines.allocate, w, request(network(w), **change))
    assert not w.ips
    assert all(m.allocation is None for m in w.machines.values())


def test_allocation_refusals_about_networks_and_ips() -> None:
    w = world()
    net, theirs, second = network(w), network(w, OTHER), network(w)
    w.add_network("underlay", "10.1.0.0/24", "vagrant", underlay=True)
    two = [{"networkid": net}, {"networkid": second}]
    refused(422, "only one primary private", machines.allocate, w, request(net, networks=two))
    refused(422, "does not belong to the project", machines.allocate, w, request(theirs))
    under = [{"networkid": "underlay"}, {"networkid": net}]
    refused(422, "underlay networks", machines.allocate, w, request(net, networks=under))
    foreign = w.allocate_ip({"networkid": INTERNET, "projectid": OTHER})
    refused(422, "does not belong", machines.allocate, w, request(net, ips=[foreign.ipaddress]))
    elsewhere = w.allocate_ip({"networkid": second, "projectid": P})
    refused(422, "not in any", machines.allocate, w, request(net, ips=[elsewhere.ipaddress]))
    noauto = [{"networkid": net, "autoacquire": False}]
    firewall = request(net, imageid="firewall-ubuntu-2.0", networks=noauto)
    refused(422, "at least one auto acquire", machines.allocate, w, firewall, firewall=True)
    refused(422, "not usable for a firewall", machines.allocate, w, request(net), firewall=True)


def test_ssh_keys_parse_as_authorized_keys_lines() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    rsa_line = key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    assert authorized_key(ED25519)
    assert authorized_key(rsa_line)
    assert authorized_key(f'no-pty,command="x" {rsa_line} me@host')
    blob = ED25519.split()[1]
    assert not authorized_key(f"ssh-rsa {blob}")  # the blob names another type
    assert not authorized_key("")
    assert not authorized_key("ssh-ed25519 !!!")


def test_uuid_pins_the_machine_and_the_pool_runs_dry() -> None:
    w = world(pool_size=2)
    net = network(w)
    pinned = sorted(w.machines)[1]
    assert machines.allocate(w, request(net, uuid=pinned, partitionid="", sizeid="")).id == pinned
    refused(422, "already allocated", machines.allocate, w, request(net, uuid=pinned))
    w.partitions["other"] = 22
    other = sorted(w.machines)[0]
    elsewhere = request(net, uuid=other, partitionid="other")
    refused(422, "not in the requested partition", machines.allocate, w, elsewhere)
    machines.allocate(w, request(net, hostname="m2"))
    refused(422, "no machine available", machines.allocate, w, request(net, hostname="m3"))


# --- free, provisioning, reboot --------------------------------------------------------------


def test_free_releases_ephemeral_ips_keeps_static_ones_and_reboots() -> None:
    w = world()
    net = network(w)
    cp = w.allocate_ip({"networkid": INTERNET, "projectid": P}, "185.1.2.50")
    keep = w.allocate_ip({"networkid": net, "projectid": P, "type": "static"})
    machine = machines.allocate(w, request(net, ips=[cp.ipaddress, keep.ipaddress]))
    machines.free(w, machine.id, "r1")
    assert list(w.ips) == [keep.ipaddress]  # the control-plane IP went with the machine
    assert keep.tags == []
    assert (machine.allocation, machine.tags, machine.last_event) == (None, [], "Planned Reboot")
    assert not machine.waiting
    assert machines.rebooted(w, machine.id, "stale") is None
    assert machines.rebooted(w, machine.id, "r1") is machine
    assert machine.waiting
    refused(422, "still in use", w.free_network, net)
    w.free_ip(keep.ipaddress)
    w.free_network(net)


def test_steps_belong_to_their_allocation() -> None:
    w = world()
    machine = machines.allocate(w, request(network(w)))
    assert machine.allocation is not None
    old = machine.allocation.id
    assert machines.step(w, machine.id, "other", "Installing", succeeded=True) is None
    for event in machines.PROVISIONING:
        machines.step(w, machine.id, old, event, succeeded=False)
    events = [e.event for e in machine.events[:4]]
    assert events == ["Phoned Home", "Booting New Kernel", "Installing", "Waiting"]
    assert machine.allocation.succeeded is False  # the real metal-api never sets it


class Listener:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def phoned_home(self, machine: Any) -> None:
        self.seen.append(("up", machine.allocation.hostname))

    def freed(self, machine_id: str, hostname: str) -> None:
        self.seen.append(("down", hostname))


async def test_lifecycle_steps_after_the_delay_and_tells_the_listener() -> None:
    knobs = replace(KNOBS, provisioning_delay=0.06, reboot_delay=0.03)
    listener = Listener()
    life = Lifecycle(World.seeded(knobs), knobs, listener=listener)
    net = network(life.world)
    machine = life.allocate(request(net))
    wall = request(net, imageid="firewall-ubuntu-2.0", hostname="fw")
    firewall = life.allocate(wall, firewall=True)
    assert machine.last_event == "Waiting"
    await _until(lambda: machine.last_event == "Phoned Home" == firewall.last_event)
    assert machine.allocation is not None
    assert machine.allocation.succeeded
    assert life.world.is_firewall(firewall)
    assert not life.world.is_firewall(machine)
    life.free(machine.id)
    life.free(firewall.id)
    assert listener.seen == [("up", "m1"), ("down", "m1")]
    await _until(lambda: machine.waiting and firewall.waiting)
    life.close()


async def _until(check: Any, timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


# --- HMAC ------------------------------------------------------------------------------------


def test_verify_accepts_the_clients_headers_and_says_why_it_refuses() -> None:
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    verify("k", "POST", hmac_headers("k", "POST", now=now), now=now + timedelta(seconds=14))
    verify("k", "GET", hmac_headers("k", "GET", now=now + timedelta(minutes=5)), now=now)
    mac = "dd864d767ca9eec0337727e6ae69a30c47fa1501d1df9c7f2c4caaa83cf2f9f3"
    upstream = {
        "Authorization": f"Metal-Admin {mac}",
        "X-Date": "2019-05-29T09:26:39.000Z",
        "X-Data-Salt": "",
    }  # metal-stack/security mac_test.go: the date is re-formatted before signing
    verify("metal-test-admin", "GET", upstream, lifetime=0)
    cases = [
        ("k", "POST", now + timedelta(seconds=16), "too old"),
        ("wrong", "POST", now, "Wrong HMAC found"),
        ("k", "GET", now, "Wrong HMAC found"),
    ]
    for key, method, when, fragment in cases:
        with pytest.raises(AuthError, match=fragment):
            verify(key, method, hmac_headers("k", "POST", now=now), now=when)
    for headers, fragment in [({}, "no auth found"), ({"Authorization": "x"}, "illegal auth")]:
        with pytest.raises(AuthError, match=fragment):
            verify("k", "GET", headers, now=now)


# --- HTTP ------------------------------------------------------------------------------------


async def test_http_auth_faults_and_bookkeeping() -> None:
    knobs = replace(KNOBS, hmac="secret")
    server = MetalApiServer(Lifecycle(World.seeded(knobs), knobs), knobs)
    url = await server.start()
    try:
        async with (
            MetalApiClient(MetalApiConfig(url, hmac="secret")) as api,
            httpx.AsyncClient(base_url=url) as raw,
        ):
            assert len(await api.list_machines()) == 4
            stale = hmac_headers("secret", "GET", now=datetime.now(UTC) - timedelta(seconds=20))
            answer = await raw.get("/v1/machine", headers=stale)
            assert answer.status_code == 401
            assert "too old" in answer.json()["message"]
            async with MetalApiClient(MetalApiConfig(url, hmac="nope")) as wrong:
                with pytest.raises(MetalApiUnauthorized, match="Wrong HMAC"):
                    await wrong.list_machines()
            fault = {"route": "machine-list", "status": 503, "count": 2, "retry_after": 3}
            assert (await raw.post("/_standin/faults", json=fault)).status_code == 200
            for _ in range(2):
                with pytest.raises(MetalApiUnavailable) as caught:
                    await api.list_machines()
                assert caught.value.delay == 3.0
            assert len(await api.list_machines()) == 4
            bad = await raw.post("/_standin/faults", json={"route": "nope"})
            assert bad.status_code == 422
            garbage = await raw.post(
                "/v1/machine/find", content=b"{", headers=hmac_headers("secret", "POST")
            )
            assert garbage.json()["statuscode"] == 422
            counts = (await raw.get("/_standin/requests")).json()
            assert counts == {"machine-list": 6, "machine-find": 1}
            state = (await raw.get("/_standin/state")).json()
            assert len(state["machines"]["waiting"]) == 4
            assert {n["id"] for n in state["networks"]} == {
                INTERNET,
                "tenant-super-network-vagrant",
            }
    finally:
        await server.stop()


# --- node registrar --------------------------------------------------------------------------


class FakeKube:
    """Records Node writes; fails the first ``outage`` calls as an unreachable API server."""

    def __init__(self, outage: int = 0) -> None:
        self.outage = outage
        self.nodes: dict[str, Json] = {}

    def _maybe_down(self) -> None:
        if self.outage > 0:
            self.outage -= 1
            raise KubeUnavailable("connection refused")

    async def create(self, kind: Any, obj: Json) -> Json:
        self._maybe_down()
        name = obj["metadata"]["name"]
        if name in self.nodes:
            raise KubeConflict("exists")
        self.nodes[name] = obj
        return obj

    async def patch_merge(self, kind: Any, ns: Any, name: str, patch: Json, **kw: Any) -> Json:
        self._maybe_down()
        assert kw == {"subresource": "status"}
        self.nodes[name]["status"] = patch["status"]
        return self.nodes[name]

    async def delete(self, kind: Any, ns: Any, name: str) -> Json:
        self._maybe_down()
        if self.nodes.pop(name, None) is None:
            raise KubeNotFound(name)
        return {}


async def test_registrar_registers_retries_and_deletes() -> None:
    kube = FakeKube(outage=2)
    registrar = NodeRegistrar(kube, first_backoff=0.01)  # type: ignore[arg-type]
    w = world()
    machine = machines.allocate(w, request(network(w)))
    stop = asyncio.Event()
    task = asyncio.create_task(registrar.run(stop))
    registrar.phoned_home(machine)
    await _until(lambda: "status" in kube.nodes.get("m1", {}))
    info = kube.nodes["m1"]["status"]["nodeInfo"]
    assert info["systemUUID"] == machine.id
    assert kube.nodes["m1"]["spec"] == {}
    assert kube.nodes["m1"]["status"]["addresses"][0] == {
        "type": "InternalIP",
        "address": "10.0.0.1",
    }
    registrar.freed("someone-else", "m1")  # another machine's free leaves this Node alone
    await asyncio.sleep(0.05)
    assert "m1" in kube.nodes
    registrar.freed(machine.id, "m1")
    await _until(lambda: "m1" not in kube.nodes and not registrar.pending())
    stop.set()
    await asyncio.wait_for(task, 2)
