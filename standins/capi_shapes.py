"""Pure pieces of the Cluster API stand-in: names, labels, conditions, object shapes, plans.

Nothing here does I/O, so the decisions the controllers take (which status an object should
have, which Machine to create or delete next) can be read, and tested, on their own. Shapes
follow ``docs/upstream.md`` §3 and §5; the capi-operator reads exactly these
fields (upstream H10 to H16, ``docs/upstream.md`` §1).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import secrets
import uuid
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.kube import ResourceKind
from shared.resources import MACHINE, OPENSTACK_MACHINE

Json = dict[str, Any]

OPENSTACK_MACHINE_TEMPLATE = ResourceKind(
    "openstackmachinetemplate",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackMachineTemplate",
    "openstackmachinetemplates",
)

# Labels: the chart's (prefix capi.stackhpc.com) and Cluster API's own.
CLUSTER_LABEL = "capi.stackhpc.com/cluster"
COMPONENT_LABEL = "capi.stackhpc.com/component"
NODE_GROUP_LABEL = "capi.stackhpc.com/node-group"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CONTROL_PLANE_NAME_LABEL = "cluster.x-k8s.io/control-plane-name"
DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
SET_NAME_LABEL = "cluster.x-k8s.io/set-name"
TEMPLATE_HASH_LABEL = "machine-template-hash"
MIN_SIZE_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"

# Finalizers, as the real controllers name them.
CLUSTER_FINALIZER = "cluster.cluster.x-k8s.io"
MACHINE_FINALIZER = "machine.cluster.x-k8s.io"
ADDON_FINALIZER = "addons.stackhpc.com/finalizer"

# kubernetes' rand.String alphabet: no vowels, so generated names never spell words.
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels_of(obj: Json) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def phase_of(obj: Json) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def is_deleting(obj: Json) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def finalizers_of(obj: Json) -> list[str]:
    return list(obj.get("metadata", {}).get("finalizers") or [])


def cluster_name_of(obj: Json) -> str:
    """The CAPI Cluster an object belongs to (for a CAPI Cluster: itself)."""
    spec_name = (obj.get("spec") or {}).get("clusterName")
    labels = labels_of(obj)
    return str(
        spec_name
        or labels.get(CLUSTER_LABEL)
        or labels.get(CLUSTER_NAME_LABEL)
        or obj["metadata"]["name"]
    )


def random_suffix(length: int = 5) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def stable_suffix(*parts: str, length: int = 5) -> str:
    """A name-safe digest: the same inputs always give the same suffix."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:length])


def address_for(seed: str, prefix: str = "10.0") -> str:
    value = zlib.crc32(seed.encode())
    return f"{prefix}.{value % 250}.{(value >> 8) % 250 + 2}"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("-")[0].split(".") if p.isdigit())


def owner_ref(obj: Json, *, controller: bool) -> Json:
    ref = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }
    return {**ref, "controller": True} if controller else ref


def has_owner(obj: Json, owner: Json) -> bool:
    uid = owner["metadata"]["uid"]
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def adopted(obj: Json, owner: Json, *, controller: bool) -> list[Json] | None:
    """``obj``'s ownerReferences with ``owner`` added, or None if it is one already. As
    controller only if asked and nothing else controls ``obj`` (the API server refuses two):
    an object another provider created as its controller's (a control plane's clone) gets an
    owner link only."""
    if has_owner(obj, owner):
        return None
    refs = list(obj["metadata"].get("ownerReferences") or [])
    controlled = any(r.get("controller") for r in refs)
    return [*refs, owner_ref(owner, controller=controller and not controlled)]


# --- conditions (Cluster API v1beta1 shape) -------------------------------------------------


def condition(kind: str, ok: bool, reason: str = "", *, severity: str = "Info") -> Json:
    cond: Json = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now()}
    if not ok:
        cond["severity"] = severity
        cond["reason"] = reason
    return cond


