from services.writer.logic import (
    Snapshot,
    StatusCache,
    apply,
    changes_nothing,
    compose,
    compose_all,
)


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


def test_changes_nothing() -> None:
    assert changes_nothing({"phase": "Ready", "n": 1}, {"phase": "Ready"})
    assert not changes_nothing({"phase": "Ready"}, {"phase": "Unhealthy"})
    assert changes_nothing({"phase": "Ready"}, {"gone": None})


def test_cache_is_per_incarnation_and_bounded() -> None:
    cache = StatusCache(2)
    cache.put("ns/a", Snapshot("uid-1", {"phase": "Ready"}, None))
    assert cache.get("ns/a", "uid-1") == Snapshot("uid-1", {"phase": "Ready"}, None)
    assert cache.get("ns/a", "uid-2") is None
    cache.put("ns/b", Snapshot("u", {}, None))
    cache.put("ns/c", Snapshot("u", {}, None))
    assert cache.get("ns/a", "uid-1") is None
