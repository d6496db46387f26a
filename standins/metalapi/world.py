"""The stand-in's state and its network and IP rules, free of HTTP and of time.

Entities carry metal-api's fields; ``render`` turns them into metal-api JSON. Every refusal
is a ``MetalError`` carrying metal-api's status and, where upstream has one, its message
(``service/network-service.go``, ``service/ip-service.go`` at v0.15.3; the specific-IP
answers, 409 "ip already allocated" and 422 "specific ip not contained in any of the defined
prefixes", are from later metal-api's ``allocateSpecificIP``). A lookup that finds nothing is
metal-api's ``metal.NotFound``, which ``checkError`` answers with 404; every other refusal
is 422.

The machine rules (allocation, free, the provisioning steps) live in ``machines``; they use
the same ``World``.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from standins.metalapi.ipam import Ipam, IpamError, contains
from standins.metalapi.knobs import MetalApiKnobs
from standins.metalapi.model import (
    ASN_BASE,
    EPHEMERAL,
    FIRST_VRF,
    STATIC,
    Ip,
    Json,
    Machine,
    MetalError,
    Network,
    machine_tag,
    not_found,
)

#: machine ids are stable across runs: uuid5 of the pool index in this namespace
MACHINE_IDS = uuid.UUID("6d6574616c2d4000a000737461636b21")


@dataclass
class World:
    """Everything metal-api would hold in RethinkDB and its IPAM."""

    projects: set[str]
    partitions: dict[str, int]  # partition id -> private network prefix length
    sizes: set[str]
    images: dict[str, str]  # image id -> its feature: "machine" or "firewall"
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    rng: random.Random = field(default_factory=random.Random)
    ipam: Ipam = field(default_factory=Ipam)
    networks: dict[str, Network] = field(default_factory=dict)
    ips: dict[str, Ip] = field(default_factory=dict)
    machines: dict[str, Machine] = field(default_factory=dict)
    vrfs: set[int] = field(default_factory=set)
    asns: set[int] = field(default_factory=set)

    @classmethod
    def seeded(cls, knobs: MetalApiKnobs, **options: Any) -> World:
        world = cls(
            projects=set(knobs.projects),
            partitions={knobs.partition: knobs.child_length},
            sizes={knobs.size},
            images={knobs.machine_image: "machine", knobs.firewall_image: "firewall"},
            rng=random.Random(knobs.seed),
            **options,
        )
        world.add_network(
            knobs.super_network, knobs.super_prefix, knobs.partition, private_super=True
        )
        world.add_network(knobs.external_network, knobs.external_prefix, "", nat=True)
        for index in range(knobs.pool_size):
            world.add_machine(index, knobs.partition, knobs.size)
        return world

    def add_machine(self, index: int, partition: str, size: str) -> Machine:
        """A registered machine that booted into metal-hammer and waits for an allocation."""
        machine_id = str(uuid.uuid5(MACHINE_IDS, f"machine-{index}"))
        machine = Machine(machine_id, partition, size, f"rack-{index % 4 + 1}", events=[])
        now = self.clock()
        for event in ("PXE Booting", "Preparing", "Registering", "Waiting"):
            machine.record(event, "", now)
        self.machines[machine_id] = machine
        return machine

    def add_network(self, network_id: str, cidr: str, partition: str, **flags: Any) -> Network:
        prefix = self.ipam.create(cidr)
        network = Network(network_id, network_id, "", partition, "", [prefix], **flags)
        network.destination_prefixes = ["0.0.0.0/0"] if not partition else []
        self.networks[network_id] = network
        return network

    # --- lookups ---------------------------------------------------------------------------

    def network(self, network_id: str) -> Network:
        if network_id not in self.networks:
            raise not_found("network", network_id)
        return self.networks[network_id]

    def machine(self, machine_id: str) -> Machine:
        if machine_id not in self.machines:
            raise not_found("machine", machine_id)
        return self.machines[machine_id]

    def is_firewall(self, machine: Machine) -> bool:
        """metal-api's ``IsFirewall``: allocated with an image that has the firewall feature."""
        allocation = machine.allocation
        return allocation is not None and self.images.get(allocation.image_id) == "firewall"

    def ip(self, address: str) -> Ip:
        if address not in self.ips:
            raise not_found("ip", address)
        return self.ips[address]

    def require_project(self, project_id: str) -> None:
        if project_id not in self.projects:
            raise MetalError(404, f'project with id "{project_id}" not found')

    def require_partition(self, partition_id: str) -> int:
        if partition_id not in self.partitions:
            raise not_found("partition", partition_id)
        return self.partitions[partition_id]

    def super_network(self, partition_id: str) -> Network:
        for network in self.networks.values():
            if network.private_super and network.partition_id == partition_id:
                return network
        raise MetalError(404, f"partition {partition_id} does not have a private super network")

    def used_ips(self, network: Network) -> int:
        """Addresses in use in ``network`` beyond network and broadcast (go-ipam's 2)."""
        live = [p for p in network.prefixes if p in self.ipam.prefixes]  # freed: none left
        return sum(max(self.ipam.usage(p) - 2, 0) for p in live)

    # --- networks --------------------------------------------------------------------------

    def allocate_network(self, body: Json) -> Network:
        project_id = str(body.get("projectid") or "")
        partition_id = str(body.get("partitionid") or "")
        if not project_id:
            raise MetalError(422, "projectid should not be empty")
        if not partition_id:
            raise MetalError(422, "partitionid should not be empty")
        self.require_project(project_id)
        length = self.require_partition(partition_id)
        parent = self.super_network(partition_id)
        try:
            child = self.ipam.acquire_child(parent.prefixes[0], length)
        except IpamError as exc:
            raise MetalError(422, f"error creating new prefix in ipam: {exc}") from exc
        network = Network(
            id=str(uuid.uuid4()),
            name=str(body.get("name") or ""),
            description=str(body.get("description") or ""),
            partition_id=partition_id,
            project_id=project_id,
            prefixes=[child],
            labels=_labels(body.get("labels")),
            destination_prefixes=list(body.get("destinationprefixes") or []),
            shared=bool(body.get("shared")),
            nat=bool(body.get("nat")),
            vrf=self._acquire_vrf(),
            parent_network_id=parent.id,
            created=self.clock(),
        )
        self.networks[network.id] = network
        return network

    def find_networks(self, query: Json) -> list[Network]:
        labels = _labels(query.get("labels"))
        wanted = {k: query.get(k) for k in ("id", "name", "partitionid", "projectid")}
        fields = {
            "id": "id",
            "name": "name",
            "partitionid": "partition_id",
            "projectid": "project_id",
        }
        found = []
        for network in self.networks.values():
            if any(v is not None and getattr(network, fields[k]) != v for k, v in wanted.items()):
                continue
            if any(network.labels.get(k) != v for k, v in labels.items()):
                continue
            if _differs(query, "parentnetworkid", network.parent_network_id):
                continue
            if _differs(query, "privatesuper", network.private_super):
                continue
            found.append(network)
        return found

    def free_network(self, network_id: str) -> Network:
        network = self.network(network_id)
        for prefix in network.prefixes:
            used = self.ipam.usage(prefix) - 2
            if used > 0:
                raise MetalError(
                    422,
                    f"cannot release child prefix {prefix} because IPs in the prefix are still "
                    f"in use: {used}",
                )
        for prefix in network.prefixes:
            try:
                self.ipam.release_child(prefix)
            except IpamError as exc:
                raise MetalError(422, f"error releasing child prefix in ipam: {exc}") from exc
        self.vrfs.discard(network.vrf)
        del self.networks[network_id]
        return network

    def _acquire_vrf(self) -> int:
        return _lowest_free(self.vrfs, FIRST_VRF)

    def acquire_asn(self) -> int:
        return _lowest_free(self.asns, ASN_BASE)

    # --- IPs -------------------------------------------------------------------------------

    def allocate_ip(self, body: Json, specific: str | None = None) -> Ip:
        network_id = str(body.get("networkid") or "")
        project_id = str(body.get("projectid") or "")
        if not network_id:
            raise MetalError(422, "networkid should not be empty")
        if not project_id:
            raise MetalError(422, "projectid should not be empty")
        network = self.network(network_id)
        self.require_project(project_id)
        if not network.shared and network.parent_network_id and network.project_id != project_id:
            raise MetalError(
                422,
                f'can not allocate ip for project "{project_id}" because network belongs to '
                f'"{network.project_id}" and the network is not shared',
            )
        tags = list(dict.fromkeys(_strings(body.get("tags"))))
        if body.get("machineid"):
            tags.append(machine_tag(str(body["machineid"])))
        ip = self.acquire_ip(network, project_id, specific=specific)
        ip.name = str(body.get("name") or "")
        ip.description = str(body.get("description") or "")
        ip.type = STATIC if body.get("type") == STATIC else EPHEMERAL
        ip.tags = list(dict.fromkeys(tags))
        return ip

    def acquire_ip(self, network: Network, project_id: str, *, specific: str | None = None) -> Ip:
        """A fresh address in ``network`` (or ``specific``), recorded as an ephemeral IP."""
        prefix, address = self._acquire_address(network, specific)
        ip = Ip(address, network.id, project_id, prefix, created=self.clock())
        self.ips[address] = ip
        return ip

    def _acquire_address(self, network: Network, specific: str | None) -> tuple[str, str]:
        if specific is not None:
            prefix = next((p for p in network.prefixes if contains(p, specific)), None)
            if prefix is None:
                raise MetalError(422, "specific ip not contained in any of the defined prefixes")
            try:
                return prefix, self.ipam.acquire(prefix, specific)
            except IpamError as exc:
                raise MetalError(409 if exc.conflict else 422, "ip already allocated") from exc
        errors = []
        for prefix in network.prefixes:
            try:
                return prefix, self.ipam.acquire(prefix)
            except IpamError as exc:
                errors.append(str(exc))
        raise MetalError(422, f"cannot allocate free ip in ipam: {errors}")

    def find_ips(self, query: Json) -> list[Ip]:
        tags = _strings(query.get("tags"))
        machine = query.get("machineid")
        if machine:
            tags.append(machine_tag(str(machine)))
        fields = {
            "ipaddress": "ipaddress",
            "projectid": "project_id",
            "networkid": "network_id",
            "type": "type",
            "name": "name",
            "networkprefix": "prefix",
        }
        return [
            ip
            for ip in self.ips.values()
            if all(query.get(k) is None or getattr(ip, a) == query[k] for k, a in fields.items())
            and all(t in ip.tags for t in tags)
        ]

    def free_ip(self, address: str) -> Ip:
        ip = self.ip(address)
        if ip.machine_ids():
            raise MetalError(422, "ip with machine scope can not be deleted")
        self.release_ip(ip)
        return ip

    def release_ip(self, ip: Ip) -> None:
        self.ips.pop(ip.ipaddress, None)
        self.ipam.release(ip.prefix, ip.ipaddress)


def _lowest_free(taken: set[int], first: int) -> int:
    value = first
    while value in taken:
        value += 1
    taken.add(value)
    return value


def _labels(value: Any) -> dict[str, str]:
    if not value:
        return {}
    if not isinstance(value, dict):
        raise MetalError(422, "labels must be a map of strings")
    return {str(k): str(v) for k, v in value.items()}


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MetalError(422, f"expected a list of strings, got {value!r}")
    return [str(item) for item in value]


def _differs(query: Json, key: str, actual: Any) -> bool:
    return query.get(key) is not None and query[key] != actual
