"""Pure rules of the lease service: what a Lease means for its Cluster, and how to hold it.

**Verdicts** (``assess``) follow the Lease ``status.phase`` the schedule operator writes
(``docs/upstream.md`` §5): ``Active`` is ready and hands ``sizeNameMap`` to the Helm values;
``Error`` is not ready and, unlike upstream, carries the schedule operator's ``errorMessage``
to the user; every other phase waits. A phase string nobody knows becomes ``Unknown`` with a
warning instead of an exception (upstream's ``status.lease_updated`` parses it into its enum,
so an unknown one drops the whole event). A missing ``phase`` is ``Unknown``, as upstream
reads it (``lease_status.get("phase", "Unknown")`` in ``azimuth_capi/operator.py``).

**Holding the Lease** is a finalizer (the bare group ``azimuth.stackhpc.com``, as upstream, so
either operator can take over from the other) and a non-controller ownerReference. Both are
written as JSON patches that first ``test`` the resourceVersion they were computed from:
finalizers and ownerReferences are lists other controllers edit too, and a patch computed
from a stale copy must fail rather than clobber their entries. The patches only append or
remove our own entries, so a retry after a lost race never duplicates one.

**Saying things once.** Status is compared with the Cluster as read (the API server is the
truth): ``status_change`` is None when the Cluster already says it, and the reporter
(``shared.status``) gives a change one message per cause, so a redelivered event stores
nothing new. The prerequisite is compared with the last one this service published; its id
includes the previous one's, so a return to an earlier state (Active, Error, Active again) is
a new fact that JetStream's duplicate window must not swallow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from shared.messages import Condition, ObjectRef, PrerequisiteChanged, stable_id
from shared.models.azimuth import LeasePhase
from shared.resources import AZIMUTH, CLUSTER, cluster_ref

Json = dict[str, Any]

STEP = "lease"
CONDITION_TYPE = "LeaseReady"


class Reason:
    ACTIVE = "Active"
    ERROR = "LeaseError"
    NOT_ACTIVE = "LeaseNotActive"
    NOT_FOUND = "LeaseNotFound"
    WAITING_FOR_CAPI = "WaitingForClusterAPI"
    RELEASED = "Released"
    REJECTED = "LeasePatchRejected"


# --- the Cluster, live or last known -------------------------------------------------------


@dataclass(frozen=True)
class ClusterView:
    """What the lease service needs of an Azimuth Cluster; ``gone`` when only history is left."""

    namespace: str
    name: str
    uid: str
    generation: int
    lease_name: str | None
    paused: bool = False
    deleting: bool = False
    gone: bool = False
    #: the Cluster as read or last seen; empty when only a Lease's ownerReference names it
    obj: Json = field(default_factory=dict)

    @classmethod
    def of(cls, obj: Json, *, gone: bool = False) -> ClusterView:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 0),
            lease_name=spec.get("leaseName") or None,
            paused=bool(spec.get("paused")),
            deleting=gone or is_deleting(obj),
            gone=gone,
            obj=obj,
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def status(self) -> Json:
        return self.obj.get("status") or {}

    @property
    def ref(self) -> ObjectRef:
        return cluster_ref(self.namespace, self.name, self.uid or None)


def gone_cluster(last_known: Json | None, lease: Json | None) -> ClusterView | None:
    """The deleted Cluster as last seen on the bus, else as its Lease's ownerReference names it.

    The Lease from the event that brought us here stands in for ``spec.leaseName`` when the
    history does not name one: its ownerReference says it belonged to this Cluster.
    """
    lease_name = lease["metadata"]["name"] if lease is not None else None
    if last_known is not None:
        view = ClusterView.of(last_known, gone=True)
        return view if view.lease_name else replace(view, lease_name=lease_name)
    owner = owning_cluster(lease) if lease is not None else None
    if lease is None or owner is None:
        return None
    return ClusterView(
        namespace=lease["metadata"]["namespace"],
        name=owner["name"],
        uid=owner.get("uid") or "",
        generation=0,
        lease_name=lease_name,
        deleting=True,
        gone=True,
    )


def is_deleting(obj: Json) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


# --- ownership -----------------------------------------------------------------------------


def owning_cluster(lease: Json) -> Json | None:
    """The ownerReference to an Azimuth Cluster, the way the portal and upstream link them."""
    for owner in lease.get("metadata", {}).get("ownerReferences") or []:
        group = str(owner.get("apiVersion", "")).split("/")[0]
        if group == AZIMUTH and owner.get("kind") == CLUSTER.kind and owner.get("name"):
            return dict(owner)
    return None


def adoption_patch(lease: Json, *, owner: Json, finalizer: str) -> list[Json]:
    """JSON patch adding our finalizer and ``owner`` where missing; ``[]`` if already adopted."""
    meta = lease["metadata"]
    ops: list[Json] = []
    finalizers = meta.get("finalizers")
    if finalizer not in (finalizers or []):
        ops.append(_append("/metadata/finalizers", finalizers, finalizer))
    owners = meta.get("ownerReferences")
    if not any(o.get("uid") == owner["uid"] for o in owners or []):
        ops.append(_append("/metadata/ownerReferences", owners, owner))
    return _guarded(meta, ops)


def release_patch(lease: Json, *, finalizer: str) -> list[Json]:
    """JSON patch removing every copy of our finalizer; ``[]`` if it holds none."""
    meta = lease["metadata"]
    held = [i for i, f in enumerate(meta.get("finalizers") or []) if f == finalizer]
    # Highest index first, so each removal leaves the next index in place.
    ops: list[Json] = [{"op": "remove", "path": f"/metadata/finalizers/{i}"} for i in held[::-1]]
    return _guarded(meta, ops)


def _append(path: str, current: list[Any] | None, value: Any) -> Json:
    if current is None:
        # "/-" needs an existing list; the API server omits empty ones.
        return {"op": "add", "path": path, "value": [value]}
    return {"op": "add", "path": f"{path}/-", "value": value}


def _guarded(meta: Json, ops: list[Json]) -> list[Json]:
    if not ops:
        return []
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}
    return [test, *ops]


# --- verdicts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prerequisite:
    ready: bool
    reason: str
    detail: str = ""
    outputs: Json = field(default_factory=dict)
    released: bool = False


@dataclass(frozen=True)
class Verdict:
    """What one look at the Lease means: status phase, condition and prerequisite."""

    #: None leaves ``status.leasePhase`` as it is
    phase: LeasePhase | None
    condition: Condition
    prerequisite: Prerequisite
    #: a phase string no known schedule operator writes, reported as Unknown
    unrecognised: str | None = None


def parse_phase(raw: Any) -> tuple[LeasePhase, str | None]:
    """(phase, the raw value if it was not a known phase)."""
    if not raw:
        return LeasePhase.UNKNOWN, None
    try:
        return LeasePhase(raw), None
    except ValueError:
        return LeasePhase.UNKNOWN, str(raw)


def assess(lease: Json | None, lease_name: str) -> Verdict:
    if lease is None:
        detail = f"lease {lease_name} not found"
        return _not_ready(LeasePhase.UNKNOWN, Reason.NOT_FOUND, detail)
    status = lease.get("status") or {}
    phase, unrecognised = parse_phase(status.get("phase"))
    if phase is LeasePhase.ACTIVE:
        outputs = {"sizeNameMap": _string_map(status.get("sizeNameMap"))}
        return Verdict(
            phase=phase,
            condition=_condition(True, Reason.ACTIVE, ""),
            prerequisite=Prerequisite(ready=True, reason=Reason.ACTIVE, outputs=outputs),
        )
    if phase is LeasePhase.ERROR:
        return _not_ready(phase, Reason.ERROR, str(status.get("errorMessage") or ""))
    verdict = _not_ready(phase, Reason.NOT_ACTIVE, f"lease is {phase}")
    return replace(verdict, unrecognised=unrecognised)


def rejected(lease_name: str, error: Exception) -> Verdict:
    """The API server refused our patch of the Lease for good (422 that is no lost race, 403)."""
    return _not_ready(None, Reason.REJECTED, f"lease {lease_name}: {error}")


def _not_ready(phase: LeasePhase | None, reason: str, detail: str) -> Verdict:
    return Verdict(
        phase=phase,
        condition=_condition(False, reason, detail),
        prerequisite=Prerequisite(ready=False, reason=reason, detail=detail),
    )


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _condition(ready: bool, reason: str, message: str) -> Condition:
    return Condition(
        type=CONDITION_TYPE, status="True" if ready else "False", reason=reason, message=message
    )


def waiting_for_capi(cluster: ClusterView) -> Condition:
    message = f"holding the lease until Cluster API cluster {cluster.name} is deleted"
    return _condition(False, Reason.WAITING_FOR_CAPI, message)


def released(lease_name: str) -> Prerequisite:
    return Prerequisite(
        ready=True, reason=Reason.RELEASED, detail=f"lease {lease_name} released", released=True
    )


# --- what to say --------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusChange:
    """What the Cluster's status must gain: a merge patch and the conditions to set."""

    patch: Json
    conditions: tuple[Condition, ...]


