"""(d) Many Clusters at once: time to all Ready, Helm and status work per Cluster, memory, delete.

The services run with OIDC, Zenith and leases off, and the Cluster API stand-in (``python -m
standins --only capi``; the identity, schedule and Zenith stand-ins would have nothing to do)
runs with ``STANDIN_STEP_DELAY=0``: it adds no deliberate delay, but it still plays Cluster
API for every Cluster (Machines, control plane, addons) in one Python process, and that work
is part of the time to Ready. The credentials Secrets and the ClusterTemplate exist first;
then all Clusters are created at once (``CONCURRENCY`` concurrent creates) at t0 and the
clock stops when the benchmark's watch has seen every one with ``status.phase`` Ready.

Then, with everything Ready:

- **capibus's own lag at the end**: per Cluster, from the last change of one of its CAPI
  objects to the Cluster showing Ready, both as stored by the watcher in ``CAPIBUS_EVENTS``
  (``ready_lag``): what capibus adds once the stand-in is done, as opposed to the stand-in's
  own time;

- **Helm release revisions** per Cluster: the release Secrets ``sh.helm.release.v1.<name>.v<N>``
  the benchmark's watch saw (helm keeps 10, so none was pruned). Exactly one is the target: a
  second revision would be an upgrade nobody asked for. The helm commands the helm service
  ran (its log names each with its duration) are counted as well.
- **status writes** per Cluster: ``StatusWritten`` journal entries with
  ``skipped=False`` on ``capibus.journal.statuswritten.cluster.<ns>.<name>`` (``CAPIBUS_JOURNAL``),
  read ``SETTLE`` seconds after all were Ready.
- **deletion**: every Cluster deleted with Foreground propagation (as the portal does), at
  once; the clock stops when nothing of theirs is left in the namespace (watched kinds below).
- **peak memory**: ``VmHWM`` of every service and of the stand-in process, read after the
  deletion (so it covers both phases), before they are stopped.

The reference: once the services and the stand-in are stopped, the same number of releases
is installed with a bare sequential ``helm install`` of the same chart with the values
capibus gave the first Cluster, in a fresh namespace. That is no equivalent of capibus's work
(no status, no CAPI stand-in, nothing in parallel); it shows this machine's speed, and the
ratio is capibus's all-Ready time over it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench import deployment, helmlog
from bench.common import Clients, new_namespace, percentile, run_pool
from bench.deployment import CHARTS, Deployment, load_average, mib
from bench.lifecycle import Figure, Section, Verdict, spread
from bench.observe import Observer
from bench.procs import Children, CpuSnapshot
from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    SECRET,
)
from testenv.harness import LocalStack

Json = dict[str, Any]
READY_TIMEOUT = 900.0
DELETE_TIMEOUT = 600.0
SETTLE = 3.0
CAPI_LABEL = "capi.stackhpc.com/cluster"
RELEASE = re.compile(r"^sh\.helm\.release\.v1\.(?P<name>.+)\.v(?P<version>\d+)$")


def _capi(token: str, group: str, kind: str) -> ResourceKind:
    return ResourceKind(token, group, "v1beta1", kind, f"{kind.lower()}s")


LEFTOVER_KINDS = (
    CLUSTER,
    SECRET,
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    _capi("osmtemplate", "infrastructure.cluster.x-k8s.io", "OpenStackMachineTemplate"),
    _capi("kctemplate", "bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate"),
    _capi("mhc", "cluster.x-k8s.io", "MachineHealthCheck"),
    HELM_RELEASE,
    MANIFESTS,
)


@dataclass(frozen=True)
class FleetSizes:
    clusters: int


@dataclass
class Creation:
    """When each Cluster was created, its release started and it was first Ready."""

    t0: float
    created: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)

    def all_ready(self) -> float:
        return max(self.ready.values(), default=self.t0 + READY_TIMEOUT) - self.t0


async def create_all(
    kube: KubeClient, obs: Observer, namespace: str, names: list[str], template: str
) -> Creation:
    creation = Creation(t0=time.monotonic())

    async def create(index: int) -> None:
        await deployment.create_cluster(kube, namespace, names[index], template)
        creation.created[names[index]] = time.monotonic()

    def all_ready() -> bool:
        # Runs at every event: the first moment each Cluster is seen Ready is recorded here.
        now = time.monotonic()
        for name in names:
            cluster = obs.get(CLUSTER, name) or {}
            if name not in creation.ready and (cluster.get("status") or {}).get("phase") == "Ready":
                creation.ready[name] = now
        return len(creation.ready) == len(names)

    await run_pool(len(names), create)
    await obs.until(all_ready, READY_TIMEOUT)
    return creation


# -- counting ---------------------------------------------------------------------------------


def revisions(obs: Observer, names: list[str]) -> Counter[str]:
    """Release revisions the benchmark saw per Cluster (every Secret ever seen counts)."""
    counts: Counter[str] = Counter({name: 0 for name in names})
    for token, secret in obs.first_seen:
        match = RELEASE.match(secret)
        if token == SECRET.token and match and match["name"] in counts:
            counts[match["name"]] += 1
    return counts


@dataclass
class Writes:
    written: Counter[str] = field(default_factory=Counter)
    before_ready: Counter[str] = field(default_factory=Counter)
    skipped: int = 0


async def stored(bus: Bus, stream: str, subject: str) -> AsyncIterator[tuple[float, str, Json]]:
    """Every message on ``subject`` so far: (time JetStream stored it, subject, body)."""
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0
    )
    psub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    try:
        remaining = (await psub.consumer_info()).num_pending or 0
        while remaining > 0:
            msgs = await psub.fetch(min(remaining, 1000), timeout=10)
            remaining -= len(msgs)
            for msg in msgs:
                yield msg.metadata.timestamp.timestamp(), msg.subject, json.loads(msg.data)
    finally:
        await psub.unsubscribe()


async def status_writes(bus: Bus, namespace: str, ready_wall: dict[str, datetime]) -> Writes:
    """``StatusWritten`` entries of the namespace, per Cluster."""
    writes = Writes()
    subject = subjects.journal("statuswritten", CLUSTER.token, namespace, "*")
    async for _, _, entry in stored(bus, subjects.JOURNAL.name, subject):
        _count(entry, writes, ready_wall)
    return writes


async def ready_lag(bus: Bus, namespace: str) -> dict[str, float]:
    """Per Cluster: its last CAPI-side change before it showed Ready → it showing Ready.

    Both moments are when the watcher's event was stored in ``CAPIBUS_EVENTS``, so they share
    one clock and one path. What lies between is capibus alone (monitor, writer, the watcher
    seeing the Cluster change); the time before it is the CAPI stand-in's.
    """
    ready: dict[str, float] = {}
    changes: dict[str, list[float]] = {}
    subject = f"{subjects.PREFIX}.evt.*.*.{subjects.namespace_token(namespace)}.*"
    async for when, subject_name, body in stored(bus, subjects.EVENTS.name, subject):
        kind, name = subject_name.split(".")[2], subject_name.split(".")[-1]
        obj = body.get("object") or {}
        if kind == CLUSTER.token:
            if (obj.get("status") or {}).get("phase") == "Ready":
                ready.setdefault(name, when)
            continue
        labels = (obj.get("metadata") or {}).get("labels") or {}
        owner = name if kind == CAPI_CLUSTER.token else labels.get(CAPI_LABEL)
        if owner and body.get("event") != "DELETED":
            changes.setdefault(owner, []).append(when)
    lag: dict[str, float] = {}
    for name, at in ready.items():
        before = [t for t in changes.get(name, []) if t <= at]
        if before:
            lag[name] = at - max(before)
    return lag


def _count(entry: Json, writes: Writes, ready_wall: dict[str, datetime]) -> None:
    if entry.get("skipped"):
        writes.skipped += 1
        return
    name = str(entry["ref"]["name"])
    writes.written[name] += 1
    ready = ready_wall.get(name)
    if ready is not None and datetime.fromisoformat(entry["finished"]) <= ready:
        writes.before_ready[name] += 1


def wall_clock(moments: dict[str, float]) -> dict[str, datetime]:
    """Monotonic moments as UTC wall-clock times (the journal's clock)."""
    offset = time.time() - time.monotonic()
    return {k: datetime.fromtimestamp(v + offset, UTC) for k, v in moments.items()}


# -- deletion ---------------------------------------------------------------------------------


def leftovers(obs: Observer) -> dict[str, int]:
    found: Counter[str] = Counter()
    for token, name in obs.live:
        if token == SECRET.token and name.endswith("-cloud-credentials"):
            continue  # the portal's, not the Cluster's
        found[token] += 1
    return dict(found)


async def delete_all(
    kube: KubeClient, obs: Observer, namespace: str, names: list[str]
) -> tuple[float, float | None]:
    """Seconds until every Cluster was gone, and until nothing of theirs was left (or None)."""
    started = time.monotonic()

    async def delete(index: int) -> None:
        await deployment.delete_like_the_portal(kube, namespace, names[index])

    await run_pool(len(names), delete)
    clusters_gone: Callable[[], bool] = lambda: not obs.names(CLUSTER)  # noqa: E731
    await obs.until(clusters_gone, DELETE_TIMEOUT)
    gone = max((obs.gone_at.get((CLUSTER.token, n), 0.0) for n in names), default=started)
    if not await obs.until(lambda: not leftovers(obs), DELETE_TIMEOUT):
        return gone - started, None
    last = max(obs.gone_at.values(), default=started)
    return gone - started, last - started


# -- the bare reference -------------------------------------------------------------------------


async def release_values(helm: Path, stack: LocalStack, namespace: str, name: str) -> Json:
    out = await _helm(helm, stack, ["get", "values", name, "-n", namespace, "-o", "json"])
    values: Json = json.loads(out)
    return values


async def bare_installs(
    helm: Path, stack: LocalStack, namespace: str, count: int, values: Json
) -> list[float]:
    """``helm install`` ``count`` releases one after the other; each one's duration."""
    chart = str(CHARTS / "openstack-cluster")
    took: list[float] = []
    for index in range(count):
        started = time.monotonic()
        args = ["install", f"b{index:03d}", chart, "-n", namespace, "--values", "-"]
        await _helm(helm, stack, args, stdin=json.dumps(values).encode())
        took.append(time.monotonic() - started)
    return took


async def _helm(helm: Path, stack: LocalStack, args: list[str], stdin: bytes | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-helm-") as home:
        env = {**os.environ, **stack.env()}
        env |= {f"HELM_{d.upper()}_HOME": f"{home}/{d}" for d in ("cache", "config", "data")}
        proc = await asyncio.create_subprocess_exec(
            str(helm),
            *args,
            "--kubeconfig",
            str(stack.endpoints.kubeconfig),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:3])}: {err.decode(errors='replace')}")
    return out.decode()


