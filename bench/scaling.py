"""(w) Scaling out: the helm service at 1, 2 and 4 replicas, a replica added and one killed.

What is scaled: the helm service, with identity and monitor at the same replica count, beside
one watcher, one writer and one lease service (OIDC, Zenith and Leases off, as in (d)). Each
replica count runs on a fresh stack (its own API server, NATS and Redis: no durable consumer,
lease or earlier Cluster is shared), on the same workload: ``clusters`` Clusters created at
once in a namespace of the same name, so each Cluster hashes to the same partition in every
run, and replicas named alike in every run (``scaling-helm-<k>``), so a replica count places
the partitions the same way in every run that uses it.

Why a helm stand-in: the real helm is CPU-bound on this machine (``bench/ANALYSIS.md``,
"s: first step"); with it, more replicas would only share the same two cores. The helm
service runs ``standins/helmbin.py`` instead (``CAPIBUS_HELM__EXECUTABLE``, a wrapper written
here), which answers the adapter's commands, keeps releases as Helm's storage Secrets and
*waits* ``latency`` seconds in each install (its CPU is a Python start and a few requests).
With ``CAPIBUS_HELM__MAX_CONCURRENT=slots`` (4), one replica installs at most ``slots /
latency`` releases per second, whatever the machine: the replica, not the slot or the core,
is the unit scaled. The stand-in applies no chart object, so no CAPI object exists and no
Cluster reaches Ready: the clock stops at **release deployed** (the benchmark's watch sees the
release Secret ``sh.helm.release.v1.<name>.v1`` labelled ``status=deployed``), which is what
the helm service's own work ends with.

Runs, each on its own stack:

- **1, 2, 4 replicas**, in ``rounds`` rounds (1, 2, 4 in turn: the machine is shared, and
  other tenants' load moves between runs): t0 = the first create; all installed = the last
  release deployed; throughput = Clusters / that time. The ratios 2 vs 1 and 4 vs 1 are the
  median of each round's own ratio, against ≥ 1.8 and ≥ 3.2.
  The partition placement is reported beside them (partitions and Clusters per replica, and
  the ratio it allows: the Clusters / the largest replica's share), since a replica's work is
  what its partitions hold.
- **join**: 2 replicas; when a quarter of the releases are deployed a third helm replica
  starts. Per partition it ends up holding: from its start to its ``owns partition`` log line,
  and to the first message it handled there (the first status or metadata patch it published
  on the partition, as stored in ``CAPIBUS_STATUS``, whose subjects carry the partition and
  whose ``source`` names the replica).
- **kill**: 2 replicas; when a quarter are deployed one replica's process group is SIGKILLed
  (its helm stand-in processes die with it, mid-install). Per partition it held: from the
  kill to the survivor's ``owns partition`` line and to the survivor's first message there.

Checks over every run:

- **exclusivity**: no Cluster handled by two replicas at once. Every helm command is an
  interval in the stand-in's record (start and end lines with the calling replica; a command
  killed with its replica ends at the kill) and in the calling replica's log (``shared.helm``
  logs each command with its duration); two intervals of one release from two replicas that
  overlap count that Cluster.
- **exactly once** (join and kill): at the end, one release revision per Cluster (the release
  Secrets left) and one completed install per Cluster (release Secrets, told apart by uid, that
  the benchmark's watch saw reach ``deployed``; the stand-in's record cannot say it, since a
  kill may land between the release turning ``deployed`` and the record's end line). Installs
  a kill interrupted before ``deployed`` are repaired by the next holder (``get metadata``
  finds ``pending-install``, ``uninstall``, install again) and counted apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import deployment, helmlog, status
from bench.common import PARTITIONS, Clients, percentile, run_pool
from bench.deployment import LEASE_TTL, load_average, reaped_cpu, wait_for_count
from bench.fleet import RELEASE, stored
from bench.lifecycle import Figure, Section, Verdict, spread
from bench.observe import Observer
from bench.procs import Child, Children, CpuSnapshot, labels_for
from shared import coordination, subjects
from shared.resources import CLUSTER, KINDS, NAMESPACE, SECRET
from standins import helmbin
from testenv.crds import apply_crds
from testenv.harness import LocalStack, ensure_binaries

Json = dict[str, Any]
NAMESPACE_NAME = "bench-scaling"
TEMPLATE = "bench-scaling-tpl"
SINGLE = ("watcher", "writer", "lease")
SCALED = ("identity", "monitor", "helm")
TRIGGER = 0.25  # share of releases deployed when a replica joins or is killed
SETTLE = 3.0
TARGETS = {2: 1.8, 4: 3.2}
#: what a replica logs when partitions move slowly or leases lapse (``shared.consumer``)
MOVES = (
    "handing over partition",
    "lost partition",
    "renewed after its lease lapsed",
    "in flight at the previous owner",
)
OWNS = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ INFO \S+: owns partition (?P<p>\d+) "
)


@dataclass(frozen=True)
class ScalingSizes:
    clusters: int
    latency: float  # seconds the stand-in helm waits in each install
    slots: int = 4  # CAPIBUS_HELM__MAX_CONCURRENT per replica
    replicas: tuple[int, ...] = (1, 2, 4)
    #: rounds of every replica count, one after the other (other tenants' load varies)
    rounds: int = 3


@dataclass
class Run:
    """One run: its workload, what the benchmark saw, and what the services left behind."""

    tag: str
    replicas: int
    names: list[str]
    t0: float = 0.0
    #: wall clock minus monotonic clock, to put the services' wall-clock times on our clock
    offset: float = field(default_factory=lambda: time.time() - time.monotonic())
    created: dict[str, float] = field(default_factory=dict)
    installed: dict[str, float] = field(default_factory=dict)
    #: uids of the release Secrets seen deployed, per Cluster: one per completed install
    deployed_uids: dict[str, set[str]] = field(default_factory=dict)
    round: int = 0  # of the plain runs (0: the join and kill runs)
    event_at: float | None = None  # monotonic: the third replica started, or the kill
    event_replica: str = ""
    helm_logs: dict[str, str] = field(default_factory=dict)
    record: list[Json] = field(default_factory=list)
    #: (wall time stored, partition, Cluster name, source) of the helm service's patches
    patches: list[tuple[float, int, str, str]] = field(default_factory=list)
    revisions: Counter[str] = field(default_factory=Counter)
    #: messages and bytes stored per stream at the end of the run
    streams: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: API requests (WATCH left out) from t0 to the last release deployed, "client verb"
    requests: Counter[str] = field(default_factory=Counter)
    ended: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.installed) == len(self.names)

    def all_installed(self) -> float:
        return max(self.installed.values(), default=self.t0) - self.t0

    def rate(self) -> float:
        took = self.all_installed()
        return len(self.installed) / took if took > 0 else 0.0

    def wall(self, monotonic: float) -> float:
        return monotonic + self.offset


# --- placement ---------------------------------------------------------------------------------


def labels(service: str, count: int) -> list[str]:
    return [f"scaling-{service}-{k}" for k in range(1, count + 1)]


def partition_of(name: str, partitions: int = PARTITIONS) -> int:
    return subjects.partition_of(f"{NAMESPACE_NAME}/{name}", partitions)


def placement(members: Sequence[str], partitions: int = PARTITIONS) -> dict[str, list[int]]:
    """The partitions the replicas place on each member (``shared.coordination``)."""
    placed: dict[str, list[int]] = {m: [] for m in members}
    for p, owner in sorted(coordination.placement(partitions, members).items()):
        placed[owner].append(p)
    return placed


def loads(placed: dict[str, list[int]], per_partition: Counter[int]) -> dict[str, int]:
    return {m: sum(per_partition[p] for p in ps) for m, ps in placed.items()}


def bound(total: int, member_loads: Iterable[int]) -> float:
    """The speed-up over one replica a placement allows: everything / the largest share."""
    return total / max(max(member_loads, default=total), 1)


def random_bounds(
    per_partition: Counter[int], members: int, samples: int = 2000, partitions: int = PARTITIONS
) -> list[float]:
    """``bound`` for ``samples`` sets of random member names (pod names are random)."""
    rng = random.Random(20261128)
    total = sum(per_partition.values())
    out = []
    for _ in range(samples):
        names = [f"helm-{rng.getrandbits(40):010x}" for _ in range(members)]
        out.append(bound(total, loads(placement(names, partitions), per_partition).values()))
    return out


def balanced_bound(per_partition: Counter[int], members: int) -> float:
    """``bound`` if each member held ⌈P/n⌉ partitions at most, heaviest placed first."""
    cap = -(-PARTITIONS // members)
    held: list[list[int]] = [[] for _ in range(members)]
    for p in sorted(range(PARTITIONS), key=lambda p: -per_partition[p]):
        free = [h for h in held if len(h) < cap]
        min(free, key=lambda h: sum(per_partition[q] for q in h)).append(p)
    total = sum(per_partition.values())
    return bound(total, (sum(per_partition[p] for p in h) for h in held))


# --- the stack and the services ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_stack(workdir: Path, bin_dir: Path) -> AsyncIterator[tuple[LocalStack, Clients]]:
    """A stack of the run's own, with our CRDs and the peers' applied; stopped on exit."""
    # Laid out as the benchmark lays out a phase's stack: the audit log beside its directory.
    audit = status.audit_args(workdir)
    stack = LocalStack(
        workdir / "stack", bin_dir=bin_dir, use_env_stack=False, apiserver_args=audit
    )
    await asyncio.to_thread(stack.start)
    try:
        clients = await Clients.connect(stack)
        try:
            await apply_crds(clients.kube, field_manager="capibus-bench")
            yield stack, clients
        finally:
            await clients.aclose()
    finally:
        await asyncio.to_thread(stack.stop)


@dataclass
class Services:
    """The run's service processes, by label, and how to start one more helm replica."""

    children: Children
    env: dict[str, str]
    running: dict[str, Child] = field(default_factory=dict)

    def start(self, service: str, label: str) -> Child:
        child = self.children.start(service, self.env, label=label)
        self.running[label] = child
        return child

    def of(self, service: str) -> list[Child]:
        return [c for label, c in self.running.items() if label.startswith(f"scaling-{service}-")]


