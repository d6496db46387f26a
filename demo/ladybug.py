"""The CB-Ladybug story (``--scene ladybug``): a Kubernetes cluster on Tumblebug VMs, made
through CB-Ladybug's REST API, bootstrapped over SSH by capibus's provisioner, grown by one
worker, then deleted (steps 2 to 7 of ``demo.__main__``).

The demo acts as a CB-Ladybug user does: every step is a call of the REST API
(``services.ladybug.api``), printed as the equivalent ``curl`` line with the answer's key
fields (``demo.ladybugrest``). The create and the add-node calls are the blocking kind, as
upstream's clients make them, so the answer comes once the provisioner is done; while a call
waits, the live view (``demo.ladybugview``) shows the work as it happens: the LadybugCluster's
phase and each node bootstrapped and joined over SSH, Tumblebug's MCIS and VMs (real sshds on
loopback addresses), and the Nodes registering in the workload API server. After each step the
result is read where it lives (``demo.ladybugoutcome``).

The cluster is upstream's default shape: one control plane and two workers on one connection
(``aws-ap-northeast-2`` of the Tumblebug stand-in), the haproxy load balancer, local etcd,
canal. The deletion must leave nothing but the per-connection sshKey: Tumblebug's MCIR and the
Secret that mirrors its private key are shared by every cluster of that namespace and
connection, so CB-Ladybug keeps them, as upstream does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx

from demo import ladybugoutcome, ladybugsystem
from demo.feed import DemoTimeout
from demo.ladybugrest import Rest
from demo.ladybugsystem import NAMESPACE, Endpoints
from demo.ladybugview import View, node_ready, until, watching
from demo.scene import Scene
from demo.style import BOLD, GREEN, heading, note, say
from shared.kube import KubeClient, KubeConfig
from shared.models.ladybug import object_name
from testenv.harness import LocalStack, kubectl_line

TBNS = "ns-1"
CLUSTER = "lb-demo"
CONNECTION = "aws-ap-northeast-2"
SPEC = "t3.medium"
WORKERS = 2
CREATE_TIMEOUT = 90.0
ADD_TIMEOUT = 60.0
DELETE_TIMEOUT = 60.0
CLUSTERS = f"/ns/{TBNS}/clusters"

Json = dict[str, Any]


class Ladybug:
    def __init__(self) -> None:
        self.workload: Path | None = None
        self.endpoints: Endpoints | None = None

    def prepare(self, stack: LocalStack) -> None:
        """The workload cluster's API server: starting it blocks, so before the event loop."""
        self.workload = stack.workload()
        note(f"a second kube-apiserver plays the Ladybug cluster's own: {self.workload}")

    def kubectl_args(self) -> tuple[str, ...]:
        return ("get", "ladybugclusters.ladybug.capibus.dev,secrets", "-n", NAMESPACE)

    def access_notes(self, bin_dir: Path) -> list[str]:
        assert self.workload is not None
        lines = [
            f"the workload cluster's Nodes: {kubectl_line(bin_dir, self.workload, 'get', 'nodes')}"
        ]
        if self.endpoints is not None:
            lines.append(
                f"the REST API: export LADYBUG_TOKEN=$(cat {self.endpoints.token_file});"
                f' curl -sS -H "Authorization: Bearer $LADYBUG_TOKEN"'
                f" {self.endpoints.api}/ladybug{CLUSTERS}"
            )
            lines.append(f"Tumblebug's state: curl -sS {self.endpoints.tumblebug}/_standin/state")
        return lines

    async def play(self, scene: Scene) -> None:
        assert self.workload is not None
        heading("2. Ladybug REST API, provisioner, watcher, writer; the Tumblebug stand-in")
        self.endpoints = await ladybugsystem.start(scene, self.workload)
        nodes_dir = self.endpoints.nodes_dir
        view = View(NAMESPACE, object_name(TBNS, CLUSTER), TBNS, nodes_dir)
        rest = Rest(self.endpoints.api, self.endpoints.token)
        tumblebug = httpx.AsyncClient(base_url=self.endpoints.tumblebug, timeout=10)
        workload = KubeClient.from_config(KubeConfig.load(self.workload), qps=None)
        try:
            async with watching(scene, view, tumblebug, workload):
                await _steps(Steps(scene, view, rest, tumblebug, workload))
        finally:
            await asyncio.gather(rest.aclose(), tumblebug.aclose(), workload.aclose())


class Steps:
    def __init__(
        self,
        scene: Scene,
        view: View,
        rest: Rest,
        tumblebug: httpx.AsyncClient,
        workload: KubeClient,
    ) -> None:
        self.scene, self.view, self.rest = scene, view, rest
        self.tumblebug, self.workload = tumblebug, workload


async def _steps(s: Steps) -> None:
    heading(
        f"3. Create cluster {TBNS}/{CLUSTER}: 1 control plane + {WORKERS} workers ({SPEC}), haproxy"
    )
    await s.rest.call("GET", f"/ns/{TBNS}/clusters")
    await _create(s)

    heading("4. What the create made: the resource, its Secrets, Tumblebug, the workload Nodes")
    await ladybugoutcome.show_resource(s.scene, NAMESPACE, s.view.name)
    await ladybugoutcome.show_secrets(s.scene, NAMESPACE, TBNS, CLUSTER)
    await ladybugoutcome.show_tumblebug(s.tumblebug, TBNS)
    await ladybugoutcome.show_nodes(s.workload)
    _show_commands(s.view)

    heading("5. Add a worker (POST nodes)")
    await _add_worker(s)
    await ladybugoutcome.show_tumblebug(s.tumblebug, TBNS)
    await ladybugoutcome.show_nodes(s.workload)
    _show_commands(s.view)

    heading(f"6. Delete cluster {TBNS}/{CLUSTER}")
    await _delete(s)

    heading("7. What is left")
    await _leftovers(s)