# -- the benchmark ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """Everything measured; ``section`` turns it into figures."""

    names: list[str]
    creation: Creation | None = None
    revisions: Counter[str] = field(default_factory=Counter)
    writes: Writes = field(default_factory=Writes)
    release_started: dict[str, float] = field(default_factory=dict)
    helm_log: str = ""
    deleted: tuple[float, float | None] | None = None
    memory: dict[str, int] = field(default_factory=dict)
    lag: dict[str, float] = field(default_factory=dict)
    bare: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def measure(
    clients: Clients, stack: LocalStack, children: Children, helm: Path, sizes: FleetSizes
) -> Section:
    kube = clients.kube
    namespace = await new_namespace(kube, "bench-fleet")
    template = f"bench-tpl-{uuid.uuid4().hex[:6]}"
    outcome = Outcome(names=[f"f{i:03d}" for i in range(sizes.clusters)])
    names = outcome.names
    await deployment.create_template(kube, template)
    await run_pool(len(names), lambda i: deployment.create_credentials(kube, namespace, names[i]))
    running = await deployment.start(
        children,
        stack,
        helm=helm,
        oidc=False,
        standins=("capi",),
        standin_env={"STANDIN_STEP_DELAY": "0"},
        prefix="fleet",
    )
    try:
        values = await _create(
            clients, stack=stack, running=running, helm=helm, namespace=namespace,
            template=template, outcome=outcome,
        )  # fmt: skip
        await _delete(kube, running, namespace, outcome)
        outcome.memory = running.peak_memory()
    finally:
        running.stop(children)
    bare_namespace = await new_namespace(kube, "bench-bare")
    outcome.bare = await bare_installs(helm, stack, bare_namespace, len(names), values)
    return section(outcome)