def service_env(stack: LocalStack, wrapper: Path, sizes: ScalingSizes) -> dict[str, str]:
    return {
        **stack.env(),
        **deployment.deployment_env(wrapper, oidc=False),
        "CAPIBUS_HELM__MAX_CONCURRENT": str(sizes.slots),
    }


async def start_services(services: Services, replicas: int) -> None:
    """Start every process; return once each replica owns the partitions placed on it."""
    for name in SINGLE:
        services.start(name, f"scaling-{name}")
    for name in SCALED:
        for label in labels(name, replicas):
            services.start(name, label)
    waits = [wait_for_count(services.running["scaling-watcher"], "listed at", len(KINDS))]
    waits += [wait_for_count(services.running[f"scaling-{n}"], "owns partition", PARTITIONS)
              for n in SINGLE if n != "watcher"]  # fmt: skip
    for name in SCALED:
        for label, partitions in placement(labels(name, replicas)).items():
            waits.append(until_owned(services.running[label], partitions))
    await asyncio.gather(*waits)
    # A freshly claimed partition is fenced for one lease TTL before it is pulled from.
    await asyncio.sleep(LEASE_TTL + 0.5)


def stop_at_once(children: Children) -> None:
    """SIGTERM to every process group first, then ``Children.stop`` each (which waits, and
    kills what lingers): the services wind down together, not one after the other."""
    for child in children.running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGTERM)
    children.stop_all()