def find_condition(obj: Json, kind: str) -> Json | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def condition_true(obj: Json, kind: str) -> bool:
    cond = find_condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def merge_conditions(existing: list[Json], wanted: list[Json]) -> list[Json]:
    """``wanted``, keeping the old transition time of every condition whose status held."""
    before = {c.get("type"): c for c in existing}
    merged = []
    for cond in wanted:
        old = before.get(cond["type"])
        kept = old is not None and old.get("status") == cond["status"]
        since = old.get("lastTransitionTime") if old is not None and kept else None
        merged.append({**cond, "lastTransitionTime": since or cond["lastTransitionTime"]})
    return merged


def _signature(conditions: list[Json]) -> list[tuple[Any, ...]]:
    return [(c.get("type"), c.get("status"), c.get("reason")) for c in conditions]


def status_differs(current: Json, wanted: Json) -> bool:
    """True when writing ``wanted`` would change ``current`` (transition times aside)."""
    for key, value in wanted.items():
        if key == "conditions":
            if _signature(current.get(key) or []) != _signature(value):
                return True
        elif current.get(key) != value:
            return True
    return False


# --- objects -------------------------------------------------------------------------------


def template_hash(version: str, template_name: str) -> str:
    """What a Machine was built from; a Machine whose hash differs is out of date."""
    return stable_suffix(version, template_name, length=10)


def openstack_machine(*, name: str, namespace: str, labels: dict[str, str], template: Json) -> Json:
    """An OpenStackMachine cloned from ``template`` (so ``spec.flavor`` is the template's)."""
    return infrastructure_machine(
        kind=OPENSTACK_MACHINE, name=name, namespace=namespace, labels=labels, template=template
    )


def infrastructure_machine(
    *, kind: ResourceKind, name: str, namespace: str, labels: dict[str, str], template: Json
) -> Json:
    """A ``kind`` object cloned from the machine ``template``, as CAPI's
    ``external.CreateFromTemplate`` does: the template's ``spec.template.spec``, its
    ``spec.template.metadata`` under the Machine's labels, and where it came from."""
    meta = template["metadata"]
    resource = template.get("spec", {}).get("template", {})
    extra = resource.get("metadata") or {}
    template_kind = kind.kind + "Template"
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(extra.get("labels") or {}), **labels},
            "annotations": {
                **(extra.get("annotations") or {}),
                "cluster.x-k8s.io/cloned-from-name": meta["name"],
                "cluster.x-k8s.io/cloned-from-groupkind": f"{template_kind}.{kind.group}",
            },
        },
        "spec": copy.deepcopy(resource.get("spec") or {}),
    }


def machine(
    *,
    name: str,
    namespace: str,
    cluster: str,
    version: str,
    labels: dict[str, str],
    owner: Json,
    infrastructure: Json | None = None,
    bootstrap: Json | None = None,
) -> Json:
    """A Machine; with an ``infrastructure`` reference (a provider other than OpenStack) its
    bootstrap data is named later, once written (``capi_infra.bootstrap``), or by the
    bootstrap config ``bootstrap`` names (``{"configRef": …}``, ``capi_assisted``)."""
    if bootstrap is None:
        bootstrap = {} if infrastructure else {"dataSecretName": name}
    return {
        "apiVersion": MACHINE.api_version,
        "kind": MACHINE.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "finalizers": [MACHINE_FINALIZER],
            "ownerReferences": [owner_ref(owner, controller=True)],
        },
        "spec": {
            "clusterName": cluster,
            "version": version,
            "bootstrap": bootstrap,
            "infrastructureRef": infrastructure
            or {
                "apiVersion": OPENSTACK_MACHINE.api_version,
                "kind": OPENSTACK_MACHINE.kind,
                "name": name,
                "namespace": namespace,
            },
        },
    }


def running_status(obj: Json, *, healthy: bool) -> Json:
    name = obj["metadata"]["name"]
    reason = "" if healthy else "NodeConditionsFailed"
    return {
        "phase": "Running",
        "bootstrapReady": True,
        "infrastructureReady": True,
        "addresses": [{"type": "InternalIP", "address": address_for(name)}],
        "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": str(uuid.uuid4())},
        "nodeInfo": {"kubeletVersion": obj["spec"].get("version", "")},
        "lastUpdated": now(),
        "conditions": [
            condition("Ready", healthy, reason, severity="Warning"),
            condition("BootstrapReady", True),
            condition("InfrastructureReady", True),
            condition("NodeHealthy", healthy, reason, severity="Warning"),
        ],
    }


