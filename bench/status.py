"""(e) Status from CAPI: status writes until Ready, the idle cost once Ready, node Ready lag.

The set-up is (d)'s (``bench.fleet``), with every service that has background work of its own
(discovery, catalog and exporter besides (d)'s six; OIDC, Zenith and leases off), the
Cluster API stand-in alone (``python -m standins --only capi``), the credentials Secrets and
the ClusterTemplate first, then all Clusters created at once. The stand-in runs with
``STANDIN_STEP_DELAY=0.02``: a short pause before each of its status writes, so the Machines
of one Cluster change one after the other, as a controller's would, instead of in one burst
per reconcile; (d) already measures the stand-in flat out.

Every moment is a watch event reaching the benchmark, on its monotonic clock, recorded by an
``Observer`` listener as each object state arrives (a wait sees only the newest state, and
the first moment a node entry turned Ready may lie between two wake-ups).

- **e1 status writes until Ready**: ``StatusWritten`` journal entries with
  ``skipped=False`` at or before the Cluster's first state seen with ``status.phase`` Ready.
  "At or before" compares resource versions, not clocks: each entry carries the
  ``resourceVersion`` its write produced, and on one etcd those order the writes exactly,
  whereas the writer's wall clock and the benchmark's watch can disagree about the very
  write that made the Cluster Ready. The API server's own count of Cluster status PATCHes
  over the same span, by response code, is in the details: it shows conflicts (409), which
  the journal does not.
- **e2/e3 the idle cost**: ``SETTLE`` seconds after the last Cluster was Ready, a window of
  ``StatusSizes.window`` seconds. e2 counts the status writes finished inside it (target: none;
  nothing changed, so nothing should be written). e3 is what capibus's services asked of the
  API server inside the window, every verb but WATCH, per Cluster per minute. The API
  server's ``apiserver_request_total`` does not say who asked, and the stand-in playing
  Cluster API re-lists and re-reads every object each time its watch ends (every 5 min, as
  a controller's resync would): so (e)'s API server keeps an audit log (level Metadata, one
  event per finished request) and requests are told apart by their client's User-Agent
  (``capibus-<service>``, ``capibus-standins``, ``kube-controller-manager`` ...). The
  details also give the ``apiserver_request_total`` difference between a ``/metrics`` scrape
  before and one after (every client, by verb and resource), the same window measured once
  more before any Cluster existed, and the watches that ended in the window (a watch is one
  long request, counted when it ends). A full run's window is longer than the watch timeout
  (5 min) and the discovery resync, so periodic work cannot hide outside it.
- **e4 node Ready lag**: for each Machine, t1 = the first state seen with ``status.phase``
  Running and a ``NodeHealthy`` condition True (v1beta1 ``status.conditions``), t2 = the first
  Cluster state seen with ``status.nodes[<machine>].phase`` Ready; the lag t2 - t1 is the
  watcher, the monitor, the writer and both watch deliveries. The two watches are separate
  streams, so a lag can come out slightly negative; the details count those. The details
  also give the same lag between the two changes as the watcher stored them in
  ``CAPIBUS_EVENTS``: capibus's part without the benchmark's watches.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import deployment
from bench.common import Clients, new_namespace, percentile, run_pool
from bench.deployment import Deployment, load_average
from bench.fleet import READY_TIMEOUT, stored
from bench.lifecycle import Figure, Section, Verdict, latency_figure, spread
from bench.observe import Key, Observer
from bench.procs import Children, CpuSnapshot
from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient
from shared.resources import CLUSTER, MACHINE
from testenv.harness import LocalStack

Json = dict[str, Any]
STEP_DELAY = "0.02"
SETTLE = 10.0
#: the footprint issue's goal for the whole set of services, idle with 100 Ready Clusters
IDLE_CORES = 0.005
NODE_READY_LIMIT = 1.0
REQUESTS = "apiserver_request_total"
SCRAPE = "/metrics"
BREAKDOWN_ROWS = 12
KINDS = (CLUSTER, MACHINE)


@dataclass(frozen=True)
class StatusSizes:
    clusters: int
    window: float
    #: the services as one all-in-one process (the chart's default), else one process each
    together: bool = False


@dataclass
class Moments:
    """What the benchmark's watch saw, each state at the moment it arrived."""

    created: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    ready_version: dict[str, int] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)  # Machine -> t1
    node_ready: dict[str, float] = field(default_factory=dict)  # Machine -> t2
    machines: set[str] = field(default_factory=set)
    events: list[tuple[float, str]] = field(default_factory=list)  # (moment, kind token)

    def listen(self, key: Key, obj: Json, now: float) -> None:
        token, name = key
        self.events.append((now, token))
        status = obj.get("status") or {}
        if token == MACHINE.token:
            self._machine(name, status, now)
        elif token == CLUSTER.token:
            self._cluster(name, obj, status, now)

    def _machine(self, name: str, status: Json, now: float) -> None:
        self.machines.add(name)
        if status.get("phase") == "Running" and _node_healthy(status):
            self.running.setdefault(name, now)

    def _cluster(self, name: str, obj: Json, status: Json, now: float) -> None:
        if status.get("phase") == "Ready" and name not in self.ready:
            self.ready[name] = now
            self.ready_version[name] = int(obj["metadata"]["resourceVersion"])
        for machine, node in (status.get("nodes") or {}).items():
            if isinstance(node, dict) and node.get("phase") == "Ready":
                self.node_ready.setdefault(machine, now)

    def count(self, token: str, start: float, end: float) -> int:
        return sum(1 for at, kind in self.events if kind == token and start <= at <= end)