async def until_owned(child: Child, partitions: Iterable[int], within: float = 90.0) -> None:
    """Until ``child``'s log says it owns every one of ``partitions``."""
    wanted = set(partitions)
    deadline = time.monotonic() + within
    while not wanted <= set(owned_at(child.log())):
        if not child.alive():
            raise RuntimeError(f"{child.label} exited; log tail:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.label} does not own {sorted(wanted)}:\n{child.log_tail()}")
        await asyncio.sleep(0.1)


def owned_at(log: str, since: float = 0.0) -> dict[int, float]:
    """Partition → the first ``owns partition`` line at or after ``since`` (wall clock)."""
    found: dict[int, float] = {}
    for line in log.splitlines():
        match = OWNS.match(line)
        if match:
            at = datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since:
                found.setdefault(int(match["p"]), at)
    return found


# --- one run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """What a run does mid-way: nothing, a third helm replica joining, or a SIGKILL."""

    tag: str
    replicas: int
    action: str = ""  # "", "join" or "kill"
    round: int = 0  # of the plain runs


async def run_once(
    scenario: Scenario, stack: LocalStack, clients: Clients, log_dir: Path, sizes: ScalingSizes
) -> Run:
    await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
    record = log_dir / "helm-record.jsonl"
    wrapper = helmbin.write_wrapper(log_dir / "helm", latency=sizes.latency, record=record)
    names = [f"w{i:03d}" for i in range(sizes.clusters)]
    run = Run(tag=scenario.tag, replicas=scenario.replicas, names=names, round=scenario.round)
    kube = clients.kube
    await kube.create(NAMESPACE, {"metadata": {"name": NAMESPACE_NAME}})
    await deployment.create_template(kube, TEMPLATE)
    await run_pool(
        len(names), lambda i: deployment.create_credentials(kube, NAMESPACE_NAME, names[i])
    )
    services = Services(Children(log_dir=log_dir), service_env(stack, wrapper, sizes))
    try:
        await start_services(services, scenario.replicas)
        await _measure(run, scenario, services, clients, sizes)
        run.helm_logs = {c.label: c.log() for c in services.of("helm")}
    finally:
        stop_at_once(services.children)
    if record.exists():
        run.record = [json.loads(line) for line in record.read_text().splitlines() if line]
    # The API server's audit log (``bench.status.audit_args``), next to the stack's directory.
    audit = stack.workdir.parent / status.AUDIT_LOG
    end = run.wall(max(run.installed.values(), default=run.t0))
    run.requests = await asyncio.to_thread(status.requests_by_client, audit, run.wall(run.t0), end)
    return run


async def _measure(
    run: Run, scenario: Scenario, services: Services, clients: Clients, sizes: ScalingSizes
) -> None:
    obs = Observer(clients.kube, NAMESPACE_NAME, (CLUSTER, SECRET))
    obs.listeners.append(lambda key, obj, now: _deployed(run, key, obj, now))
    await obs.start()
    helm_pids = [c.proc.pid for c in services.of("helm")]
    cpu_labels = labels_for(*services.running.values())
    try:
        load, helm_cpu = load_average(), sum(reaped_cpu(pid) for pid in helm_pids)
        before = CpuSnapshot.take(cpu_labels)
        action = asyncio.create_task(_act(run, scenario, services, obs))
        run.t0 = time.monotonic()
        await run_pool(len(run.names), lambda i: _create(run, clients, i))
        within = max(300.0, 3 * len(run.names) / sizes.slots * sizes.latency + 120.0)
        await obs.until(lambda: run.complete, within)
        # Labels again: a replica that joined mid-run is named too.
        after = CpuSnapshot.take(labels_for(*services.running.values()))
        await action
        run.ended = time.monotonic()
        stand_in = sum(_reaped(pid) for pid in helm_pids) - helm_cpu
        run.notes += [
            f"load average before (1/5/15 min): {load}, at the end: {load_average()}",
            after.cpu_line(before),
            f"helm stand-in processes (in 'other processes' above): "
            f"{stand_in / max(after.wall - before.wall, 1e-9):.2f} cores",
        ]
        await asyncio.sleep(SETTLE)
        run.patches = await helm_patches(clients, run)
        run.revisions = await release_revisions(clients, run.names)
        run.streams = await stream_sizes(clients)
    finally:
        await obs.stop()


