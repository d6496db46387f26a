"""What the metal-stack provider made, read where it lives: the metal-api stand-in's state
(``GET /_standin/state``, which needs no HMAC), the workload API server's Nodes, and the
MetalStackCluster in the management API server. Everything here is a read; the waits on
metal-api poll it, since metal-api pushes nothing (the provider polls it for the firewall too).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from demo.feed import DemoTimeout
from demo.metalsystem import POOL_SIZE, SEEDED_NETWORKS
from demo.scene import Scene
from demo.style import BOLD, GREEN, RED, say
from shared.kube import KubeClient
from shared.resources import METALSTACK_CLUSTER, NODE

Json = dict[str, Any]

POOL_TIMEOUT = 30.0
POLL_INTERVAL = 0.3


async def state(url: str) -> Json:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        response = await client.get("/_standin/state")
        response.raise_for_status()
        found: Json = response.json()
        return found


def pool_line(found: Json) -> str:
    machines = found["machines"]
    return (
        f"{len(machines['allocated'])} allocated, {len(machines['rebooting'])} rebooting,"
        f" {len(machines['waiting'])} Waiting (pool of {POOL_SIZE})"
    )


async def until_allocated(scene: Scene, url: str, count: int) -> Json:
    """metal-api's state once exactly ``count`` machines are allocated and, with none,
    every freed machine has rebooted back to ``Waiting``."""
    last: Json = {}

    async def poll() -> Json:
        nonlocal last
        while True:
            last = await state(url)
            machines = last["machines"]
            if len(machines["allocated"]) == count and (count or not machines["rebooting"]):
                return last
            await asyncio.sleep(POLL_INTERVAL)

    what = f"metal-api with {count} machines allocated"
    try:
        return await scene.guarded(poll(), what, seconds=POOL_TIMEOUT)
    except DemoTimeout as exc:
        now = pool_line(last) if last else "never answered"
        raise DemoTimeout(f"{exc}; last: {now}; logs: {scene.logs()}") from None


def show_machines(found: Json) -> None:
    say(f"   ↳ metal-api: {pool_line(found)}", BOLD)
    for machine in sorted(found["machines"]["allocated"], key=lambda m: m["hostname"]):
        role = "  (firewall)" if machine["firewall"] else ""
        say(
            f"     {machine['id']}  {machine['hostname']:<28} {machine['last_event']}{role}",
            BOLD,
        )


async def show_nodes(workload: KubeClient) -> None:
    nodes, _ = await workload.list(NODE)
    say(f"   ↳ workload API server: {len(nodes)} Nodes (the firewall is no Node)", BOLD)
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        provider = (node.get("spec") or {}).get("providerID") or "-"
        uuid = ((node.get("status") or {}).get("nodeInfo") or {}).get("systemUUID", "")
        match = provider == f"metalstack://{uuid}"
        say(
            f"     {node['metadata']['name']:<28} providerID {provider}"
            f"  {'= metalstack://<systemUUID>' if match else f'systemUUID {uuid}'}",
            BOLD,
            "" if match else RED,
        )


async def show_cluster(scene: Scene, namespace: str, name: str, found: Json) -> None:
    msc = await scene.kube.get(METALSTACK_CLUSTER, namespace, name)
    spec, status = msc["spec"], msc.get("status") or {}
    networks = {n["id"]: n for n in found["networks"]}
    network = networks.get(spec.get("privateNetworkID") or "", {})
    endpoint = spec.get("controlPlaneEndpoint") or {}
    ips = {ip["ipaddress"]: ip for ip in found["ips"]}
    ip = ips.get(endpoint.get("host") or "", {})
    say(f"   ↳ MetalStackCluster {namespace}/{name}: project {spec.get('projectID')}", BOLD)
    say(
        f"     partition {spec.get('partition')} · public network {spec.get('publicNetworkID')}",
        BOLD,
    )
    say(
        f"     spec.privateNetworkID {spec.get('privateNetworkID')}"
        f" (prefixes {', '.join(network.get('prefixes') or ['?'])},"
        f" {network.get('used_ips', '?')} IPs used)",
        BOLD,
    )
    say(
        f"     spec.controlPlaneEndpoint {endpoint.get('host')}:{endpoint.get('port')}"
        f" ({ip.get('type', '?')} IP in {ip.get('networkid', '?')})",
        BOLD,
    )
    say(
        f"     status ready={status.get('ready')}"
        f" controlPlaneIPAllocated={status.get('controlPlaneIPAllocated')}",
        BOLD,
    )


def show_pool(found: Json) -> None:
    """After deletion: every machine Waiting, no IP, no network but the seeded ones."""
    machines, ips = found["machines"], found["ips"]
    networks = sorted(n["id"] for n in found["networks"])
    clean = len(machines["waiting"]) == POOL_SIZE and not machines["allocated"]
    say(f"   ↳ metal-api machines: {pool_line(found)}", BOLD, GREEN if clean else RED)
    shown = ", ".join(ip["ipaddress"] for ip in ips) or "none"
    say(f"   ↳ metal-api IPs left: {shown}", BOLD, RED if ips else GREEN)
    seeded = networks == sorted(SEEDED_NETWORKS)
    say(
        f"   ↳ metal-api networks: {', '.join(networks)}{' (the seeded ones)' if seeded else ''}",
        BOLD,
        GREEN if seeded else RED,
    )
