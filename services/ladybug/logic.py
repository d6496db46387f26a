"""CB-Ladybug's pure rules, shared by the REST API and the provisioner: defaults, validation
with upstream's messages, subgroup naming, request → ``LadybugCluster`` spec, and resource →
upstream's JSON shapes.

Everything here takes and returns plain JSON (``dict``), never a FastAPI or pydantic request
model, so the provisioner imports it without the web stack and every rule is tested as a
function.

Decisions:

* **Upstream's order and words.** ``validate_cluster`` is ``validateCreateClusterReq`` of
  ``src/rest-api/router/cluster.go`` (cloud-barista/cb-ladybug) after its defaults: the first
  failing rule answers, with upstream's message, so a client matching on messages sees the
  same text. ``validate_node_set`` is ``validateNodeSetReq`` (``router/node.go``), and
  ``service_refusal`` the count and single-cloud checks of ``CreateCluster``
  (``src/core/service/cluster.go``), which upstream answers with 500, not 400.
* **The defaults upstream forgot.** ``etcd`` defaults to ``local`` (upstream's default
  branch tests ``loadbalancer`` instead, so an omitted ``etcd`` fails there) and
  ``serviceType`` to ``multi`` (upstream has none and fails later in bootstrap). An unknown
  ``serviceType`` is refused here ("serviceType allows only multi or single"): upstream lets
  it through to fail in bootstrap.
* **Names are chosen once, by the API.** Each NodeSet gets its subgroup base name when the
  request is accepted (``c-1-xxxxx`` for the control plane, ``w-<i>-xxxxx`` per worker VM,
  5 characters from upstream's alphabet ``[a-z1-90]``, ``lang.GenerateNewNodeName``), and
  the name is stored in the spec, so a provisioner that restarts names the VMs as before.
  Worker NodeSets are expanded to one per VM (upstream gives every worker VM its own
  subgroup of size 1).
* **Responses carry no credential.** ``node_view`` is upstream's Node without
  ``credential``; the admin kubeconfig reaches ``clusterConfig`` from its Secret only.
"""

from __future__ import annotations

import copy
import random
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import PermanentError
from shared.models.ladybug import (
    API_VERSION,
    CLUSTER_LABEL,
    FINALIZER,
    KIND,
    NAMESPACE_LABEL,
    LadybugPhase,
    object_name,
)

Json = dict[str, Any]

# --- upstream's constants (src/core/app/const.go, src/rest-api/router/cluster.go) ------------

DEFAULT_VERSION = "1.23.13"
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_DOMAIN = "cluster.local"
MULTI, SINGLE = "multi", "single"
HAPROXY, NLB = "haproxy", "nlb"
LOCAL, EXTERNAL = "local", "external"
CONTROL_PLANE, WORKER = "control-plane", "worker"
MULTI_CNIS = ("canal", "kilo")
SINGLE_CNIS = ("flannel", "calico")
EXTERNAL_ETCD_COUNTS = (3, 5, 7)
#: ``lang.GenerateNewRandomString``'s alphabet
NAME_ALPHABET = "abcdefghijklmnopqrstuvwxyz1234567890"
NAME_SUFFIX_LENGTH = 5
HEALTHY = "cb-barista cb-ladybug"

_CLUSTER_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: upstream's pattern, unescaped dots included (``lang.VerifyCIDR``)
_CIDR = re.compile(r"^((?:\d{1,3}.){3}\d{1,3})\/(\d{1,2})$")

#: phases after which a request's wait ends (Failed ends every wait; see ``settled``)
TERMINAL = (LadybugPhase.PROVISIONED.value, LadybugPhase.FAILED.value)


class InvalidRequest(PermanentError):
    """A request refused before anything is stored; upstream answers these with 400."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="InvalidRequest")


class Refused(PermanentError):
    """A request refused by upstream's service layer; upstream answers these with 500."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="Refused")


# --- defaults and validation ------------------------------------------------------------------


def _or(value: Any, default: str) -> Any:
    """``lang.NVL``: an empty (or missing) value takes the default."""
    return default if value in (None, "") else value


