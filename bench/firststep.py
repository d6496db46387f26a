"""(s) First step: a Cluster created → its Helm install started, and Clusters with Leases deleted.

The figures of the footprint issue's "first step" goal, on a fresh stack with the six
services of a Cluster's lifecycle (watcher, writer, identity, lease, helm, monitor; OIDC and
Zenith off, as in (d)) and the Cluster API and schedule stand-ins at their default step delay:

- **s1**: ``CLUSTERS`` Clusters without a Lease created at once; per Cluster, its create
  answered → its release Secret ``sh.helm.release.v1.<name>.v1`` ADDED (helm writes it,
  ``pending-install``, before any object of the chart: "install started", as (c) and (d)
  measure it). Target p50 ≤ 1 s and p99 ≤ 2 s.
- **s2**: ``LEASED`` Clusters, each with a Lease ``kube-<name>`` it owns (as the portal makes
  it, the schedule stand-in turns it Active), created at once and taken to phase Ready by the
  CAPI stand-in; then all deleted at once with Foreground propagation (as the portal does)
  → every Cluster gone. The reference is the upstream operator's 4.6 s on the same stack,
  stand-ins and chart (measured by the project's lead; upstream cannot run here).
- **s3** (info): s2's Clusters, created → install started, with their Lease as a prerequisite.
- **s0** (info), the floor of s1 on this machine: the same ``CLUSTERS`` installs without
  capibus, ``helm upgrade --install`` started at once by the benchmark itself through
  ``shared.helm`` (the helm service's own arguments, and the values one of s1's releases was
  installed with), with the services and stand-ins idle beside them; per release, its helm
  process started → its release Secret ADDED. s1 minus s0 is what capibus adds to a first
  install; s0 alone is what two shared cores give ten helm processes and the API server
  answering them, which no change to capibus moves.

Between s1 and s2, s1's Clusters are taken to Ready and deleted (not measured), so s2 starts
on an idle system. Every moment is a watch event reaching the benchmark process (its
monotonic clock), except the timelines: those list, for the median Cluster of s1 and the
slowest of s2's deletion, every message of its story on ``CAPIBUS_EVENTS``,
``CAPIBUS_STATUS``, ``CAPIBUS_LIFECYCLE`` and ``CAPIBUS_JOURNAL`` at the time JetStream stored
it, beside the helm commands the helm service logged, all on the wall clock relative to the
benchmark's create (or delete) request. That is where each wait shows: which service's
message came after which, and how long after.
"""

from __future__ import annotations

import asyncio
import resource
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import deployment, helmlog
from bench.common import Clients, new_namespace, percentile, run_pool
from bench.deployment import Deployment, load_average
from bench.fleet import stored
from bench.lifecycle import Figure, Section, Verdict, spread
from bench.observe import Observer
from bench.procs import Children, CpuSnapshot
from shared import subjects
from shared.bus import Bus
from shared.helm import ChartRef, Helm
from shared.kube import KubeClient
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE, SECRET
from testenv.harness import LocalStack

Json = dict[str, Any]
CLUSTERS = 10
LEASED = 5
#: s1's Clusters
FIRST = [f"s{i:03d}" for i in range(CLUSTERS)]
FLAVORS = ("f-small", "f-medium")
#: the chart the helm service installs in these benchmarks (``deployment.deployment_env``)
CHART = ChartRef(str(deployment.CHARTS / "openstack-cluster"))
STEP_TIMEOUT = 120.0
READY_TIMEOUT = 300.0
P50_LIMIT, P99_LIMIT = 1.0, 2.0
#: the upstream operator's deletion of 5 Clusters with Leases, on the same stack (the issue)
UPSTREAM_DELETE = 4.6
UPSTREAM_FIRST_STEP = "p50 3.2 s / max 3.4 s"
STREAMS = (subjects.EVENTS, subjects.STATUS, subjects.LIFECYCLE, subjects.JOURNAL)
KINDS = (CLUSTER, SECRET, LEASE, CAPI_CLUSTER)


@dataclass
class Batch:
    """One set of Clusters created at once: when each create was answered, what followed."""

    names: list[str]
    #: when each create was sent (the timelines start there) and answered (the figures do)
    sent: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    #: wall clock minus monotonic clock at the start, to place journal times on our clock
    offset: float = field(default_factory=lambda: time.time() - time.monotonic())

    def started(self, obs: Observer) -> dict[str, float]:
        """Per Cluster: created → its release Secret first seen (seconds)."""
        out: dict[str, float] = {}
        for name in self.names:
            seen = obs.seen(SECRET, release_secret(name))
            if seen is not None and name in self.created:
                out[name] = seen - self.created[name]
        return out


