"""Pure rules of the monitor: which Cluster an object speaks for, and what it says.

Each watched kind maps to a fragment of the Azimuth Cluster's status, as upstream's event
handlers H10-H16 map it (``docs/upstream.md`` §1; the rules in ``azimuth_capi/status.py``),
written as an RFC 7386 merge patch whose ``None`` removes a key:

==============================  ==================================================  ==========
kind                            fragment                                            on DELETED
==============================  ==================================================  ==========
CAPI Cluster                    ``networkingPhase``                                 Unknown
KubeadmControlPlane             ``controlPlanePhase``, ``kubernetesVersion``        Unknown,
                                                                                    removed
Machine                         ``nodes.<machine>``                                 removed
HelmRelease, Manifests          ``addons.<component>`` (phase, revision)            removed
Flux Kustomization              ``addons.<component>`` (from its first condition)   removed
kubeconfig Secret (below)       ``kubeconfigSecretName``                            nothing
==============================  ==================================================  ==========

The kubeconfig Secret is the one the portal hands to users (H16): ``<cluster>-kubeconfig``
from CAPI, or with OIDC on ``<cluster>-kubeconfig-user`` from the identity service (which
copies the CAPI label, so it arrives here too). With OIDC on the admin Secret says nothing, so
the status only ever names the OIDC kubeconfig, from the moment it exists.

Every phase is checked against its enum; a string another controller invents becomes
Unknown here instead of a 422 from the API server that would sink the whole status write.

``difference`` then cuts a fragment down to what the Cluster does not already say (a node's
``created`` in another spelling of the same instant says the same), so an event that changes
nothing the portal shows costs no write at all; ``ClusterViews`` keeps
what the monitor believes each Cluster says between reads.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.monitor import capi
from shared import freshness
from shared.kube import ResourceKind
from shared.mergepatch import apply
from shared.messages import EventType, ResourceChanged
from shared.models.azimuth import (
    AddonPhase,
    ControlPlanePhase,
    NetworkingPhase,
    NodePhase,
    NodeRole,
)
from shared.phase import as_enum, parse_time
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    KUSTOMIZATION,
    MACHINE,
    MANIFESTS,
    SECRET,
)

log = logging.getLogger(__name__)

Json = dict[str, Any]

CLUSTER_LABEL = "capi.stackhpc.com/cluster"
COMPONENT_LABEL = "capi.stackhpc.com/component"
NODE_GROUP_LABEL = "capi.stackhpc.com/node-group"
CAPI_CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
KUBECONFIG_SUFFIX = "-kubeconfig"
USER_KUBECONFIG_SUFFIX = "-kubeconfig-user"

#: Kinds the monitor follows, in the order their subscriptions are declared.
WATCHED: tuple[ResourceKind, ...] = (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    HELM_RELEASE,
    MANIFESTS,
    KUSTOMIZATION,
    SECRET,
)

_BY_REF = {(k.api_version, k.kind): k for k in WATCHED}

#: What a missing top-level key means (status is stored with defaults omitted).
STATUS_DEFAULTS: Json = {"networkingPhase": "Unknown", "controlPlanePhase": "Unknown"}
#: Keys holding a timestamp, equal when they name the same instant: upstream stored a node's
#: ``created`` as pydantic prints a datetime (``…+00:00``), we copy the Machine's
#: ``creationTimestamp`` (``…Z``); rewriting every node of a Cluster taken over from upstream
#: would be a status write that changes nothing.
TIMESTAMPS = frozenset({"created"})


def _meta(obj: Json) -> Json:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _labels(obj: Json) -> dict[str, str]:
    return _meta(obj).get("labels") or {}


def latest_per_kind(
    changes: Sequence[ResourceChanged],
) -> list[tuple[ResourceKind, ResourceChanged]]:
    """The newest change of each watched kind among ``changes``, one per kind.

    One subscription carries every kind, so a CAPI Cluster and a Secret that share a name
    share a queue and can arrive in one batch: each kind keeps its own latest event. Newest
    by the object's resourceVersion, not by stream order (``shared.freshness`` says why
    they differ).
    """
    by_kind: dict[ResourceKind, list[ResourceChanged]] = {}
    for change in changes:
        kind = _BY_REF.get((change.ref.api_version, change.ref.kind))
        if kind is not None:
            by_kind.setdefault(kind, []).append(change)
    latest = ((kind, freshness.newest(events)) for kind, events in by_kind.items())
    return [(kind, change) for kind, change in latest if change is not None]


def owner(kind: ResourceKind, obj: Json, *, oidc: bool = False) -> str | None:
    """The name of the Azimuth Cluster (same namespace) ``obj`` reports on, if any.

    Of all Secrets only the users' kubeconfig matters (the module docstring says which, by
    ``oidc``); CAPI labels its CA, etcd and service-account Secrets alike, and upstream
    rewrote the status for every one of them.
    """
    labels = _labels(obj)
    if kind == SECRET:
        # Exactly ``<cluster>-kubeconfig[-user]``, as the identity service matches them.
        cluster = labels.get(CAPI_CLUSTER_NAME_LABEL)
        if not cluster or _meta(obj).get("name") != kubeconfig_secret_name(cluster, oidc=oidc):
            return None
        return cluster
    return labels.get(CLUSTER_LABEL) or None


def kubeconfig_secret_name(cluster: str, *, oidc: bool) -> str:
    """The Secret ``status.kubeconfigSecretName`` names (the module docstring says why)."""
    return f"{cluster}{USER_KUBECONFIG_SUFFIX if oidc else KUBECONFIG_SUFFIX}"


# --- one mapping per kind ------------------------------------------------------------------


def networking_phase(obj: Json) -> NetworkingPhase:
    return as_enum(NetworkingPhase, capi.phase(obj))


def control_plane_phase(obj: Json) -> ControlPlanePhase:
    """From the legacy ``Ready`` condition as upstream; v1beta2-only objects by analogy."""
    legacy = capi.legacy_conditions(obj)
    if legacy or not capi.new_conditions(obj):
        ready = capi.find(legacy, "Ready")
        return _from_ready(obj, ready) if ready else ControlPlanePhase.PENDING
    return _from_v1beta2(capi.new_conditions(obj))


_READY_REASONS = {
    "ScalingUp": ControlPlanePhase.SCALING_UP,
    "ScalingDown": ControlPlanePhase.SCALING_DOWN,
    "RollingUpdateInProgress": ControlPlanePhase.UPGRADING,
    "Deleting": ControlPlanePhase.DELETING,
}


def _from_ready(obj: Json, ready: Json) -> ControlPlanePhase:
    if capi.is_true(ready):
        healthy = capi.is_true(capi.condition(obj, "ControlPlaneComponentsHealthy"))
        return ControlPlanePhase.READY if healthy else ControlPlanePhase.UNHEALTHY
    reason = str(ready.get("reason") or "")
    if reason in _READY_REASONS:
        return _READY_REASONS[reason]
    if reason.startswith("Waiting"):
        return ControlPlanePhase.SCALING_UP
    log.warning("control plane %s: unexpected Ready reason %r", _meta(obj).get("name"), reason)
    return ControlPlanePhase.UNHEALTHY


# v1beta2 reports each transition as its own True condition instead of a Ready reason.
_V1BETA2_TRANSITIONS = (
    ("Deleting", ControlPlanePhase.DELETING),
    ("RollingOut", ControlPlanePhase.UPGRADING),
    ("ScalingUp", ControlPlanePhase.SCALING_UP),
    ("ScalingDown", ControlPlanePhase.SCALING_DOWN),
)


def _from_v1beta2(conditions: list[Json]) -> ControlPlanePhase:
    for kind, phase in _V1BETA2_TRANSITIONS:
        if capi.is_true(capi.find(conditions, kind)):
            return phase
    available = capi.find(conditions, "Available")
    if available is None:
        return ControlPlanePhase.PENDING
    if capi.is_true(available):
        healthy = capi.is_true(capi.find(conditions, "ControlPlaneComponentsHealthy"))
        return ControlPlanePhase.READY if healthy else ControlPlanePhase.UNHEALTHY
    # Not yet initialised is upstream's WaitingForKubeadmInit: still coming up.
    initialized = capi.is_true(capi.find(conditions, "Initialized"))
    return ControlPlanePhase.UNHEALTHY if initialized else ControlPlanePhase.SCALING_UP


def node_phase(obj: Json) -> NodePhase:
    phase = capi.phase(obj)
    if phase is None:
        # Not reconciled yet: CAPI's first phase for a new Machine is Pending. Upstream shows
        # Unknown, which turns the whole Cluster Unhealthy for a moment on every scale-up.
        return NodePhase.PENDING
    # v1beta2's in-place Updating is a Running machine (the v1beta1 view says Running).
    if phase in ("Running", "Updating"):
        healthy = capi.is_true(capi.condition(obj, "NodeHealthy"))
        return NodePhase.READY if healthy else NodePhase.UNHEALTHY
    if phase == "Provisioned":
        return NodePhase.PROVISIONING
    return as_enum(NodePhase, phase)


def node_status(obj: Json, *, size: str | None) -> Json:
    """The full ``nodes.<machine>`` entry; ``None`` marks a field to remove."""
    labels = _labels(obj)
    ips = capi.internal_ips(obj)
    return {
        "role": as_enum(NodeRole, labels.get(COMPONENT_LABEL)).value,
        "phase": node_phase(obj).value,
        "size": size or None,
        "ip": ips[0] if ips else None,
        "ips": ips,
        "kubeletVersion": capi.machine_version(obj),
        "nodeGroup": labels.get(NODE_GROUP_LABEL) or None,
        "created": _meta(obj).get("creationTimestamp") or None,
    }


def addon_status(obj: Json) -> Json:
    status = obj.get("status") or {}
    return {
        "phase": as_enum(AddonPhase, status.get("phase")).value,
        "revision": _revision(status.get("revision")),
    }


def flux_status(obj: Json) -> Json:
    """Upstream reads only the *first* condition of a Flux Kustomization."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    if not conditions or not isinstance(conditions[0], dict):
        return {"phase": AddonPhase.UNKNOWN.value, "revision": 0}
    first = conditions[0]
    if first.get("type", "Ready") != "Ready":
        phase = AddonPhase.PENDING
    elif first.get("status", "False") == "True":
        phase = AddonPhase.DEPLOYED
    else:
        phase = AddonPhase.FAILED
    return {"phase": phase.value, "revision": _revision(first.get("observedGeneration"))}