def with_defaults(request: Mapping[str, Any]) -> Json:
    """A copy of the create request with upstream's defaults, and capibus's for ``etcd``
    (``local``) and ``serviceType`` (``multi``)."""
    req = copy.deepcopy(dict(request))
    req["serviceType"] = _or(req.get("serviceType"), MULTI)
    config = req.setdefault("config", {}) or {}
    req["config"] = config
    config["installMonAgent"] = _or(config.get("installMonAgent"), "no")
    k8s = config.setdefault("kubernetes", {}) or {}
    config["kubernetes"] = k8s
    k8s["version"] = _or(k8s.get("version"), DEFAULT_VERSION)
    k8s["podCidr"] = _or(k8s.get("podCidr"), POD_CIDR)
    k8s["serviceCidr"] = _or(k8s.get("serviceCidr"), SERVICE_CIDR)
    k8s["serviceDnsDomain"] = _or(k8s.get("serviceDnsDomain"), SERVICE_DOMAIN)
    k8s["loadbalancer"] = _or(k8s.get("loadbalancer"), HAPROXY)
    k8s["etcd"] = _or(k8s.get("etcd"), LOCAL)
    k8s["networkCni"] = _or(k8s.get("networkCni"), "kilo")
    req["controlPlane"] = [node_set_defaults(s) for s in req.get("controlPlane") or []]
    req["worker"] = [node_set_defaults(s) for s in req.get("worker") or []]
    return req


def node_set_defaults(node_set: Mapping[str, Any]) -> Json:
    """A NodeSet with its root disk defaulted to ``default``/``default``."""
    result = copy.deepcopy(dict(node_set))
    disk = result.get("rootDisk") or {}
    result["rootDisk"] = {
        **disk,
        "type": _or(disk.get("type"), "default"),
        "size": _or(disk.get("size"), "default"),
    }
    result["count"] = int(result.get("count") or 0)
    return result


def validate_cluster(req: Mapping[str, Any]) -> None:
    """``InvalidRequest`` with upstream's message for the first rule ``req`` (defaults applied)
    breaks, in ``validateCreateClusterReq``'s order."""
    control_plane, workers = req.get("controlPlane") or [], req.get("worker") or []
    k8s = req["config"]["kubernetes"]
    if not control_plane:
        raise InvalidRequest("Control plane node must be at least one")
    if len(control_plane) > 1:
        raise InvalidRequest("Only one control plane node is supported")
    if not workers:
        raise InvalidRequest("Worker node must be at least one")
    _validate_network(req["serviceType"], k8s["networkCni"])
    if k8s["loadbalancer"] not in (HAPROXY, NLB):
        raise InvalidRequest("loadbalancer allows only haproxy or nlb")
    if k8s["etcd"] not in (LOCAL, EXTERNAL):
        raise InvalidRequest("etcd allows only local or external")
    if k8s["etcd"] == EXTERNAL and control_plane[0].get("count") not in EXTERNAL_ETCD_COUNTS:
        raise InvalidRequest("External etcd must have 3,5,7 controlPlane count")
    validate_name(str(req.get("name") or ""))
    validate_cidr("podCidr", str(k8s["podCidr"]))
    validate_cidr("serviceCidr", str(k8s["serviceCidr"]))
    for node_set in [*control_plane, *workers]:
        validate_node_set(node_set)


def _validate_network(service_type: str, cni: str) -> None:
    if service_type not in (MULTI, SINGLE):
        raise InvalidRequest("serviceType allows only multi or single")
    if service_type == MULTI and cni not in MULTI_CNIS:
        raise InvalidRequest("Network-cni allows only canal or kilo in Multi-Cloud type")
    if service_type == SINGLE and cni not in SINGLE_CNIS:
        raise InvalidRequest("Network-cni allows only calico or flannel in Single-Cloud type")


def validate_name(name: str) -> None:
    """``lang.VerifyClusterName``, after upstream's "empty" check."""
    if not name:
        raise InvalidRequest("Cluster name is empty")
    if not _CLUSTER_NAME.fullmatch(name):
        raise InvalidRequest(
            f"{name}: The first character of name must be a lowercase letter, and all "
            "following characters must be a dash, lowercase letter, or digit, except the "
            "last character, which cannot be a dash."
        )


def validate_cidr(field: str, value: str) -> None:
    """``lang.VerifyCIDR`` (an empty value is not checked, as upstream)."""
    if value and not _CIDR.fullmatch(value):
        raise InvalidRequest(f"{field} {value} : Type mismatch ex)10.244.0.0/16")