async def _create(s: Steps) -> None:
    body = {
        "name": CLUSTER,
        "label": "capibus-demo",
        "description": "the capibus demo's Ladybug cluster",
        "controlPlane": [{"connection": CONNECTION, "count": 1, "spec": SPEC}],
        "worker": [{"connection": CONNECTION, "count": WORKERS, "spec": SPEC}],
        "config": {
            "kubernetes": {"networkCni": "canal", "loadbalancer": "haproxy", "etcd": "local"}
        },
    }
    note("blocking, as upstream's clients call it: the answer comes when the cluster is")
    note("Provisioned; meanwhile the ◆ lines show the provisioner's work")
    answer = await _blocking(s, s.rest.call("POST", CLUSTERS, body), "the create", CREATE_TIMEOUT)
    nodes = 1 + WORKERS
    what = f"{nodes} status nodes joined, {nodes} workload Nodes Ready"
    await until(s.scene, s.view, lambda: _converged(s.view, nodes), what, 10.0)
    say(f"   ⇒ {CLUSTER} {answer['status']['phase']}: {what}", BOLD, GREEN)
    say(f"   ⇒ LadybugCluster phases: {' → '.join(s.view.phases)}", BOLD, GREEN)


async def _add_worker(s: Steps) -> None:
    before = {str(n["name"]) for n in s.view.status_nodes()}
    body = {"worker": [{"connection": CONNECTION, "count": 1, "spec": SPEC}]}
    note("the API appends a worker NodeSet to the spec; the provisioner adds a VM to the MCIS,")
    note("bootstraps it and joins it with a fresh token made on the leader")
    answer = await _blocking(
        s, s.rest.call("POST", f"{CLUSTERS}/{CLUSTER}/nodes", body), "the add", ADD_TIMEOUT
    )
    nodes = 2 + WORKERS
    what = f"{nodes} nodes joined, {nodes} workload Nodes Ready"
    await until(s.scene, s.view, lambda: _converged(s.view, nodes), what, 10.0)
    added = [n for n in answer.get("items") or [] if n["name"] not in before]
    for node in added:
        say(f"   ⇒ added {node['name']} ({node['role']}) at {node['publicIp']}", BOLD, GREEN)
    say(f"   ⇒ {what}", BOLD, GREEN)


async def _delete(s: Steps) -> None:
    note("DELETE marks the LadybugCluster for deletion; the provisioner, holding its finalizer,")
    note("runs `kubectl delete all --all` on the leader, terminates and deletes the MCIS, drops")
    note("the cluster's Secrets, then releases the finalizer; the blocking call answers then")
    await _blocking(s, s.rest.call("DELETE", f"{CLUSTERS}/{CLUSTER}"), "the delete", DELETE_TIMEOUT)
    what = "LadybugCluster, MCIS and workload Nodes gone"
    await until(s.scene, s.view, lambda: _gone(s.view), what, 20.0)
    say(f"   ⇒ {what}", BOLD, GREEN)
    await s.rest.call("GET", f"{CLUSTERS}/{CLUSTER}", expect=404)


async def _leftovers(s: Steps) -> None:
    found = await ladybugoutcome.leftovers(
        s.scene, s.tumblebug, s.workload, namespace=NAMESPACE, tbns=TBNS, connection=CONNECTION
    )
    ladybugoutcome.show_leftovers(found)
    if not found.clean():
        raise LeftBehind(f"the deleted cluster left {found.found}")
    say("   ⇒ nothing of the cluster left", BOLD, GREEN)
    note("kept on purpose: the sshKey MCIR of the connection and the Secret holding its")
    note("private key, shared by every cluster of the namespace and connection (upstream")
    note("keeps the MCIR too), and the Kubernetes namespace")


async def _blocking(s: Steps, call: Awaitable[Json], what: str, seconds: float) -> Json:
    """A blocking REST call awaited under the demo's guard (a crashed process ends it)."""
    try:
        answer = await s.scene.guarded(call, f"the answer to {what}", seconds=seconds)
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; last: {s.view.summary()}; logs: {s.scene.logs()}") from None
    await s.view.refresh(s.tumblebug, s.workload)
    return answer


def _show_commands(view: View) -> None:
    counts = " · ".join(f"{address} {count}" for address, count in sorted(view.ran.items()))
    say(f"   ↳ SSH commands run per node (the emulators' logs): {counts}", BOLD)


def _converged(view: View, count: int) -> bool:
    joined = [n for n in view.status_nodes() if n.get("bootstrapped") and n.get("joined")]
    ready = [n for n in view.nodes.values() if node_ready(n)]
    return view.phase() == "Provisioned" and len(joined) == count and len(ready) == count


def _gone(view: View) -> bool:
    return view.cluster is None and not view.mcis and not view.nodes


class LeftBehind(DemoTimeout):
    """The deletion left something of the cluster: an expected effect that never came."""