def _revision(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# --- the fragment for one event ------------------------------------------------------------

Mapping = Callable[[bool, Json, str | None], Json]


def _capi_cluster(deleted: bool, obj: Json, size: str | None) -> Json:
    phase = NetworkingPhase.UNKNOWN if deleted else networking_phase(obj)
    return {"networkingPhase": phase.value}


def _control_plane(deleted: bool, obj: Json, size: str | None) -> Json:
    if deleted:
        return {"controlPlanePhase": ControlPlanePhase.UNKNOWN.value, "kubernetesVersion": None}
    return {
        "controlPlanePhase": control_plane_phase(obj).value,
        "kubernetesVersion": capi.control_plane_version(obj),
    }


def _machine(deleted: bool, obj: Json, size: str | None) -> Json:
    return {"nodes": {_meta(obj)["name"]: None if deleted else node_status(obj, size=size)}}


def _addon(status: Callable[[Json], Json]) -> Mapping:
    def mapping(deleted: bool, obj: Json, size: str | None) -> Json:
        component = _labels(obj).get(COMPONENT_LABEL)
        if not component:
            return {}
        return {"addons": {component: None if deleted else status(obj)}}

    return mapping


def _kubeconfig(deleted: bool, obj: Json, size: str | None) -> Json:
    # ``owner`` already let only the users' kubeconfig through. A deleted one keeps its name:
    # CAPI or the identity service writes it again under the same name.
    return {} if deleted else {"kubeconfigSecretName": _meta(obj)["name"]}


MAPPINGS: dict[str, Mapping] = {
    CAPI_CLUSTER.token: _capi_cluster,
    CONTROL_PLANE.token: _control_plane,
    MACHINE.token: _machine,
    HELM_RELEASE.token: _addon(addon_status),
    MANIFESTS.token: _addon(addon_status),
    KUSTOMIZATION.token: _addon(flux_status),
    SECRET.token: _kubeconfig,
}


def fragment(kind: ResourceKind, event: EventType, obj: Json, *, size: str | None = None) -> Json:
    """What ``obj`` (of ``kind``, seen as ``event``) says about its Cluster's status."""
    mapping = MAPPINGS.get(kind.token)
    return mapping(event == "DELETED", obj, size) if mapping else {}


# --- comparing with the Cluster ------------------------------------------------------------


def difference(current: Json, wanted: Json, defaults: Json = STATUS_DEFAULTS) -> Json:
    """The smallest merge patch that makes ``current`` say what ``wanted`` says.

    Keys ``wanted`` does not name are left alone (other services own them); ``None`` in
    ``wanted`` removes a key only if it is there.
    """
    patch: Json = {}
    for key, want in wanted.items():
        have = current.get(key, defaults.get(key))
        if want is None:
            if key in current:
                patch[key] = None
        elif isinstance(want, dict) and isinstance(have, dict):
            nested = difference(have, want, {})
            if nested:
                patch[key] = nested
        elif isinstance(want, dict):
            added = _without_nones(want)
            if added:
                patch[key] = added
        elif want != have and not (key in TIMESTAMPS and _same_instant(want, have)):
            patch[key] = want
    return patch


def _same_instant(a: Any, b: Any) -> bool:
    moment = parse_time(a)
    return moment is not None and moment == parse_time(b)


def _without_nones(value: Json) -> Json:
    return {
        k: _without_nones(v) if isinstance(v, dict) else v
        for k, v in value.items()
        if v is not None
    }


@dataclass
class View:
    """One Cluster incarnation as the monitor believes it is."""

    uid: str
    status: Json
    read_at: float
    sent: list[tuple[float, Json]] = field(default_factory=list)


class ClusterViews:
    """Per Cluster: the status last read, with every patch sent since folded in.

    A read stands for ``ttl`` seconds, so a burst of Machine events costs one GET, not one
    per Machine. Folding in what was sent matters more than saving reads: a patch travels
    through the bus and the writer before it lands, and comparing a newer event against a
    read that predates it could conclude "nothing to change" while the older patch is still
    on its way. So a fresh read of the same incarnation gets the patches of the last
    ``replay`` seconds applied again; that is always safe because the monitor alone writes
    these keys and merge patches are idempotent. A new uid starts from its own status.
    """

    def __init__(self, *, size: int, ttl: float, replay: float) -> None:
        self.size = size
        self.ttl = ttl
        self.replay = replay
        self._views: OrderedDict[str, View] = OrderedDict()

    def get(self, key: str, now: float) -> View | None:
        """The view of ``key`` if its read is still fresh."""
        view = self._views.get(key)
        if view is None or now - view.read_at >= self.ttl:
            return None
        self._views.move_to_end(key)
        return view

    def read(self, key: str, cluster: Json, now: float) -> View:
        """Start from a Cluster just read from the API server."""
        uid = str(cluster["metadata"]["uid"])
        status = cluster.get("status") or {}
        before = self._views.get(key)
        sent = before.sent if before is not None and before.uid == uid else []
        sent = [(at, patch) for at, patch in sent if now - at < self.replay]
        for _, patch in sent:
            status = apply(status, patch)
        view = View(uid=uid, status=status, read_at=now, sent=sent)
        self._store(key, view)
        return view

    def record(self, view: View, patch: Json, now: float) -> None:
        """``patch`` was sent for ``view``."""
        view.status = apply(view.status, patch)
        view.sent = [(at, p) for at, p in view.sent if now - at < self.replay] + [(now, patch)]

    def forget(self, key: str) -> None:
        self._views.pop(key, None)

    def _store(self, key: str, view: View) -> None:
        if self.size == 0:
            return
        self._views[key] = view
        self._views.move_to_end(key)
        while len(self._views) > self.size:
            self._views.popitem(last=False)

    def __len__(self) -> int:
        return len(self._views)