def validate_node_set(node_set: Mapping[str, Any]) -> None:
    """``validateNodeSetReq``: a connection and a machine spec."""
    if not node_set.get("connection"):
        raise InvalidRequest("Connection is empty")
    if not node_set.get("spec"):
        raise InvalidRequest("Machine specification is empty")


def validate_add_nodes(req: Mapping[str, Any]) -> list[Json]:
    """The worker NodeSets of an add-node request (defaults applied), or ``InvalidRequest``
    with upstream's message (``AddNode`` of ``router/node.go``)."""
    if req.get("controlPlane"):
        raise InvalidRequest("Control plane node is not supported")
    workers = [node_set_defaults(s) for s in req.get("worker") or []]
    if not workers:
        raise InvalidRequest("Worker node must be at least one")
    for node_set in workers:
        validate_node_set(node_set)
    return workers


def service_refusal(req: Mapping[str, Any]) -> str | None:
    """The message of ``CreateCluster``'s parameter checks (counts; one connection for a
    single-cloud cluster), or None."""
    control_plane, workers = req["controlPlane"], req["worker"]
    if control_plane[0]["count"] < 1:
        return "Control-Plane count must be at least one."
    for worker in workers:
        if worker["count"] < 1:
            return f"Worker count must be at least one. (connection={worker['connection']})"
    if req["serviceType"] == SINGLE:
        connection = control_plane[0]["connection"]
        for worker in workers:
            if worker["connection"] != connection:
                return (
                    "All nodes must be the same connection config. "
                    f"(connection={worker['connection']})"
                )
    return None


def add_nodes_refusal(
    workers: Iterable[Mapping[str, Any]], spec: Mapping[str, Any] | None = None
) -> str | None:
    """A worker count below one, which the CRD would refuse with a less helpful message; a
    single-cloud cluster's new worker on another connection (``AddNode``'s check)."""
    workers = list(workers)
    for worker in workers:
        if worker["count"] < 1:
            return f"Worker count must be at least one. (connection={worker['connection']})"
    spec = spec or {}
    if spec.get("serviceType") == SINGLE and spec.get("controlPlane"):
        connection = spec["controlPlane"][0].get("connection")
        for worker in workers:
            if worker["connection"] != connection:
                return (
                    "The new node must be the same connection config. "
                    f"(connection={worker['connection']})"
                )
    return None


def nlb_refusal(loadbalancer: str, connection: Mapping[str, Any] | None) -> str | None:
    """``CreateCluster``'s load-balancer check against the control plane's connection config
    (``ProviderName``, ``RegionName``); None when allowed or the config is unknown."""
    if loadbalancer == HAPROXY or not connection:
        return None
    provider = str(connection.get("ProviderName", "")).lower()
    if provider in ("ibm", "ncp"):
        return f"{provider} does not yet supported nlb loadbalancer."
    region = str(connection.get("RegionName", ""))
    if provider == "ncpvpc" and "sgn" not in region and "jpn" not in region:
        return f"To use nlb in {provider}, must use SGN, JPN region"
    return None


# --- naming -----------------------------------------------------------------------------------


def suffix(rng: random.Random | None = None) -> str:
    """Five characters of upstream's alphabet; ``rng`` for reproducible tests."""
    choose = rng.choice if rng else secrets.choice
    return "".join(choose(NAME_ALPHABET) for _ in range(NAME_SUFFIX_LENGTH))


def node_set_id(role: str, index: int, rng: random.Random | None = None) -> str:
    """``lang.GenerateNewNodeName``: ``<role initial>-<index>-<5 characters>``."""
    return f"{role[:1]}-{index}-{suffix(rng)}"


def name_index(name: str) -> int:
    """``lang.GetNodeNameIndex``: the index in ``w-3-abcde`` (or ``w-3-abcde-1``), else 0."""
    parts = name.split("-")
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0


