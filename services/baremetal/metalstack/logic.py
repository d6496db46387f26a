"""Pure decisions of the metal-stack provider: what an object waits for, what to ask metal-api.

Upstream's controllers (``controllers/metalstack*_controller.go`` in
metal-stack/cluster-api-provider-metalstack) keep no memory between reconciles; neither does
this service. What makes a retried or resumed step safe is that every object capibus asks
metal-api for carries a tag naming the Kubernetes object it is for (its uid), so before
allocating anything the provider *finds* what it may already have allocated: a replica killed
between "allocate" and "record the id" adopts its own machine instead of taking a second one.

The names below are upstream's (finalizers, the cluster tag, the network label, the provider
id scheme) except the ``metal-stack.infrastructure.cluster.x-k8s.io/*`` resource tags, which
follow the successor provider (metal-stack/cluster-api-provider-metal-stack) in spirit: one tag
per kind of object, valued with that object's uid.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shared.messages import Condition

Json = dict[str, Any]

CLUSTER_FINALIZER = "metalstackcluster.infrastructure.cluster.x-k8s.io"
MACHINE_FINALIZER = "metalstackmachine.infrastructure.cluster.x-k8s.io"
FIREWALL_FINALIZER = "metalstackfirewall.infrastructure.cluster.x-k8s.io"

CAPI_GROUP = "cluster.x-k8s.io"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"

#: tag on every machine and firewall of a cluster: ``=<MetalStackCluster uid>`` (upstream)
CLUSTER_TAG = "cluster.metal-stack.io/id"
#: label of the private network: ``=<MetalStackCluster name>`` (upstream)
NETWORK_LABEL = "cluster.metal-stack.io/id"
_RESOURCE = "metal-stack.infrastructure.cluster.x-k8s.io"
#: which Kubernetes object (by uid) a metal-api object was allocated for
CLUSTER_RESOURCE = f"{_RESOURCE}/cluster-resource"
MACHINE_RESOURCE = f"{_RESOURCE}/machine-resource"
FIREWALL_RESOURCE = f"{_RESOURCE}/firewall-resource"
PURPOSE_CONTROL_PLANE = f"{_RESOURCE}/purpose=control-plane"

PROVIDER_SCHEME = "metalstack://"
#: the event after which metal-api considers a machine installed and running
PHONED_HOME = "Phoned Home"


def tag(key: str, value: str) -> str:
    return f"{key}={value}"


# --- reading objects ----------------------------------------------------------------------


def meta(obj: Json) -> Json:
    return obj.get("metadata") or {}


def spec(obj: Json) -> Json:
    return obj.get("spec") or {}


def status(obj: Json) -> Json:
    return obj.get("status") or {}


def deleting(obj: Json) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def object_key(obj: Json) -> str:
    """``<namespace>/<name>``, for log lines."""
    return f"{meta(obj).get('namespace')}/{meta(obj)['name']}"


def has_finalizer(obj: Json, finalizer: str) -> bool:
    return finalizer in (meta(obj).get("finalizers") or [])


def owner_name(obj: Json, kind: str, group: str = CAPI_GROUP) -> str | None:
    """The name of ``obj``'s owner of ``kind`` in ``group`` (any version), if any."""
    for owner in meta(obj).get("ownerReferences") or []:
        if owner.get("kind") == kind and str(owner.get("apiVersion", "")).startswith(f"{group}/"):
            return str(owner["name"])
    return None


def cluster_label(obj: Json) -> str | None:
    value = (meta(obj).get("labels") or {}).get(CLUSTER_NAME_LABEL)
    return str(value) if value else None


def paused(*objects: Json) -> bool:
    """A Cluster with ``spec.paused``, or any object annotated paused (CAPI's rule)."""
    for obj in objects:
        if PAUSED_ANNOTATION in (meta(obj).get("annotations") or {}):
            return True
    return any(obj.get("kind") == "Cluster" and spec(obj).get("paused") for obj in objects)