def release_secret(name: str) -> str:
    return f"sh.helm.release.v1.{name}.v1"


@dataclass
class Outcome:
    first: dict[str, float] = field(default_factory=dict)
    leased_first: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    leases_gone: float | None = None
    #: s0, per bare release: its helm process started → its release Secret ADDED
    bare: dict[str, float] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    timelines: list[str] = field(default_factory=list)


# -- creating and deleting ---------------------------------------------------------------------


async def create_at_once(
    kube: KubeClient, namespace: str, template: str, names: list[str], *, leased: bool
) -> Batch:
    batch = Batch(names=names)
    await run_pool(len(names), lambda i: deployment.create_credentials(kube, namespace, names[i]))

    async def create(index: int) -> None:
        name = names[index]
        spec = {"leaseName": f"kube-{name}"} if leased else {}
        batch.sent[name] = time.monotonic()
        cluster = await deployment.create_cluster(kube, namespace, name, template, **spec)
        batch.created[name] = time.monotonic()
        if leased:
            await kube.create(LEASE, deployment.lease_object(cluster, FLAVORS))

    await run_pool(len(names), create)
    return batch


async def until_started(obs: Observer, batch: Batch) -> None:
    def all_started() -> bool:
        return all(obs.seen(SECRET, release_secret(n)) is not None for n in batch.names)

    if not await obs.until(all_started, STEP_TIMEOUT):
        missing = [n for n in batch.names if obs.seen(SECRET, release_secret(n)) is None]
        raise TimeoutError(f"no Helm install started for {missing}")


async def until_ready(obs: Observer, names: list[str]) -> None:
    def ready() -> bool:
        return all(
            ((obs.get(CLUSTER, n) or {}).get("status") or {}).get("phase") == "Ready" for n in names
        )

    if not await obs.until(ready, READY_TIMEOUT):
        raise TimeoutError(f"not all of {names} Ready after {READY_TIMEOUT:.0f} s")


async def delete_at_once(
    kube: KubeClient, obs: Observer, namespace: str, names: list[str]
) -> float:
    """Delete ``names`` as the portal does, at once; the moment the deletes started."""
    started = time.monotonic()
    await run_pool(
        len(names), lambda i: deployment.delete_like_the_portal(kube, namespace, names[i])
    )
    gone = lambda: not any(n in obs.names(CLUSTER) for n in names)  # noqa: E731
    if not await obs.until(gone, READY_TIMEOUT):
        raise TimeoutError(f"Clusters left after {READY_TIMEOUT:.0f} s: {obs.names(CLUSTER)}")
    return started


# -- the timeline of one Cluster -----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    at: float  # wall clock
    what: str


async def timeline(
    bus: Bus, namespace: str, name: str, helm_log: str, *, since: float, until: float
) -> list[str]:
    """Every message of ``name``'s story stored between ``since`` and ``until`` (wall clock),
    and the helm commands run for it, as lines ``+seconds what``."""
    entries = [e for e in await _messages(bus, namespace, name) if since <= e.at <= until]
    for run in helmlog.runs(helm_log):
        if run.release == name and since <= run.started <= until:
            entries.append(Entry(run.started, f"helm {run.verb} started ({run.seconds:.2f} s)"))
            entries.append(Entry(run.ended, f"helm {run.verb} ended: {run.outcome}"))
    entries.sort(key=lambda e: e.at)
    return [f"`+{e.at - since:6.3f}` {e.what}" for e in entries]


def _ours(name: str, subject_name: str) -> bool:
    token = subjects.name_token
    return subject_name in (
        token(name), token(f"kube-{name}"), token(release_secret(name)), token(f"{name}-etcd-key"),
    )  # fmt: skip


async def _messages(bus: Bus, namespace: str, name: str) -> list[Entry]:
    ns = subjects.namespace_token(namespace)
    entries: list[Entry] = []
    for stream in STREAMS:
        async for when, subject, body in stored(bus, stream.name, f"{subjects.PREFIX}.>"):
            tokens = subject.split(".")
            if tokens[-2] == ns and _ours(name, tokens[-1]):
                entries.append(Entry(when, _describe(stream.name, subject, body)))
    return entries


