"""The stand-in's entities and the small rules every module shares.

Plain data plus Tumblebug v0.7.0's refusal (``TbError``: a status and ``{"message"}``), its
name rule (``common.CheckString``), Go's case-insensitive reading of request bodies, the
loopback address pool and the VM fault list. The MCIS, VM and MCIR rules are in ``world``;
their JSON in ``render``.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from standins.tumblebug.seed import Connection

Json = dict[str, Any]

#: ``common.CheckString``: what Tumblebug accepts as a namespace, MCIS, VM or subgroup id
NAME_RULE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
NAME_MESSAGE = (
    "The first character of name must be a lowercase letter, and all following characters "
    "must be a dash, lowercase letter, or digit, except the last character, which cannot be "
    "a dash."
)
RUNNING, FAILED, TERMINATED = "Running", "Failed", "Terminated"
FAILED_VM, NO_PUBLIC_IP, NODE = "failed", "no-public-ip", "node"


class TbError(Exception):
    """A refusal as Tumblebug answers it: an HTTP status and ``{"message": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


def check_name(name: str) -> None:
    if not NAME_RULE.fullmatch(name):
        raise TbError(500, NAME_MESSAGE)


def get(body: Json, name: str, default: Any = None) -> Any:
    """``body[name]`` matched without regard to case, as Go's ``encoding/json`` binds it."""
    if name in body:
        return body[name]
    lowered = name.lower()
    return next((v for k, v in body.items() if k.lower() == lowered), default)


def text(body: Json, name: str) -> str:
    value = get(body, name)
    return "" if value is None else str(value)


def required(body: Json, struct: str, *names: str) -> None:
    """go-playground/validator's ``required`` failure, in its own words."""
    for name in names:
        if get(body, name) in (None, "", []):
            go_name = name[0].upper() + name[1:]
            raise TbError(
                500,
                f"Key: '{struct}.{go_name}' Error:Field validation for '{go_name}' failed on "
                "the 'required' tag",
            )


@dataclass
class Vm:
    name: str
    subgroup: str
    connection: Connection
    request: Json
    created: str
    csp_id: str
    status: str = "Creating"
    system_message: str = ""
    public_ip: str = ""
    private_ip: str = ""
    #: the pool address this VM's sshd holds; None once terminated (the address is free)
    address: str | None = None


@dataclass
class Mcis:
    name: str
    namespace: str
    request: Json
    vms: dict[str, Vm] = field(default_factory=dict)
    subgroups: dict[str, list[str]] = field(default_factory=dict)
    nlbs: dict[str, Json] = field(default_factory=dict)
    new_vms: list[str] = field(default_factory=list)


class AddressPool:
    """``count`` consecutive loopback addresses; the lowest free one is handed out next."""

    def __init__(self, start: str, count: int) -> None:
        self.base = ipaddress.IPv4Address(start)
        self.count = count
        self.used: set[int] = set()

    def take(self) -> str:
        for offset in range(self.count):
            if offset not in self.used:
                self.used.add(offset)
                return str(self.base + offset)
        raise TbError(500, f"stand-in: all {self.count} VM addresses from {self.base} are in use")

    def release(self, address: str) -> None:
        self.used.discard(int(ipaddress.IPv4Address(address)) - int(self.base))

    def in_use(self) -> list[str]:
        return [str(self.base + offset) for offset in sorted(self.used)]


@dataclass
class VmFault:
    kind: str
    pattern: str
    #: VMs still to hit; negative: every matching VM until the faults are cleared
    count: int = -1
    message: str = ""
    #: for ``node`` faults: the ``NodeKnobs`` fields the VM's node plays
    node: Json | None = None

    def matches(self, vm_name: str) -> bool:
        return fnmatch.fnmatchcase(vm_name, self.pattern)

    def as_json(self) -> Json:
        found: Json = {"fault": self.kind, "vm": self.pattern, "count": self.count}
        if self.node is not None:
            return found | {"node": self.node}
        return found | {"message": self.message}


class VmFaults:
    def __init__(self) -> None:
        self.armed: list[VmFault] = []

    def arm(self, fault: VmFault) -> None:
        self.armed.append(fault)

    def take(self, kind: str, vm_name: str) -> VmFault | None:
        """The first armed fault of ``kind`` matching ``vm_name``, used up by one."""
        for fault in self.armed:
            if fault.kind == kind and fault.matches(vm_name):
                if fault.count > 0:
                    fault.count -= 1
                    if fault.count == 0:
                        self.armed.remove(fault)
                return fault
        return None

    def clear(self) -> None:
        self.armed.clear()
