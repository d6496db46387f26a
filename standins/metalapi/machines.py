"""Machine rules: allocate, free, the provisioning steps, find.

- **Allocate** (``allocation.plan`` checks first): every auto network gets a fresh
  ephemeral IP named after the allocation, described "autoassigned" and tagged
  ``machine.metal-stack.io/id=<machine id>`` (metal-api's ``makeMachineNetwork``); IPs given
  in ``ips`` are tagged the same way. All networks share one ASN. The machine's ``tags`` are
  the request's tags (real metal-api adds its rack and ASN labels; the stand-in does not).
  IPs acquired before a later one fails are released again, like metal-api's rollback.
- **Free** (``async-actor.go`` ``freeMachine``, ``releaseMachineNetworks``,
  ``disassociateIP``): each IP loses this machine's tag; an ephemeral IP no other machine
  holds is deleted and its address released, including an ephemeral IP that came in through
  ``ips`` (the control-plane IP of cluster-api-provider-metalstack, which leaks this way);
  static IPs stay. The allocation and tags are cleared and ``Planned Reboot`` recorded; the
  answer already shows that event (metal-api records it just after answering).
- **Provisioning**: ``Installing``, ``Booting New Kernel``, ``Phoned Home``, each recorded
  by ``step`` when the lifecycle's timer fires; a step for an allocation that is gone is
  dropped. ``rebooted`` brings a freed machine back to ``Waiting``.
"""

from __future__ import annotations

from collections.abc import Iterable

from standins.metalapi.allocation import Plan, PlannedNetwork, plan
from standins.metalapi.model import (
    Allocation,
    Ip,
    Json,
    Machine,
    MachineNetwork,
    MetalError,
)
from standins.metalapi.world import World

PROVISIONING = ("Installing", "Booting New Kernel", "Phoned Home")
PHONED_HOME = "Phoned Home"
WAITING = "Waiting"


def allocate(world: World, body: Json, *, firewall: bool = False) -> Machine:
    checked = plan(world, body, firewall=firewall)
    spec, machine = checked.spec, checked.machine
    allocation = Allocation(
        created=world.clock(),
        name=spec.name,
        description=spec.description,
        hostname=spec.hostname,
        project=spec.project,
        image_id=spec.image_id,
        ssh_pub_keys=spec.ssh_pub_keys,
        user_data=spec.user_data,
    )
    allocation.networks = _make_networks(world, checked)
    machine.allocation = allocation
    machine.tags = list(spec.tags)
    machine.reboot = None
    machine.changed = allocation.created
    return machine


def _make_networks(world: World, checked: Plan) -> list[MachineNetwork]:
    spec, machine_id = checked.spec, checked.machine.id
    acquired: list[Ip] = []
    try:
        for planned in checked.networks:
            if planned.auto:
                ip = world.acquire_ip(planned.network, spec.project)
                ip.name, ip.description = spec.name, "autoassigned"
                acquired.append(ip)
                planned.ips.append(ip)
    except MetalError as exc:
        for ip in acquired:
            world.release_ip(ip)
        raise MetalError(422, f"unable to allocate an ip in network: {exc.message}") from exc
    asn = world.acquire_asn()
    for planned in checked.networks:
        for ip in planned.ips:
            ip.bind(machine_id)
    return [_machine_network(planned, asn) for planned in checked.networks]


def _machine_network(planned: PlannedNetwork, asn: int) -> MachineNetwork:
    network = planned.network
    return MachineNetwork(
        network_id=network.id,
        prefixes=list(network.prefixes),
        ips=[ip.ipaddress for ip in planned.ips],
        destination_prefixes=list(network.destination_prefixes),
        network_type=planned.network_type,
        vrf=network.vrf,
        nat=network.nat,
        private=planned.private,
        asn=asn,
    )


def free(world: World, machine_id: str, reboot_id: str) -> Machine:
    """Free ``machine_id``; ``reboot_id`` names the reboot that ``rebooted`` later ends."""
    machine = world.machine(machine_id)
    if machine.allocation is not None:
        for network in machine.allocation.networks:
            for address in network.ips:
                if address in world.ips:
                    _disassociate(world, world.ips[address], machine_id)
            world.asns.discard(network.asn)
    for ip in [ip for ip in world.ips.values() if machine_id in ip.machine_ids()]:
        _disassociate(world, ip, machine_id)  # dangling: tagged, but not in the allocation
    now = world.clock()
    machine.allocation = None
    machine.tags = []
    machine.reboot = reboot_id
    machine.record("Planned Reboot", "freeMachine", now)
    return machine


def _disassociate(world: World, ip: Ip, machine_id: str) -> None:
    if machine_id not in ip.machine_ids():
        return
    ip.unbind(machine_id)
    if ip.type == "static" or ip.machine_ids():
        return
    world.release_ip(ip)


def step(
    world: World, machine_id: str, allocation_id: str, event: str, *, succeeded: bool
) -> Machine | None:
    """Record provisioning ``event`` if ``allocation_id`` is still the machine's allocation."""
    machine = world.machines.get(machine_id)
    if machine is None or machine.allocation is None or machine.allocation.id != allocation_id:
        return None
    machine.record(event, "", world.clock())
    machine.liveliness = "Alive"
    if event == PHONED_HOME and succeeded:
        machine.allocation.succeeded = True
    return machine


def rebooted(world: World, machine_id: str, reboot_id: str) -> Machine | None:
    """The freed machine is back in metal-hammer, waiting, unless something happened since."""
    machine = world.machines.get(machine_id)
    if machine is None or machine.reboot != reboot_id or machine.allocation is not None:
        return None
    machine.reboot = None
    machine.record(WAITING, "", world.clock())
    return machine


def find(world: World, query: Json, *, firewalls: bool = False) -> list[Machine]:
    """metal-api's ``MachineSearchQuery`` over the fields the stand-in keeps."""
    found = [m for m in world.machines.values() if _matches(m, query)]
    if firewalls:
        found = [m for m in found if world.is_firewall(m)]
    return found


def _matches(machine: Machine, query: Json) -> bool:
    plain = {
        "id": machine.id,
        "name": machine.name,
        "partition_id": machine.partition_id,
        "sizeid": machine.size_id,
        "rackid": machine.rack_id,
    }
    if any(query.get(k) is not None and query[k] != v for k, v in plain.items()):
        return False
    if not _all_in(query.get("tags"), machine.tags):
        return False
    allocation = machine.allocation
    of_allocation = {
        "allocation_name": allocation.name if allocation else None,
        "allocation_project": allocation.project if allocation else None,
        "allocation_image_id": allocation.image_id if allocation else None,
        "allocation_hostname": allocation.hostname if allocation else None,
        "allocation_succeeded": allocation.succeeded if allocation else None,
    }
    if any(query.get(k) is not None and query[k] != v for k, v in of_allocation.items()):
        return False
    networks = allocation.networks if allocation else []
    ids = [n.network_id for n in networks]
    ips = [ip for n in networks for ip in n.ips]
    return _all_in(query.get("network_ids"), ids) and _all_in(query.get("network_ips"), ips)


def _all_in(wanted: object, have: Iterable[str]) -> bool:
    if not wanted:
        return True
    if not isinstance(wanted, list):
        raise MetalError(422, f"expected a list of strings, got {wanted!r}")
    present = set(have)
    return all(str(item) in present for item in wanted)