async def _create(
    clients: Clients,
    *,
    stack: LocalStack,
    running: Deployment,
    helm: Path,
    namespace: str,
    template: str,
    outcome: Outcome,
) -> Json:
    """Create every Cluster at once and count; the values capibus gave the first release."""
    labels = running.labels()
    obs = await Observer(clients.kube, namespace, (CLUSTER, SECRET)).start()
    try:
        load, helm_cpu = load_average(), running.helm_cpu()
        before = CpuSnapshot.take(labels)
        creation = await create_all(clients.kube, obs, namespace, outcome.names, template)
        after = CpuSnapshot.take(labels)
        outcome.notes += [
            f"load average before (1/5/15 min): {load}, at all Ready: {load_average()}",
            "creation: " + after.cpu_line(before),
            f"creation: helm processes of the helm service (in 'other processes' above): "
            f"{(running.helm_cpu() - helm_cpu) / (after.wall - before.wall):.2f} cores",
        ]
        outcome.creation = creation
        values = await release_values(helm, stack, namespace, outcome.names[0])
        await asyncio.sleep(SETTLE)
        outcome.revisions = revisions(obs, outcome.names)
        outcome.writes = await status_writes(clients.bus, namespace, wall_clock(creation.ready))
        outcome.lag = await ready_lag(clients.bus, namespace)
        for name in outcome.names:
            seen = obs.seen(SECRET, f"sh.helm.release.v1.{name}.v1")
            if seen is not None:
                outcome.release_started[name] = seen
        outcome.helm_log = running.services["helm"].log()
        return values
    finally:
        await obs.stop()


