import itertools
import random
from collections import Counter
from statistics import mean

import pytest

from shared.coordination import placement, share
from shared.retry import backoff

PARTITION_COUNTS = (16, 32, 64)
#: per member count and partition count, this many sets of member names
NAME_SETS = 50


def names(count: int, seed: int) -> list[str]:
    return [f"replica-{seed}-{i}" for i in range(count)]


def moved(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(before[p] != after[p] for p in before)


@pytest.mark.parametrize("partitions", PARTITION_COUNTS)
@pytest.mark.parametrize("members", range(1, 9))
def test_every_partition_has_one_owner_and_every_member_its_share_give_or_take_one(
    partitions: int, members: int
) -> None:
    cap = -(-partitions // members)
    for seed in range(NAME_SETS):
        group = names(members, seed)
        owners = placement(partitions, group)
        assert sorted(owners) == list(range(partitions))
        assert set(owners.values()) <= set(group)
        counts = Counter(owners.values())
        assert max(counts.values()) <= cap
        assert min(counts[m] for m in group) >= partitions // members  # nobody left idle
        # what each member computes for itself is that same placement, with nothing left out
        shares = [share(m, partitions, group) for m in group]
        assert sum(len(s) for s in shares) == partitions
        assert set().union(*shares) == set(range(partitions))


def test_an_even_split_when_the_members_divide_the_partitions() -> None:
    for members, seed in itertools.product((1, 2, 4, 8), range(NAME_SETS)):
        counts = Counter(placement(16, names(members, seed)).values())
        assert set(counts.values()) == {16 // members}


def test_the_placement_depends_on_the_member_set_alone() -> None:
    group = names(5, 7)
    expected = placement(32, group)
    shuffled = random.Random(3).sample(group, len(group))
    assert placement(32, shuffled) == expected
    assert placement(32, [*group, *group[:2]]) == expected  # a duplicate changes nothing
    assert placement(32, iter(group)) == expected
    assert placement(32, names(5, 8)) != expected


def test_the_placement_of_known_names_stays_put() -> None:
    """Every replica of a service must compute the same placement, replicas of two builds
    during a rolling upgrade included: a change here moves partitions in production (and
    the benchmark's figures, ``bench/scaling.py``, are for these names)."""
    owners = placement(16, [f"scaling-helm-{k}" for k in (1, 2, 3, 4)])
    assert {m: sorted(p for p, o in owners.items() if o == m) for m in set(owners.values())} == {
        "scaling-helm-1": [2, 5, 7, 14],
        "scaling-helm-2": [1, 10, 13, 15],
        "scaling-helm-3": [0, 3, 9, 12],
        "scaling-helm-4": [4, 6, 8, 11],
    }


def test_no_members_no_owner() -> None:
    assert placement(16, []) == {}
    assert share("a", 16, []) == set()


@pytest.mark.parametrize("partitions", PARTITION_COUNTS)
@pytest.mark.parametrize("members", range(1, 8))
def test_a_member_joining_or_leaving_moves_few_partitions(partitions: int, members: int) -> None:
    """Plain rendezvous moves exactly the partitions the newcomer takes (or the leaver gives
    up); the bound moves a few more, between the others, as it shrinks (or grows). Measured on
    these names: on average 1.0-1.5 times the newcomer's fair share (partitions / members),
    1.5-2.2 times from 7 to 8 members (where the bound drops: 3 to 2 of 16, 5 to 4 of 32, 10
    to 8 of 64), and never more than half of the partitions."""
    fair = partitions / (members + 1)
    joins, leaves = [], []
    for seed in range(NAME_SETS):
        group = names(members + 1, seed)
        smaller, larger = placement(partitions, group[:-1]), placement(partitions, group)
        joins.append(moved(smaller, larger))
        gone = group[seed % len(group)]
        leaves.append(moved(larger, placement(partitions, [m for m in group if m != gone])))
        newcomer = sum(owner == group[-1] for owner in larger.values())
        assert joins[-1] >= newcomer
    for moves in (joins, leaves):
        assert max(moves) <= partitions / 2
        assert mean(moves) <= 1.5 * fair + 2


def test_backoff_grows_and_is_capped() -> None:
    assert [backoff(n, base=0.5, cap=3) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 3, 3]
    assert backoff(1, base=0.5, cap=3, hint=10) == 3
