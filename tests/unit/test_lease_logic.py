"""The lease service's pure rules: verdicts, patches, what is said and when."""

from typing import Any

import pytest

from services.lease import logic
from services.lease.logic import ClusterView, Reason
from shared.messages import PrerequisiteChanged
from shared.models.azimuth import LeasePhase
from shared.resources import CLUSTER, owner_reference

FINALIZER = "azimuth.stackhpc.com"
ENVELOPE = logic.Envelope(source="lease/t", causation_id="cause")


def cluster(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1", "generation": 3},
        "spec": {"leaseName": "kube-c", **spec},
    }


def lease(
    phase: str | None = None, *, rv: str = "7", meta: dict[str, Any] | None = None, **status: Any
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "kube-c", "resourceVersion": rv, **(meta or {})},
        "status": {**({"phase": phase} if phase else {}), **status},
    }
    return obj


VIEW = ClusterView.of(cluster())
OWNER = owner_reference(CLUSTER, cluster(), controller=False)


# --- verdicts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "status", "reason", "message", "ready"),
    [
        ("Active", "True", Reason.ACTIVE, "", True),
        ("Error", "False", Reason.ERROR, "quota exceeded", False),
        ("Pending", "False", Reason.NOT_ACTIVE, "lease is Pending", False),
        ("Creating", "False", Reason.NOT_ACTIVE, "lease is Creating", False),
        ("Updating", "False", Reason.NOT_ACTIVE, "lease is Updating", False),
        ("Terminated", "False", Reason.NOT_ACTIVE, "lease is Terminated", False),
        (None, "False", Reason.NOT_ACTIVE, "lease is Unknown", False),
    ],
)
def test_phase_decides_condition_and_prerequisite(
    phase: str | None, status: str, reason: str, message: str, ready: bool
) -> None:
    verdict = logic.assess(lease(phase, errorMessage="quota exceeded"), "kube-c")
    assert verdict.phase == (phase or "Unknown")
    assert (verdict.condition.type, verdict.condition.status) == ("LeaseReady", status)
    assert (verdict.condition.reason, verdict.condition.message) == (reason, message)
    prerequisite = verdict.prerequisite
    assert (prerequisite.ready, prerequisite.reason, prerequisite.detail) == (
        ready,
        reason,
        message,
    )
    assert verdict.unrecognised is None


def test_active_hands_over_the_size_name_map() -> None:
    verdict = logic.assess(lease("Active", sizeNameMap={"small": "reserved-small"}), "kube-c")
    assert verdict.prerequisite.outputs == {"sizeNameMap": {"small": "reserved-small"}}
    assert logic.assess(lease("Active"), "kube-c").prerequisite.outputs == {"sizeNameMap": {}}
    odd = logic.assess(lease("Active", sizeNameMap=["not", "a", "map"]), "kube-c")
    assert odd.prerequisite.outputs == {"sizeNameMap": {}}


def test_missing_lease_is_not_found() -> None:
    verdict = logic.assess(None, "kube-c")
    assert verdict.phase is LeasePhase.UNKNOWN
    assert verdict.condition.reason == Reason.NOT_FOUND
    assert not verdict.prerequisite.ready
    assert "kube-c" in verdict.prerequisite.detail


@pytest.mark.parametrize("raw", ["Exploding", "active", 42])
def test_unknown_phase_strings_become_unknown_and_are_flagged(raw: Any) -> None:
    assert logic.parse_phase(raw) == (LeasePhase.UNKNOWN, str(raw))
    verdict = logic.assess(lease(raw), "kube-c")
    assert verdict.phase is LeasePhase.UNKNOWN
    assert verdict.unrecognised == str(raw)
    assert verdict.condition.reason == Reason.NOT_ACTIVE


def test_a_rejection_is_not_ready_and_leaves_the_phase_alone() -> None:
    verdict = logic.rejected("kube-c", ValueError("422 nope"))
    assert verdict.phase is None
    assert (verdict.condition.reason, verdict.condition.message) == (
        "LeasePatchRejected",
        "lease kube-c: 422 nope",
    )
    assert not verdict.prerequisite.ready