def _node_healthy(status: Json) -> bool:
    conditions = status.get("conditions") or []
    return any(c.get("type") == "NodeHealthy" and c.get("status") == "True" for c in conditions)


# -- the API server's request counter ------------------------------------------------------------


#: One ``apiserver_request_total`` series: ("VERB resource", response code).
Series = tuple[str, str]
STATUS_PATCH = f"PATCH {CLUSTER.plural}.{CLUSTER.group}/status"


async def apiserver_requests(kube: KubeClient) -> Counter[Series]:
    """``apiserver_request_total`` by "VERB resource" and code, the scrape itself left out.

    ``/metrics`` is text, not JSON, so this goes through the client's HTTP connection (same
    server, same credentials) rather than ``KubeClient.request``.
    """
    response = await kube.http.get(SCRAPE)
    response.raise_for_status()
    # Only this family: the whole page is megabytes of histograms.
    text = "\n".join(x for x in response.text.splitlines() if x.startswith(REQUESTS)) + "\n"
    counts: Counter[Series] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name != REQUESTS or labels.get("subresource") == SCRAPE:
                continue
            counts[request_key(labels), labels.get("code", "?")] += int(sample.value)
    return counts


def request_key(labels: dict[str, str]) -> str:
    """``PATCH clusters.azimuth.stackhpc.com/status``, ``GET /readyz``."""
    resource = labels.get("resource", "")
    if labels.get("group"):
        resource += f".{labels['group']}"
    if labels.get("subresource"):
        resource += f"/{labels['subresource'].lstrip('/')}" if resource else labels["subresource"]
    return f"{labels.get('verb', '?')} {resource or '?'}"


def by_request(counts: Counter[Series], *, watches: bool) -> Counter[str]:
    """Requests by "VERB resource": WATCH only, or everything else.

    A watch is one long request, counted when it ends: WATCH counts in a window are watches
    that ended there (timeouts, re-watches), which say what the other requests cannot.
    """
    found: Counter[str] = Counter()
    for (key, _), n in counts.items():
        if key.startswith("WATCH ") == watches:
            found[key] += n
    return found


def status_patches(counts: Counter[Series]) -> Counter[str]:
    """The Cluster status PATCHes by response code (``200``, ``409`` ...)."""
    return Counter({code: n for (key, code), n in counts.items() if key == STATUS_PATCH and n})


