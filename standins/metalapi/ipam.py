"""The stand-in's IPAM: prefixes, child prefixes and addresses, with the ``ipaddress`` module.

It keeps the accounting of metal-stack's go-ipam where metal-api can observe it:

- A prefix counts its network and broadcast addresses as acquired from the start, so
  ``used`` is 2 for an empty IPv4 prefix; metal-api refuses to release a child prefix whose
  usage is above 2 (``service/network-service.go`` ``freeNetwork``).
- A random address is the lowest free one; a specific address that is acquired already
  (network and broadcast included) is a conflict.
- A child prefix is the first free, aligned block of the asked length inside its parent that
  overlaps no other child; releasing one of a prefix that is not a child is refused.
- A prefix with child prefixes hands out no addresses itself, and the reverse.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class IpamError(Exception):
    """An IPAM refusal; ``conflict`` marks an address that is taken."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


@dataclass
class Prefix:
    network: Network
    parent: str | None = None
    acquired: set[Address] = field(default_factory=set)
    children: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.network.version == 4 and self.network.num_addresses > 2:
            self.acquired |= {self.network.network_address, self.network.broadcast_address}

    @property
    def cidr(self) -> str:
        return str(self.network)


@dataclass
class Ipam:
    prefixes: dict[str, Prefix] = field(default_factory=dict)

    def create(self, cidr: str) -> str:
        network = ipaddress.ip_network(cidr)
        self.prefixes[str(network)] = Prefix(network)
        return str(network)

    def usage(self, cidr: str) -> int:
        """Acquired addresses of ``cidr``, network and broadcast included (go-ipam's count)."""
        return len(self._prefix(cidr).acquired)

    def acquire_child(self, parent_cidr: str, length: int) -> str:
        parent = self._prefix(parent_cidr)
        if parent.acquired - _reserved(parent):
            raise IpamError(f"prefix {parent.cidr} has ips, acquire child prefix not possible")
        taken = [self.prefixes[child].network for child in parent.children]
        if length < parent.network.prefixlen or length > parent.network.max_prefixlen:
            raise IpamError(f"given length:{length} must be greater than prefix length")
        for candidate in parent.network.subnets(new_prefix=length):
            if not any(candidate.overlaps(other) for other in taken):
                child = Prefix(candidate, parent=parent.cidr)
                self.prefixes[child.cidr] = child
                parent.children.add(child.cidr)
                return child.cidr
        raise IpamError(f"no prefix found in {parent.cidr} with length:{length}")

    def release_child(self, cidr: str) -> None:
        child = self._prefix(cidr)
        if child.parent is None:
            raise IpamError(f"prefix {cidr} is no child prefix")
        if child.acquired - _reserved(child):
            raise IpamError(f"prefix {cidr} has ips, deletion not possible")
        self.prefixes[child.parent].children.discard(cidr)
        del self.prefixes[cidr]

    def acquire(self, cidr: str, specific: str | None = None) -> str:
        prefix = self._prefix(cidr)
        if prefix.children:
            raise IpamError(f"prefix {cidr} has childprefixes, acquire ip not possible")
        if specific is not None:
            return self._acquire_specific(prefix, ipaddress.ip_address(specific))
        for address in prefix.network:  # lowest first
            if address not in prefix.acquired:
                prefix.acquired.add(address)
                return str(address)
        raise IpamError(f"no more ips in prefix: {cidr} left")

    def release(self, cidr: str, address: str) -> None:
        prefix = self.prefixes.get(cidr)
        if prefix is not None:
            prefix.acquired.discard(ipaddress.ip_address(address))

    def _acquire_specific(self, prefix: Prefix, address: Address) -> str:
        if address not in prefix.network:
            raise IpamError(f"given ip:{address} is not in {prefix.cidr}")
        if address in prefix.acquired:
            message = f"AlreadyAllocatedError: given ip:{address} is already allocated"
            raise IpamError(message, conflict=True)
        prefix.acquired.add(address)
        return str(address)

    def _prefix(self, cidr: str) -> Prefix:
        try:
            return self.prefixes[str(ipaddress.ip_network(cidr))]
        except (KeyError, ValueError) as exc:
            raise IpamError(f"prefix {cidr} not found") from exc


def contains(cidr: str, address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(cidr)
    except ValueError:
        return False


def _reserved(prefix: Prefix) -> set[Address]:
    network = prefix.network
    return {network.network_address, network.broadcast_address}
