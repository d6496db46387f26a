"""A Cluster's overall phase, derived from its parts (upstream ``azimuth_capi/status.py``).

Pure and total: ``derive`` reads a status dict as stored (defaults omitted, so a missing key
means Unknown or empty, and an unexpected string means Unknown) and returns the keys it owns,
ready to merge into that status: ``phase``, ``nodeCount``, ``addonCount`` and ``lastUpdated``.
The writer calls it on every write, so the phase can never disagree with the parts it was
derived from, whichever service changed them.

The rules are upstream's, checked in order, first match wins, after one of capibus's own:

0. a Cluster being deleted (``metadata.deletionTimestamp`` set) is Deleting. Upstream never
   derived this: its phase kept whatever the parts said (often Pending with the last install
   error) until the CAPI Cluster reported Deleting, if it ever did, while the Azimuth portal
   worked it out from the timestamp itself (azimuth ``api/azimuth/cluster_api/base.py``).
   ``kubectl get`` and the ``azimuth_kube_cluster_phase`` metric read ``status.phase``, so
   the phase must say it;
1. a Lease that is not Active or Updating decides;
2. then the networking (CAPI Cluster) phase;
3. then the control plane phase (a control plane mid-change with mixed kubelet versions is
   an upgrade);
4. worker nodes on mixed kubelet versions: Upgrading;
5. a node on its way in or out: Reconciling;
6. an addon on its way in or out: Reconciling;
7. anything unhealthy, failed or unknown: Unhealthy;
8. otherwise Ready.

Timeout (upstream PR #306): Ready and Failed clear ``lastUpdated``; any other phase stamps it
once, when the period starts. Pending, Reconciling or Upgrading for longer than the timeout
shows as Unhealthy; the stamp is kept, so the mask holds until the cluster settles. Upstream
only noticed a timeout when a 60 s timer rewrote the status; ``deadline`` says when it will
fire, so a caller can schedule exactly one re-derivation for that moment instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from shared.models.azimuth import (
    AddonPhase,
    ClusterPhase,
    ControlPlanePhase,
    LeasePhase,
    NetworkingPhase,
    NodePhase,
    NodeRole,
)

Json = dict[str, Any]
E = TypeVar("E", bound=StrEnum)

DEFAULT_TIMEOUT_SECONDS = 1800.0

#: Phases that end a period: they clear ``lastUpdated``.
SETTLED = frozenset({ClusterPhase.READY, ClusterPhase.FAILED})
#: Phases that turn Unhealthy once they have lasted longer than the timeout.
TIMED = frozenset({ClusterPhase.PENDING, ClusterPhase.RECONCILING, ClusterPhase.UPGRADING})

_BY_LEASE = {
    LeasePhase.CREATING: ClusterPhase.PENDING,
    LeasePhase.PENDING: ClusterPhase.PENDING,
    LeasePhase.STARTING: ClusterPhase.PENDING,
    LeasePhase.UNKNOWN: ClusterPhase.PENDING,
    LeasePhase.ERROR: ClusterPhase.FAILED,
    LeasePhase.TERMINATING: ClusterPhase.UNHEALTHY,
    LeasePhase.TERMINATED: ClusterPhase.UNHEALTHY,
    LeasePhase.DELETING: ClusterPhase.UNHEALTHY,
}
_BY_NETWORKING = {
    NetworkingPhase.PENDING: ClusterPhase.RECONCILING,
    NetworkingPhase.PROVISIONING: ClusterPhase.RECONCILING,
    NetworkingPhase.DELETING: ClusterPhase.DELETING,
    NetworkingPhase.FAILED: ClusterPhase.FAILED,
    NetworkingPhase.UNKNOWN: ClusterPhase.PENDING,
}
_CONTROL_PLANE_CHANGING = frozenset(
    {ControlPlanePhase.PENDING, ControlPlanePhase.SCALING_UP, ControlPlanePhase.SCALING_DOWN}
)
_BY_CONTROL_PLANE = {
    ControlPlanePhase.UPGRADING: ClusterPhase.UPGRADING,
    ControlPlanePhase.DELETING: ClusterPhase.DELETING,
    ControlPlanePhase.FAILED: ClusterPhase.FAILED,
    ControlPlanePhase.UNKNOWN: ClusterPhase.PENDING,
}
_NODES_BUSY = frozenset(
    {NodePhase.PENDING, NodePhase.PROVISIONING, NodePhase.DELETING, NodePhase.DELETED}
)
_ADDONS_BUSY = frozenset(
    {
        AddonPhase.PENDING,
        AddonPhase.PREPARING,
        AddonPhase.INSTALLING,
        AddonPhase.UPGRADING,
        AddonPhase.UNINSTALLING,
    }
)
_NODES_BAD = frozenset({NodePhase.UNHEALTHY, NodePhase.FAILED, NodePhase.UNKNOWN})
_ADDONS_BAD = frozenset({AddonPhase.FAILED, AddonPhase.UNKNOWN})


def derive(
    status: Json,
    *,
    lease_name: str | None,
    now: datetime,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    deleting: bool = False,
) -> Json:
    """``phase``, ``nodeCount``, ``addonCount`` and ``lastUpdated`` (``None``: remove it)."""
    phase = cluster_phase(status, lease_name=lease_name, deleting=deleting)
    stamp = None if phase in SETTLED else _period_start(status, now)
    ends = _timeout_at(parse_time(stamp), timeout_seconds)
    if phase in TIMED and ends and _aware(now) > ends:
        phase = ClusterPhase.UNHEALTHY
    return {
        "phase": phase.value,
        "nodeCount": len(_entries(status, "nodes")),
        "addonCount": len(_entries(status, "addons")),
        "lastUpdated": stamp,
    }


def _period_start(status: Json, now: datetime) -> str:
    """The stored stamp, verbatim (re-formatting it would make every derivation a write),
    or ``now`` when there is none yet."""
    stored = status.get("lastUpdated")
    return str(stored) if parse_time(stored) else format_time(now)


def deadline(status: Json, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> datetime | None:
    """When a derived ``status`` will time out into Unhealthy, or None if it cannot."""
    if as_enum(ClusterPhase, status.get("phase")) not in TIMED:
        return None
    return _timeout_at(parse_time(status.get("lastUpdated")), timeout_seconds)


def _timeout_at(started: datetime | None, timeout_seconds: float) -> datetime | None:
    """When a period that began at ``started`` times out; None without a start, or when that
    moment lies past the end of the calendar (a stamp of year 9999 is anyone's edit, and
    must not make every derivation raise)."""
    if started is None:
        return None
    try:
        return started + timedelta(seconds=timeout_seconds)
    except OverflowError:
        return None


def cluster_phase(status: Json, *, lease_name: str | None, deleting: bool = False) -> ClusterPhase:
    """Rule 0, then upstream's rules 1 to 8 (module docstring), without the timeout."""
    if deleting:
        return ClusterPhase.DELETING
    return (
        _by_lease(status, lease_name)
        or _by_networking(status)
        or _by_control_plane(status)
        or _by_nodes_and_addons(status)
    )