@dataclass
class Window:
    """One measurement window: its bounds on both clocks, the requests and CPU inside it."""

    start: float
    end: float
    start_wall: float
    end_wall: float
    counts: Counter[Series]
    cpu: str
    load: str
    #: from the audit log: "client verb" -> requests (WATCH left out)
    by_client: Counter[str] = field(default_factory=Counter)
    #: cores capibus's own service processes used on average (CPU seconds / wall seconds)
    ours: float = 0.0
    #: how many processes those services ran in
    processes: int = 0

    @property
    def minutes(self) -> float:
        return (self.end - self.start) / 60.0

    @property
    def requests(self) -> Counter[str]:
        return by_request(self.counts, watches=False)

    @property
    def watches(self) -> Counter[str]:
        return by_request(self.counts, watches=True)

    def per_minute(self) -> float:
        return sum(self.requests.values()) / self.minutes

    def capibus_per_minute(self) -> float:
        return capibus_requests(self.by_client) / self.minutes

    def breakdown(self, *, watches: bool = False, clients: bool = False) -> str:
        counts = self.by_client if clients else self.watches if watches else self.requests
        rows = counts.most_common()
        text = ", ".join(f"{key} {n / self.minutes:.1f}" for key, n in rows[:BREAKDOWN_ROWS])
        rest = sum(n for _, n in rows[BREAKDOWN_ROWS:])
        if rest:
            text += f", {len(rows) - BREAKDOWN_ROWS} others {rest / self.minutes:.1f}"
        return text or "none"


async def measure_window(
    kube: KubeClient, running: Deployment, seconds: float, audit: Path
) -> Window:
    labels = running.labels()
    before = await apiserver_requests(kube)
    cpu_before = CpuSnapshot.take(labels)
    start, start_wall = time.monotonic(), time.time()
    await asyncio.sleep(seconds)
    end, end_wall = time.monotonic(), time.time()
    cpu_after = CpuSnapshot.take(labels)
    after = await apiserver_requests(kube)
    cpu = cpu_after.cpu_line(cpu_before)
    services = list(running.services.values())
    wall = cpu_after.wall - cpu_before.wall
    ours = sum(cpu_after.seconds_of(c.proc.pid, cpu_before) for c in services) / wall
    cpu += f"; capibus's {len(services)} services together {ours:.4f}"
    # The audit backend writes each event as its request finishes: wait out the last ones.
    await asyncio.sleep(1.0)
    by_client = requests_by_client(audit, start_wall, end_wall)
    load = load_average()
    counts = after - before
    window = Window(start, end, start_wall, end_wall, counts, cpu, load, by_client)
    window.ours, window.processes = ours, len(services)
    return window


# -- who asked: the API server's audit log -------------------------------------------------------

AUDIT_LOG = "kube-apiserver-audit.log"
#: One audit event per finished request, without bodies: enough to say who asked for what.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
"""


def audit_args(workdir: Path) -> list[str]:
    """kube-apiserver flags that log every request of (e)'s stack to ``workdir/AUDIT_LOG``."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / AUDIT_LOG}",
        "--audit-log-format=json",
    ]


def client_of(user_agent: str) -> str:
    """``capibus-monitor``, ``kube-controller-manager`` (the version and the rest dropped)."""
    return user_agent.split("/", 1)[0].split(" ", 1)[0] or "?"


def requests_by_client(log: Path, start_wall: float, end_wall: float) -> Counter[str]:
    """Requests that finished inside the window, WATCH left out, by client and verb."""
    found: Counter[str] = Counter()
    if not log.exists():
        return found
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("verb") == "watch" or event.get("stage") != "ResponseComplete":
                continue
            if start_wall <= _wall(event["stageTimestamp"]) <= end_wall:
                found[f"{client_of(event.get('userAgent', ''))} {event['verb']}"] += 1
    return found


#: Clients named ``capibus-*`` that are not capibus's services: they play Cluster API, or measure.
NOT_OURS = ("capibus-standins ", "capibus-bench ")


def capibus_requests(by_client: Counter[str]) -> int:
    """What capibus's services asked: not the stand-ins, not the bench."""
    return sum(
        n
        for key, n in by_client.items()
        if key.startswith("capibus-") and not key.startswith(NOT_OURS)
    )


# -- the journal ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """One ``StatusWritten`` entry, reduced to what is counted."""

    name: str
    skipped: bool
    version: int | None
    finished: float  # wall clock, seconds


async def journal(bus: Bus, namespace: str) -> list[Written]:
    subject = subjects.journal("statuswritten", CLUSTER.token, namespace, "*")
    found: list[Written] = []
    async for _, _, entry in stored(bus, subjects.JOURNAL.name, subject):
        version = entry.get("resource_version")
        found.append(
            Written(
                name=str(entry["ref"]["name"]),
                skipped=bool(entry.get("skipped")),
                version=int(version) if version else None,
                finished=_wall(entry["finished"]),
            )
        )
    return found