def _reaped(pid: int) -> float:
    """``reaped_cpu`` of a process, 0 once it is gone (the killed replica)."""
    try:
        return reaped_cpu(pid)
    except OSError:
        return 0.0


def _deployed(run: Run, key: tuple[str, str], obj: Json, now: float) -> None:
    match = RELEASE.match(key[1])
    status = ((obj.get("metadata") or {}).get("labels") or {}).get("status")
    if key[0] == SECRET.token and match and status == "deployed":
        run.installed.setdefault(match["name"], now)
        uid = str(obj["metadata"].get("uid", ""))
        run.deployed_uids.setdefault(match["name"], set()).add(uid)


async def _create(run: Run, clients: Clients, index: int) -> None:
    name = run.names[index]
    await deployment.create_cluster(clients.kube, NAMESPACE_NAME, name, TEMPLATE)
    run.created[name] = time.monotonic()


async def _act(run: Run, scenario: Scenario, services: Services, obs: Observer) -> None:
    if not scenario.action:
        return
    trigger = max(1, round(TRIGGER * len(run.names)))
    await obs.until(lambda: len(run.installed) >= trigger, 600.0)
    if scenario.action == "join":
        label = labels("helm", scenario.replicas + 1)[-1]
        run.event_at = time.monotonic()
        services.start("helm", label)
    else:
        victim = services.of("helm")[0]
        run.event_at = time.monotonic()
        os.killpg(victim.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait)
        label = victim.label
    run.event_replica = label


async def helm_patches(clients: Clients, run: Run) -> list[tuple[float, int, str, str]]:
    """The helm service's status and metadata patches of the run's Clusters, as stored."""
    found = []
    subject = f"{subjects.PREFIX}.status.*.{CLUSTER.token}.*.{NAMESPACE_NAME}.*"
    async for when, name, body in stored(clients.bus, subjects.STATUS.name, subject):
        source = str(body.get("source", ""))
        if source.startswith("helm/"):
            tokens = name.split(".")
            found.append((when, int(tokens[4]), tokens[-1], source.removeprefix("helm/")))
    return found


async def stream_sizes(clients: Clients) -> dict[str, tuple[int, int]]:
    sizes = {}
    for stream in subjects.ALL_STREAMS:
        info = await clients.bus.js.stream_info(stream.name)
        sizes[stream.name] = (info.state.messages, info.state.bytes)
    return sizes


async def release_revisions(clients: Clients, names: Sequence[str]) -> Counter[str]:
    """Release Secrets left per Cluster (Helm keeps one per stored revision)."""
    secrets, _ = await clients.kube.list(
        SECRET, namespace=NAMESPACE_NAME, label_selector="owner=helm"
    )
    counts: Counter[str] = Counter({name: 0 for name in names})
    for secret in secrets:
        counts[secret["metadata"]["labels"]["name"]] += 1
    return counts


# --- what the records say -------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    release: str
    replica: str
    start: float  # wall clock
    end: float
    verb: str


def record_intervals(
    record: Sequence[Json], killed: str, killed_at: float, ended: float
) -> list[Interval]:
    """Every stand-in command as an interval; one with no end ran until its replica died
    (``killed_at``) or, for a live replica, until the run ended."""
    starts: dict[int, Json] = {}
    out: list[Interval] = []
    for line in record:
        if line["event"] == "start":
            starts[line["pid"]] = line
        elif (start := starts.pop(line["pid"], None)) is not None and start["release"]:
            out.append(
                Interval(start["release"], start["replica"], start["at"], line["at"], start["verb"])
            )
    for start in starts.values():
        if start["release"]:
            end = killed_at if start["replica"] == killed else ended
            out.append(
                Interval(start["release"], start["replica"], start["at"], end, start["verb"])
            )
    return out


def log_intervals(helm_logs: dict[str, str]) -> list[Interval]:
    """The helm commands each replica logged (``shared.helm``: label, outcome, duration)."""
    return [
        Interval(r.release, replica, r.started, r.ended, r.verb)
        for replica, log in helm_logs.items()
        for r in helmlog.runs(log)
        if r.release
    ]


def concurrent(intervals: Iterable[Interval]) -> set[str]:
    """Releases with two overlapping intervals from two replicas."""
    by_release: dict[str, list[Interval]] = {}
    for i in intervals:
        by_release.setdefault(i.release, []).append(i)
    found = set()
    for release, items in by_release.items():
        items.sort(key=lambda i: i.start)
        for a, b in itertools.pairwise(items):
            if a.replica != b.replica and b.start < a.end:
                found.add(release)
    return found


def touched_by(intervals: Iterable[Interval]) -> Counter[int]:
    """How many Clusters had helm commands from 1, 2, ... replicas (at any time)."""
    replicas: dict[str, set[str]] = {}
    for i in intervals:
        replicas.setdefault(i.release, set()).add(i.replica)
    return Counter(len(r) for r in replicas.values())