def _describe(stream: str, subject: str, body: Json) -> str:
    kind = body.get("type", "?")
    source = str(body.get("source", "?")).split("/")[0]
    what = f"{stream.removeprefix('CAPIBUS_').lower()} {kind} from {source}"
    detail = DETAILS.get(kind)
    return f"{what}: {detail(body)}" if detail else f"{what} ({subject})"


def _resource(body: Json) -> str:
    return f"{body['ref']['kind']} {body['ref']['name']} {body['event']} ({_object_state(body)})"


def _patch(body: Json) -> str:
    conditions = ", ".join(f"{c['type']}={c['reason']}" for c in body.get("conditions") or [])
    return conditions or ", ".join(body.get("patch") or {})


def _metadata(command: Json) -> str:
    parts = [f"+finalizer {f}" for f in command.get("add_finalizers") or []]
    parts += [f"-finalizer {f}" for f in command.get("remove_finalizers") or []]
    parts += [f"label {k}" for k in command.get("labels") or {}]
    parts += [f"annotation {k.split('/')[-1]}" for k in command.get("annotations") or {}]
    return ", ".join(parts) or "nothing"


def _object_state(body: Json) -> str:
    obj = body.get("object") or {}
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    parts = [f"rv {body.get('resource_version')}"]
    if meta.get("deletionTimestamp"):
        parts.append("deleting")
    if meta.get("finalizers"):
        parts.append("finalizers " + ",".join(f.split("/")[-1] for f in meta["finalizers"]))
    if status.get("phase"):
        parts.append(f"phase {status['phase']}")
    reasons = [f"{c['type']}={c.get('reason')}" for c in status.get("conditions") or []]
    if reasons:
        parts.append(" ".join(reasons))
    return "; ".join(parts)


DETAILS: dict[str, Callable[[Json], str]] = {
    "ResourceChanged": _resource,
    "PatchStatus": _patch,
    "PatchMetadata": _metadata,
    "PrerequisiteChanged": lambda b: f"{b['step']} ready={b['ready']} {b['reason']}",
    "ReconcileCluster": lambda b: str(b["reason"]),
    "StatusWritten": lambda b: f"rv {b.get('resource_version')} skipped={b.get('skipped')}",
    "MetadataChanged": lambda b: _metadata(b.get("command") or {}),
}


# -- the benchmark -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """What both parts of the phase work with."""

    clients: Clients
    running: Deployment
    obs: Observer
    namespace: str
    template: str

    async def create(self, names: list[str], *, leased: bool) -> Batch:
        kube = self.clients.kube
        return await create_at_once(kube, self.namespace, self.template, names, leased=leased)

    async def timeline(self, name: str, *, since: float, until: float) -> list[str]:
        log = self.running.services["helm"].log()
        bus = self.clients.bus
        return await timeline(bus, self.namespace, name, log, since=since, until=until)


async def measure(clients: Clients, stack: LocalStack, children: Children, helm: Path) -> Section:
    kube = clients.kube
    namespace = await new_namespace(kube, "bench-first")
    template = f"bench-tpl-{uuid.uuid4().hex[:6]}"
    await deployment.create_template(kube, template)
    running = await deployment.start(
        children, stack, helm=helm, oidc=False, standins=("capi", "schedule"), prefix="first"
    )
    outcome = Outcome()
    obs = await Observer(kube, namespace, KINDS).start()
    try:
        stage = Stage(clients, running, obs, namespace, template)
        driver = _driver(stack, helm)
        median = await _first_step(stage, outcome)
        values = await driver.values(median, namespace, 1)
        # Not measured: s1's Clusters out of the way, so s0 and s2 start on an idle system.
        await delete_at_once(kube, obs, namespace, FIRST)
        await _bare_floor(stage, outcome, driver, values)
        await _deletion(stage, outcome)
    finally:
        await obs.stop()
        running.stop(children)
    return section(outcome)