async def _delete(kube: KubeClient, running: Deployment, namespace: str, outcome: Outcome) -> None:
    obs = await Observer(kube, namespace, LEFTOVER_KINDS).start()
    try:
        labels = running.labels()
        helm_cpu = running.helm_cpu()
        before = CpuSnapshot.take(labels)
        outcome.deleted = await delete_all(kube, obs, namespace, outcome.names)
        after = CpuSnapshot.take(labels)
        outcome.notes += [
            "deletion: " + after.cpu_line(before),
            f"deletion: helm processes of the helm service: "
            f"{(running.helm_cpu() - helm_cpu) / (after.wall - before.wall):.2f} cores",
        ]
        if outcome.deleted[1] is None:
            outcome.notes.append(f"left after {DELETE_TIMEOUT:.0f} s: {leftovers(obs)}")
    finally:
        await obs.stop()


# -- the figures ----------------------------------------------------------------------------------


def section(o: Outcome) -> Section:
    n = len(o.names)
    s = Section(key="d", title=f"{n} Clusters at once", method=METHOD)
    s.figures += [_all_ready(o), _revisions(o), _writes(o), _deletion(o), _memory(o)]
    s.details += [*_timings(o), *_helm_details(o), *o.notes]
    return s


def _all_ready(o: Outcome) -> Figure:
    n, c = len(o.names), o.creation
    title = f"{n} Clusters created at once → all phase Ready"
    if c is None:
        return Figure("d1", title, "not measured", verdict="INCOMPLETE")
    capibus, bare = c.all_ready(), sum(o.bare)
    value = f"{len(c.ready)}/{n} Ready after {capibus:.1f} s"
    if bare:
        value += f"; bare sequential `helm install` x{n}: {bare:.1f} s; ratio {capibus / bare:.2f}"
    verdict: Verdict = "info" if len(c.ready) == n else "INCOMPLETE"
    return Figure("d1", title, value, "— (ratio: lower is better)", verdict)


def _revisions(o: Outcome) -> Figure:
    per = Counter(o.revisions.values())
    value = ", ".join(f"{k} revision(s): {v} Clusters" for k, v in sorted(per.items()))
    verdict: Verdict = "pass" if per.get(1, 0) == len(o.names) else "MISSED"
    return Figure("d2", "Helm release revisions per Cluster", value, "exactly 1 each", verdict)