async def as_stored(bus: Bus, namespace: str) -> Moments:
    """The same moments as the watcher stored them in ``CAPIBUS_EVENTS`` (JetStream's clock).

    From the Machine's change stored to the Cluster's change stored is capibus alone (the
    monitor, the writer, the watcher seeing the Cluster change); the benchmark's own watch
    deliveries are not part of it.
    """
    moments = Moments()
    namespace_token = subjects.namespace_token(namespace)
    for kind in KINDS:
        subject = f"{subjects.PREFIX}.evt.{kind.token}.*.{namespace_token}.*"
        async for when, _, body in stored(bus, subjects.EVENTS.name, subject):
            obj = body.get("object") or {}
            if body.get("event") != "DELETED" and obj:
                moments.listen((kind.token, obj["metadata"]["name"]), obj, when)
    return moments


def _wall(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# -- the benchmark -------------------------------------------------------------------------------


@dataclass
class Outcome:
    names: list[str]
    window: float
    moments: Moments = field(default_factory=Moments)
    t0: float = 0.0
    baseline: Window | None = None
    idle: Window | None = None
    writes: list[Written] = field(default_factory=list)
    stored: Moments = field(default_factory=Moments)
    #: every request the API server answered from the first create to the last Ready
    to_ready: Counter[Series] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


async def measure(
    clients: Clients, stack: LocalStack, children: Children, helm: Path, sizes: StatusSizes
) -> Section:
    kube = clients.kube
    namespace = await new_namespace(kube, "bench-status")
    template = f"bench-tpl-{uuid.uuid4().hex[:6]}"
    outcome = Outcome(names=[f"s{i:03d}" for i in range(sizes.clusters)], window=sizes.window)
    names = outcome.names
    await deployment.create_template(kube, template)
    await run_pool(len(names), lambda i: deployment.create_credentials(kube, namespace, names[i]))
    running = await deployment.start(
        children,
        stack,
        helm=helm,
        oidc=False,
        standins=("capi",),
        standin_env={"STANDIN_STEP_DELAY": STEP_DELAY},
        prefix="status",
        services=deployment.EVERY_SERVICE,
        together=sizes.together,
    )
    moments = outcome.moments
    obs = Observer(kube, namespace, KINDS, listeners=[moments.listen])
    await obs.start()
    try:
        outcome.notes.append(f"load average before (1/5/15 min): {load_average()}")
        audit = children.log_dir / AUDIT_LOG
        outcome.baseline = await measure_window(kube, running, sizes.window, audit)
        await _create(kube, obs, namespace, template, outcome)
        await asyncio.sleep(SETTLE)
        outcome.idle = await measure_window(kube, running, sizes.window, audit)
        outcome.writes = await journal(clients.bus, namespace)
        outcome.stored = await as_stored(clients.bus, namespace)
    finally:
        await obs.stop()
        running.stop(children)
    return section(outcome)


async def _create(
    kube: KubeClient, obs: Observer, namespace: str, template: str, outcome: Outcome
) -> None:
    names, moments = outcome.names, outcome.moments
    before = await apiserver_requests(kube)
    outcome.t0 = time.monotonic()

    async def create(index: int) -> None:
        await deployment.create_cluster(kube, namespace, names[index], template)
        moments.created[names[index]] = time.monotonic()

    await run_pool(len(names), create)
    await obs.until(lambda: len(moments.ready) == len(names), READY_TIMEOUT)
    outcome.to_ready = await apiserver_requests(kube) - before
    outcome.notes.append(f"load average at all Ready: {load_average()}")


# -- the figures ---------------------------------------------------------------------------------


def section(o: Outcome) -> Section:
    n = len(o.names)
    s = Section(key="e", title=f"status from CAPI, {n} Clusters", method=METHOD)
    s.figures += [_to_ready(o), _idle_writes(o), _idle_requests(o), _node_lag(o), _idle_cpu(o)]
    s.details += [*_timings(o), *_idle_details(o), *_lag_details(o), *o.notes]
    return s


def _before_ready(o: Outcome) -> Counter[str]:
    counts: Counter[str] = Counter({name: 0 for name in o.names})
    versions = o.moments.ready_version
    for w in o.writes:
        if w.skipped or w.version is None or w.name not in versions:
            continue
        if w.version <= versions[w.name]:
            counts[w.name] += 1
    return counts


def _in_window(o: Outcome) -> list[Written]:
    if o.idle is None:
        return []
    return [w for w in o.writes if o.idle.start_wall <= w.finished <= o.idle.end_wall]


def _to_ready(o: Outcome) -> Figure:
    title = "status writes per Cluster, created → first seen Ready (journal, skipped=False)"
    if len(o.moments.ready) < len(o.names):
        ready = f"{len(o.moments.ready)}/{len(o.names)} Ready"
        return Figure("e1", title, f"not measured: {ready}", verdict="INCOMPLETE")
    per = [float(v) for v in _before_ready(o).values()]
    value = f"p50 {percentile(per, 50):.0f} / max {max(per):.0f} ({sum(per):.0f} in all)"
    return Figure("e1", title, value)


def _idle_writes(o: Outcome) -> Figure:
    title = f"status writes per Cluster per minute once all Ready ({o.window:g} s window)"
    if o.idle is None or len(o.moments.ready) < len(o.names):
        return Figure("e2", title, "not measured", "0", "INCOMPLETE")
    written = [w for w in _in_window(o) if not w.skipped]
    rate = len(written) / len(o.names) / o.idle.minutes
    value = f"{rate:.2f} ({len(written)} writes to {len(o.names)} Clusters)"
    verdict: Verdict = "pass" if not written else "MISSED"
    return Figure("e2", title, value, "0", verdict)


def _idle_requests(o: Outcome) -> Figure:
    title = "API requests by capibus's services (no WATCH) per Cluster per minute once all Ready"
    if o.idle is None:
        return Figure("e3", title, "not measured", verdict="INCOMPLETE")
    n, idle = len(o.names), o.idle
    value = (
        f"{idle.capibus_per_minute() / n:.2f} ({idle.capibus_per_minute():.1f}/min in all; "
        f"every client, stand-ins and the stack included: {idle.per_minute():.0f}/min"
    )
    if o.baseline is not None:
        value += f", with no Cluster: {o.baseline.per_minute():.0f}/min"
    return Figure("e3", title, value + ")")


def _idle_cpu(o: Outcome) -> Figure:
    title = f"idle CPU of capibus's services, {len(o.names)} Clusters Ready ({o.window:g} s)"
    if o.idle is None or len(o.moments.ready) < len(o.names):
        return Figure("e5", title, "not measured", f"≤ {IDLE_CORES}", "INCOMPLETE")
    idle = o.idle
    how = "one all-in-one process" if idle.processes == 1 else f"{idle.processes} processes"
    value = f"{idle.ours:.4f} cores ({how}"
    if o.baseline is not None:
        value += f"; before any Cluster: {o.baseline.ours:.4f}"
    verdict: Verdict = "pass" if idle.ours <= IDLE_CORES else "MISSED"
    return Figure("e5", title, value + ")", f"≤ {IDLE_CORES} cores", verdict)


def node_lags(m: Moments) -> list[float]:
    return [m.node_ready[x] - m.running[x] for x in m.running if x in m.node_ready]


def _node_lag(o: Outcome) -> Figure:
    m = o.moments
    samples = node_lags(m)
    return latency_figure(
        "e4",
        "Machine Running + NodeHealthy → its node Ready in the Cluster's status",
        samples,
        expected=len(m.machines),
        limit=NODE_READY_LIMIT,
    )


def _timings(o: Outcome) -> list[str]:
    m = o.moments
    if not m.created:
        return []
    ready = [m.ready[x] - m.created[x] for x in o.names if x in m.ready]
    last = max(m.ready.values(), default=o.t0) - o.t0
    total = Counter(w.name for w in o.writes if not w.skipped)
    patches = status_patches(o.to_ready)
    answered = ", ".join(f"{code}: {n}" for code, n in sorted(patches.items())) or "none"
    return [
        f"all {len(o.names)} creates answered {max(m.created.values()) - o.t0:.2f} s after t0; "
        f"{len(m.ready)}/{len(o.names)} Ready, the last {last:.1f} s after t0",
        f"per Cluster, created → first seen phase Ready: {spread(ready, 's', 1, 1)}",
        f"status writes per Cluster from creation to the end of the idle window: p50 "
        f"{percentile([float(total[x]) for x in o.names], 50):.0f}, "
        f"{sum(total.values())} in all; journal entries skipped as no-ops: "
        f"{sum(w.skipped for w in o.writes)}",
        f"Cluster status PATCHes the API server answered from the first create to the last "
        f"Ready, by code (every client; the writer is the only status writer here): {answered}",
    ]


def _idle_details(o: Outcome) -> list[str]:
    lines: list[str] = []
    if (idle := o.idle) is not None:
        window = _in_window(o)
        clusters, machines = (o.moments.count(k.token, idle.start, idle.end) for k in KINDS)
        lines += [
            f"idle window ({SETTLE:g} s after all Ready, {idle.end - idle.start:.1f} s): "
            f"journal entries {len(window)} ({sum(w.skipped for w in window)} skipped as "
            f"no-ops); watch events seen: Clusters {clusters}, Machines {machines}",
            f"idle window, API requests per minute by verb and resource (all clients, stand-in "
            f"and stack included): {idle.breakdown()}",
            f"idle window, API requests per minute by client and verb (the API server's audit "
            f"log, WATCH left out): {idle.breakdown(clients=True)}",
            f"idle window, watches ended per minute (re-watches after a server timeout): "
            f"{idle.breakdown(watches=True)}",
            f"idle window: {idle.cpu}; load average at its end: {idle.load}",
        ]
    if (base := o.baseline) is not None:
        lines += [
            f"the same window before any Cluster existed ({base.end - base.start:.1f} s), API "
            f"requests per minute: {base.per_minute():.1f}: {base.breakdown()}; by client and "
            f"verb: {base.breakdown(clients=True)}; watches ended per minute: "
            f"{base.breakdown(watches=True)}",
            f"that window: {base.cpu}; load average at its end: {base.load}",
        ]
    return lines


def _lag_details(o: Outcome) -> list[str]:
    m = o.moments
    lags = node_lags(m)
    never = sorted(x for x in m.running if x not in m.node_ready)
    lines = [
        f"Machines seen {len(m.machines)} ({len(m.machines) / len(o.names):g} per Cluster), "
        f"Running + NodeHealthy {len(m.running)}, their node Ready in the Cluster's status "
        f"{len(lags)}; node Ready seen before the Machine (separate watches): "
        f"{sum(lag < 0 for lag in lags)}",
        f"Machine Running + NodeHealthy → node Ready: {spread(lags)}",
        "the same, both as stored by the watcher in CAPIBUS_EVENTS (capibus alone: monitor, "
        f"writer, the watcher seeing the Cluster change): {spread(node_lags(o.stored))}",
    ]
    if never:
        lines.append(f"never seen Ready in the Cluster's status: {', '.join(never[:10])}")
    return lines


METHOD = (
    "Services: all nine with background work (watcher, writer, identity, lease, helm, monitor, "
    "discovery, catalog, exporter), OIDC, Zenith and leases off, default settings; the CAPI "
    "stand-in with "
    f"`STANDIN_STEP_DELAY={STEP_DELAY}`. All Clusters created at once; every moment is a watch "
    "event reaching the benchmark. e1: `StatusWritten` journal entries with "
    "`skipped=False` whose resourceVersion is at or before that of the Cluster's first state "
    f"seen with `status.phase: Ready`. e2/e3: a window starting {SETTLE:g} s after the last "
    "Cluster was Ready, longer in a full run than the API server's watch timeout (5 min), so "
    "periodic re-watches and resyncs fall inside it; e2 = journal entries finished inside it; "
    "e3 = requests capibus's services finished inside it (all verbs but WATCH), told apart "
    "from the stand-ins' and the stack's by User-Agent in the API server's audit log, per "
    "Cluster per minute; every client's total (`apiserver_request_total`) and the same window "
    "before any Cluster existed are given beside it. e4: per Machine, the first state with "
    "`status.phase: Running` and `NodeHealthy` True → the first Cluster state with "
    "`status.nodes[<machine>].phase: Ready`. e5: CPU seconds of capibus's service processes "
    "(from /proc) over e2's window, divided by its length; a full run starts the services as "
    "one all-in-one process (`python -m services.allinone`, the chart's default), a quick run "
    "as one process each."
)
