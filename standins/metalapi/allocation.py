"""What metal-api checks before it allocates a machine or firewall, in metal-api's order.

From ``service/machine-service.go`` (v0.15.3): ``allocateMachine`` (the handler: the image
first), ``validateAllocationSpec``, the project lookup, ``findMachineCandidate`` and
``gatherNetworksFromSpec``; the firewall handler differs only in the image feature it wants
(``service/firewall-service.go``). Messages are metal-api's. Nothing here changes the world:
``machines.allocate`` acts on the ``Plan`` once every check has passed.

One difference on purpose: a real firewall also gets the partition's underlay network
(``gatherUnderlayNetwork``); the stand-in seeds no underlay, so firewalls have only the
networks they ask for.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from standins.metalapi.model import Ip, Json, Machine, MetalError, Network, not_found
from standins.metalapi.world import World

#: the key types ``golang.org/x/crypto/ssh`` parses in an authorized_keys line
KEY_TYPES = {
    "ssh-rsa",
    "ssh-dss",
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
}

PRIMARY_UNSHARED = "privateprimaryunshared"
PRIMARY_SHARED = "privateprimaryshared"
SECONDARY_SHARED = "privatesecondaryshared"
EXTERNAL = "external"


@dataclass
class Spec:
    """The request, read: metal-api's ``machineAllocationSpec``."""

    project: str
    partition: str
    size: str
    image_id: str
    uuid: str = ""
    name: str = ""
    description: str = ""
    hostname: str = "metal"
    ssh_pub_keys: list[str] = field(default_factory=list)
    user_data: str = ""
    tags: list[str] = field(default_factory=list)
    networks: list[tuple[str, bool]] = field(default_factory=list)  # (network id, auto)
    ips: list[str] = field(default_factory=list)
    firewall: bool = False


@dataclass
class PlannedNetwork:
    network: Network
    auto: bool
    network_type: str = EXTERNAL
    ips: list[Ip] = field(default_factory=list)

    @property
    def private(self) -> bool:
        return self.network_type != EXTERNAL


@dataclass
class Plan:
    spec: Spec
    machine: Machine
    networks: list[PlannedNetwork]


def plan(world: World, body: Json, *, firewall: bool) -> Plan:
    spec = read_spec(body, firewall=firewall)
    check_image(world, spec)
    validate(spec)
    world.require_project(spec.project)
    machine = candidate(world, spec)
    spec.partition, spec.size = machine.partition_id, machine.size_id
    return Plan(spec, machine, gather_networks(world, spec))


def read_spec(body: Json, *, firewall: bool) -> Spec:
    networks = []
    for entry in _list(body, "networks"):
        if not isinstance(entry, dict):
            raise MetalError(422, "networks must be a list of {networkid, autoacquire}")
        auto = entry.get("autoacquire")
        networks.append((str(entry.get("networkid") or ""), auto is None or bool(auto)))
    return Spec(
        project=_text(body, "projectid"),
        partition=_text(body, "partitionid"),
        size=_text(body, "sizeid"),
        image_id=_text(body, "imageid"),
        uuid=_text(body, "uuid"),
        name=_text(body, "name"),
        description=_text(body, "description"),
        hostname=_text(body, "hostname") or "metal",
        ssh_pub_keys=[str(k) for k in _list(body, "ssh_pub_keys")],
        user_data=_text(body, "user_data"),
        tags=list(dict.fromkeys(str(t) for t in _list(body, "tags"))),
        networks=networks,
        ips=[str(ip) for ip in _list(body, "ips")],
        firewall=firewall,
    )


def check_image(world: World, spec: Spec) -> None:
    feature = world.images.get(spec.image_id)
    if feature is None:
        raise MetalError(404, f"no image for id:{spec.image_id} found")
    wanted = "firewall" if spec.firewall else "machine"
    if feature != wanted:
        raise MetalError(422, f"given image is not usable for a {wanted}, features: {feature}")


def validate(spec: Spec) -> None:
    """metal-api's ``validateAllocationSpec``."""
    if not spec.project:
        raise MetalError(422, "project id must be specified")
    if not spec.uuid and not spec.partition:
        raise MetalError(422, "when no machine id is given, a partition id must be specified")
    if not spec.uuid and not spec.size:
        raise MetalError(422, "when no machine id is given, a size id must be specified")
    for ip in spec.ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError as exc:
            raise MetalError(422, f'"{ip}" is not a valid IP address') from exc
    for key in spec.ssh_pub_keys:
        if not authorized_key(key):
            raise MetalError(422, f"invalid public SSH key: {key}")
    autos = sum(1 for _, auto in spec.networks if auto)
    if spec.firewall and not spec.ips and not autos:
        raise MetalError(
            422, "when no ip is given at least one auto acquire network must be specified"
        )
    if len(spec.networks) - autos > len(spec.ips):
        raise MetalError(422, "missing ip(s) for network(s) without automatic ip allocation")


def authorized_key(line: str) -> bool:
    """Whether ``line`` parses as an authorized_keys line: options, type, key blob, comment.

    As ``ssh.ParseAuthorizedKey`` checks it: a known key type followed by base64 whose
    decoded blob starts with the same type as a length-prefixed string.
    """
    tokens = line.split()
    for index, token in enumerate(tokens[:-1]):
        if token not in KEY_TYPES:
            continue
        try:
            blob = base64.b64decode(tokens[index + 1], validate=True)
        except (binascii.Error, ValueError):
            return False
        size = int.from_bytes(blob[:4], "big")
        return blob[4 : 4 + size] == token.encode()
    return False


