from collections import Counter

from shared.coordination import rendezvous_owner
from shared.retry import backoff


def test_rendezvous_spreads_partitions_and_moves_few_on_join() -> None:
    members = ["a", "b", "c"]
    before = {p: rendezvous_owner(p, members) for p in range(64)}
    assert set(Counter(before.values())) == set(members)
    after = {p: rendezvous_owner(p, [*members, "d"]) for p in range(64)}
    moved = [p for p in before if before[p] != after[p]]
    assert all(after[p] == "d" for p in moved)
    assert 0 < len(moved) < 32


def test_no_members_no_owner() -> None:
    assert rendezvous_owner(3, []) is None


def test_backoff_grows_and_is_capped() -> None:
    assert [backoff(n, base=0.5, cap=3) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 3, 3]
    assert backoff(1, base=0.5, cap=3, hint=10) == 3