async def _first_step(stage: Stage, outcome: Outcome) -> str:
    """s1; returns the median Cluster's name (s0 installs with its release's values)."""
    names = FIRST
    obs, running = stage.obs, stage.running
    load, helm_cpu = load_average(), running.helm_cpu()
    before = CpuSnapshot.take(running.labels())
    batch = await stage.create(names, leased=False)
    await until_started(obs, batch)
    after = CpuSnapshot.take(running.labels())
    outcome.first = batch.started(obs)
    spent = max(batch.created.values()) - min(batch.sent.values())
    outcome.details += [
        f"s1: all {CLUSTERS} creates answered within {spent:.2f} s; load average before "
        f"(1/5/15 min): {load}, after: {load_average()}",
        "s1: " + after.cpu_line(before),
    ]
    # Once all are Ready every install has ended (and its CPU is counted), and the median
    # Cluster's helm command is in the log.
    await until_ready(obs, names)
    outcome.details.append(
        f"s1: CPU of the helm processes the helm service ran for the {CLUSTERS} installs: "
        f"{running.helm_cpu() - helm_cpu:.2f} s"
    )
    median = sorted(outcome.first, key=lambda n: outcome.first[n])[len(outcome.first) // 2]
    since = batch.sent[median] + batch.offset
    until = batch.created[median] + batch.offset + outcome.first[median] + 0.3
    lines = await stage.timeline(median, since=since, until=until)
    outcome.timelines += [
        f"s1, the median Cluster {median} (install started {outcome.first[median]:.2f} s after "
        "its create was answered), from its create sent:",
        *lines,
    ]
    return median


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended (the bare helm processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _driver(stack: LocalStack, helm: Path) -> Helm:
    """helm as the helm service runs it (its adapter and arguments), one slot per release."""
    kubeconfig = stack.endpoints.kubeconfig
    return Helm(executable=helm, kubeconfig=kubeconfig, timeout="30s", max_concurrent=CLUSTERS)


async def _bare_floor(stage: Stage, outcome: Outcome, driver: Helm, values: Json) -> None:
    """s0: ``CLUSTERS`` bare ``helm upgrade --install`` at once, no capibus in the way."""
    kube = stage.clients.kube
    namespace = await new_namespace(kube, "bench-bare")
    names = [f"b{i:03d}" for i in range(CLUSTERS)]
    obs = await Observer(kube, namespace, (SECRET,)).start()
    started: dict[str, float] = {}

    async def install(name: str) -> None:
        started[name] = time.monotonic()
        await driver.ensure_release(name, namespace, CHART, values, absent=True)

    def seen() -> dict[str, float]:
        return {n: at for n in names if (at := obs.seen(SECRET, release_secret(n))) is not None}

    load, cpu = load_average(), _children_cpu()
    try:
        await asyncio.gather(*(install(n) for n in names))
        await obs.until(lambda: len(seen()) == len(names), STEP_TIMEOUT)
        outcome.bare = {n: at - started[n] for n, at in seen().items()}
        outcome.details.append(
            f"s0: load average before (1/5/15 min): {load}; CPU of the {CLUSTERS} helm "
            f"processes, each to its end: {_children_cpu() - cpu:.2f} s"
        )
    finally:
        await obs.stop()
        await asyncio.gather(*(driver.uninstall(n, namespace) for n in names))


async def _deletion(stage: Stage, outcome: Outcome) -> None:
    names = [f"l{i:03d}" for i in range(LEASED)]
    obs, running = stage.obs, stage.running
    batch = await stage.create(names, leased=True)
    await until_started(obs, batch)
    outcome.leased_first = batch.started(obs)
    await until_ready(obs, names)
    load = load_average()
    before = CpuSnapshot.take(running.labels())
    started = await delete_at_once(stage.clients.kube, obs, stage.namespace, names)
    after = CpuSnapshot.take(running.labels())
    outcome.deleted = {n: obs.gone_at[(CLUSTER.token, n)] - started for n in names}
    leases = [obs.gone_at.get((LEASE.token, f"kube-{n}")) for n in names]
    if all(at is not None for at in leases):
        outcome.leases_gone = max(at for at in leases if at is not None) - started
    outcome.details += [
        f"s2: load average before the deletes (1/5/15 min): {load}, after: {load_average()}",
        "s2: " + after.cpu_line(before),
    ]
    slowest = max(outcome.deleted, key=lambda n: outcome.deleted[n])
    since = started + batch.offset
    lines = await stage.timeline(slowest, since=since, until=since + outcome.deleted[slowest] + 0.1)
    outcome.timelines += [
        f"s2, the last Cluster gone, {slowest} ({outcome.deleted[slowest]:.2f} s), "
        "from the deletes sent:",
        *lines,
    ]


# -- the figures ---------------------------------------------------------------------------------


def section(o: Outcome) -> Section:
    s = Section(key="s", title=f"first step, {CLUSTERS} Clusters at once", method=METHOD)
    s.figures += [_bare(o), _first(o), _delete(o), _leased_first(o)]
    s.details += [
        f"s0 bare helm started → install started: {spread(list(o.bare.values()), 's', 1, 2)}",
        f"s1 created → install started: {spread(list(o.first.values()), 's', 1, 2)}",
        f"s3 created → install started (with a Lease): "
        f"{spread(list(o.leased_first.values()), 's', 1, 2)}",
        f"s2 each Cluster gone after the deletes: {spread(list(o.deleted.values()), 's', 1, 2)}",
        *o.details,
        *o.timelines,
    ]
    return s


def _first(o: Outcome) -> Figure:
    title = f"{CLUSTERS} Clusters created at once → Helm install started (release Secret ADDED)"
    if len(o.first) < CLUSTERS:
        return Figure("s1", title, f"{len(o.first)}/{CLUSTERS} started", verdict="INCOMPLETE")
    v = list(o.first.values())
    p50, p99, top = percentile(v, 50), percentile(v, 99), max(v)
    verdict: Verdict = "pass" if p50 <= P50_LIMIT and p99 <= P99_LIMIT else "MISSED"
    value = f"p50 {p50:.2f} s / p99 {p99:.2f} s / max {top:.2f} s"
    if len(o.bare) == CLUSTERS:
        floor = list(o.bare.values())
        added = p50 - percentile(floor, 50)
        value += f"; capibus adds p50 {added:.2f} s to s0's bare installs"
    value += f" (upstream: {UPSTREAM_FIRST_STEP})"
    return Figure("s1", title, value, f"p50 ≤ {P50_LIMIT:g} s, p99 ≤ {P99_LIMIT:g} s", verdict)


def _bare(o: Outcome) -> Figure:
    title = (
        f"{CLUSTERS} bare `helm upgrade --install` at once, no capibus (s1's floor) → "
        "release Secret ADDED, per release from its helm process started"
    )
    if len(o.bare) < CLUSTERS:
        return Figure("s0", title, f"{len(o.bare)}/{CLUSTERS} started", verdict="INCOMPLETE")
    v = list(o.bare.values())
    value = f"p50 {percentile(v, 50):.2f} s / p99 {percentile(v, 99):.2f} s / max {max(v):.2f} s"
    return Figure("s0", title, value)


def _delete(o: Outcome) -> Figure:
    title = f"{LEASED} Clusters with Leases, Ready, deleted (Foreground) at once → all gone"
    if len(o.deleted) < LEASED:
        return Figure("s2", title, "not measured", verdict="INCOMPLETE")
    took = max(o.deleted.values())
    leases = f"; their Leases gone after {o.leases_gone:.1f} s" if o.leases_gone else ""
    value = f"{took:.1f} s{leases} (upstream: {UPSTREAM_DELETE} s)"
    verdict: Verdict = "pass" if took <= UPSTREAM_DELETE else "MISSED"
    return Figure("s2", title, value, f"≤ {UPSTREAM_DELETE} s (upstream)", verdict)


def _leased_first(o: Outcome) -> Figure:
    v = list(o.leased_first.values())
    value = (
        f"p50 {percentile(v, 50):.2f} s / max {max(v):.2f} s (n={len(v)})" if v else "not measured"
    )
    return Figure(
        "s3", f"{LEASED} Clusters with Leases created at once → Helm install started", value
    )


METHOD = (
    "Services: the six of a Cluster's lifecycle, OIDC and Zenith off, default settings (the "
    "deployment's as in (d)); stand-ins: Cluster API and schedule operator, default step delay "
    "(0.05 s). s1: 10 Clusters without Leases created at once (16 concurrent creates); per "
    "Cluster its create answered → its release Secret `sh.helm.release.v1.<name>.v1` ADDED in "
    "the benchmark's watch. s2: 5 Clusters, each with a Lease it owns (Active from the schedule "
    "stand-in), created at once, taken to phase Ready, then deleted at once with Foreground "
    "propagation → the last Cluster's DELETED event; upstream's 4.6 s (the issue, same stack) is "
    "the reference. s3: s2's Clusters, created → install started. The timelines list every "
    "message of one Cluster's story at the time JetStream stored it and the helm commands the "
    "helm service logged, relative to the benchmark's request. Why each wait is there or gone: "
    '`bench/ANALYSIS.md`, "s: first step".'
)