def candidate(world: World, spec: Spec) -> Machine:
    """metal-api's ``findMachineCandidate``: the pinned machine, or a random waiting one."""
    if spec.uuid:
        return _pinned(world, spec)
    if spec.size not in world.sizes:
        raise MetalError(404, f'size cannot be found: no size with id "{spec.size}" found')
    if spec.partition not in world.partitions:
        raise MetalError(
            404, f'partition cannot be found: no partition with id "{spec.partition}" found'
        )
    waiting = [
        m
        for m in world.machines.values()
        if m.waiting and m.partition_id == spec.partition and m.size_id == spec.size
    ]
    if not waiting:
        raise MetalError(422, "no machine available")
    return world.rng.choice(sorted(waiting, key=lambda m: m.id))


def _pinned(world: World, spec: Spec) -> Machine:
    machine = world.machines.get(spec.uuid)
    if machine is None:
        raise MetalError(404, f"machine cannot be found: {not_found('machine', spec.uuid).message}")
    if machine.allocation is not None:
        raise MetalError(422, "machine is already allocated")
    if spec.partition and machine.partition_id != spec.partition:
        raise MetalError(
            422, f'machine "{machine.id}" is not in the requested partition: {spec.partition}'
        )
    if spec.size and machine.size_id != spec.size:
        raise MetalError(
            422, f'machine "{machine.id}" does not have the requested size: {spec.size}'
        )
    return machine


def gather_networks(world: World, spec: Spec) -> list[PlannedNetwork]:
    """metal-api's ``gatherNetworksFromSpec``, in the request's order."""
    supers = {n.id: n for n in world.networks.values() if n.private_super}
    own_super = next((n for n in supers.values() if n.partition_id == spec.partition), None)
    if own_super is None:
        raise MetalError(422, f"partition {spec.partition} does not have a private super network")
    planned = [_classify(world, network_id, auto, supers) for network_id, auto in spec.networks]
    if len({p.network.id for p in planned}) != len(planned):
        raise MetalError(422, "given network ids are not unique")
    private = [p for p in planned if p.private]
    primary = _primary(private)
    if not spec.firewall and len(private) > 1:
        raise MetalError(
            422, "machines are not allowed to be placed into multiple private networks"
        )
    if primary.network.project_id != spec.project:
        raise MetalError(
            422, "the given private network does not belong to the project, which is not allowed"
        )
    _attach_ips(world, spec, planned)
    for p in private:
        if p.network.partition_id != own_super.partition_id:
            raise MetalError(
                422,
                f'private network "{p.network.id}" must be located in the partition where the '
                "machine is going to be placed",
            )
        if not p.auto and not p.ips:
            raise MetalError(
                422,
                f'the private network "{p.network.id}" has no auto ip acquisition, but no '
                "suitable IPs were provided, which would lead into a machine having no ip address",
            )
    return planned


def _classify(
    world: World, network_id: str, auto: bool, supers: dict[str, Network]
) -> PlannedNetwork:
    network = world.network(network_id)
    if network.underlay:
        raise MetalError(
            422, f"underlay networks are not allowed to be set explicitly: {network.id}"
        )
    if network.private_super:
        raise MetalError(
            422, f"private super networks are not allowed to be set explicitly: {network.id}"
        )
    planned = PlannedNetwork(network, auto)
    if network.parent_network_id in supers:
        planned.network_type = SECONDARY_SHARED if network.shared else PRIMARY_UNSHARED
    return planned


def _primary(private: list[PlannedNetwork]) -> PlannedNetwork:
    unshared = [p for p in private if p.network_type == PRIMARY_UNSHARED]
    if len(unshared) > 1:
        raise MetalError(
            422,
            "multiple private networks are specified but there must be only one primary "
            "private network that must not be shared",
        )
    if unshared:
        return unshared[0]
    if not private:
        raise MetalError(422, "no private network given")
    if len(private) > 1:
        raise MetalError(
            422,
            "machines and firewalls are not allowed to be placed into multiple private, shared "
            "networks (firewall needs an unshared private network and machines may only reside "
            "in one private network)",
        )
    private[0].network_type = PRIMARY_SHARED
    return private[0]


def _attach_ips(world: World, spec: Spec, planned: list[PlannedNetwork]) -> None:
    by_network = {p.network.id: p for p in planned}
    for address in spec.ips:
        ip = world.ip(address)
        if ip.project_id != spec.project:
            raise MetalError(
                422,
                f'given ip "{ip.ipaddress}" with project id "{ip.project_id}" does not belong '
                f"to the project of this allocation: {spec.project}",
            )
        target = by_network.get(ip.network_id)
        if target is None:
            raise MetalError(
                422,
                f'given ip "{ip.ipaddress}" is not in any of the given networks, which is required',
            )
        target.auto = False
        target.ips.append(ip)


def _text(body: Json, key: str) -> str:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise MetalError(422, f"{key} must be a string")
    return value or ""


def _list(body: Json, key: str) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise MetalError(422, f"{key} must be a list")
    return value