def infrastructure_name(cluster: Json, kind: str) -> str | None:
    ref = spec(cluster).get("infrastructureRef") or {}
    return str(ref["name"]) if ref.get("kind") == kind and ref.get("name") else None


def is_control_plane(machine: Json) -> bool:
    # Presence, not value, marks a control-plane Machine (CAPI's util.IsControlPlaneMachine).
    return CONTROL_PLANE_LABEL in (meta(machine).get("labels") or {})


def machine_id(provider_id: str | None) -> str | None:
    """The metal-api machine id in ``metalstack://<id>`` (None when unset or unparsable)."""
    if not provider_id or "://" not in provider_id:
        return None
    scheme, _, rest = provider_id.partition("://")
    machine = rest.strip("/")
    return machine if scheme and machine else None


def provider_id(machine: str) -> str:
    return f"{PROVIDER_SCHEME}{machine}"


# --- the cluster ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterPlace:
    """Where a MetalStackCluster's things live in metal-stack."""

    name: str
    uid: str
    project: str
    partition: str
    public_network: str

    @classmethod
    def of(cls, msc: Json) -> ClusterPlace:
        s = spec(msc)
        return cls(
            name=meta(msc)["name"],
            uid=meta(msc)["uid"],
            project=s.get("projectID") or "",
            partition=s.get("partition") or "",
            public_network=s.get("publicNetworkID") or "",
        )

    @property
    def cluster_tag(self) -> str:
        return tag(CLUSTER_TAG, self.uid)

    @property
    def network_labels(self) -> dict[str, str]:
        return {NETWORK_LABEL: self.name, CLUSTER_RESOURCE: self.uid}

    @property
    def ip_tags(self) -> list[str]:
        return [self.cluster_tag, PURPOSE_CONTROL_PLANE]


def awaiting_allocation(msm: Json) -> bool:
    """A machine that has no metal machine yet and may still get one."""
    st = status(msm)
    return not (spec(msm).get("providerID") or st.get("failureReason") or st.get("failureMessage"))


def awaiting_readiness(obj: Json) -> bool:
    """A machine or firewall not ready yet and not failed for good."""
    st = status(obj)
    return not (st.get("ready") or st.get("failureReason") or st.get("failureMessage"))


def cluster_ready(msc: Json) -> bool:
    s, st = spec(msc), status(msc)
    host = (s.get("controlPlaneEndpoint") or {}).get("host")
    return bool(st.get("ready") and s.get("privateNetworkID") and host)


# --- machines -------------------------------------------------------------------------------


def machine_request(
    msm: Json,
    place: ClusterPlace,
    *,
    private_network: str,
    user_data: str,
    control_plane: bool,
    control_plane_ip: str | None,
) -> Json:
    """``POST /v1/machine/allocate`` for ``msm``, as upstream builds it, plus our resource tag.

    Control-plane machines get the cluster's API address in ``ips``; workers do not.
    """
    s = spec(msm)
    name = meta(msm)["name"]
    request: Json = {
        "name": name,
        "hostname": name,
        "description": f"{name} created by capibus (metal-stack Cluster API provider)",
        "imageid": s.get("image") or "",
        "sizeid": s.get("machineType") or "",
        "partitionid": place.partition,
        "projectid": place.project,
        "networks": _networks(place.public_network, private_network),
        "tags": [
            place.cluster_tag,
            tag(MACHINE_RESOURCE, meta(msm)["uid"]),
            *(s.get("tags") or []),
            tag(CONTROL_PLANE_LABEL, "true" if control_plane else "false"),
        ],
        "ssh_pub_keys": list(s.get("sshKeys") or []),
        "user_data": user_data,
    }
    pinned = machine_id(s.get("providerID"))
    if pinned:
        request["uuid"] = pinned
    if control_plane and control_plane_ip:
        request["ips"] = [control_plane_ip]
    return request


