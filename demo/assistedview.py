"""An OpenShift Assisted install as the live feed shows it: the newest of each object of the
scene's namespace, and a highlighted line (◆) whenever one of them gets something a reader
waits for.

The same fold as ``demo.metalview`` (every ``ResourceChanged`` carries the whole object, a
DELETED event drops it, waits re-check the fold on every message), with one difference: the
fold takes the whole namespace, not one cluster's partition. The scene's namespace holds one
cluster, and the hardware is not the cluster's: a BareMetalHost belongs to no cluster until a
Metal3Machine claims it, and an Agent gets the cluster-name label only once the bootstrap
provider binds it, so filtering by ``cluster_key`` would hide the free hosts and the Agents
just booted, which are half of what the scene is about.

The ◆ lines follow the flow of ``docs/assisted.md`` §2: each InfraEnv's discovery
ISO, each host claimed and freed, each Agent booted, approved with a role and walked through
its install, the AgentClusterInstall's state walk, the kubeconfig Secrets, the control plane's
initialized/ready and replica counts, and the CAPI Cluster's phase. Machines and
OpenshiftAssistedConfigs are tracked for the waits but not highlighted: the feed shows them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from demo.style import BOLD, YELLOW, say
from shared.messages import Message, ResourceChanged
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)

Json = dict[str, Any]
Key = tuple[str, str]  # (kind, name): no two tracked kinds share a kind name

TRACKED = {
    (k.api_version, k.kind): k
    for k in (
        AGENT,
        AGENT_CLUSTER_INSTALL,
        BARE_METAL_HOST,
        CAPI_CLUSTER,
        CLUSTER_DEPLOYMENT,
        INFRA_ENV,
        MACHINE,
        OPENSHIFT_ASSISTED_CONFIG,
        OPENSHIFT_ASSISTED_CONTROL_PLANE,
        SECRET,
    )
}
QUIET = {MACHINE.kind, OPENSHIFT_ASSISTED_CONFIG.kind, CLUSTER_DEPLOYMENT.kind}
#: an Agent whose host is part of the cluster: day 1 or day 2
JOINED = {"installed", "added-to-existing-cluster"}
#: the kinds a deleted cluster must leave none of (hosts stay, free)
CLUSTER_KINDS = {
    AGENT.kind,
    AGENT_CLUSTER_INSTALL.kind,
    CAPI_CLUSTER.kind,
    CLUSTER_DEPLOYMENT.kind,
    INFRA_ENV.kind,
    MACHINE.kind,
    OPENSHIFT_ASSISTED_CONFIG.kind,
    OPENSHIFT_ASSISTED_CONTROL_PLANE.kind,
}


@dataclass
class View:
    """Feed observer: the namespace's objects, and a ◆ line for each change worth one."""

    namespace: str
    cluster: str
    objects: dict[Key, Json] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    shown: dict[Key, str] = field(default_factory=dict)
    #: every state the AgentClusterInstall showed, in order, repeats folded
    walk: list[str] = field(default_factory=list)

    def __call__(self, message: Message) -> None:
        if not isinstance(message, ResourceChanged):
            return
        kind = TRACKED.get((message.ref.api_version, message.ref.kind))
        if kind is None or message.ref.namespace != self.namespace:
            return
        if kind is SECRET and not message.ref.name.endswith("kubeconfig"):
            return  # pull secrets, BMC credentials: nothing to watch for
        key = (kind.kind, message.ref.name)
        if message.event == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = message.object
            if kind is AGENT_CLUSTER_INSTALL:
                self._walked(state(message.object))
        self._highlight(key, message)

    def of(self, kind: str) -> list[Json]:
        return [obj for (k, _), obj in sorted(self.objects.items()) if k == kind]

    def hosts_available(self, count: int) -> bool:
        hosts = self.of(BARE_METAL_HOST.kind)
        return len(hosts) == count and all(_host_free(h) for h in hosts)

    def installed(self, control_planes: int, hosts: int) -> bool:
        """The control plane is ready with ``control_planes`` replicas and ``hosts`` hosts
        have joined, each Machine Running, none being made or removed."""
        acps = self.of(OPENSHIFT_ASSISTED_CONTROL_PLANE.kind)
        agents = [a for a in self.of(AGENT.kind) if _live(a)]
        machines = [m for m in self.of(MACHINE.kind) if _live(m)]
        return (
            len(acps) == 1
            and bool(_status(acps[0]).get("ready"))
            and _status(acps[0]).get("readyReplicas") == control_planes
            and len(agents) == hosts
            and all(state(a) in JOINED for a in agents)
            and len(machines) == hosts
            and all(_status(m).get("phase") == "Running" for m in machines)
        )

    def gone(self, hosts: int) -> bool:
        """Nothing of the cluster left, and every host free again."""
        left = [k for (k, _) in self.objects if k in CLUSTER_KINDS]
        return not left and self.hosts_available(hosts)

    def summary(self) -> str:
        """What the view holds, for a timeout's message."""
        if not self.objects:
            return "nothing seen"
        return "; ".join(
            f"{_label(kind)} {name}: {facts(kind, obj)}"
            for (kind, name), obj in sorted(self.objects.items())
        )

    def _walked(self, found: str) -> None:
        if found and (not self.walk or self.walk[-1] != found):
            self.walk.append(found)

    def _highlight(self, key: Key, message: ResourceChanged) -> None:
        kind, name = key
        if kind in QUIET:
            return
        said = "is gone" if message.event == "DELETED" else facts(kind, message.object)
        if not said or self.shown.get(key) == said:
            return
        self.shown[key] = said
        elapsed = time.monotonic() - self.started
        shown = short(name) if kind == AGENT.kind else name
        say(f"   ◆ +{elapsed:5.1f}s  {_label(kind)} {shown}: {said}", BOLD, YELLOW)