def _by_lease(status: Json, lease_name: str | None) -> ClusterPhase | None:
    if not lease_name:
        return None
    return _BY_LEASE.get(as_enum(LeasePhase, status.get("leasePhase")))


def _by_networking(status: Json) -> ClusterPhase | None:
    return _BY_NETWORKING.get(as_enum(NetworkingPhase, status.get("networkingPhase")))


def _by_control_plane(status: Json) -> ClusterPhase | None:
    phase = as_enum(ControlPlanePhase, status.get("controlPlanePhase"))
    if phase in _CONTROL_PLANE_CHANGING:
        mixed = _mixed_versions(status, NodeRole.CONTROL_PLANE)
        return ClusterPhase.UPGRADING if mixed else ClusterPhase.RECONCILING
    return _BY_CONTROL_PLANE.get(phase)


def _by_nodes_and_addons(status: Json) -> ClusterPhase:
    nodes = [as_enum(NodePhase, n.get("phase")) for n in _entries(status, "nodes").values()]
    addons = [as_enum(AddonPhase, a.get("phase")) for a in _entries(status, "addons").values()]
    control_plane = as_enum(ControlPlanePhase, status.get("controlPlanePhase"))
    if _mixed_versions(status, NodeRole.WORKER):
        return ClusterPhase.UPGRADING
    if _any(nodes, _NODES_BUSY) or _any(addons, _ADDONS_BUSY):
        return ClusterPhase.RECONCILING
    if (
        control_plane == ControlPlanePhase.UNHEALTHY
        or _any(nodes, _NODES_BAD)
        or _any(addons, _ADDONS_BAD)
    ):
        return ClusterPhase.UNHEALTHY
    return ClusterPhase.READY


def _mixed_versions(status: Json, role: NodeRole) -> bool:
    versions = {
        _version(node)
        for node in _entries(status, "nodes").values()
        if as_enum(NodeRole, node.get("role")) == role
    }
    return len(versions) > 1


def _version(node: Json) -> str | None:
    """A node's kubelet version; one that is not a string is unreadable, like a missing one
    (and unhashable when it is a list or an object)."""
    version = node.get("kubeletVersion")
    return version if isinstance(version, str) else None


def _any(phases: Iterable[StrEnum], wanted: frozenset[Any]) -> bool:
    return any(phase in wanted for phase in phases)


def _entries(status: Json, key: str) -> Mapping[str, Json]:
    entries = status.get(key)
    if not isinstance(entries, dict):
        return {}
    return {name: entry if isinstance(entry, dict) else {} for name, entry in entries.items()}


def as_enum(kind: type[E], value: Any) -> E:
    """``value`` as ``kind``; missing or unexpected values are that enum's Unknown."""
    try:
        return kind(value)
    except (ValueError, TypeError):
        return kind("Unknown")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime; None if absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return _aware(datetime.fromisoformat(value))
    except ValueError:
        return None


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, to the second, as Kubernetes writes timestamps."""
    return _aware(moment).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