def test_known_and_missing_phases_are_not_flagged() -> None:
    assert logic.parse_phase("Terminating") == (LeasePhase.TERMINATING, None)
    assert logic.parse_phase(None) == (LeasePhase.UNKNOWN, None)
    assert logic.parse_phase("") == (LeasePhase.UNKNOWN, None)


# --- patches -------------------------------------------------------------------------------


def test_adoption_of_a_bare_lease_creates_both_lists_behind_a_version_test() -> None:
    ops = logic.adoption_patch(lease(), owner=OWNER, finalizer=FINALIZER)
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        {"op": "add", "path": "/metadata/ownerReferences", "value": [OWNER]},
    ]
    assert OWNER == {
        "apiVersion": "azimuth.stackhpc.com/v1alpha1",
        "kind": "Cluster",
        "name": "c",
        "uid": "u1",
        "blockOwnerDeletion": True,
    }


def test_adoption_appends_to_other_controllers_entries() -> None:
    portal = {**OWNER, "uid": "old-uid"}
    meta = {"finalizers": ["scheduling.azimuth.stackhpc.com"], "ownerReferences": [portal]}
    ops = logic.adoption_patch(lease(meta=meta), owner=OWNER, finalizer=FINALIZER)
    assert ops[1:] == [
        {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        {"op": "add", "path": "/metadata/ownerReferences/-", "value": OWNER},
    ]


def test_adoption_adds_only_what_is_missing() -> None:
    portal_ref = {"apiVersion": "azimuth.stackhpc.com/v1alpha1", "kind": "Cluster", "uid": "u1"}
    meta = {"ownerReferences": [portal_ref]}
    ops = logic.adoption_patch(lease(meta=meta), owner=OWNER, finalizer=FINALIZER)
    assert [op["path"] for op in ops] == ["/metadata/resourceVersion", "/metadata/finalizers"]
    adopted = {"finalizers": [FINALIZER], "ownerReferences": [portal_ref]}
    assert logic.adoption_patch(lease(meta=adopted), owner=OWNER, finalizer=FINALIZER) == []


def test_release_removes_every_copy_of_ours_from_the_back() -> None:
    meta = {"finalizers": [FINALIZER, "other", FINALIZER]}
    assert logic.release_patch(lease(meta=meta, rv="9"), finalizer=FINALIZER) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
        {"op": "remove", "path": "/metadata/finalizers/2"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    assert logic.release_patch(lease(meta={"finalizers": ["other"]}), finalizer=FINALIZER) == []
    assert logic.release_patch(lease(), finalizer=FINALIZER) == []


def test_owner_is_an_azimuth_cluster_reference_only() -> None:
    capi = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "x"}
    lookalike = {"apiVersion": "azimuth.stackhpc.com.evil/v1", "kind": "Cluster", "name": "y"}
    platform = {"apiVersion": "azimuth.stackhpc.com/v1alpha1", "kind": "Platform", "name": "z"}
    ours = {"apiVersion": "azimuth.stackhpc.com/v1alpha1", "kind": "Cluster", "name": "c"}
    refs = [capi, lookalike, platform]
    assert logic.owning_cluster(lease(meta={"ownerReferences": refs})) is None
    assert logic.owning_cluster(lease(meta={"ownerReferences": [*refs, ours]})) == ours


# --- the Cluster, live or gone -------------------------------------------------------------


def test_cluster_view_reads_what_matters() -> None:
    view = ClusterView.of(cluster(paused=True))
    assert (view.key, view.uid, view.generation, view.lease_name) == ("ns/c", "u1", 3, "kube-c")
    assert view.paused
    assert not view.deleting
    deleting = cluster()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert ClusterView.of(deleting).deleting
    assert ClusterView.of(cluster(leaseName="")).lease_name is None


def test_gone_cluster_comes_from_history_else_from_the_lease_owner() -> None:
    from_history = logic.gone_cluster(cluster(), lease())
    assert from_history is not None
    assert (from_history.uid, from_history.lease_name, from_history.gone) == ("u1", "kube-c", True)
    assert from_history.deleting
    unnamed = logic.gone_cluster(cluster(leaseName=None), lease())
    assert unnamed is not None
    assert unnamed.lease_name == "kube-c"
    owned = lease(meta={"ownerReferences": [OWNER]})
    from_owner = logic.gone_cluster(None, owned)
    assert from_owner is not None
    assert (from_owner.key, from_owner.uid, from_owner.lease_name) == ("ns/c", "u1", "kube-c")
    assert logic.gone_cluster(None, lease()) is None
    assert logic.gone_cluster(None, None) is None


# --- what is said and when -----------------------------------------------------------------


def status(view: ClusterView, phase: LeasePhase | None, verdict: logic.Verdict) -> Any:
    return logic.status_change(view, phase=phase, condition=verdict.condition)


def test_status_carries_only_what_differs_from_the_cluster() -> None:
    active = logic.assess(lease("Active"), "kube-c")
    change = status(VIEW, active.phase, active)
    assert change.patch == {"leasePhase": "Active"}
    assert change.conditions == (active.condition,)
    shown = {"leasePhase": "Active", "conditions": [active.condition.model_dump()]}
    current = ClusterView.of({**cluster(), "status": shown})
    assert status(current, active.phase, active) is None
    error = logic.assess(lease("Error", errorMessage="boom"), "kube-c")
    change = status(current, error.phase, error)
    assert change.patch == {"leasePhase": "Error"}
    assert change.conditions[0].message == "boom"


def test_a_return_to_an_earlier_state_is_a_change_again() -> None:
    active = logic.assess(lease("Active"), "kube-c")
    error = logic.assess(lease("Error"), "kube-c")
    was_error = ClusterView.of(
        {
            **cluster(),
            "status": {"leasePhase": "Error", "conditions": [error.condition.model_dump()]},
        }
    )
    assert status(was_error, active.phase, active) == status(VIEW, active.phase, active)


def test_waiting_touches_only_the_condition() -> None:
    condition = logic.waiting_for_capi(VIEW)
    change = logic.status_change(VIEW, phase=None, condition=condition)
    assert change is not None
    assert change.patch == {}
    assert change.conditions[0].reason == Reason.WAITING_FOR_CAPI


def prerequisite(
    verdict: logic.Prerequisite, last: PrerequisiteChanged | None, view: ClusterView = VIEW
) -> PrerequisiteChanged | None:
    return logic.prerequisite_message(view, verdict, last=last, envelope=ENVELOPE)


def test_prerequisite_is_said_once_per_fact_and_generation() -> None:
    ready = logic.assess(lease("Active", sizeNameMap={"a": "b"}), "kube-c").prerequisite
    first = prerequisite(ready, None)
    assert first is not None
    assert (first.step, first.generation, first.ready, first.outputs) == (
        "lease",
        3,
        True,
        {"sizeNameMap": {"a": "b"}},
    )
    repeat = prerequisite(ready, None)
    assert repeat is not None
    assert repeat.id == first.id
    assert prerequisite(ready, first) is None
    newer = ClusterView.of({**cluster(), "metadata": {**cluster()["metadata"], "generation": 4}})
    again = prerequisite(ready, first, newer)
    assert again is not None
    assert again.generation == 4


def test_prerequisite_back_to_an_earlier_fact_gets_a_new_id() -> None:
    ready = logic.assess(lease("Active"), "kube-c").prerequisite
    broken = logic.assess(lease("Error"), "kube-c").prerequisite
    first = prerequisite(ready, None)
    assert first is not None
    second = prerequisite(broken, first)
    assert second is not None
    third = prerequisite(ready, second)
    assert third is not None
    assert len({first.id, second.id, third.id}) == 3


def test_released_is_ready_and_released() -> None:
    message = prerequisite(logic.released("kube-c"), None)
    assert message is not None
    assert (message.ready, message.reason, message.released) == (True, "Released", True)