def served_after(
    patches: Sequence[tuple[float, int, str, str]],
    replica: str,
    partitions: Iterable[int],
    since: float,
) -> dict[int, float]:
    """Partition → seconds from ``since`` to ``replica``'s first patch on it (wall clock)."""
    first: dict[int, float] = {}
    wanted = set(partitions)
    for when, partition, _, source in sorted(patches):
        if source == replica and partition in wanted and when >= since:
            first.setdefault(partition, when - since)
    return first


def first_command(
    intervals: Iterable[Interval], replica: str, partitions: Iterable[int], since: float
) -> dict[int, float]:
    """Partition → seconds from ``since`` to ``replica``'s first helm command on one of its
    Clusters (the stand-in's record)."""
    first: dict[int, float] = {}
    wanted = set(partitions)
    for i in sorted(intervals, key=lambda i: i.start):
        p = partition_of(i.release)
        if i.replica == replica and p in wanted and i.start >= since:
            first.setdefault(p, i.start - since)
    return first


def claims(helm_logs: dict[str, str]) -> list[tuple[float, int, str]]:
    """Every ``owns partition`` line of every replica: (wall time, partition, replica)."""
    found = []
    for replica, log in helm_logs.items():
        for line in log.splitlines():
            match = OWNS.match(line)
            if match:
                at = datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((at, int(match["p"]), replica))
    return sorted(found)


def outside_lease(intervals: Iterable[Interval], helm_logs: dict[str, str]) -> list[Interval]:
    """Helm commands a replica started after another replica had claimed the Cluster's
    partition: its lease was gone by then (a claim needs the key free), whatever it ran."""
    history = claims(helm_logs)
    out = []
    for i in intervals:
        p = partition_of(i.release)
        holders = [replica for at, q, replica in history if q == p and at <= i.start]
        if holders and holders[-1] != i.replica:
            out.append(i)
    return out


def installs(record: Sequence[Json]) -> tuple[Counter[str], Counter[str]]:
    """Per release: installs completed (``upgrade`` ended ok), and uninstalls that repaired."""
    done: Counter[str] = Counter()
    repaired: Counter[str] = Counter()
    for line in record:
        if line["event"] == "end" and line["outcome"] == "ok" and line["release"]:
            if line["verb"] == "upgrade":
                done[line["release"]] += 1
            elif line["verb"] == "uninstall":
                repaired[line["release"]] += 1
    return done, repaired


def slot_use(intervals: Iterable[Interval]) -> dict[str, tuple[int, float, float]]:
    """Per replica: installs, the span from its first install start to its last end, and
    the installs in flight on average over that span (at most the slots)."""
    by: dict[str, list[Interval]] = {}
    for i in intervals:
        if i.verb == "upgrade":
            by.setdefault(i.replica, []).append(i)
    out = {}
    for replica, items in sorted(by.items()):
        span = max(i.end for i in items) - min(i.start for i in items)
        busy = sum(i.end - i.start for i in items)
        out[replica] = (len(items), span, busy / span if span > 0 else 0.0)
    return out


# --- the phase ------------------------------------------------------------------------------------


async def measure(
    clients: Clients, stack: LocalStack, children: Children, sizes: ScalingSizes
) -> Section:
    """Every run; the first on the phase's own stack, each other one on a fresh stack."""
    bin_dir = await asyncio.to_thread(ensure_binaries)
    scenarios = [
        Scenario(f"r{n}" + (f"-{k}" if sizes.rounds > 1 else ""), n, round=k)
        for k in range(1, sizes.rounds + 1)
        for n in sizes.replicas
    ]
    scenarios += [Scenario("join", 2, "join"), Scenario("kill", 2, "kill")]
    runs: list[Run] = []
    errors: list[str] = []
    for index, scenario in enumerate(scenarios):
        log_dir = children.log_dir / f"scaling-{scenario.tag}"
        _progress(f"(w) {scenario.tag}: {scenario.replicas} replica(s), {sizes.clusters} Clusters")
        try:
            if index == 0:
                runs.append(await run_once(scenario, stack, clients, log_dir, sizes))
                continue
            workdir = stack.workdir.parent / f"stack-w-{scenario.tag}"
            async with fresh_stack(workdir, bin_dir) as (fresh, fresh_clients):
                runs.append(await run_once(scenario, fresh, fresh_clients, log_dir, sizes))
        except Exception as exc:  # one run's failure leaves the others' figures
            errors.append(f"{scenario.tag}: {type(exc).__name__}: {exc}")
    return section(runs, sizes, errors)


def _progress(text: str) -> None:
    print(f"[bench] {text}", flush=True, file=sys.stderr)


# --- the figures ------------------------------------------------------------------------------


def section(runs: list[Run], sizes: ScalingSizes, errors: list[str]) -> Section:
    n = sizes.clusters
    s = Section(key="w", title=f"scaling out, {n} Clusters at once", method=method(sizes))
    plain = Rounds([r for r in runs if r.round])
    for count in sizes.replicas:
        s.figures.append(_throughput(plain, count, sizes))
    s.figures.append(_exclusive(runs))
    by_tag = {r.tag: r for r in runs}
    s.figures += [_join(by_tag.get("join"), plain), _kill(by_tag.get("kill"), plain)]
    s.figures.append(_exactly_once([r for r in runs if r.tag in ("join", "kill")], n))
    s.figures.append(_outside(runs))
    s.details += _placement_details(sizes, runs[0].names if runs else [])
    for run in runs:
        s.details += _run_details(run, sizes.slots)
    s.details += [f"run failed: {e}" for e in errors]
    return s


