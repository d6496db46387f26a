"""Every rule of the phase derivation (``docs/upstream.md`` §4) and of its timeout, one by one."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.phase import deadline, derive, format_time

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
Json = dict[str, Any]


def node(role: str = "worker", phase: str = "Ready", version: str = "1.31.2") -> Json:
    return {"role": role, "phase": phase, "kubeletVersion": version}


def healthy(**overrides: Any) -> Json:
    """A status that derives Ready; keyword arguments replace its keys."""
    status: Json = {
        "leasePhase": "Active",
        "networkingPhase": "Provisioned",
        "controlPlanePhase": "Ready",
        "nodes": {"cp-0": node("control-plane"), "w-0": node(), "w-1": node()},
        "addons": {"cni": {"phase": "Deployed", "revision": 1}},
    }
    return {**status, **overrides}


def phase(status: Json, lease_name: str | None = "lease") -> str:
    return str(derive(status, lease_name=lease_name, now=NOW)["phase"])


def test_rule_8_everything_fine_is_ready() -> None:
    assert phase(healthy()) == "Ready"


# --- rule 0: deletion ----------------------------------------------------------------------


def deleting(status: Json, **kwargs: Any) -> Json:
    return derive(status, lease_name="lease", now=NOW, deleting=True, **kwargs)


@pytest.mark.parametrize(
    "status",
    [
        healthy(),
        healthy(leasePhase="Error"),
        healthy(networkingPhase="Failed"),
        {},  # nothing known yet: a Cluster deleted before it was ever installed
    ],
)
def test_rule_0_a_cluster_being_deleted_is_deleting_whatever_its_parts_say(status: Json) -> None:
    assert deleting(status)["phase"] == "Deleting"


def test_rule_0_deleting_never_times_out_into_unhealthy() -> None:
    long_ago = format_time(NOW - timedelta(days=1))
    derived = deleting({"lastUpdated": long_ago}, timeout_seconds=60)
    assert derived["phase"] == "Deleting"
    assert derived["lastUpdated"] == long_ago
    assert deadline(derived, 60) is None


# --- rule 1: the lease --------------------------------------------------------------------


@pytest.mark.parametrize("lease", ["Creating", "Pending", "Starting", "Unknown"])
def test_rule_1_lease_not_yet_active_is_pending(lease: str) -> None:
    assert phase(healthy(leasePhase=lease)) == "Pending"


def test_rule_1_missing_or_unexpected_lease_phase_counts_as_unknown() -> None:
    status = healthy()
    del status["leasePhase"]
    assert phase(status) == "Pending"
    assert phase(healthy(leasePhase="Bogus")) == "Pending"


def test_rule_1_lease_error_is_failed() -> None:
    assert phase(healthy(leasePhase="Error")) == "Failed"


@pytest.mark.parametrize("lease", ["Terminating", "Terminated", "Deleting"])
def test_rule_1_lease_ending_is_unhealthy(lease: str) -> None:
    assert phase(healthy(leasePhase=lease)) == "Unhealthy"


@pytest.mark.parametrize("lease", ["Active", "Updating"])
def test_rule_1_active_or_updating_lease_defers_to_the_next_rules(lease: str) -> None:
    assert phase(healthy(leasePhase=lease)) == "Ready"
    assert phase(healthy(leasePhase=lease, networkingPhase="Pending")) == "Reconciling"


def test_rule_1_applies_only_when_the_cluster_names_a_lease() -> None:
    assert phase(healthy(leasePhase="Error"), lease_name=None) == "Ready"


def test_rule_1_wins_over_later_rules() -> None:
    assert phase(healthy(leasePhase="Error", networkingPhase="Deleting")) == "Failed"


# --- rule 2: networking -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("networking", "expected"),
    [
        ("Pending", "Reconciling"),
        ("Provisioning", "Reconciling"),
        ("Deleting", "Deleting"),
        ("Failed", "Failed"),
        ("Unknown", "Pending"),
    ],
)
def test_rule_2_networking_phase(networking: str, expected: str) -> None:
    assert phase(healthy(networkingPhase=networking)) == expected


def test_rule_2_missing_networking_phase_is_pending() -> None:
    status = healthy()
    del status["networkingPhase"]
    assert phase(status) == "Pending"


def test_rule_2_wins_over_the_control_plane() -> None:
    assert phase(healthy(networkingPhase="Provisioning", controlPlanePhase="Failed")) == (
        "Reconciling"
    )


# --- rule 3: control plane ----------------------------------------------------------------


@pytest.mark.parametrize("control_plane", ["Pending", "ScalingUp", "ScalingDown"])
def test_rule_3_changing_control_plane_is_reconciling(control_plane: str) -> None:
    assert phase(healthy(controlPlanePhase=control_plane)) == "Reconciling"


@pytest.mark.parametrize("control_plane", ["Pending", "ScalingUp", "ScalingDown"])
def test_rule_3_changing_control_plane_on_mixed_versions_is_upgrading(control_plane: str) -> None:
    nodes = {"cp-0": node("control-plane", version="1.30.1"), "cp-1": node("control-plane")}
    assert phase(healthy(controlPlanePhase=control_plane, nodes=nodes)) == "Upgrading"


def test_rule_3_only_control_plane_versions_count_for_the_control_plane() -> None:
    nodes = {"cp-0": node("control-plane"), "w-0": node(version="1.30.1")}
    assert phase(healthy(controlPlanePhase="ScalingUp", nodes=nodes)) == "Reconciling"


@pytest.mark.parametrize(
    ("control_plane", "expected"),
    [
        ("Upgrading", "Upgrading"),
        ("Deleting", "Deleting"),
        ("Failed", "Failed"),
        ("Unknown", "Pending"),
    ],
)
def test_rule_3_control_plane_phase(control_plane: str, expected: str) -> None:
    assert phase(healthy(controlPlanePhase=control_plane)) == expected


def test_rule_3_missing_control_plane_phase_is_pending() -> None:
    status = healthy()
    del status["controlPlanePhase"]
    assert phase(status) == "Pending"


def test_rule_3_wins_over_nodes() -> None:
    nodes = {"w-0": node(phase="Provisioning")}
    assert phase(healthy(controlPlanePhase="Deleting", nodes=nodes)) == "Deleting"


# --- rules 4 to 7: nodes and addons -------------------------------------------------------


def test_rule_4_workers_on_mixed_versions_are_upgrading() -> None:
    nodes = {"w-0": node(version="1.30.1"), "w-1": node(), "w-2": node(phase="Provisioning")}
    assert phase(healthy(nodes=nodes)) == "Upgrading"


def test_rule_4_a_missing_kubelet_version_is_a_version_of_its_own() -> None:
    nodes = {"w-0": {"role": "worker", "phase": "Ready"}, "w-1": node()}
    assert phase(healthy(nodes=nodes)) == "Upgrading"


@pytest.mark.parametrize("node_phase", ["Pending", "Provisioning", "Deleting", "Deleted"])
def test_rule_5_a_node_coming_or_going_is_reconciling(node_phase: str) -> None:
    nodes = {"w-0": node(phase=node_phase), "w-1": node(phase="Failed")}
    assert phase(healthy(nodes=nodes)) == "Reconciling"


@pytest.mark.parametrize(
    "addon_phase", ["Pending", "Preparing", "Installing", "Upgrading", "Uninstalling"]
)
def test_rule_6_an_addon_in_progress_is_reconciling(addon_phase: str) -> None:
    addons = {"cni": {"phase": addon_phase}, "csi": {"phase": "Failed"}}
    assert phase(healthy(addons=addons)) == "Reconciling"


def test_rule_7_unhealthy_control_plane() -> None:
    assert phase(healthy(controlPlanePhase="Unhealthy")) == "Unhealthy"


@pytest.mark.parametrize("node_phase", ["Unhealthy", "Failed", "Unknown", None])
def test_rule_7_a_bad_node(node_phase: str | None) -> None:
    entry = {"role": "worker", "kubeletVersion": "1.31.2"}
    if node_phase:
        entry["phase"] = node_phase
    assert phase(healthy(nodes={"w-0": entry, "w-1": node()})) == "Unhealthy"


@pytest.mark.parametrize("addon_phase", ["Failed", "Unknown", None])
def test_rule_7_a_bad_addon(addon_phase: str | None) -> None:
    entry = {"phase": addon_phase} if addon_phase else {}
    assert phase(healthy(addons={"cni": entry})) == "Unhealthy"


def test_no_nodes_and_no_addons_is_ready() -> None:
    status = healthy()
    del status["nodes"], status["addons"]
    assert phase(status) == "Ready"


# --- counts -------------------------------------------------------------------------------


def test_counts_follow_the_maps() -> None:
    derived = derive(healthy(), lease_name=None, now=NOW)
    assert (derived["nodeCount"], derived["addonCount"]) == (3, 1)
    derived = derive({}, lease_name=None, now=NOW)
    assert (derived["nodeCount"], derived["addonCount"]) == (0, 0)


# --- timeout ------------------------------------------------------------------------------


def stamped(minutes_ago: float, **overrides: Any) -> Json:
    return healthy(lastUpdated=format_time(NOW - timedelta(minutes=minutes_ago)), **overrides)


@pytest.mark.parametrize(
    "status",
    [healthy(), healthy(leasePhase="Error"), stamped(5), stamped(60, networkingPhase="Failed")],
)
def test_ready_and_failed_clear_last_updated(status: Json) -> None:
    assert derive(status, lease_name="lease", now=NOW)["lastUpdated"] is None


def test_other_phases_stamp_last_updated_once() -> None:
    first = derive(healthy(networkingPhase="Pending"), lease_name=None, now=NOW)
    assert first["lastUpdated"] == "2025-01-01T12:00:00Z"
    later = NOW + timedelta(minutes=1)
    again = derive(healthy(networkingPhase="Pending", **first), lease_name=None, now=later)
    assert again["lastUpdated"] == "2025-01-01T12:00:00Z"


def test_an_existing_stamp_is_kept_verbatim() -> None:
    status = healthy(networkingPhase="Pending", lastUpdated="2025-01-01T11:59:00.123456Z")
    assert derive(status, lease_name=None, now=NOW)["lastUpdated"] == status["lastUpdated"]


def test_an_unreadable_stamp_is_replaced() -> None:
    status = healthy(networkingPhase="Pending", lastUpdated="yesterday")
    assert derive(status, lease_name=None, now=NOW)["lastUpdated"] == "2025-01-01T12:00:00Z"


@pytest.mark.parametrize(
    "overrides",
    [
        {"networkingPhase": "Unknown"},
        {"networkingPhase": "Provisioning"},
        {"controlPlanePhase": "Upgrading"},
    ],
    ids=["Pending", "Reconciling", "Upgrading"],
)
def test_pending_reconciling_upgrading_past_the_timeout_are_unhealthy(overrides: Json) -> None:
    assert phase(stamped(29, **overrides)) != "Unhealthy"
    assert phase(stamped(31, **overrides)) == "Unhealthy"
    assert derive(stamped(31, **overrides), lease_name="l", now=NOW)["lastUpdated"] is not None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [({"networkingPhase": "Deleting"}, "Deleting"), ({"leasePhase": "Deleting"}, "Unhealthy")],
)
def test_deleting_and_unhealthy_never_time_out(overrides: Json, expected: str) -> None:
    assert phase(stamped(600, **overrides)) == expected


def test_the_timeout_is_configurable() -> None:
    status = stamped(2, networkingPhase="Pending")
    assert derive(status, lease_name=None, now=NOW, timeout_seconds=60)["phase"] == "Unhealthy"
    assert derive(status, lease_name=None, now=NOW, timeout_seconds=600)["phase"] == "Reconciling"


def test_the_timeout_mask_holds_on_later_derivations() -> None:
    first = derive(stamped(31, networkingPhase="Pending"), lease_name=None, now=NOW)
    later = NOW + timedelta(minutes=5)
    status = stamped(31, networkingPhase="Pending") | first
    assert derive(status, lease_name=None, now=later)["phase"] == "Unhealthy"


def test_an_unhealthy_period_keeps_the_stamp_so_reconciling_after_it_times_out() -> None:
    unhealthy = derive(stamped(40, controlPlanePhase="Unhealthy"), lease_name=None, now=NOW)
    assert unhealthy["phase"] == "Unhealthy"
    assert unhealthy["lastUpdated"] == format_time(NOW - timedelta(minutes=40))
    status = healthy(networkingPhase="Provisioning", lastUpdated=unhealthy["lastUpdated"])
    assert phase(status) == "Unhealthy"


def test_naive_now_is_taken_as_utc() -> None:
    status = stamped(31, networkingPhase="Pending")
    naive = NOW.replace(tzinfo=None)
    assert derive(status, lease_name=None, now=naive)["phase"] == "Unhealthy"


def test_deadline_is_when_the_timeout_fires() -> None:
    status = derive(healthy(networkingPhase="Pending"), lease_name=None, now=NOW)
    assert deadline(status, 1800) == NOW + timedelta(seconds=1800)
    assert deadline(status | {"phase": "Upgrading"}, 60) == NOW + timedelta(seconds=60)


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Ready"},
        {"phase": "Unhealthy", "lastUpdated": "2025-01-01T12:00:00Z"},
        {"phase": "Deleting", "lastUpdated": "2025-01-01T12:00:00Z"},
        {"phase": "Pending"},
        {},
    ],
)
def test_no_deadline_when_nothing_can_time_out(status: Json) -> None:
    assert deadline(status) is None
