"""The stand-in's entities, with metal-api's fields (``cmd/metal-api/internal/metal``).

Plain data: the rules that change them are in ``world`` (networks, IPs) and ``machines``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Json = dict[str, Any]

#: the IP tag that binds an IP to a machine (metal-lib ``tag.MachineID``, metal-api ``IpTag``)
MACHINE_TAG = "machine.metal-stack.io/id"
EPHEMERAL, STATIC = "ephemeral", "static"
FIRST_VRF = 30
ASN_BASE = 4210000000


class MetalError(Exception):
    """A refusal as metal-api answers it: status and ``message``; ``retry_after`` only for
    injected faults."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


def not_found(kind: str, key: str) -> MetalError:
    return MetalError(404, f'no {kind} with id "{key}" found')


def machine_tag(machine_id: str) -> str:
    return f"{MACHINE_TAG}={machine_id}"


@dataclass
class Network:
    id: str
    name: str
    description: str
    partition_id: str
    project_id: str
    prefixes: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    destination_prefixes: list[str] = field(default_factory=list)
    shared: bool = False
    nat: bool = False
    private_super: bool = False
    underlay: bool = False
    vrf: int = 0
    parent_network_id: str | None = None
    created: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class Ip:
    ipaddress: str
    network_id: str
    project_id: str
    prefix: str
    name: str = ""
    description: str = ""
    type: str = EPHEMERAL
    tags: list[str] = field(default_factory=list)
    allocation_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: datetime = field(default_factory=lambda: datetime.now(UTC))

    def machine_ids(self) -> list[str]:
        head = MACHINE_TAG + "="
        return [t[len(head) :] for t in self.tags if t.startswith(head)]

    def bind(self, machine_id: str) -> None:
        """metal-api's ``AddMachineId``: the IP now belongs to this machine alone."""
        self.tags = [t for t in self.tags if not t.startswith(MACHINE_TAG)]
        self.tags.append(machine_tag(machine_id))

    def unbind(self, machine_id: str) -> None:
        self.tags = [t for t in self.tags if t != machine_tag(machine_id)]


@dataclass
class Event:
    event: str
    message: str
    time: datetime


@dataclass
class MachineNetwork:
    network_id: str
    prefixes: list[str]
    ips: list[str]
    destination_prefixes: list[str]
    network_type: str
    vrf: int
    nat: bool
    private: bool
    asn: int = 0
    underlay: bool = False


@dataclass
class Allocation:
    created: datetime
    name: str
    description: str
    hostname: str
    project: str
    image_id: str
    ssh_pub_keys: list[str]
    user_data: str
    networks: list[MachineNetwork] = field(default_factory=list)
    succeeded: bool = False
    reinstall: bool = False
    creator: str = "metal-admin@capibus.test"
    #: tells this allocation from a later one of the same machine, for delayed steps
    id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Machine:
    id: str
    partition_id: str
    size_id: str
    rack_id: str
    events: list[Event]  # newest first, as metal-api's provisioning event container
    name: str = "4-core/34 GB"
    description: str = "a machine with 4 core(s) and 34 GB of RAM"
    liveliness: str = "Alive"
    allocation: Allocation | None = None
    tags: list[str] = field(default_factory=list)
    #: tells this reboot from a later one, for the delayed return to Waiting
    reboot: str | None = None
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    changed: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def last_event(self) -> str:
        return self.events[0].event if self.events else ""

    @property
    def waiting(self) -> bool:
        """Allocatable: metal-api's ``FindWaitingMachine`` (unallocated, waiting, alive)."""
        return (
            self.allocation is None and self.last_event == "Waiting" and self.liveliness == "Alive"
        )

    def record(self, event: str, message: str, when: datetime) -> None:
        self.events.insert(0, Event(event, message, when))
        self.changed = when