def _key(count: int) -> str:
    return {1: "w1", 2: "w2", 4: "w3"}.get(count, f"w1-{count}")


@dataclass
class Rounds:
    """The plain runs, by round and replica count."""

    runs: list[Run]

    def of(self, count: int) -> list[Run]:
        return [r for r in self.runs if r.replicas == count and r.complete]

    def median_time(self, count: int) -> float | None:
        times = [r.all_installed() for r in self.of(count)]
        return percentile(times, 50) if times else None

    def ratios(self, count: int) -> list[float]:
        """Per round: this count's throughput over one replica's in the same round."""
        ones = {r.round: r for r in self.of(1)}
        return [r.rate() / ones[r.round].rate() for r in self.of(count) if r.round in ones]


def _throughput(plain: Rounds, count: int, sizes: ScalingSizes) -> Figure:
    n = sizes.clusters
    title = (
        f"{count} helm replica(s) x {sizes.slots} helm slots: {n} Clusters created at once → "
        "all releases deployed"
    )
    done = plain.of(count)
    if not done:
        return Figure(_key(count), title, "not measured", verdict="INCOMPLETE")
    times = [r.all_installed() for r in done]
    rates = [r.rate() for r in done]
    value = (
        f"{percentile(times, 50):.1f} s, {percentile(rates, 50):.2f} Clusters/s "
        f"(rounds: {', '.join(f'{t:.1f}' for t in times)} s)"
    )
    target = TARGETS.get(count)
    ratios = plain.ratios(count)
    if count == 1 or target is None or not ratios:
        return Figure(_key(count), title, value)
    ratio = percentile(ratios, 50)
    placed = loads(
        placement(labels("helm", count)), Counter(partition_of(x) for x in done[0].names)
    )
    value += (
        f"; {ratio:.2f}x one replica ({', '.join(f'{x:.2f}' for x in ratios)}; the "
        f"placement allows {bound(n, placed.values()):.2f}x)"
    )
    verdict: Verdict = "pass" if ratio >= target else "MISSED"
    return Figure(_key(count), title, value, f"≥ {target:g}x one replica", verdict)


def _record_intervals(run: Run) -> list[Interval]:
    killed = run.event_replica if run.tag == "kill" else ""
    killed_at = run.wall(run.event_at) if run.event_at is not None else 0.0
    return record_intervals(run.record, killed, killed_at, run.wall(run.ended))


def _all_intervals(run: Run) -> list[Interval]:
    return _record_intervals(run) + log_intervals(run.helm_logs)


def _exclusive(runs: list[Run]) -> Figure:
    title = (
        "Clusters handled by two helm replicas at once (stand-in record and helm logs, all runs)"
    )
    if not runs:
        return Figure("w4", title, "not measured", verdict="INCOMPLETE")
    parts = [f"{r.tag}: {len(concurrent(_all_intervals(r)))}" for r in runs]
    total = sum(len(concurrent(_all_intervals(r))) for r in runs)
    verdict: Verdict = "pass" if total == 0 else "MISSED"
    return Figure("w4", title, f"{total} ({', '.join(parts)})", "0", verdict)


def _outside(runs: list[Run]) -> Figure:
    title = (
        "helm commands a replica started after another had claimed the Cluster's partition "
        "(stand-in record, all runs)"
    )
    if not runs:
        return Figure("w8", title, "not measured", verdict="INCOMPLETE")
    parts, total = [], 0
    for run in runs:
        late = outside_lease(_record_intervals(run), run.helm_logs)
        total += len(late)
        verbs = Counter(i.verb for i in late)
        said = f" ({', '.join(f'{v} {c}' for v, c in verbs.items())})" if late else ""
        parts.append(f"{run.tag}: {len(late)} on {len({i.release for i in late})} Clusters{said}")
    verdict: Verdict = "pass" if total == 0 else "MISSED"
    return Figure("w8", title, f"{total}: {'; '.join(parts)}", "0", verdict)


def _join(run: Run | None, two: Rounds) -> Figure:
    title = "a third helm replica started mid-run (2 → 3) → each partition it takes served by it"
    if run is None or run.event_at is None:
        return Figure("w5", title, "not measured", verdict="INCOMPLETE")
    mine = placement(labels("helm", 3))[run.event_replica]
    value, served_all = _takeover(run, run.event_replica, mine)
    verdict: Verdict = "pass" if run.complete and served_all else "MISSED"
    return Figure("w5", title, f"{value}{_against(run, two)}", TAKEOVER, verdict)


def _kill(run: Run | None, two: Rounds) -> Figure:
    title = "one of 2 helm replicas SIGKILLed mid-run → each of its partitions served again"
    if run is None or run.event_at is None:
        return Figure("w6", title, "not measured", verdict="INCOMPLETE")
    members = labels("helm", 2)
    survivor = next(m for m in members if m != run.event_replica)
    value, served_all = _takeover(run, survivor, placement(members)[run.event_replica])
    verdict: Verdict = "pass" if run.complete and served_all else "MISSED"
    return Figure("w6", title, f"{value}{_against(run, two)}", TAKEOVER, verdict)


