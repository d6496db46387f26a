"""A metal-stack cluster as the live feed shows it: the newest of each of its objects, and a
highlighted line (◆) whenever one of them gets something a reader waits for.

The watcher publishes every change of the CAPI Cluster, its Machines, the MetalStackCluster,
MetalStackMachines and firewall as a ``ResourceChanged`` carrying the whole object, so the
view is a fold over the feed (a DELETED event drops the object) kept current by an observer,
and waiting for "up with N machines" or "gone" is a check on it, re-evaluated on every
message. Which cluster an object belongs to is decided as the provider decides it
(``shared.resources.cluster_key``: the cluster-name label, else the owning Cluster, else its
own name).

The ◆ lines follow what ``docs/metalstack.md`` §3 says each object waits for: the
MetalStackCluster's private network and API address, each MetalStackMachine's metal-api
machine (``providerID``) and readiness (its Node carries the providerID), the firewall's
machine and whether it runs, and the CAPI Cluster's phase. A CAPI Machine's phases are
tracked (the wait needs them all Running) but not highlighted: the feed shows them anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from demo.style import BOLD, YELLOW, say
from shared.messages import Message, ResourceChanged
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    cluster_key,
)

Json = dict[str, Any]
Key = tuple[str, str]  # (kind, name): no two tracked kinds share a kind name

TRACKED = {
    (k.api_version, k.kind): k
    for k in (CAPI_CLUSTER, MACHINE, METALSTACK_CLUSTER, METALSTACK_MACHINE, METALSTACK_FIREWALL)
}


@dataclass
class View:
    """Feed observer: the cluster's objects, and a ◆ line for each change worth one."""

    namespace: str
    cluster: str
    objects: dict[Key, Json] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    shown: dict[Key, str] = field(default_factory=dict)

    def __call__(self, message: Message) -> None:
        if not isinstance(message, ResourceChanged):
            return
        kind = TRACKED.get((message.ref.api_version, message.ref.kind))
        if kind is None or message.ref.namespace != self.namespace:
            return
        if cluster_key(kind, message.object) != f"{self.namespace}/{self.cluster}":
            return
        key = (kind.kind, message.ref.name)
        if message.event == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = message.object
        self._highlight(key, message)

    def of(self, kind: str) -> list[Json]:
        return [obj for (k, _), obj in sorted(self.objects.items()) if k == kind]

    def up(self, machines: int) -> bool:
        """The cluster runs with ``machines`` machines, nothing more being made or removed."""
        infra, capi = self.of(METALSTACK_CLUSTER.kind), self.of(CAPI_CLUSTER.kind)
        return (
            len(capi) == len(infra) == 1
            and _status(capi[0]).get("phase") == "Provisioned"
            and bool(_status(infra[0]).get("ready"))
            and _all(self.of(METALSTACK_FIREWALL.kind), 1, _ready)
            and _all(self.of(METALSTACK_MACHINE.kind), machines, _ready)
            and _all(
                self.of(MACHINE.kind), machines, lambda m: _status(m).get("phase") == "Running"
            )
        )

    def gone(self) -> bool:
        return not self.objects

    def summary(self) -> str:
        """What the view holds, for a timeout's message."""
        if not self.objects:
            return "nothing of the cluster seen"
        return "; ".join(
            f"{_label(kind)} {name}: {_facts(kind, obj)}"
            for (kind, name), obj in sorted(self.objects.items())
        )

    def _highlight(self, key: Key, message: ResourceChanged) -> None:
        kind, name = key
        if kind == MACHINE.kind:
            return
        facts = "is gone" if message.event == "DELETED" else _facts(kind, message.object)
        if self.shown.get(key) == facts:
            return
        self.shown[key] = facts
        elapsed = time.monotonic() - self.started
        say(f"   ◆ +{elapsed:5.1f}s  {_label(kind)} {self.namespace}/{name}: {facts}", BOLD, YELLOW)


def _facts(kind: str, obj: Json) -> str:
    spec, status = obj.get("spec") or {}, _status(obj)
    parts: list[str] = []
    if kind == METALSTACK_CLUSTER.kind:
        endpoint = spec.get("controlPlaneEndpoint") or {}
        network = spec.get("privateNetworkID")
        parts.append(f"network {network}" if network else "no network yet")
        if endpoint.get("host"):
            parts.append(f"API address {endpoint['host']}:{endpoint.get('port')}")
    elif kind in (METALSTACK_MACHINE.kind, METALSTACK_FIREWALL.kind):
        provider = spec.get("providerID")
        parts.append(f"machine {provider}" if provider else "no machine yet")
    elif kind in (CAPI_CLUSTER.kind, MACHINE.kind):
        parts.append(f"phase {status['phase']}" if status.get("phase") else "no phase yet")
    if status.get("ready"):
        parts.append("running" if kind == METALSTACK_FIREWALL.kind else "ready")
    if status.get("failureReason"):
        parts.append(f"failed: {status['failureReason']} {status.get('failureMessage', '')}")
    if obj["metadata"].get("deletionTimestamp"):
        parts.append("deleting")
    return " · ".join(parts)


def _label(kind: str) -> str:
    # As the feed names them: Cluster API's Cluster shares its kind name with Azimuth's.
    return f"CAPI {kind}" if kind in (CAPI_CLUSTER.kind, MACHINE.kind) else kind


def _status(obj: Json) -> Json:
    return dict(obj.get("status") or {})


def _ready(obj: Json) -> bool:
    return bool(_status(obj).get("ready"))


def _all(objs: list[Json], count: int, test: Callable[[Json], bool]) -> bool:
    return len(objs) == count and all(
        test(o) and not o["metadata"].get("deletionTimestamp") for o in objs
    )