def facts(kind: str, obj: Json) -> str:
    """The facts of ``obj`` a reader waits for, one line; empty when there are none yet."""
    spec, status = obj.get("spec") or {}, _status(obj)
    parts: list[str] = []
    if kind == INFRA_ENV.kind:
        url = status.get("isoDownloadURL")
        parts.append(f"discovery ISO ready {url}" if url else "no ISO yet")
    elif kind == BARE_METAL_HOST.kind:
        parts.append(_host_facts(spec, status))
    elif kind == AGENT.kind:
        parts += _agent_facts(spec, status)
    elif kind == AGENT_CLUSTER_INSTALL.kind:
        parts.append(f"state {state(obj) or 'none yet'}")
    elif kind == OPENSHIFT_ASSISTED_CONTROL_PLANE.kind:
        parts += _control_plane_facts(spec, status)
    elif kind == SECRET.kind:
        parts.append(f"written ({obj.get('type') or 'Opaque'})")
    elif kind in (CAPI_CLUSTER.kind, MACHINE.kind):
        parts.append(f"phase {status['phase']}" if status.get("phase") else "no phase yet")
    if obj["metadata"].get("deletionTimestamp"):
        parts.append("deleting")
    return " · ".join(p for p in parts if p)


def _host_facts(spec: Json, status: Json) -> str:
    """Free and available, or claimed and provisioned with the ISO; the steps in between
    (enrolled, claimed but not yet provisioned, released but not yet available) last one
    stand-in step and would only double every line."""
    consumer = (spec.get("consumerRef") or {}).get("name")
    provisioning = (status.get("provisioning") or {}).get("state")
    if consumer and provisioning == "provisioned":
        return f"claimed by Metal3Machine {consumer}, booting the discovery ISO"
    if not consumer and provisioning == "available":
        return "available"
    return ""


def _agent_facts(spec: Json, status: Json) -> list[str]:
    host = (status.get("inventory") or {}).get("hostname")
    if not host:
        return []  # its inventory comes a moment later: say nothing until it can name its host
    parts = [f"booted from {host}", str((status.get("debugInfo") or {}).get("state") or "")]
    if spec.get("role"):
        parts.append(f"role {spec['role']}")
    parts.append("approved" if spec.get("approved") else "not approved")
    return parts


def _control_plane_facts(spec: Json, status: Json) -> list[str]:
    parts = [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', '?')} replicas ready"]
    if status.get("initialized"):
        parts.append("initialized (kubeconfig available)")
    if status.get("ready"):
        parts.append("ready")
    return parts


def state(obj: Json) -> str:
    """``status.debugInfo.state`` of an Agent or AgentClusterInstall."""
    return str((_status(obj).get("debugInfo") or {}).get("state") or "")


def short(name: str) -> str:
    """An Agent's name is a UUID: its first group tells them apart in a scene of six."""
    return name.split("-", 1)[0]


def _label(kind: str) -> str:
    # As the feed names them: Cluster API's Cluster shares its kind name with Azimuth's.
    return f"CAPI {kind}" if kind in (CAPI_CLUSTER.kind, MACHINE.kind) else kind


def _status(obj: Json) -> Json:
    return dict(obj.get("status") or {})


def _live(obj: Json) -> bool:
    return not obj["metadata"].get("deletionTimestamp")


def _host_free(host: Json) -> bool:
    provisioning = (_status(host).get("provisioning") or {}).get("state")
    return not (host.get("spec") or {}).get("consumerRef") and provisioning == "available"