TAKEOVER = "every partition with work left at its claim served by its new holder"


def _takeover(run: Run, holder: str, partitions: list[int]) -> tuple[str, bool]:
    """From the join or the kill: ``holder`` claiming each of ``partitions``, its first helm
    command and its first patch there; and whether every partition with work left at the
    claim (a Cluster of it deployed later) was served by it."""
    since = run.wall(run.event_at or 0.0)
    claimed = owned_at(run.helm_logs.get(holder, ""), since)
    served = served_after(run.patches, holder, partitions, since)
    helm = first_command(_record_intervals(run), holder, partitions, since)
    deployed = {name: run.wall(at) for name, at in run.installed.items()}
    left = {
        p
        for p in partitions
        if p in claimed
        and any(partition_of(x) == p and at > claimed[p] for x, at in deployed.items())
    }
    text = (
        f"served: {_p50_p99(list(served.values()))} ({len(served)} of {len(partitions)} "
        f"partitions; {len(left)} had work left when claimed); claimed: "
        f"{_p50_p99([claimed[p] - since for p in partitions if p in claimed])}; first helm "
        f"command: {_p50_p99(list(helm.values()))}; all deployed after {run.all_installed():.1f} s"
    )
    return text, left <= set(served)


def _against(run: Run, plain: Rounds) -> str:
    two = plain.median_time(2)
    return f" (2 replicas throughout: {two:.1f} s, median)" if two is not None else ""


def _exactly_once(runs: list[Run], n: int) -> Figure:
    title = (
        "every Cluster installed exactly once (join and kill runs): revisions left, installs "
        "completed"
    )
    if not runs:
        return Figure("w7", title, "not measured", verdict="INCOMPLETE")
    parts, good = [], True
    for run in runs:
        _, repaired = installs(run.record)
        revisions = Counter(run.revisions.values())
        completed = Counter(len(run.deployed_uids.get(name, ())) for name in run.names)
        good &= revisions == Counter({1: n}) and completed == Counter({1: n})
        parts.append(
            f"{run.tag}: revisions {_hist(revisions)}, installs completed {_hist(completed)}, "
            f"stuck releases repaired {sum(repaired.values())}"
        )
    return Figure(
        "w7", title, "; ".join(parts), "1 revision and 1 install each", "pass" if good else "MISSED"
    )


def _hist(counts: Counter[int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))


def _p50_p99(values: list[float]) -> str:
    if not values:
        return "none"
    return f"p50 {percentile(values, 50):.1f} s / p99 {percentile(values, 99):.1f} s"


def _placement_details(sizes: ScalingSizes, names: Sequence[str]) -> list[str]:
    per_partition = Counter(partition_of(x) for x in names)
    lines = [
        "Clusters per partition (crc32 of namespace/name, 16 partitions): "
        + ", ".join(f"p{p} {per_partition[p]}" for p in range(PARTITIONS))
    ]
    total = sum(per_partition.values())
    for count in sorted({*sizes.replicas, 3}):
        placed = placement(labels("helm", count))
        share = loads(placed, per_partition)
        text = "; ".join(f"{m.removeprefix('scaling-')}: {len(ps)} partitions, {share[m]} Clusters"
                         for m, ps in placed.items())  # fmt: skip
        allows = bound(total, share.values())
        lines.append(f"placement of {count} helm replica(s): {text}; allows {allows:.2f}x")
        if count > 1:
            randoms = random_bounds(per_partition, count)
            target = TARGETS.get(count)
            meets = (
                f", ≥ {target:g}x in {sum(b >= target for b in randoms) / len(randoms):.0%}"
                if target
                else ""
            )
            lines.append(
                f"  {count} replicas with random names (2000 draws): allows p50 "
                f"{percentile(randoms, 50):.2f}x (p1 {percentile(randoms, 1):.2f}x, p99 "
                f"{percentile(randoms, 99):.2f}x){meets}; at most ⌈16/{count}⌉ partitions each: "
                f"{balanced_bound(per_partition, count):.2f}x"
            )
    return [*lines, *_more_partitions(names)]


def _more_partitions(names: Sequence[str]) -> list[str]:
    """What a larger ``CAPIBUS_PARTITIONS`` would allow with random replica names."""
    lines = []
    for partitions in (64, 128, 256):
        per = Counter(partition_of(x, partitions) for x in names)
        texts = []
        for count, target in TARGETS.items():
            draws = random_bounds(per, count, samples=500, partitions=partitions)
            met = sum(b >= target for b in draws) / len(draws)
            texts.append(
                f"{count} replicas p50 {percentile(draws, 50):.2f}x (≥ {target:g}x in {met:.0%})"
            )
        lines.append(
            f"with CAPIBUS_PARTITIONS={partitions}, random names (500 draws): " + ", ".join(texts)
        )
    return lines