def _networks(public: str, private: str) -> list[Json]:
    return [
        {"networkid": public, "autoacquire": True},
        {"networkid": private, "autoacquire": True},
    ]


def addresses(metal_machine: Json) -> list[Json]:
    """``status.addresses``: the hostname, then the first IP of every network of the
    allocation, internal for private networks, external otherwise (upstream's rule plus the
    hostname the successor provider reports; ``docs/metalstack.md`` says why)."""
    allocation = metal_machine.get("allocation") or {}
    found: list[Json] = []
    if allocation.get("hostname"):
        found.append({"type": "Hostname", "address": allocation["hostname"]})
    for network in allocation.get("networks") or []:
        ips = network.get("ips") or []
        if ips:
            kind = "InternalIP" if network.get("private") else "ExternalIP"
            found.append({"type": kind, "address": ips[0]})
    return found


def allocated(metal_machine: Json) -> bool:
    return metal_machine.get("allocation") is not None


def belongs_to(metal_machine: Json, *, project: str) -> bool:
    allocation = metal_machine.get("allocation") or {}
    return allocation.get("project") == project


def node_for(nodes: Iterable[Json], machine: str) -> Json | None:
    """The Node whose ``systemUUID`` *is* the machine id (upstream matched substrings, so an
    empty systemUUID matched any machine)."""
    for node in nodes:
        if (status(node).get("nodeInfo") or {}).get("systemUUID") == machine:
            return node
    return None


# --- firewalls ------------------------------------------------------------------------------


def firewall_request(
    msf: Json, place: ClusterPlace, *, private_network: str, kubeconfig: str
) -> Json:
    """``POST /v1/firewall/allocate`` as upstream builds it, plus our resource tag."""
    s = spec(msf)
    name = meta(msf)["name"]
    request: Json = {
        "name": name,
        "hostname": f"{name}-firewall",
        "description": f"{name} created by Cluster API provider MetalStack",
        "imageid": s.get("image") or "",
        "sizeid": s.get("machineType") or "",
        "partitionid": place.partition,
        "projectid": place.project,
        "networks": _networks(place.public_network, private_network),
        "tags": [place.cluster_tag, tag(FIREWALL_RESOURCE, meta(msf)["uid"])],
        "ssh_pub_keys": list(s.get("sshKeys") or []),
        "user_data": firewall_ignition(kubeconfig),
    }
    pinned = machine_id(s.get("providerID"))
    if pinned:
        request["uuid"] = pinned
    return request


def firewall_ignition(kubeconfig: str) -> str:
    """The firewall's Ignition config: the firewall-controller unit enabled, and the workload
    cluster's kubeconfig at ``/etc/firewall-controller/.kubeconfig`` (root, 0600): what
    upstream's Container Linux Config (``metalstackfirewall_ignition_generator.go``)
    transpiles to."""
    config = {
        "ignition": {"version": "2.2.0"},
        "storage": {
            "files": [
                {
                    "filesystem": "root",
                    "path": "/etc/firewall-controller/.kubeconfig",
                    "mode": 0o600,
                    "user": {"id": 0},
                    "group": {"id": 0},
                    "contents": {"source": "data:," + urllib.parse.quote(kubeconfig)},
                }
            ]
        },
        "systemd": {"units": [{"name": "firewall-controller.service", "enabled": True}]},
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def phoned_home(metal_machine: Json) -> bool:
    """Whether the machine runs: its newest event is ``Phoned Home`` (the successor's signal,
    which real metal-api gives), or upstream's ``allocation.succeeded`` (which real metal-api
    never sets, so upstream's firewall never became ready)."""
    log = (metal_machine.get("events") or {}).get("log") or []
    if log and log[0].get("event") == PHONED_HOME:
        return True
    return bool((metal_machine.get("allocation") or {}).get("succeeded"))


# --- status ---------------------------------------------------------------------------------


def condition(kind: str, ok: bool, reason: str, message: str = "") -> Condition:
    return Condition(type=kind, status="True" if ok else "False", reason=reason, message=message)