def next_worker_index(obj: Mapping[str, Any]) -> int:
    """One more than the highest worker index in the spec's NodeSets and the status's nodes
    (``Cluster.NextNodeIndex``), so a failed or removed worker's index is never reused."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names = [s.get("id", "") for s in spec.get("worker") or []]
    names += [n.get("name", "") for n in status.get("nodes") or [] if n.get("role") == WORKER]
    return max((name_index(n) for n in names), default=0) + 1


def worker_sets(
    workers: Sequence[Mapping[str, Any]], first_index: int, rng: random.Random | None = None
) -> list[Json]:
    """One NodeSet of size 1 per worker VM, each with its own id from ``first_index`` on."""
    expanded: list[Json] = []
    for worker in workers:
        for _ in range(worker["count"]):
            index = first_index + len(expanded)
            expanded.append(_node_set(worker, node_set_id(WORKER, index, rng), count=1))
    return expanded


def _node_set(node_set: Mapping[str, Any], id_: str, *, count: int) -> Json:
    return {
        "id": id_,
        "connection": node_set["connection"],
        "count": count,
        "spec": node_set["spec"],
        "rootDisk": dict(node_set["rootDisk"]),
        "role": node_set.get("role") or "",
    }


# --- the resource ---------------------------------------------------------------------------


def labels(namespace: str, cluster: str) -> dict[str, str]:
    return {NAMESPACE_LABEL: namespace, CLUSTER_LABEL: cluster}


def cluster_spec(namespace: str, req: Mapping[str, Any], rng: random.Random | None = None) -> Json:
    """The LadybugCluster spec of a validated create request (defaults applied)."""
    k8s = req["config"]["kubernetes"]
    control_plane = req["controlPlane"][0]
    return {
        "namespace": namespace,
        "name": req["name"],
        "controlPlane": [
            _node_set(
                control_plane, node_set_id(CONTROL_PLANE, 1, rng), count=control_plane["count"]
            )
        ],
        "worker": worker_sets(req["worker"], 1, rng),
        "removeNodes": [],
        "serviceType": req["serviceType"],
        "config": {
            "installMonAgent": req["config"]["installMonAgent"],
            "kubernetes": {
                "version": k8s["version"],
                "networkCni": k8s["networkCni"],
                "podCidr": k8s["podCidr"],
                "serviceCidr": k8s["serviceCidr"],
                "serviceDnsDomain": k8s["serviceDnsDomain"],
                "storageclass": _storage_class(k8s.get("storageclass")),
                "loadbalancer": k8s["loadbalancer"],
                "etcd": k8s["etcd"],
            },
        },
        "label": req.get("label") or "",
        "description": req.get("description") or "",
    }


def _storage_class(value: Any) -> Json:
    nfs = ((value or {}).get("nfs")) or {}
    return {"nfs": {"server": nfs.get("server") or "", "path": nfs.get("path") or ""}}


def cluster_object(
    k8s_namespace: str, namespace: str, req: Mapping[str, Any], rng: random.Random | None = None
) -> Json:
    """The LadybugCluster to create for a validated request in Tumblebug ``namespace``.

    It is born with the provisioner's finalizer: a cluster deleted before the provisioner
    first saw it still waits for it, so no MCIS it may already be creating is left behind."""
    name = str(req["name"])
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(namespace, name),
            "namespace": k8s_namespace,
            "labels": labels(namespace, name),
            "finalizers": [FINALIZER],
        },
        "spec": cluster_spec(namespace, req, rng),
    }


def phase(obj: Mapping[str, Any]) -> str:
    """The object's phase; ``Pending`` until the provisioner wrote one (upstream's initial),
    ``Deleting`` as soon as its deletion is asked for."""
    written = (obj.get("status") or {}).get("phase")
    if deleting(obj):
        return LadybugPhase.DELETING.value
    return str(written or LadybugPhase.PENDING.value)


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def observed(obj: Mapping[str, Any], generation: int) -> bool:
    """Whether the status describes ``generation`` (or a later one)."""
    seen = (obj.get("status") or {}).get("observedGeneration")
    return isinstance(seen, int) and seen >= generation


def settled(obj: Mapping[str, Any], generation: int) -> bool:
    """Whether a wait for ``generation`` is over: Failed (nothing more will happen without a
    new request), or Provisioned with that generation observed."""
    current = phase(obj)
    if current == LadybugPhase.FAILED.value:
        return True
    return current == LadybugPhase.PROVISIONED.value and observed(obj, generation)


def node_names(obj: Mapping[str, Any]) -> list[str]:
    return [str(n.get("name")) for n in (obj.get("status") or {}).get("nodes") or []]


def failure_message(obj: Mapping[str, Any], default: str) -> str:
    """Why the last request on ``obj`` failed: the status message, else the message of a
    condition that is False, else ``default``."""
    status = obj.get("status") or {}
    if status.get("message"):
        return str(status["message"])
    for condition in status.get("conditions") or []:
        if condition.get("status") == "False" and condition.get("message"):
            return str(condition["message"])
    return default


@dataclass(frozen=True)
class Outcome:
    """How a wait ended: ``ok``, else ``message`` says why not."""

    ok: bool
    message: str = ""


def create_outcome(obj: Mapping[str, Any]) -> Outcome:
    if phase(obj) == LadybugPhase.PROVISIONED.value:
        return Outcome(ok=True)
    return Outcome(ok=False, message=failure_message(obj, "Failed to provision the cluster."))


def add_outcome(obj: Mapping[str, Any], ids: Iterable[str]) -> Outcome:
    """Added when every new subgroup has its node and the cluster is still Provisioned."""
    subgroups = {str(n.get("subGroup") or "") for n in (obj.get("status") or {}).get("nodes") or []}
    names = node_names(obj)
    missing = [
        i for i in ids if i not in subgroups and not any(n.startswith(f"{i}-") for n in names)
    ]
    if phase(obj) == LadybugPhase.PROVISIONED.value and not missing:
        return Outcome(ok=True)
    default = f"Failed to add nodes. (subgroups={','.join(missing)})"
    return Outcome(ok=False, message=failure_message(obj, default))


def remove_outcome(obj: Mapping[str, Any], node: str) -> Outcome:
    if node not in node_names(obj) and phase(obj) == LadybugPhase.PROVISIONED.value:
        return Outcome(ok=True)
    default = f"Failed to remove a node. (node={node})"
    return Outcome(ok=False, message=failure_message(obj, default))


# --- upstream's JSON shapes (src/core/model/types.go, src/core/app/const.go) -------------------


def status_body(code: int, message: str) -> Json:
    """``app.Status``."""
    return {"kind": "Status", "code": code, "message": message}


_NODE_FIELDS = (
    "publicIp",
    "privateIp",
    "role",
    "spec",
    "csp",
    "createdTime",
    "cspLabel",
    "regionLabel",
    "zoneLabel",
)


def node_view(node: Mapping[str, Any]) -> Json:
    """Upstream's Node, without ``credential`` (the SSH private key never leaves its Secret)."""
    view: Json = {"name": node.get("name") or "", "kind": "Node"}
    for field in _NODE_FIELDS:
        view[field] = node.get(field) or ""
    return view


