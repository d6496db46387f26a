"""The Cluster as a user sees it: a one-line progress report, a read-back, waiting for Ready.

Progress comes from the feed, not from polling: every write to the Cluster comes back as the
watcher's ``ResourceChanged`` carrying the whole object, so the demo notices each change of
``status.phase`` or of the ``Reconciled`` condition (the helm service's account of what the
Cluster waits for) the moment it is published, and prints it right under that message.

"Converged" means all of: the helm service has handled the current spec (its
``last-handled-configuration`` annotation holds it), ``Reconciled`` is True, the phase is
Ready, and, when a node count is expected, the monitor reports exactly that many nodes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from demo.feed import DemoTimeout
from demo.render import condition_of
from demo.scene import Scene
from demo.style import BOLD, YELLOW, say
from shared.errors import KubeNotFound
from shared.messages import Message, ObjectRef, ResourceChanged
from shared.resources import CLUSTER

Json = dict[str, Any]

LAST_HANDLED = "azimuth.stackhpc.com/last-handled-configuration"
CONVERGE_TIMEOUT = 180.0


def summary(cluster: Json) -> str:
    """``phase=Reconciling Reconciled=True/Deployed nodes=3``."""
    status = cluster.get("status") or {}
    reconciled = condition_of(cluster, "Reconciled")
    condition = f"{reconciled['status']}/{reconciled['reason']}" if reconciled else "-"
    nodes = status.get("nodeCount", 0)
    # The portal shows any Cluster with a deletionTimestamp as Deleting, whatever its phase.
    deleting = " (deletionTimestamp set)" if cluster["metadata"].get("deletionTimestamp") else ""
    return f"phase={status.get('phase', '-')} Reconciled={condition} nodes={nodes}{deleting}"


@dataclass
class Progress:
    """Feed observer: one highlighted line whenever the Cluster's phase or Reconciled changes."""

    ref: ObjectRef
    started: float = field(default_factory=time.monotonic)
    last: tuple[str, ...] = ()
    latest: Json | None = None

    def __call__(self, message: Message) -> None:
        if not (isinstance(message, ResourceChanged) and message.ref.uid == self.ref.uid):
            return
        self.latest = message.object
        status = message.object.get("status") or {}
        reconciled = condition_of(message.object, "Reconciled")
        state = (
            message.event,
            str(status.get("phase", "")),
            str(reconciled.get("status", "")),
            str(reconciled.get("reason", "")),
        )
        if state != self.last:
            self.last = state
            elapsed = time.monotonic() - self.started
            what = {"ADDED": "appears:", "DELETED": "is gone, last seen:"}.get(message.event, "is")
            line = f"   ◆ +{elapsed:5.1f}s  Cluster {self.ref.key} {what} {summary(message.object)}"
            say(line, BOLD, YELLOW)


def converged(cluster: Json, *, nodes: int | None = None) -> bool:
    status = cluster.get("status") or {}
    annotations = cluster["metadata"].get("annotations") or {}
    handled = json.loads(annotations.get(LAST_HANDLED, "{}")).get("spec")
    return (
        handled == cluster["spec"]
        and condition_of(cluster, "Reconciled").get("status") == "True"
        and status.get("phase") == "Ready"
        and (nodes is None or status.get("nodeCount") == nodes)
    )


async def until_converged(scene: Scene, ref: ObjectRef, *, nodes: int | None = None) -> Json:
    """The Cluster once ``converged``, printing its progress on the way."""
    progress = Progress(ref)

    def check(seen: list[Message]) -> Json | None:
        obj = latest(seen, ref)
        return obj if obj is not None and converged(obj, nodes=nodes) else None

    with scene.feed.observing(progress):
        try:
            return await scene.expect(check, f"{ref.key} Ready", seconds=CONVERGE_TIMEOUT)
        except DemoTimeout as exc:
            last = summary(progress.latest) if progress.latest else "never seen"
            raise DemoTimeout(f"{exc}; last: {last}; logs: {scene.logs()}") from None


def latest(seen: list[Message], ref: ObjectRef) -> Json | None:
    """The newest object the watcher published for the Cluster."""
    for message in reversed(seen):
        if isinstance(message, ResourceChanged) and message.ref.uid == ref.uid:
            return message.object
    return None


async def show(scene: Scene, ref: ObjectRef) -> Json | None:
    """Read the Cluster back from the API server: phase, conditions, nodes, addons."""
    try:
        cluster = await scene.kube.get(CLUSTER, ref.namespace, ref.name)
    except KubeNotFound:
        say(f"   ↳ API server: Cluster {ref.key} does not exist", BOLD)
        return None
    meta, status = cluster["metadata"], cluster.get("status") or {}
    say(
        f"   ↳ API server: Cluster {ref.key} generation {meta.get('generation')}"
        f" rv={meta['resourceVersion']}",
        BOLD,
    )
    say(
        f"     phase {status.get('phase', '-')} · networking {status.get('networkingPhase', '-')}"
        f" · control plane {status.get('controlPlanePhase', '-')}"
        f" · lease {status.get('leasePhase', '-')} · {status.get('nodeCount', 0)} nodes",
        BOLD,
    )
    for c in status.get("conditions") or []:
        say(f"     condition {c['type']}={c['status']} ({c.get('reason', '')})", BOLD)
    addons = status.get("addons") or {}
    if addons:
        shown = ", ".join(f"{n} {a.get('phase', '?')}" for n, a in sorted(addons.items()))
        say(f"     {len(addons)} addons: {shown}", BOLD)
    return cluster
