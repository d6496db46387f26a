"""The whole run decided up front from one seed: the Clusters' stories and the faults.

Everything random in a soak is drawn here, from one ``random.Random(seed)``, before anything
starts: which Clusters get a Lease, what each one goes through, which fault comes when, what
it hits and for how long. The same seed and sizes give the same plan, so a failing run is
repeated by its seed; only the system's own timing differs between two runs.

The run is a sequence of *episodes*. Each one issues a few workload steps (each on a
different Cluster, each Cluster's steps in its own order), waits ``lead`` seconds so those
steps are in flight, then injects one fault for ``duration`` seconds, and times how long the
system takes to be quiet and back at the expected state once the fault has ended. One fault
at a time is what lets a recovery be timed and attributed; the steps issued just before it
are what make it hit work in flight.

Coverage is planned, not hoped for: every service replica is SIGKILLed at least once (in a
quick run, one replica of every service), and every other kind of fault happens at least
once; the rest of the episodes draw a kind by weight (kills most often). Steps that did not
fit into the episodes (fewer Clusters with a step left than an episode wanted) are issued at
the end in rounds without faults, before the final convergence window.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

SERVICES = ("watcher", "writer", "identity", "lease", "helm", "monitor", "discovery")
REPLICAS = ("a", "b")
#: the streams whose leader a ``nats-leader`` fault kills (the busiest two)
LEADER_STREAMS = ("CAPIBUS_EVENTS", "CAPIBUS_STATUS")
#: planning figure for one episode (steps, fault, recovery, pause) on a busy two-core host
EPISODE_SECONDS = 45.0

Action = Literal["create", "scale", "upgrade", "delete"]

KILL = "kill"
FREEZE = "freeze"
NATS_NODE = "nats-node"
NATS_LEADER = "nats-leader"
REDIS = "redis"
APISERVER = "apiserver"
COMPACTION = "etcd-compaction"
REGISTRAR = "registrar"
STANDINS = "standins"
#: every fault kind, in the order the report lists them
KINDS = (
    KILL,
    FREEZE,
    NATS_NODE,
    NATS_LEADER,
    REDIS,
    APISERVER,
    COMPACTION,
    REGISTRAR,
    STANDINS,
)
#: how the episodes beyond the required ones choose their fault
EXTRA_WEIGHTS = {
    KILL: 6,
    FREEZE: 2,
    NATS_NODE: 1,
    NATS_LEADER: 1,
    REDIS: 1,
    APISERVER: 1,
    COMPACTION: 1,
    REGISTRAR: 1,
    STANDINS: 1,
}


@dataclass(frozen=True)
class Sizes:
    """What the command line decides; ``lease_ttl`` and ``watch_timeout`` bound durations."""

    clusters: int = 50
    minutes: float = 25.0
    quick: bool = False
    lease_ttl: float = 6.0
    #: the watchers' server-side watch timeout: a compaction fault freezes them for longer,
    #: so their watches end and resume from a compacted resourceVersion (a real 410)
    watch_timeout: float = 20.0
    #: ``NAME=value`` settings every service gets on top of the soak's (``--set``)
    settings: tuple[str, ...] = ()
    #: NATS and Redis over TLS only (``--tls``), as a production install runs them
    tls: bool = False


@dataclass(frozen=True)
class Step:
    """One thing the portal does to one Cluster."""

    cluster: str
    action: Action
    #: the first node group's count after the step (create and scale)
    count: int = 0
    #: create only: the Cluster gets a Lease
    lease: bool = False


@dataclass(frozen=True)
class Fault:
    kind: str
    #: a replica label (``helm-a``), a stream name (``nats-leader``), or empty
    target: str
    #: seconds the fault lasts (a process down or frozen, a server stopped)
    duration: float
    #: seconds between the episode's steps and the fault
    lead: float


@dataclass(frozen=True)
class Episode:
    index: int
    steps: tuple[Step, ...]
    fault: Fault


@dataclass(frozen=True)
class Plan:
    seed: int
    sizes: Sizes
    clusters: tuple[str, ...]
    episodes: tuple[Episode, ...]
    #: steps issued after the last fault, a round at a time, each round converged
    tail: tuple[tuple[Step, ...], ...]

    def steps(self) -> list[Step]:
        return [s for e in self.episodes for s in e.steps] + [s for r in self.tail for s in r]


def replicas() -> list[str]:
    return [f"{service}-{replica}" for service in SERVICES for replica in REPLICAS]


def make_plan(seed: int, sizes: Sizes) -> Plan:
    rng = random.Random(seed)
    names = tuple(f"soak-{i:03d}" for i in range(sizes.clusters))
    stories = {name: story(rng, name) for name in names}
    faults = fault_schedule(rng, sizes)
    chunks, rounds = spread(rng, stories, len(faults))
    episodes = tuple(
        Episode(i, chunk, fault)
        for i, (chunk, fault) in enumerate(zip(chunks, faults, strict=True))
    )
    return Plan(seed, sizes, names, episodes, rounds)


def story(rng: random.Random, name: str) -> list[Step]:
    """A Cluster's steps in order: created (sometimes with a Lease), scaled and upgraded
    (each usually, in either order), and deleted about half the time, so the end state has
    live Clusters to compare with their objects as well as deleted ones to find gone."""
    steps = [Step(name, "create", count=2, lease=rng.random() < 0.3)]
    changes: list[Step] = []
    if rng.random() < 0.9:
        changes.append(Step(name, "scale", count=rng.choice((1, 3))))
    if rng.random() < 0.8:
        changes.append(Step(name, "upgrade"))
    rng.shuffle(changes)
    steps += changes
    if rng.random() < 0.5:
        steps.append(Step(name, "delete"))
    return steps


def fault_schedule(rng: random.Random, sizes: Sizes) -> list[Fault]:
    required = required_faults(rng, sizes)
    wanted = max(len(required), round(sizes.minutes * 60 / EPISODE_SECONDS))
    kinds, weights = list(EXTRA_WEIGHTS), list(EXTRA_WEIGHTS.values())
    extra = [rng.choices(kinds, weights)[0] for _ in range(wanted - len(required))]
    chosen = required + [(kind, pick_target(rng, kind)) for kind in extra]
    rng.shuffle(chosen)
    return [
        Fault(kind, target, duration(rng, kind, sizes), round(rng.uniform(0, 3), 1))
        for kind, target in chosen
    ]


def required_faults(rng: random.Random, sizes: Sizes) -> list[tuple[str, str]]:
    if sizes.quick:
        kills = [(KILL, f"{service}-{rng.choice(REPLICAS)}") for service in SERVICES]
    else:
        kills = [(KILL, label) for label in replicas()]
    others = [(kind, pick_target(rng, kind)) for kind in KINDS if kind != KILL]
    return kills + others


def pick_target(rng: random.Random, kind: str) -> str:
    if kind in (KILL, FREEZE):
        return rng.choice(replicas())
    if kind == NATS_LEADER:
        return rng.choice(LEADER_STREAMS)
    if kind == NATS_NODE:
        return f"nats-{rng.randrange(3)}"
    return ""


def duration(rng: random.Random, kind: str, sizes: Sizes) -> float:
    """Seconds the fault lasts; a frozen replica always outlives its leases."""
    low, high = {
        KILL: (0.0, 8.0),
        FREEZE: (sizes.lease_ttl + 2, sizes.lease_ttl + 12),
        NATS_NODE: (3.0, 15.0),
        NATS_LEADER: (3.0, 15.0),
        REDIS: (3.0, 12.0),
        APISERVER: (3.0, 12.0),
        COMPACTION: (sizes.watch_timeout + 5, sizes.watch_timeout + 15),
        REGISTRAR: (10.0, 30.0),
        STANDINS: (10.0, 30.0),
    }[kind]
    return round(rng.uniform(low, high), 1)


def spread(
    rng: random.Random, stories: dict[str, list[Step]], episodes: int
) -> tuple[list[tuple[Step, ...]], tuple[tuple[Step, ...], ...]]:
    """The steps cut into ``episodes`` chunks of nearly equal size, consumed from the
    stories in order, at most one step per Cluster per chunk (each step waits for the
    Cluster's previous one to have converged, at the end of the episode before); and what
    did not fit, as rounds of one step per Cluster."""
    pending = {name: list(steps) for name, steps in stories.items()}
    total = sum(len(steps) for steps in pending.values())
    chunks: list[tuple[Step, ...]] = []
    for index in range(episodes):
        want = math.floor((index + 1) * total / episodes) - math.floor(index * total / episodes)
        ready = sorted(name for name, steps in pending.items() if steps)
        chosen = rng.sample(ready, min(want, len(ready)))
        chunks.append(tuple(pending[name].pop(0) for name in chosen))
    rounds: list[tuple[Step, ...]] = []
    while any(pending.values()):
        rounds.append(tuple(steps.pop(0) for _, steps in sorted(pending.items()) if steps))
    return chunks, tuple(rounds)