def cluster_view(obj: Mapping[str, Any], *, kubeconfig: str = "") -> Json:
    """Upstream's Cluster, read from the LadybugCluster and its kubeconfig Secret's value."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    k8s = (spec.get("config") or {}).get("kubernetes") or {}
    return {
        "name": spec.get("name") or "",
        "kind": "Cluster",
        "status": {
            "phase": phase(obj),
            "reason": status.get("reason") or "",
            "message": status.get("message") or "",
        },
        "mcis": status.get("mcis") or "",
        "namespace": spec.get("namespace") or "",
        "k8sVersion": status.get("k8sVersion") or k8s_version(k8s.get("version") or ""),
        "clusterConfig": kubeconfig,
        "cpLeader": status.get("cpLeader") or "",
        "cpGroup": status.get("cpGroup") or "",
        "networkCni": k8s.get("networkCni") or "",
        "label": spec.get("label") or "",
        "installMonAgent": (spec.get("config") or {}).get("installMonAgent") or "",
        "loadbalancer": k8s.get("loadbalancer") or "",
        "etcd": k8s.get("etcd") or "",
        "description": spec.get("description") or "",
        "createdTime": status.get("createdTime") or "",
        "serviceType": spec.get("serviceType") or "",
        "nodes": [node_view(n) for n in status.get("nodes") or []],
    }


def k8s_version(version: str) -> str:
    """Upstream's package version of a Kubernetes version (``1.23.13`` → ``1.23.13-00``)."""
    return f"{version}-00" if version else ""


