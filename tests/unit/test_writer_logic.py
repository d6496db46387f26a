from datetime import UTC, datetime
from typing import Any

from services.writer.logic import Snapshot, StatusCache, apply, compose, compose_all, plan
from shared.messages import Condition, ObjectRef, PatchStatus

REF = ObjectRef(api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", name="c", uid="u")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def nothing(status: dict[str, Any], facts: Any, now: datetime) -> dict[str, Any]:
    return {}


def patches(*bodies: dict[str, Any]) -> list[PatchStatus]:
    return [PatchStatus(source="t", correlation_id="c", ref=REF, patch=b) for b in bodies]


def test_compose_equals_sequential_application() -> None:
    target = {"phase": "Pending", "nodes": {"a": {"phase": "Ready"}, "b": {"phase": "Pending"}}}
    patches = [
        {"phase": "Reconciling", "nodes": {"b": {"phase": "Ready"}}},
        {"nodes": {"a": None, "c": {"phase": "Pending"}}},
        {"phase": "Ready", "addons": {"x": {"phase": "Deployed"}}},
    ]
    sequential = target
    for patch in patches:
        sequential = apply(sequential, patch)
    assert apply(target, compose_all(patches)) == sequential


def test_compose_keeps_deletions_and_lets_later_values_win() -> None:
    assert compose({"a": 1, "b": {"c": 1}}, {"a": None, "b": {"d": 2}}) == {
        "a": None,
        "b": {"c": 1, "d": 2},
    }
    assert compose({"b": {"c": 1}}, {"b": 5}) == {"b": 5}


def test_apply_follows_rfc7386() -> None:
    assert apply({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert apply({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert apply({"a": "b"}, {"a": None}) == {}
    assert apply({"a": ["b"]}, {"a": "c"}) == {"a": "c"}
    assert apply({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert apply({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}


def test_a_plan_that_changes_nothing_is_none() -> None:
    ready = Snapshot("u", {"phase": "Ready", "n": 1}, {})
    assert plan(ready, patches({"phase": "Ready"}), nothing, NOW) is None
    assert plan(ready, patches({"gone": None}), nothing, NOW) is None
    assert plan(ready, patches({"phase": "Unhealthy"}), nothing, NOW) == {"phase": "Unhealthy"}


def test_a_plan_adds_only_derived_keys_that_change() -> None:
    def count(status: dict[str, Any], facts: Any, now: datetime) -> dict[str, Any]:
        return {"nodeCount": len(status.get("nodes", {})), "kind": facts["kind"]}

    snapshot = Snapshot("u", {"kind": "x"}, {"kind": "x"})
    body = plan(snapshot, patches({"nodes": {"a": {}}}), count, NOW)
    assert body == {"nodes": {"a": {}}, "nodeCount": 1}
    # A nudge (no patch) is written when only the derivation changed.
    stale = Snapshot("u", {"kind": "x", "nodes": {"a": {}}}, {"kind": "x"})
    assert plan(stale, patches({}), count, NOW) == {"nodeCount": 1}


def test_a_node_removed_and_set_again_in_one_batch_keeps_only_its_new_fields() -> None:
    """Applied in turn, the removal drops the old entry; one composed merge patch would have
    merged the new entry into it (the old ``reason`` would survive)."""
    snapshot = Snapshot("u", {"nodes": {"n1": {"phase": "Failed", "reason": "x"}}}, {})
    batch = patches({"nodes": {"n1": None}}, {"nodes": {"n1": {"phase": "Ready"}}})
    body = plan(snapshot, batch, nothing, NOW)
    assert body == {"nodes": {"n1": {"phase": "Ready", "reason": None}}}
    assert body is not None
    assert apply(snapshot.status, body) == {"nodes": {"n1": {"phase": "Ready"}}}


def test_a_late_patch_replayed_under_newer_ones_changes_only_what_they_leave() -> None:
    """The consumer runs a late patch with the newer ones after it; here the newer set the
    phase and the condition back where they are, so only the late patch's own field lands and
    ``lastTransitionTime`` stays."""
    since = "2025-12-31T00:00:00Z"
    ready = {"type": "Ready", "status": "True", "reason": "", "message": ""}
    snapshot = Snapshot(
        "u", {"phase": "Ready", "conditions": [{**ready, "lastTransitionTime": since}]}, {}
    )
    late, newer = (
        PatchStatus(
            source="t",
            correlation_id="c",
            ref=REF,
            patch={"phase": "Provisioning", "kubeconfig": "k"},
            conditions=(Condition(type="Ready", status="False", reason=""),),
        ),
        PatchStatus(
            source="t",
            correlation_id="c",
            ref=REF,
            patch={"phase": "Ready"},
            conditions=(Condition(type="Ready", status="True", reason=""),),
        ),
    )
    assert plan(snapshot, [late, newer], nothing, NOW) == {"kubeconfig": "k"}


def test_cache_is_per_incarnation_and_bounded() -> None:
    cache = StatusCache(2)
    cache.put("ns/a", Snapshot("uid-1", {"phase": "Ready"}, {}), token=7)
    assert cache.get("ns/a", "uid-1", 7) == Snapshot("uid-1", {"phase": "Ready"}, {})
    assert cache.get("ns/a", "uid-2", 7) is None
    cache.put("ns/b", Snapshot("u", {}, {}), token=7)
    cache.put("ns/c", Snapshot("u", {}, {}), token=7)
    assert cache.get("ns/a", "uid-1", 7) is None


def test_cache_is_trusted_only_under_the_claim_that_filled_it() -> None:
    cache = StatusCache(10)
    cache.put("ns/a", Snapshot("u", {"phase": "Ready"}, {}), token=7)
    # The partition was elsewhere in between: another replica may have written the Cluster.
    assert cache.get("ns/a", "u", 8) is None


def test_a_seed_never_replaces_what_this_claim_wrote() -> None:
    cache = StatusCache(10)
    written = Snapshot("u", {"phase": "Ready"}, {}, resource_version="12")
    listed = Snapshot("u", {"phase": "Pending"}, {}, resource_version="10")
    cache.put("ns/a", written, token=8)
    assert not cache.seed("ns/a", listed, token=8)
    assert cache.get("ns/a", "u", 8) == written
    assert cache.seed("ns/a", listed, token=9)
    assert cache.get("ns/a", "u", 9) == listed
