"""The soak's plan: one seed decides everything, every fault kind and replica is covered, each
Cluster's steps keep their order and never share an episode."""

from __future__ import annotations

from collections import Counter

from soak.__main__ import parse, sizes
from soak.plan import (
    FREEZE,
    KILL,
    KINDS,
    SERVICES,
    Plan,
    Sizes,
    Step,
    make_plan,
    replicas,
)
from soak.report import command

QUICK = Sizes(clusters=10, minutes=10.0, quick=True)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    assert make_plan(42, Sizes()) == make_plan(42, Sizes())
    assert make_plan(42, QUICK) == make_plan(42, QUICK)
    assert make_plan(42, Sizes()).episodes != make_plan(43, Sizes()).episodes


def test_every_replica_is_killed_and_every_other_kind_happens() -> None:
    for seed in range(20):
        faults = [e.fault for e in make_plan(seed, Sizes()).episodes]
        killed = {f.target for f in faults if f.kind == KILL}
        assert killed == set(replicas())
        assert {f.kind for f in faults} == set(KINDS)


def test_a_quick_run_kills_one_replica_of_every_service() -> None:
    for seed in range(20):
        faults = [e.fault for e in make_plan(seed, QUICK).episodes]
        killed = {f.target.rsplit("-", 1)[0] for f in faults if f.kind == KILL}
        assert killed == set(SERVICES)
        assert {f.kind for f in faults} == set(KINDS)


def test_more_minutes_means_more_faults_never_fewer_than_coverage_needs() -> None:
    short, long = make_plan(1, Sizes(minutes=1)), make_plan(1, Sizes(minutes=60))
    assert len(short.episodes) == len(replicas()) + len(KINDS) - 1
    assert len(long.episodes) > len(short.episodes)


def test_a_frozen_replica_outlives_its_lease_and_a_compaction_its_watches() -> None:
    sizes = Sizes(lease_ttl=6.0, watch_timeout=20.0)
    for seed in range(20):
        for episode in make_plan(seed, sizes).episodes:
            fault = episode.fault
            if fault.kind == FREEZE:
                assert fault.duration > sizes.lease_ttl
            if fault.kind == "etcd-compaction":
                assert fault.duration > sizes.watch_timeout


def _order(plan: Plan) -> dict[str, list[Step]]:
    seen: dict[str, list[Step]] = {}
    for step in plan.steps():
        seen.setdefault(step.cluster, []).append(step)
    return seen


def test_each_cluster_is_created_first_deleted_last_and_changed_at_most_once_each() -> None:
    for seed in range(20):
        plan = make_plan(seed, Sizes(clusters=30, minutes=20))
        assert set(_order(plan)) == set(plan.clusters)
        for steps in _order(plan).values():
            actions = [s.action for s in steps]
            assert actions[0] == "create"
            assert "delete" not in actions[:-1]
            assert Counter(actions)["scale"] <= 1
            assert Counter(actions)["upgrade"] <= 1


def test_an_episode_never_holds_two_steps_of_one_cluster() -> None:
    for seed in range(20):
        plan = make_plan(seed, Sizes(clusters=5, minutes=30))
        for episode in plan.episodes:
            names = [s.cluster for s in episode.steps]
            assert len(names) == len(set(names))
        for round_ in plan.tail:
            names = [s.cluster for s in round_]
            assert len(names) == len(set(names))


def test_steps_are_spread_over_the_episodes_not_bunched_at_the_start() -> None:
    plan = make_plan(7, Sizes(clusters=50, minutes=25))
    sizes = [len(e.steps) for e in plan.episodes]
    assert max(sizes) - min(sizes) <= 1
    assert not plan.tail
    half = len(plan.episodes) // 2
    later = [s.action for e in plan.episodes[half:] for s in e.steps]
    assert {"scale", "upgrade", "delete"} <= set(later)


def test_settings_are_in_the_repeat_command_and_leave_the_plan_alone() -> None:
    chosen = sizes(parse(["--quick", "--set", "CAPIBUS_CONSUMER__FETCH_TIMEOUT=5"]))
    plan = make_plan(3, chosen)
    assert plan.episodes == make_plan(3, QUICK).episodes
    assert command(plan) == (
        "python -m soak --seed 3 --clusters 10 --minutes 10 "
        "--set CAPIBUS_CONSUMER__FETCH_TIMEOUT=5 --quick"
    )