def kubeconfig_text(server_host: str, port: int, cluster: str) -> str:
    """A placeholder kubeconfig, for when no real one was configured."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {"server": f"https://{server_host}:{port}"}}],
            "users": [{"name": f"{cluster}-admin", "user": {}}],
            "contexts": [
                {"name": cluster, "context": {"cluster": cluster, "user": f"{cluster}-admin"}}
            ],
            "current-context": cluster,
        }
    )


def kubeconfig_secret(*, cluster: str, namespace: str, value: str, owner: Json) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "cluster.x-k8s.io/secret",
        "metadata": {
            "name": f"{cluster}-kubeconfig",
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [owner_ref(owner, controller=True)],
        },
        "data": {"value": base64.b64encode(value.encode()).decode()},
    }


def bootstrap_secret(machine: Json) -> Json:
    """The kubeadm bootstrap provider's output for ``machine``: cloud-init naming it."""
    meta = machine["metadata"]
    name, cluster = meta["name"], str(machine["spec"].get("clusterName", ""))
    role = "control-plane" if CONTROL_PLANE_LABEL in labels_of(machine) else "worker"
    text = (
        "#cloud-config\n"
        f"# bootstrap data of Machine {meta['namespace']}/{name}, {role} of Cluster {cluster}\n"
        f"hostname: {name}\n"
        "runcmd:\n"
        f"  - echo 'bootstrapping {name}'\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "cluster.x-k8s.io/secret",
        "metadata": {
            "name": f"{name}-bootstrap",
            "namespace": meta["namespace"],
            "labels": {CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [owner_ref(machine, controller=True)],
        },
        "data": {
            "value": base64.b64encode(text.encode()).decode(),
            "format": base64.b64encode(b"cloud-config").decode(),
        },
    }


# --- machine plans -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The next change to a set of Machines: create some, or delete some, or wait."""

    create: int = 0
    delete: tuple[Json, ...] = ()


def _created(obj: Json) -> tuple[str, str]:
    meta = obj["metadata"]
    return (str(meta.get("creationTimestamp", "")), str(meta["name"]))


def plan_machines(
    machines: list[Json], *, desired: int, template: str, surge: bool, batch: bool
) -> Plan:
    """Converge ``machines`` on ``desired`` Machines built from ``template``.

    ``batch`` (a MachineSet) creates or deletes all the difference at once; otherwise (the
    KubeadmControlPlane) one Machine at a time, each after the previous one settled. Out-of-date
    Machines are always replaced one by one: with ``surge`` the new one comes first.
    """
    live = [m for m in machines if not is_deleting(m)]
    busy = len(live) < len(machines) or any(phase_of(m) != "Running" for m in live)
    old = [m for m in live if labels_of(m).get(TEMPLATE_HASH_LABEL) != template]
    if old:
        if busy:
            return Plan()
        if len(live) < desired or (surge and len(live) == desired):
            return Plan(create=1)
        return Plan(delete=(min(old, key=_created),))
    if len(live) == desired or (busy and not batch):
        return Plan()
    if len(live) < desired:
        return Plan(create=desired - len(live) if batch else 1)
    # Scale down: machines still coming up go first, then the newest.
    newest_first = sorted(live, key=_created, reverse=True)
    excess = sorted(newest_first, key=lambda m: phase_of(m) == "Running")[: len(live) - desired]
    return Plan(delete=tuple(excess if batch else excess[:1]))


def lowest_version(machines: list[Json], default: str) -> str:
    versions = [str(m["spec"].get("version")) for m in machines if m["spec"].get("version")]
    return min(versions, key=version_key) if versions else default


def unhealthy_limit(setting: str, workers: int) -> int:
    """``STANDIN_CAPI_UNHEALTHY_MACHINES``: a count ("2") or a fraction ("0.5", "1.0")."""
    if not setting:
        return 0
    if "." in setting:
        fraction = float(setting)
        return min(workers, int(-(-fraction * workers // 1)))  # ceil, so 0.1 of 3 is one
    return int(setting)
