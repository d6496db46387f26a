"""What the Ladybug cluster made, read where it lives: the LadybugCluster and its Secrets in
the management API server, the MCIS, VMs and MCIR in Tumblebug (the stand-in's
``/_standin/state``), the Nodes in the workload API server; and, after the deletion, what is
left of each (``leftovers``).

Secrets are listed by name and keys, never by value: they hold the nodes' SSH private key,
the cluster's admin kubeconfig and the nodes' SSH host keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from demo.ladybugview import node_facts
from demo.scene import Scene
from demo.style import BOLD, GREEN, RED, say
from shared.kube import KubeClient
from shared.models.ladybug import CLUSTER_LABEL, NAMESPACE_LABEL, sshkey_secret_name
from shared.resources import LADYBUG_CLUSTER, NODE, SECRET

Json = dict[str, Any]
#: the provisioner's node labels a reader looks for (upstream's topology labels)
TOPOLOGY = ("topology.cloud-barista.github.io/csp", "topology.kubernetes.io/region")


async def show_resource(scene: Scene, namespace: str, name: str) -> None:
    obj = await scene.kube.get(LADYBUG_CLUSTER, namespace, name)
    status = obj.get("status") or {}
    say(
        f"   ↳ LadybugCluster {namespace}/{name}: phase {status.get('phase')}"
        f" · generation {obj['metadata'].get('generation')}"
        f" observed {status.get('observedGeneration')} · finalizers"
        f" {', '.join(obj['metadata'].get('finalizers') or []) or '-'}",
        BOLD,
    )
    for node in status.get("nodes") or []:
        say(
            f"     {node['name']:<14} {node['role']:<13} {node.get('publicIp'):<10}"
            f" subgroup {node.get('subGroup')} · bootstrapped {node.get('bootstrapped')}"
            f" · joined {node.get('joined')}",
            BOLD,
        )


async def show_secrets(scene: Scene, namespace: str, tbns: str, cluster: str) -> list[str]:
    """The Secrets labelled with the cluster's Tumblebug namespace; their names."""
    items, _ = await scene.kube.list(SECRET, namespace=namespace)
    ours = [s for s in items if (s["metadata"].get("labels") or {}).get(NAMESPACE_LABEL) == tbns]
    say(f"   ↳ {len(ours)} Secrets in {namespace} (names and keys; values never shown):", BOLD)
    for secret in sorted(ours, key=lambda s: str(s["metadata"]["name"])):
        labels = secret["metadata"].get("labels") or {}
        whose = labels.get(CLUSTER_LABEL) or "(per connection)"
        keys = ", ".join(sorted(secret.get("data") or {}))
        say(
            f"     {secret['metadata']['name']:<44} keys {keys} · cluster {whose}",
            BOLD,
        )
    return [str(s["metadata"]["name"]) for s in ours]


async def tumblebug_state(tumblebug: httpx.AsyncClient) -> Json:
    state: Json = (await tumblebug.get("/_standin/state")).json()
    return state


async def show_tumblebug(tumblebug: httpx.AsyncClient, tbns: str) -> None:
    state = await tumblebug_state(tumblebug)
    mcis = state.get("mcis", {}).get(tbns) or []
    for found in mcis:
        say(
            f"   ↳ Tumblebug MCIS {tbns}/{found['name']}: {found['status']}"
            f" · subgroups {', '.join(found['subGroups'])}",
            BOLD,
        )
        for vm in found.get("vms") or []:
            sshd = "sshd running" if vm.get("sshd") else "no sshd"
            say(
                f"     VM {vm['name']:<14} {vm['status']:<10} public {vm['publicIP']:<10}"
                f" private {vm['privateIP']:<11} {vm['connectionName']} · {sshd}",
                BOLD,
            )
    if not mcis:
        say(f"   ↳ Tumblebug namespace {tbns}: no MCIS", BOLD)
    mcir = state.get("mcir", {}).get(tbns) or {}
    say(
        "   ↳ Tumblebug MCIR: "
        + " · ".join(f"{kind} {', '.join(ids)}" for kind, ids in sorted(mcir.items()) if ids),
        BOLD,
    )


async def show_nodes(workload: KubeClient) -> list[Json]:
    nodes, _ = await workload.list(NODE)
    say(f"   ↳ workload API server: {len(nodes)} Nodes", BOLD)
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        labels = node["metadata"].get("labels") or {}
        topology = " ".join(f"{k.rsplit('/', 1)[1]}={labels[k]}" for k in TOPOLOGY if k in labels)
        say(f"     {node['metadata']['name']:<14} {node_facts(node)} · {topology}", BOLD)
    return nodes


@dataclass
class Leftovers:
    """What a deleted cluster left, per place; ``kept`` is what stays on purpose."""

    found: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, list[str]] = field(default_factory=dict)

    def clean(self) -> bool:
        return not any(self.found.values())


async def leftovers(
    scene: Scene,
    tumblebug: httpx.AsyncClient,
    workload: KubeClient,
    *,
    namespace: str,
    tbns: str,
    connection: str,
) -> Leftovers:
    result = Leftovers()
    clusters, _ = await scene.kube.list(LADYBUG_CLUSTER, namespace=namespace)
    result.found["LadybugClusters"] = [str(c["metadata"]["name"]) for c in clusters]
    state = await tumblebug_state(tumblebug)
    result.found["Tumblebug MCIS"] = [str(m["name"]) for m in state["mcis"].get(tbns) or []]
    nodes, _ = await workload.list(NODE)
    result.found["workload Nodes"] = [str(n["metadata"]["name"]) for n in nodes]
    secrets, _ = await scene.kube.list(SECRET, namespace=namespace)
    sshkey = sshkey_secret_name(tbns, connection)
    names = [str(s["metadata"]["name"]) for s in secrets if _labelled(s, tbns)]
    result.found["Secrets"] = [n for n in names if n != sshkey]
    result.kept["Secret (sshKey private key)"] = [n for n in names if n == sshkey]
    mcir = state["mcir"].get(tbns) or {}
    result.kept["Tumblebug MCIR"] = [f"{k} {i}" for k, ids in sorted(mcir.items()) for i in ids]
    return result


def show_leftovers(result: Leftovers) -> None:
    for place, names in result.found.items():
        mark = f"{len(names)} left: {', '.join(names)}" if names else "none"
        say(f"   ↳ {place:<28} {mark}", BOLD, RED if names else GREEN)
    for place, names in result.kept.items():
        say(f"   ↳ {place:<28} kept: {', '.join(names) or '-'}", BOLD)


def _labelled(secret: Json, tbns: str) -> bool:
    return (secret["metadata"].get("labels") or {}).get(NAMESPACE_LABEL) == tbns