def _run_details(run: Run, slots: int) -> list[str]:
    created = [run.created[x] - run.t0 for x in run.names if x in run.created]
    took = [
        run.installed[x] - run.created[x]
        for x in run.names
        if x in run.installed and x in run.created
    ]
    done = sorted(t - run.t0 for t in run.installed.values())
    lines = [
        f"{run.tag}: {run.replicas} helm replica(s){_event_text(run)}: {len(run.installed)}/"
        f"{len(run.names)} deployed after {run.all_installed():.1f} s; creates answered after "
        f"{max(created, default=0):.2f} s",
        f"{run.tag}: per Cluster, created → release deployed: {spread(took, 's', 1, 1)}",
    ]
    if len(done) >= 10:
        lo, hi = done[len(done) // 10], done[(9 * len(done)) // 10]
        steady = (len(done) * 8 / 10) / (hi - lo) if hi > lo else 0.0
        lines.append(
            f"{run.tag}: first release deployed after {done[0]:.1f} s; steady rate "
            f"(10th → 90th percentile of deployments) {steady:.2f} Clusters/s"
        )
    for replica, (count, span, busy) in slot_use(_record_intervals(run)).items():
        short = replica.removeprefix("scaling-")
        lines.append(
            f"{run.tag}: {short} ran {count} installs over {span:.1f} s, {busy:.2f} in flight on "
            f"average ({slots} slots)"
        )
    for label, log in sorted(run.helm_logs.items()):
        moved = Counter(k for line in log.splitlines() for k in MOVES if k in line)
        if moved:
            said = ", ".join(f"'{k}' x{v}" for k, v in moved.items())
            lines.append(f"{run.tag}: {label.removeprefix('scaling-')} logged {said}")
    touched = touched_by(_all_intervals(run))
    lines.append(
        f"{run.tag}: Clusters whose helm commands came from 1/2/3 replicas (at any time): "
        + ", ".join(f"{touched[k]}" for k in (1, 2, 3))
    )
    if run.requests:
        lines.append(f"{run.tag}: {requests_per_cluster(run)}")
    if run.streams:
        n = max(len(run.names), 1)
        sizes = ", ".join(
            f"{name.removeprefix('CAPIBUS_')} {count / n:.1f} messages / {size / n / 1024:.1f} KiB"
            for name, (count, size) in run.streams.items()
        )
        lines.append(f"{run.tag}: stored per Cluster at the end (every stream): {sizes}")
    lines += [f"{run.tag}: {note}" for note in run.notes]
    return lines


def requests_per_cluster(run: Run) -> str:
    """API requests per Cluster from t0 to the last release deployed, by client and verb."""
    n = max(len(run.names), 1)
    clients: dict[str, Counter[str]] = {}
    for key, count in run.requests.items():
        client, _, verb = key.partition(" ")
        clients.setdefault(client, Counter())[verb] += count
    ranked = sorted(clients.items(), key=lambda item: -sum(item[1].values()))
    parts = [
        f"{client} {sum(verbs.values()) / n:.1f} ("
        + ", ".join(f"{verb} {c / n:.1f}" for verb, c in verbs.most_common())
        + ")"
        for client, verbs in ranked
    ]
    return "API requests per Cluster, t0 → all deployed (audit log, no WATCH): " + "; ".join(parts)


def _event_text(run: Run) -> str:
    if run.event_at is None:
        return ""
    what = "started" if run.tag == "join" else "SIGKILLed"
    return (
        f", {run.event_replica.removeprefix('scaling-')} {what} after {run.event_at - run.t0:.1f} s"
    )


def method(sizes: ScalingSizes) -> str:
    return (
        "Services: watcher, writer and lease once; identity, monitor and helm at the replica "
        "count (OIDC, Zenith and Leases off, defaults otherwise); the helm service runs the helm "
        "stand-in (`standins/helmbin.py`: releases kept as Helm's storage Secrets, "
        f"{sizes.latency:g} s of waiting in each install, no chart object applied) with "
        f"`CAPIBUS_HELM__MAX_CONCURRENT={sizes.slots}`, so one replica installs at most "
        f"{sizes.slots / sizes.latency:g} releases/s. "
        "Each run on a fresh stack; the Clusters (same names, same namespace in every run, so the "
        "same partitions) are created at once at t0; a Cluster is done when the benchmark's watch "
        "sees its release Secret labelled `status=deployed` (no Cluster can reach Ready: the "
        f"stand-in makes no CAPI object). {sizes.rounds} round(s) of 1, 2, 4 replicas in turn; "
        "times are medians, ratios the median of each round's throughput ratio (Clusters / time "
        "to all deployed). "
        "join/kill: 2 replicas, the third started or the first SIGKILLed (process group, with "
        f"its helm processes) once {TRIGGER:.0%} were deployed; 'claimed' is its `owns partition` "
        "log line, 'served' its first patch on the partition stored in `CAPIBUS_STATUS`, both "
        "from the start or the kill. Exclusivity: every helm command as an interval, from the "
        "stand-in's record (start and end, the calling replica) and the helm services' logs; two "
        "replicas' overlapping intervals on one release count its Cluster. Exactly once: release "
        "Secrets left, and release Secrets (by uid) the watch saw reach `deployed`, per "
        "Cluster; a release left `pending-install` by the kill is repaired (uninstalled, "
        "installed again) by the next holder. Why: "
        '`bench/ANALYSIS.md`, "w: scaling out".'
    )
