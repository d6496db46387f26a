"""``shared.phase`` over any status the API server could hand back, not only sensible ones.

A Cluster's status is written by several services and can be edited by anyone with access to
the status subresource, so the derivation must be total: lists where objects belong, numbers
where phases belong, timestamps at the ends of the calendar. These properties check that
``derive``, ``cluster_phase`` and ``deadline`` never raise on any JSON shape, that
``derive`` is deterministic, pure and a fixed point (a derived status derives itself, which
is what lets the writer skip writes that change nothing), and that the phase is exactly what
the module's documented rules say: ``expected_phase`` below is those rules written out again
from the docstring, independently of the module's tables.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from shared.mergepatch import apply
from shared.models.azimuth import (
    AddonPhase,
    ClusterPhase,
    ControlPlanePhase,
    LeasePhase,
    NetworkingPhase,
    NodePhase,
    NodeRole,
)
from shared.phase import cluster_phase, deadline, derive, format_time, parse_time

Json = dict[str, Any]

JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def phase_of(kind: type[StrEnum]) -> st.SearchStrategy[Any]:
    """Mostly the enum's own values, sometimes anything else."""
    return st.sampled_from([member.value for member in kind]) | JUNK


VERSIONS = st.sampled_from(["v1.30.1", "v1.31.0"]) | JUNK
NODE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["worker", "control-plane", "Unknown"]) | JUNK,
        "phase": phase_of(NodePhase),
        "kubeletVersion": VERSIONS,
    },
)
ADDON = st.fixed_dictionaries({}, optional={"phase": phase_of(AddonPhase), "revision": JUNK})
EDGE_TIMES = [
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59-12:00",
    "2025-01-01T12:00:00",
    "2025-01-01",
]
TIMES = (
    st.datetimes(timezones=st.just(UTC)).map(format_time)
    | st.sampled_from(EDGE_TIMES)
    | st.text(max_size=25)
    | JUNK
)


