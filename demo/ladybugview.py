"""A Ladybug cluster as it happens, from three places at once, with a highlighted line (◆)
whenever something a reader waits for changes:

- the **LadybugCluster** on the live feed (the watcher's ``ResourceChanged`` carries the whole
  object): its phase and reason, the MCIS it names, the control-plane leader, and each node's
  ``bootstrapped`` and ``joined`` as the provisioner records them over SSH;
- **Tumblebug** (the stand-in's ``/_standin/state``, polled): the MCIS and each VM's status
  and loopback address, i.e. the sshd the provisioner is about to reach;
- the **nodes themselves**: every command the provisioner ran over SSH, as each node's
  emulator logged it (``commands.log`` in the node's directory of the stand-in's
  ``--nodes-dir``, see ``standins/sshnodes/node.py``), with its exit status. Only the first
  line of a command is shown, and secrets in it are masked (``SECRET_FLAGS``: the join token
  and the certificate key a ``kubeadm join`` carries);
- the **workload API server** (polled): the Nodes that ``kubeadm init``/``join`` on the nodes
  registered.

Tumblebug and the workload cluster are not capibus objects, so nothing of theirs is on the
bus: they are polled (``POLL_SECONDS``), and waits re-check all three folds on a timer rather
than on feed messages (``until``), so a wait for "the Node is gone" ends when it is gone, not
when the next message happens to arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from demo.feed import DemoTimeout
from demo.scene import Scene
from demo.style import BLUE, BOLD, MAGENTA, YELLOW, say
from shared.kube import KubeClient
from shared.messages import Message, ResourceChanged
from shared.resources import LADYBUG_CLUSTER, NODE
from standins.sshnodes.node import commands

Json = dict[str, Any]
POLL_SECONDS = 0.2
CHECK_SECONDS = 0.1
#: command-line flags whose value is a credential: masked before a command is shown
SECRET_FLAGS = re.compile(r"(--token|--certificate-key)(\s+|=)\S+")
COMMAND_WIDTH = 110


@dataclass
class View:
    """The LadybugCluster (feed), Tumblebug's MCIS (polled), the workload's Nodes (polled)."""

    namespace: str
    name: str
    tbns: str
    #: the Tumblebug stand-in's ``--nodes-dir``: one directory per VM address under ``nodes/``
    nodes_dir: Path
    cluster: Json | None = None
    #: the MCIS of the Tumblebug namespace, by name, as ``/_standin/state`` summarises them
    mcis: dict[str, Json] = field(default_factory=dict)
    #: the workload API server's Nodes, by name
    nodes: dict[str, Json] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    shown: dict[str, str] = field(default_factory=dict)
    #: SSH commands run so far, per VM address (a VM's directory outlives the VM)
    ran: dict[str, int] = field(default_factory=dict)
    #: the poller and a step's own refresh take turns: an older snapshot folded after a
    #: newer one would show things vanishing and coming back
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)

    # --- the LadybugCluster, from the feed ---------------------------------------------------

    def __call__(self, message: Message) -> None:
        if not isinstance(message, ResourceChanged):
            return
        ref = message.ref
        if (ref.kind, ref.namespace, ref.name) != (LADYBUG_CLUSTER.kind, self.namespace, self.name):
            return
        if message.event == "DELETED":
            self.cluster = None
            self._show("LadybugCluster", self.name, "is gone (finalizer released)")
            return
        self.cluster = message.object
        self._cluster_lines(message.object)

    def _cluster_lines(self, obj: Json) -> None:
        status = obj.get("status") or {}
        phase = status.get("phase") or "Pending"
        if not self.phases or self.phases[-1] != phase:
            self.phases.append(phase)
        facts = [f"phase {phase}"]
        if status.get("reason"):
            facts.append(f"{status['reason']}: {status.get('message')}")
        if status.get("mcis"):
            facts.append(f"MCIS {status['mcis']}")
        if status.get("cpLeader"):
            facts.append(f"leader {status['cpLeader']}")
        if obj["metadata"].get("deletionTimestamp"):
            facts.append("deletion requested")
        self._show("LadybugCluster", self.name, " · ".join(facts))
        for node in status.get("nodes") or []:
            self._show("  status node", str(node.get("name")), _node_facts(node))

    def phase(self) -> str:
        return str(((self.cluster or {}).get("status") or {}).get("phase") or "")

    def status_nodes(self) -> list[Json]:
        return list(((self.cluster or {}).get("status") or {}).get("nodes") or [])

    # --- Tumblebug and the workload cluster, polled --------------------------------------------

    async def poll(self, tumblebug: httpx.AsyncClient, workload: KubeClient) -> None:
        """Forever: fold what Tumblebug and the workload API server hold."""
        while True:
            await self.refresh(tumblebug, workload)
            await asyncio.sleep(POLL_SECONDS)

    async def refresh(self, tumblebug: httpx.AsyncClient, workload: KubeClient) -> None:
        """One look at each polled place. Called after a blocking call answered, too, so the
        lines of its last moments come before the next step's heading."""
        async with self._turn:
            await self._refresh(tumblebug, workload)

    async def _refresh(self, tumblebug: httpx.AsyncClient, workload: KubeClient) -> None:
        with contextlib.suppress(httpx.HTTPError):
            state = (await tumblebug.get("/_standin/state")).json()
            self._fold_mcis(state.get("mcis", {}).get(self.tbns) or [])
        self._fold_commands(await asyncio.to_thread(self._read_commands))
        items, _ = await workload.list(NODE)
        self._fold_nodes({str(n["metadata"]["name"]): n for n in items})

    def _read_commands(self) -> dict[str, list[Json]]:
        root = self.nodes_dir / "nodes"
        if not root.is_dir():
            return {}
        return {d.name: commands(d) for d in sorted(root.iterdir()) if d.is_dir()}

    def _fold_commands(self, found: dict[str, list[Json]]) -> None:
        vms = {
            vm.get("publicIP"): vm["name"] for m in self.mcis.values() for vm in m.get("vms") or []
        }
        for address, ran in found.items():
            for entry in ran[self.ran.get(address, 0) :]:
                who = f"{address} ({vms[address]})" if address in vms else address
                self._say(
                    f"ssh {who} $ {shown_command(str(entry['command']))} → exit {entry['exit']}",
                    BLUE,
                )
            self.ran[address] = len(ran)

    def _fold_mcis(self, found: list[Json]) -> None:
        now = {str(m["name"]): m for m in found}
        for name in self.mcis.keys() - now.keys():
            self._show("Tumblebug MCIS", name, "deleted", MAGENTA)
        for name, mcis in now.items():
            self._show("Tumblebug MCIS", name, f"status {mcis['status']}", MAGENTA)
            for vm in mcis.get("vms") or []:
                self._show("  Tumblebug VM", str(vm["name"]), _vm_facts(vm), MAGENTA)
        for name in {vm["name"] for m in self.mcis.values() for vm in m.get("vms") or []} - {
            vm["name"] for m in now.values() for vm in m.get("vms") or []
        }:
            self._show("  Tumblebug VM", str(name), "deleted", MAGENTA)
        self.mcis = now

    def _fold_nodes(self, now: dict[str, Json]) -> None:
        for name in self.nodes.keys() - now.keys():
            self._show("workload Node", name, "deleted")
        for name, node in now.items():
            self._show("workload Node", name, node_facts(node))
        self.nodes = now

    def summary(self) -> str:
        """What the view holds, for a timeout's message."""
        nodes = ", ".join(f"{n.get('name')}: {_node_facts(n)}" for n in self.status_nodes())
        return (
            f"phase {self.phase() or 'none'} ({' → '.join(self.phases)}); status nodes [{nodes}];"
            f" MCIS {sorted(self.mcis) or 'none'}; workload Nodes {sorted(self.nodes) or 'none'}"
        )

    def _show(self, label: str, name: str, facts: str, colour: str = YELLOW) -> None:
        key = f"{label.strip()} {name}"
        if not facts or self.shown.get(key) == facts:
            return
        self.shown[key] = facts
        self._say(f"{label} {name}: {facts}", colour)

    def _say(self, text: str, colour: str) -> None:
        elapsed = time.monotonic() - self.started
        say(f"   ◆ +{elapsed:5.1f}s  {text}", BOLD, colour)