def _writes(o: Outcome) -> Figure:
    per = [float(o.writes.written[name]) for name in o.names]
    value = f"p50 {_n(per, 50)} / max {_n(per, 100)} ({sum(per):.0f} in all)"
    return Figure("d3", "status writes per Cluster (StatusWritten, skipped=False)", value)


def _deletion(o: Outcome) -> Figure:
    title = f"all {len(o.names)} deleted (Foreground) at once → nothing left"
    if o.deleted is None:
        return Figure("d4", title, "not measured", verdict="INCOMPLETE")
    clusters, everything = o.deleted
    if everything is None:
        return Figure("d4", title, f"not empty after {DELETE_TIMEOUT:.0f} s", verdict="INCOMPLETE")
    return Figure("d4", title, f"{everything:.1f} s (Clusters gone after {clusters:.1f} s)")


def _memory(o: Outcome) -> Figure:
    sizes = ", ".join(f"{label.removeprefix('fleet-')} {mib(v)}" for label, v in o.memory.items())
    return Figure("d5", "peak memory (VmHWM) per process", sizes or "not measured")


def _timings(o: Outcome) -> list[str]:
    c = o.creation
    if c is None:
        return []
    ready = [c.ready[x] - c.created[x] for x in o.names if x in c.ready]
    started = [o.release_started[x] - c.created[x] for x in o.names if x in o.release_started]
    rest = [c.ready[x] - o.release_started[x] for x in o.release_started if x in c.ready]
    before = [float(o.writes.before_ready[x]) for x in o.names]
    return [
        f"all {len(o.names)} creates answered {max(c.created.values()) - c.t0:.2f} s after t0",
        "per Cluster, created → release Secret ADDED (install started): "
        + spread(started, "s", 1, 2),
        f"per Cluster, release Secret ADDED → first seen phase Ready: {spread(rest, 's', 1, 1)}",
        f"per Cluster, created → first seen phase Ready: {spread(ready, 's', 1, 1)}",
        "per Cluster, its last CAPI object change → it showing Ready (capibus's own lag at the "
        f"end, both as stored by the watcher): {spread(list(o.lag.values()), 's', 1, 2)}",
        f"status writes per Cluster until it was first Ready: p50 {_n(before, 50)} / max "
        f"{_n(before, 100)}; journal entries skipped as no-ops (all Clusters): {o.writes.skipped}",
        f"bare `helm install` per release: {spread(o.bare, 's', 1, 2)}",
    ]


def _helm_details(o: Outcome) -> list[str]:
    found = helmlog.runs(o.helm_log)
    n = len(o.names)
    ran = ", ".join(
        f"{verb} {k} ({k / n:.1f}/Cluster)" for verb, k in helmlog.counts(found).most_common()
    )
    took = "; ".join(
        f"{verb}: {spread(d, 's', 1, 2)}" for verb, d in helmlog.durations(found).items()
    )
    return [
        f"helm commands the helm service ran, creation and deletion (its log): {ran}",
        f"their durations as logged (they include the wait for one of the helm service's "
        f"helm slots, `CAPIBUS_HELM__MAX_CONCURRENT`, 12 by default): {took}",
    ]


def _n(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.0f}"


METHOD = (
    "Services: all six, OIDC, Zenith and leases off, default settings (API rate limit 50/s, "
    "burst 100; at most 8 helm processes at once); the CAPI stand-in with "
    "`STANDIN_STEP_DELAY=0`. t0 = the first create; 'Ready' = the first watch event in the "
    "benchmark process showing `status.phase: Ready`. Revisions = release Secrets seen; status "
    "writes = `StatusWritten` journal entries with `skipped=False`, read "
    f"{SETTLE:g} s after all were Ready. Nothing left = no Cluster, CAPI object, addon, "
    "machine template or Secret other than the portal's cloud credentials in the namespace. "
    "Reference: bare sequential `helm install` of the same chart and values, run after the "
    "services and the stand-in were stopped; ratio = capibus all-Ready time / that time."
)
