"""Entities as metal-api JSON (``service/v1/{network,ip,machine}.go``).

Field names and shapes are metal-api's response types. ``omitempty`` fields (an allocation's
``description`` and ``user_data``) are left out when empty, as Go's encoder does; the event
log shows the newest five events, like ``NewMachineRecentProvisioningEvents``. Times are
RFC 3339 in UTC with a ``Z``, as Go writes ``time.Time``.
"""

from __future__ import annotations

from datetime import datetime

from standins.metalapi.model import Ip, Json, Machine, MachineNetwork, Network
from standins.metalapi.world import World

RECENT_EVENTS = 5


def when(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def network(world: World, item: Network) -> Json:
    used = world.used_ips(item)
    prefixes = [world.ipam.prefixes[p] for p in item.prefixes if p in world.ipam.prefixes]
    size = sum(p.network.num_addresses - 2 for p in prefixes)
    return {
        "id": item.id,
        "name": item.name,
        "description": item.description,
        "partitionid": item.partition_id,
        "projectid": item.project_id,
        "labels": dict(item.labels),
        "shared": item.shared,
        "prefixes": list(item.prefixes),
        "destinationprefixes": list(item.destination_prefixes),
        "nat": item.nat,
        "privatesuper": item.private_super,
        "underlay": item.underlay,
        "vrf": item.vrf,
        "parentnetworkid": item.parent_network_id,
        "usage": {
            "available_ips": max(size, 0),
            "used_ips": used,
            "available_prefixes": 0,
            "used_prefixes": len(item.prefixes),
        },
        "created": when(item.created),
        "changed": when(item.created),
    }


def ip(item: Ip) -> Json:
    return {
        "ipaddress": item.ipaddress,
        "allocationuuid": item.allocation_uuid,
        "name": item.name,
        "description": item.description,
        "networkid": item.network_id,
        "projectid": item.project_id,
        "type": item.type,
        "tags": list(item.tags),
        "created": when(item.created),
        "changed": when(item.created),
    }


def machine(world: World, item: Machine) -> Json:
    events = item.events[:RECENT_EVENTS]
    return {
        "id": item.id,
        "name": item.name,
        "description": item.description,
        "partition": {"id": item.partition_id, "name": item.partition_id, "description": ""},
        "size": {"id": item.size_id, "name": item.size_id, "description": "", "constraints": []},
        "rackid": item.rack_id,
        "hardware": {"memory": 34359738368, "cpu_cores": 4, "disks": [], "nics": []},
        "bios": {"version": "2.0", "vendor": "capibus", "date": "01/01/2024"},
        "allocation": _allocation(world, item),
        "state": {"value": "", "description": ""},
        "ledstate": {"value": "", "description": ""},
        "liveliness": item.liveliness,
        "events": {
            "log": [{"event": e.event, "message": e.message, "time": when(e.time)} for e in events],
            "last_event_time": when(events[0].time) if events else None,
            "incomplete_provisioning_cycles": "0",
        },
        "tags": list(item.tags),
        "created": when(item.created),
        "changed": when(item.changed),
    }


def _allocation(world: World, item: Machine) -> Json | None:
    allocation = item.allocation
    if allocation is None:
        return None
    feature = world.images.get(allocation.image_id, "machine")
    body: Json = {
        "creator": allocation.creator,
        "created": when(allocation.created),
        "name": allocation.name,
        "project": allocation.project,
        "image": {"id": allocation.image_id, "name": allocation.image_id, "features": [feature]},
        "filesystemlayout": None,
        "networks": [_machine_network(n) for n in allocation.networks],
        "hostname": allocation.hostname,
        "ssh_pub_keys": list(allocation.ssh_pub_keys),
        "succeeded": allocation.succeeded,
        "reinstall": allocation.reinstall,
        "boot_info": None,
    }
    if allocation.description:
        body["description"] = allocation.description
    if allocation.user_data:
        body["user_data"] = allocation.user_data
    return body


def _machine_network(item: MachineNetwork) -> Json:
    return {
        "networkid": item.network_id,
        "prefixes": list(item.prefixes),
        "ips": list(item.ips),
        "destinationprefixes": list(item.destination_prefixes),
        "networktype": item.network_type,
        "vrf": item.vrf,
        "asn": item.asn,
        "nat": item.nat,
        "private": item.private,
        "underlay": item.underlay,
    }


def summary(world: World) -> Json:
    """``GET /_standin/state``: what tests and benchmarks check, in one read."""
    machines = sorted(world.machines.values(), key=lambda m: m.id)
    allocated = [m for m in machines if m.allocation is not None]
    return {
        "machines": {
            "waiting": [m.id for m in machines if m.waiting],
            "rebooting": [m.id for m in machines if m.reboot is not None],
            "allocated": [
                {
                    "id": m.id,
                    "hostname": m.allocation.hostname,
                    "project": m.allocation.project,
                    "firewall": world.is_firewall(m),
                    "last_event": m.last_event,
                    "succeeded": m.allocation.succeeded,
                }
                for m in allocated
                if m.allocation is not None
            ],
        },
        "ips": [
            {
                "ipaddress": i.ipaddress,
                "networkid": i.network_id,
                "projectid": i.project_id,
                "type": i.type,
                "tags": list(i.tags),
            }
            for i in world.ips.values()
        ],
        "networks": [
            {
                "id": n.id,
                "prefixes": list(n.prefixes),
                "projectid": n.project_id,
                "partitionid": n.partition_id,
                "parentnetworkid": n.parent_network_id,
                "labels": dict(n.labels),
                "used_ips": world.used_ips(n),
            }
            for n in world.networks.values()
        ],
    }