@contextlib.asynccontextmanager
async def watching(
    scene: Scene, view: View, tumblebug: httpx.AsyncClient, workload: KubeClient
) -> AsyncIterator[None]:
    """The view on the feed and polling, for the duration of the block."""
    poller = asyncio.create_task(view.poll(tumblebug, workload))
    try:
        with scene.feed.observing(view):
            yield
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


async def until(
    scene: Scene, view: View, done: Callable[[], bool], what: str, seconds: float
) -> None:
    """Until ``done()``, re-checked on a timer; guarded against a process that exits."""

    async def check() -> None:
        while True:
            if done():
                return
            await asyncio.sleep(CHECK_SECONDS)

    try:
        await scene.guarded(check(), what, seconds=seconds)
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; last: {view.summary()}; logs: {scene.logs()}") from None


def _node_facts(node: Json) -> str:
    steps = [s for s in ("bootstrapped", "joined") if node.get(s)]
    return (
        f"{node.get('role')} at {node.get('publicIp') or '?'}"
        f" · {' + '.join(steps) if steps else 'waiting for SSH'}"
    )


def _vm_facts(vm: Json) -> str:
    where = f"public {vm['publicIP']}" if vm.get("publicIP") else "no address"
    sshd = " · sshd up" if vm.get("sshd") else ""
    return f"{vm['status']} · subgroup {vm['subGroupId']} · {where}{sshd}"


def node_facts(node: Json) -> str:
    """A workload Node's Ready condition and role labels."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k.rsplit("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    return f"Ready={ready or '?'} · roles {','.join(roles) or '-'}"


def node_ready(node: Json) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def shown_command(command: str) -> str:
    """A command as the live view prints it: its first line, credentials masked, shortened."""
    lines = command.splitlines() or [""]
    first = SECRET_FLAGS.sub(r"\1\2***", lines[0])
    if len(lines) > 1:
        first += f" …(+{len(lines) - 1} lines)"
    return first if len(first) <= COMMAND_WIDTH else first[: COMMAND_WIDTH - 1] + "…"