def cluster_list(items: Iterable[Json]) -> Json:
    return {"kind": "ClusterList", "items": list(items)}


def node_list(obj: Mapping[str, Any] | None) -> Json:
    nodes = (obj.get("status") or {}).get("nodes") or [] if obj else []
    return {"kind": "NodeList", "items": [node_view(n) for n in nodes]}


def find_node(obj: Mapping[str, Any], name: str) -> Json | None:
    for node in (obj.get("status") or {}).get("nodes") or []:
        if node.get("name") == name:
            return node_view(node)
    return None


# --- the spec list (src/rest-api/router/mcir.go, src/core/service/mcir.go) ---------------------

SPEC_MAX = 99999


@dataclass(frozen=True)
class SpecBounds:
    control_plane: bool
    cpu_min: int
    cpu_max: int
    memory_min: int
    memory_max: int


def spec_bounds(
    control_plane: str | None,
    *,
    cpu_min: str | None = None,
    cpu_max: str | None = None,
    memory_min: str | None = None,
    memory_max: str | None = None,
) -> SpecBounds:
    """``validateSpec``: a missing minimum is 1 (2 for a control plane), a missing maximum
    99999, and a value that is no number 0 (Go's ``strconv.Atoi`` error ignored)."""
    is_cp = control_plane == "Y"
    low = 2 if is_cp else 1
    return SpecBounds(
        control_plane=is_cp,
        cpu_min=_bound(cpu_min, low),
        cpu_max=_bound(cpu_max, SPEC_MAX),
        memory_min=_bound(memory_min, low),
        memory_max=_bound(memory_max, SPEC_MAX),
    )


def _bound(value: str | None, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        return 0


def spec_bounds_refusal(bounds: SpecBounds) -> str | None:
    """``VerifySpecList``'s checks, in its order and words."""
    if bounds.control_plane and bounds.cpu_min < 2:
        return f"Kubernetes control plane node needs 2 cpu at least. (cpu-min={bounds.cpu_min})"
    if bounds.control_plane and bounds.memory_min < 2:
        return (
            "Kubernetes control plane node needs 2 memory at least. "
            f"(memory-min={bounds.memory_min})"
        )
    if bounds.cpu_min > bounds.cpu_max:
        return (
            "The cpu-max must be greater than or equal to the cpu-min. "
            f"(cpu-min={bounds.cpu_min} cpu-max={bounds.cpu_max})"
        )
    if bounds.memory_min > bounds.memory_max:
        return (
            "The memory-max must be greater than or equal to the memory-min. "
            f"(memory-min={bounds.memory_min} memory-max={bounds.memory_max})"
        )
    return None


def spec_list(connection: str, specs: Iterable[Mapping[str, Any]], bounds: SpecBounds) -> Json:
    """Tumblebug's ``lookupSpecs`` items (``mem`` in MiB, ``vcpu.count``, strings) filtered by
    ``bounds`` (memory in GiB, rounded down as upstream), as upstream's ``specList``. Keys
    match without regard to case, as Go's decoder reads them (Tumblebug passes CB-Spider's
    ``Name``/``VCpu``/``Mem`` through). ``Refused`` names a value that is no number."""
    items: list[Json] = []
    for spec in specs:
        vcpu = _field(spec, "vcpu") or {}
        count, clock = _field(vcpu, "count"), _field(vcpu, "clock")
        cpu = _number(count, f"Failed to convert CPU. (CPU={count})")
        memory = _field(spec, "mem")
        mem = _number(memory, f"Failed to convert memory. (memory={memory})") // 1024
        if (
            bounds.cpu_min <= cpu <= bounds.cpu_max
            and bounds.memory_min <= mem <= bounds.memory_max
        ):
            cpu_view = {"count": str(count), "clock": str(clock or "")}
            items.append({"name": _field(spec, "name") or "", "memory": str(mem), "cpu": cpu_view})
    return {"kind": "specList", "connectionName": connection, "items": items}


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` with the key's case ignored (Go's ``encoding/json``)."""
    if name in obj:
        return obj[name]
    wanted = name.lower()
    return next((v for k, v in obj.items() if k.lower() == wanted), None)


def _number(value: Any, message: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise Refused(message) from None