def status_change(
    cluster: ClusterView, *, phase: LeasePhase | None, condition: Condition
) -> StatusChange | None:
    """What brings ``cluster`` to ``phase``/``condition``; None if its status says it already.

    ``phase`` None leaves ``status.leasePhase`` alone (the delete path reports only the wait).
    """
    observed_phase = cluster.status.get("leasePhase")
    patch: Json = {"leasePhase": str(phase)} if phase and phase != observed_phase else {}
    same = _same(_observed_condition(cluster.status), condition)
    conditions = () if same else (condition,)
    if not patch and not conditions:
        return None
    return StatusChange(patch, conditions)


def _observed_condition(status: Json) -> Json | None:
    for entry in status.get("conditions") or []:
        if isinstance(entry, dict) and entry.get("type") == CONDITION_TYPE:
            return entry
    return None


def _same(observed: Json | None, condition: Condition) -> bool:
    return observed is not None and (
        observed.get("status"),
        observed.get("reason"),
        observed.get("message") or "",
    ) == (condition.status, condition.reason, condition.message)


@dataclass(frozen=True)
class Envelope:
    source: str
    causation_id: str | None


def prerequisite_message(
    cluster: ClusterView,
    prerequisite: Prerequisite,
    *,
    last: PrerequisiteChanged | None,
    envelope: Envelope,
) -> PrerequisiteChanged | None:
    """The ``PrerequisiteChanged`` to publish, or None when ``last`` already says it."""
    content = json.dumps(
        [
            prerequisite.ready,
            prerequisite.reason,
            prerequisite.detail,
            prerequisite.outputs,
            prerequisite.released,
        ],
        sort_keys=True,
    )
    message = PrerequisiteChanged(
        id=stable_id(cluster.uid, STEP, str(cluster.generation), content, last.id if last else ""),
        source=envelope.source,
        correlation_id=f"cluster:{cluster.key}",
        causation_id=envelope.causation_id,
        ref=cluster.ref,
        step=STEP,
        generation=cluster.generation,
        ready=prerequisite.ready,
        reason=prerequisite.reason,
        detail=prerequisite.detail,
        outputs=prerequisite.outputs,
        released=prerequisite.released,
    )
    if last is not None and _fact(last) == _fact(message):
        return None
    return message


def _fact(message: PrerequisiteChanged) -> tuple[Any, ...]:
    return (
        message.ref.uid,
        message.generation,
        message.ready,
        message.reason,
        message.detail,
        json.dumps(message.outputs, sort_keys=True),
        message.released,
    )


def names_lease(cluster: Json, lease_name: str) -> bool:
    return bool((cluster.get("spec") or {}).get("leaseName") == lease_name)


def names_any_lease(cluster: Json) -> bool:
    return bool((cluster.get("spec") or {}).get("leaseName"))