def entries(entry: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.dictionaries(st.text(max_size=4), entry | JUNK, max_size=4) | JUNK


STATUSES = st.fixed_dictionaries(
    {},
    optional={
        "leasePhase": phase_of(LeasePhase),
        "networkingPhase": phase_of(NetworkingPhase),
        "controlPlanePhase": phase_of(ControlPlanePhase),
        "nodes": entries(NODE),
        "addons": entries(ADDON),
        "lastUpdated": TIMES,
        "phase": phase_of(ClusterPhase),
        "nodeCount": JUNK,
    },
)
NOW = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
LEASES = st.none() | st.sampled_from(["", "kube-c"])
TIMEOUTS = st.floats(min_value=0, max_value=1e7)

# --- the documented rules, written out again ------------------------------------------------

LEASE_DECIDES = {
    "Creating": "Pending",
    "Pending": "Pending",
    "Starting": "Pending",
    "Unknown": "Pending",
    "Error": "Failed",
    "Terminating": "Unhealthy",
    "Terminated": "Unhealthy",
    "Deleting": "Unhealthy",
}
NETWORKING_DECIDES = {
    "Pending": "Reconciling",
    "Provisioning": "Reconciling",
    "Deleting": "Deleting",
    "Failed": "Failed",
    "Unknown": "Pending",
}
CONTROL_PLANE_CHANGING = {"Pending", "ScalingUp", "ScalingDown"}
CONTROL_PLANE_DECIDES = {
    "Upgrading": "Upgrading",
    "Deleting": "Deleting",
    "Failed": "Failed",
    "Unknown": "Pending",
}
NODES_BUSY = {"Pending", "Provisioning", "Deleting", "Deleted"}
NODES_BAD = {"Unhealthy", "Failed", "Unknown"}
ADDONS_BUSY = {"Pending", "Preparing", "Installing", "Upgrading", "Uninstalling"}
ADDONS_BAD = {"Failed", "Unknown"}
SETTLED = {"Ready", "Failed"}
TIMED = {"Pending", "Reconciling", "Upgrading"}


def known(kind: type[StrEnum], value: Any) -> str:
    """The module docstring: a missing key or an unexpected value means Unknown."""
    values = {member.value for member in kind}
    return value if isinstance(value, str) and value in values else "Unknown"


def listed(status: Json, key: str) -> list[Json]:
    """``nodes``/``addons`` entries; anything but an object of objects counts as empty parts."""
    found = status.get(key)
    if not isinstance(found, dict):
        return []
    return [entry if isinstance(entry, dict) else {} for entry in found.values()]


def mixed(status: Json, role: str) -> bool:
    """Nodes of ``role`` on more than one kubelet version."""
    versions = {
        version_of(node)
        for node in listed(status, "nodes")
        if known(NodeRole, node.get("role")) == role
    }
    return len(versions) > 1


def version_of(node: Json) -> str | None:
    """A version that is not a string is no version, like a missing one (and a missing one
    counts as a version of its own, as in the derivation)."""
    version = node.get("kubeletVersion")
    return version if isinstance(version, str) else None


def expected_phase(status: Json, lease_name: str | None, deleting: bool) -> str:
    """Rules 0 to 8 of ``shared.phase``'s docstring, first match wins."""
    if deleting:
        return "Deleting"
    return deciding_part(status, lease_name) or by_nodes_and_addons(status)


def deciding_part(status: Json, lease_name: str | None) -> str | None:
    """Rules 1 to 3: the Lease, then networking, then the control plane, when they decide."""
    lease = known(LeasePhase, status.get("leasePhase"))
    if lease_name and lease in LEASE_DECIDES:
        return LEASE_DECIDES[lease]
    networking = known(NetworkingPhase, status.get("networkingPhase"))
    if networking in NETWORKING_DECIDES:
        return NETWORKING_DECIDES[networking]
    control_plane = known(ControlPlanePhase, status.get("controlPlanePhase"))
    if control_plane in CONTROL_PLANE_CHANGING:
        return "Upgrading" if mixed(status, "control-plane") else "Reconciling"
    return CONTROL_PLANE_DECIDES.get(control_plane)


def by_nodes_and_addons(status: Json) -> str:
    """Rules 4 to 8."""
    nodes = {known(NodePhase, node.get("phase")) for node in listed(status, "nodes")}
    addons = {known(AddonPhase, addon.get("phase")) for addon in listed(status, "addons")}
    control_plane = known(ControlPlanePhase, status.get("controlPlanePhase"))
    if mixed(status, "worker"):
        return "Upgrading"
    if nodes & NODES_BUSY or addons & ADDONS_BUSY:
        return "Reconciling"
    if control_plane == "Unhealthy" or nodes & NODES_BAD or addons & ADDONS_BAD:
        return "Unhealthy"
    return "Ready"


# --- properties ----------------------------------------------------------------------------

#: a worker whose version is a list: the version set cannot hold it
UNHASHABLE_VERSION: Json = {
    "networkingPhase": "Provisioned",
    "controlPlanePhase": "Ready",
    "nodes": {"a": {"role": "worker", "kubeletVersion": ["v1.31.0"]}},
}
#: a stamp so late that adding the timeout leaves the calendar
END_OF_TIME: Json = {"lastUpdated": "9999-12-31T23:59:59Z"}


@given(STATUSES, LEASES, st.booleans())
@example(status=UNHASHABLE_VERSION, lease_name=None, deleting=False)
def test_the_phase_follows_the_documented_rules_for_any_status(
    status: Json, lease_name: str | None, deleting: bool
) -> None:
    phase = cluster_phase(status, lease_name=lease_name, deleting=deleting)
    assert phase == expected_phase(status, lease_name, deleting)


@given(STATUSES, LEASES, st.booleans(), NOW, TIMEOUTS)
@example(
    status=UNHASHABLE_VERSION, lease_name=None, deleting=False, now=datetime.now(UTC), timeout=60
)
@example(status=END_OF_TIME, lease_name=None, deleting=False, now=datetime.now(UTC), timeout=60)
def test_derive_is_total_and_answers_its_four_keys(
    status: Json, lease_name: str | None, deleting: bool, now: datetime, timeout: float
) -> None:
    derived = derive(
        status, lease_name=lease_name, now=now, timeout_seconds=timeout, deleting=deleting
    )
    assert set(derived) == {"phase", "nodeCount", "addonCount", "lastUpdated"}
    assert derived["phase"] in {phase.value for phase in ClusterPhase}
    assert derived["nodeCount"] == len(listed(status, "nodes"))
    assert derived["addonCount"] == len(listed(status, "addons"))
    stamp = derived["lastUpdated"]
    assert (stamp is None) == (derived["phase"] in SETTLED)
    if stamp is not None:
        stored = status.get("lastUpdated")
        assert stamp == (stored if parse_time(stored) else format_time(now))


@given(STATUSES, LEASES, NOW, TIMEOUTS)
@example(status=END_OF_TIME, lease_name=None, now=datetime.now(UTC), timeout=60)
def test_a_period_longer_than_the_timeout_shows_as_unhealthy(
    status: Json, lease_name: str | None, now: datetime, timeout: float
) -> None:
    derived = derive(status, lease_name=lease_name, now=now, timeout_seconds=timeout)
    rules = expected_phase(status, lease_name, deleting=False)
    started = parse_time(derived["lastUpdated"])
    late = (
        rules in TIMED
        and started is not None
        and started < datetime.max.replace(tzinfo=UTC) - timedelta(seconds=timeout)
        and now > started + timedelta(seconds=timeout)
    )
    assert derived["phase"] == ("Unhealthy" if late else rules)


@given(STATUSES, LEASES, st.booleans(), NOW, TIMEOUTS)
def test_derive_is_deterministic_pure_and_a_fixed_point(
    status: Json, lease_name: str | None, deleting: bool, now: datetime, timeout: float
) -> None:
    before = copy.deepcopy(status)
    args: Json = {
        "lease_name": lease_name,
        "now": now,
        "timeout_seconds": timeout,
        "deleting": deleting,
    }
    derived = derive(status, **args)
    assert status == before
    assert derive(status, **args) == derived
    assert derive(apply(status, derived), **args) == derived


@given(STATUSES, TIMEOUTS)
@example(status={"phase": "Pending", **END_OF_TIME}, timeout=60)
def test_deadline_is_total(status: Json, timeout: float) -> None:
    when = deadline(status, timeout)
    if when is not None:
        assert status.get("phase") in TIMED
        assert parse_time(status.get("lastUpdated")) is not None
