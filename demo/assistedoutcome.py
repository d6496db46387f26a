"""What the OpenShift Assisted install made, read where it lives: the control plane's status
and the Agents, BareMetalHosts and kubeconfig Secret in the management API server, the Nodes
in the workload API server. Everything here is a read, made after the feed showed the step
done, so it shows what a user's ``kubectl get`` would.
"""

from __future__ import annotations

from typing import Any

from demo.assistedview import short, state
from demo.scene import Scene
from demo.style import BOLD, GREEN, RED, say
from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    NODE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)

Json = dict[str, Any]

UUID_LABEL = "metal3.io/uuid"


async def show_control_plane(scene: Scene, namespace: str, cluster: str) -> None:
    name = f"{cluster}-control-plane"
    acp = await scene.kube.get(OPENSHIFT_ASSISTED_CONTROL_PLANE, namespace, name)
    spec, status = acp["spec"], acp.get("status") or {}
    say(
        f"   ↳ OpenshiftAssistedControlPlane {namespace}/{name}: version {status.get('version')}"
        f" (wanted {spec.get('version')})",
        BOLD,
    )
    say(
        f"     replicas {status.get('replicas')}/{spec.get('replicas')}"
        f" ready {status.get('readyReplicas')} · initialized {status.get('initialized')}"
        f" · ready {status.get('ready')}",
        BOLD,
        GREEN if status.get("ready") else RED,
    )
    for found in status.get("conditions") or []:
        reason = f" ({found['reason']})" if found.get("reason") else ""
        say(f"     condition {found['type']}={found['status']}{reason}", BOLD)
    aci = await scene.kube.get(AGENT_CLUSTER_INSTALL, namespace, name)
    say(
        f"   ↳ AgentClusterInstall {name}: state {state(aci)}"
        f" — {(aci.get('status') or {}).get('debugInfo', {}).get('stateInfo', '')}",
        BOLD,
    )
    await _show_kubeconfig(scene, namespace, cluster)


async def _show_kubeconfig(scene: Scene, namespace: str, cluster: str) -> None:
    name = f"{cluster}-kubeconfig"
    try:
        secret = await scene.kube.get(SECRET, namespace, name)
    except KubeNotFound:
        say(f"   ↳ Secret {name}: missing", BOLD, RED)
        return
    keys = ", ".join(sorted(secret.get("data") or {}))
    say(f"   ↳ Secret {name}: type {secret.get('type')}, keys {keys}", BOLD, GREEN)


async def show_agents(scene: Scene, namespace: str) -> list[Json]:
    agents, _ = await scene.kube.list(AGENT, namespace=namespace)
    agents.sort(key=_hostname)
    say(f"   ↳ {len(agents)} Agents (name, host, role, approved, state):", BOLD)
    for agent in agents:
        spec = agent["spec"]
        say(
            f"     {short(agent['metadata']['name']):<9} {_hostname(agent):<8}"
            f" {spec.get('role') or '-':<7} {'approved' if spec.get('approved') else '-':<9}"
            f" {state(agent)}",
            BOLD,
        )
    return agents


async def show_hosts(scene: Scene, namespace: str) -> None:
    hosts, _ = await scene.kube.list(BARE_METAL_HOST, namespace=namespace)
    claimed = sum(1 for h in hosts if (h.get("spec") or {}).get("consumerRef"))
    say(f"   ↳ {len(hosts)} BareMetalHosts, {claimed} claimed:", BOLD)
    for host in sorted(hosts, key=lambda h: str(h["metadata"]["name"])):
        consumer = ((host.get("spec") or {}).get("consumerRef") or {}).get("name") or "free"
        provisioning = ((host.get("status") or {}).get("provisioning") or {}).get("state")
        say(f"     {host['metadata']['name']:<8} {provisioning or '-':<12} {consumer}", BOLD)


async def show_nodes(workload: KubeClient, agents: list[Json]) -> None:
    """The workload cluster's Nodes, each matched to its Agent by ``metal3.io/uuid``."""
    nodes, _ = await workload.list(NODE)
    by_uuid = {(a["spec"].get("nodeLabels") or {}).get(UUID_LABEL): a for a in agents}
    say(f"   ↳ workload API server: {len(nodes)} Nodes", BOLD)
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        labels = node["metadata"].get("labels") or {}
        agent = by_uuid.get(labels.get(UUID_LABEL))
        say(
            f"     {node['metadata']['name']:<8} {UUID_LABEL}={labels.get(UUID_LABEL)}"
            f"  {_agent_line(agent)}",
            BOLD,
            "" if agent else RED,
        )


def _agent_line(agent: Json | None) -> str:
    if agent is None:
        return "no Agent"
    return f"= Agent {short(agent['metadata']['name'])} ({agent['spec'].get('role')})"


def _hostname(agent: Json) -> str:
    return str(((agent.get("status") or {}).get("inventory") or {}).get("hostname") or "?")
