"""Long outages, proven end to end: ``python -m soak.outage [--apiserver-minutes 10]
[--registrar-minutes 30] [--clusters 4] [--churn-seconds 120] [--keep]``.

The fault soak (``soak/__init__.py``) plays faults of seconds. What a deployment must also
survive is an outage of many minutes: the API server down for 10, the Zenith registrar or a
chart repository for 30, while Clusters are created and deleted. The promise under test is
the one ``shared/consumer.py`` makes: a temporary error is retried with capped backoff for
as long as it takes, never dead-lettered. This run shows, on the real local stack, that

* **nothing ends in a dead letter** (the dead-letter stream is read at the end, and each
  service's ``messages_handled{outcome="dead_letter"}`` is scraped throughout);
* **no process exits** (every service is one process, watched every sample; one that died
  would be restarted, as its controller would, and counted);
* **request rates stay bounded**: each service reaches the API server, the registrar and the
  chart repository through a counting tap of its own (``soak.taps``), so every request made
  to a dead endpoint is counted, per service and minute;
* **the wait is visible**: each service's ``/metrics`` is scraped every sample
  (``capibus_objects_waiting``, ``capibus_handler_retries_total``, errors by kind), and the
  Clusters' conditions are read whenever the API server answers;
* **everything converges once it is back**: timed from the last endpoint's return to the
  moment the system is quiet and every Cluster is at its expected state
  (``soak.observe.Observer``), then judged by every invariant of ``soak.checks``.

The world is the soak's (``soak.world``), with differences that serve the outage:

* **One replica per service**: with two, an outage is ridden out twice and the per-service
  rates mix two processes; the retrying is per process, so one shows it.
* **The charts come from a chart repository** (``soak.chartrepo``), a process the run
  stops, where the soak reads them from local paths.
* ``/metrics`` on, one port per service; each service's kubeconfig, registrar URL and chart
  repository URL point at its own taps.

The outages overlap, as one long incident would: the registrar and the chart repository go
down together for ``--registrar-minutes``, and the API server for ``--apiserver-minutes``
in the middle of that window, so the default run is ~35 minutes, not 40+. Before the
outages ``--clusters`` Clusters are created and converged; then every ``--churn-seconds``,
whenever the API server answers, one new Cluster is created and the oldest live one deleted.
``soak/OUTAGE.md`` is written at the end; ``docs/operations.md``, "Long outages", says how
to read it. ``tests/integration/test_outage.py`` runs a short version in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from services.watcher.settings import WatcherTuning
from shared.bus import Bus, Retention
from shared.errors import CapibusError
from shared.kube import KubeClient, KubeConfig
from shared.resources import CLUSTER
from shared.settings import ConsumerTuning
from soak import chartrepo, observe, portal
from soak.checks import (
    COMPLETED,
    Facts,
    Intent,
    Verdict,
    all_verdicts,
    helm_revisions,
    one_of_each,
    revision_problems,
)
from soak.observe import Observer
from soak.plan import SERVICES, Sizes, Step
from soak.procs import ROOT, Proc, SoakError
from soak.run import stack_for
from soak.taps import Tap
from soak.world import BASE_DOMAIN, CHARTS, TEMPLATES, World
from testenv.crds import apply_crds
from testenv.harness import APISERVER, ensure_binaries, free_port

REPORT = ROOT / "soak" / "OUTAGE.md"
#: the consumers' backoff cap: a retrying object knocks at most once per this, once there
BACKOFF_MAX = float(ConsumerTuning.model_fields["backoff_max"].default)
BACKOFF_BASE = float(ConsumerTuning.model_fields["backoff_base"].default)
#: the watcher's own cap between failed lists and watches
WATCHER_BACKOFF_MAX = float(WatcherTuning.model_fields["retry_max_seconds"].default)
#: the endpoints an outage stops, and the services that reach each through a tap
APISERVER_ENDPOINT, REGISTRAR, CHARTREPO = "apiserver", "registrar", "chartrepo"
TAPPED = {APISERVER_ENDPOINT: SERVICES, REGISTRAR: ("helm",), CHARTREPO: ("helm",)}
CHART_NAMES = ("openstack-cluster", "zenith-apiserver", "zenith-operator")
POLL_SECONDS = 2.0
SAMPLE_TIMEOUT = 5.0


def say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[outage {stamp}] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Config:
    apiserver_minutes: float = 10.0
    registrar_minutes: float = 30.0
    #: Clusters created and converged before the outages
    clusters: int = 4
    #: while the outages run, one create and one delete this often (when the API answers)
    churn_seconds: float = 120.0
    #: how long convergence may take once everything is back
    converge_minutes: float = 15.0
    sample_seconds: float = 15.0
    #: how long the Clusters created before the outages may take to converge
    setup_minutes: float = 5.0

    def command(self) -> str:
        return (
            f"python -m soak.outage --apiserver-minutes {self.apiserver_minutes:g} "
            f"--registrar-minutes {self.registrar_minutes:g} --clusters {self.clusters} "
            f"--churn-seconds {self.churn_seconds:g}"
        )


# --- the world ----------------------------------------------------------------------------


@dataclass
class OutageWorld(World):
    """``soak.world.World`` with one replica per service, a chart repository, ``/metrics``
    and a counting tap per service and endpoint."""

    taps: dict[tuple[str, str], Tap] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    chart_url: str = ""

    async def start(self) -> None:
        await asyncio.to_thread(self.stack.start)
        config = KubeConfig.load(self.stack.endpoints.kubeconfig)
        self.kube = KubeClient.from_config(config, qps=None, user_agent="capibus-outage")
        endpoints = self.stack.endpoints
        self.bus = await Bus.connect(endpoints.nats_url, name="outage", tls=endpoints.bus_tls())
        await self.bus.ensure_streams(Retention(replicas=self.stack.stream_replicas))
        await apply_crds(self.k, field_manager="capibus-outage")
        await self._portal_setup()
        port = free_port()
        self.registrar_url = f"http://127.0.0.1:{port}"
        self.peers[REGISTRAR] = self._registrar(port).start()
        self.peers[CHARTREPO] = await self._chartrepo()
        self.peers["standins"] = self._standins().start()
        await self._taps()
        for service in SERVICES:
            label = self.replicas_of(service)[0]
            env = {**self._service_env(), **self._own_env(service), "CAPIBUS_REPLICA": label}
            proc = Proc(label, f"services.{service}", env, self._log(label))
            self.services[label] = proc.start()
        await self.ready()

    async def _chartrepo(self) -> Proc:
        served = self.workdir / "charts"
        helm = self.bin_dir / "helm"
        charts = [CHARTS / name for name in CHART_NAMES]
        self.versions = await asyncio.to_thread(chartrepo.package, charts, helm, served)
        port = free_port()
        self.chart_url = f"http://127.0.0.1:{port}"
        args = ("--port", str(port), "--dir", str(served))
        return Proc(CHARTREPO, "soak.chartrepo", {}, self._log(CHARTREPO), args).start()

    async def _taps(self) -> None:
        upstreams = {
            APISERVER_ENDPOINT: self._apiserver_address(),
            REGISTRAR: _address(self.registrar_url),
            CHARTREPO: _address(self.chart_url),
        }
        for endpoint, services in TAPPED.items():
            host, port = upstreams[endpoint]
            for service in services:
                tap = Tap(f"{service} -> {endpoint}", host, port)
                self.taps[service, endpoint] = await tap.start()

    def _apiserver_address(self) -> tuple[str, int]:
        config = yaml.safe_load(self.stack.endpoints.kubeconfig.read_text())
        return _address(config["clusters"][0]["cluster"]["server"])

    def _own_env(self, service: str) -> dict[str, str]:
        """The service's kubeconfig through its tap, its metrics port, and for the helm
        service the charts and the registrar through its taps."""
        config = yaml.safe_load(self.stack.endpoints.kubeconfig.read_text())
        tap = self.taps[service, APISERVER_ENDPOINT]
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{tap.port}"
        kubeconfig = self.workdir / f"{service}.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig.chmod(0o600)
        self.metrics_ports[service] = free_port()
        env = {
            "KUBECONFIG": str(kubeconfig),
            "CAPIBUS_METRICS_PORT": str(self.metrics_ports[service]),
            "CAPIBUS_METRICS_HOST": "127.0.0.1",
        }
        if (service, CHARTREPO) in self.taps:
            env.update(self._helm_env(service))
        return env

    def _helm_env(self, service: str) -> dict[str, str]:
        repo = f"http://127.0.0.1:{self.taps[service, CHARTREPO].port}"
        registrar = f"http://127.0.0.1:{self.taps[service, REGISTRAR].port}"

        def chart(name: str) -> dict[str, str]:
            return {"name": name, "repo": repo, "version": self.versions[name]}

        zenith = {
            "apiserver_chart": chart("zenith-apiserver"),
            "operator_chart": chart("zenith-operator"),
            "registrar_admin_url": self.registrar_url,
            "registrar_admin_url_internal": registrar,
            "sshd_host": "sshd.example.test",
            "base_domain": BASE_DOMAIN,
        }
        return {
            "CAPIBUS_HELM__CHART": json.dumps(chart("openstack-cluster")),
            "CAPIBUS_HELM__ZENITH": json.dumps(zenith),
        }

    def replicas_of(self, service: str) -> list[str]:
        return [f"{service}-a"]

    def not_ready(self) -> list[str]:
        problems = super().not_ready()
        if chartrepo.ANNOUNCEMENT not in self.peers[CHARTREPO].log():
            problems.append("chart repository not listening")
        return problems

    async def close(self) -> None:
        await super().close()
        for tap in self.taps.values():
            await tap.close()

    versions: dict[str, str] = field(default_factory=dict)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise SoakError(f"no host and port in {url}")
    return parts.hostname, parts.port


# --- what is recorded ---------------------------------------------------------------------


@dataclass
class Window:
    """One endpoint's outage: ``time.monotonic()`` it went down and came back."""

    endpoint: str
    down: float = 0.0
    up: float = 0.0
    at: str = ""

    @property
    def minutes(self) -> float:
        return (self.up - self.down) / 60


@dataclass
class Sample:
    at: float
    service: str
    waiting: float
    retries: float
    dead_letters: float
    errors: dict[str, float]


@dataclass
class Record:
    """Everything the run saw; ``soak.outage.render`` turns it into the report."""

    config: Config
    started: str = ""
    windows: dict[str, Window] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    #: per Cluster, each distinct not-True condition seen: (type, status, reason, message)
    waits: dict[str, set[tuple[str, str, str, str]]] = field(default_factory=dict)
    #: service label -> times it was found exited (and restarted)
    exits: dict[str, int] = field(default_factory=dict)
    scrape_failures: int = 0
    steps: list[str] = field(default_factory=list)
    #: ``time.monotonic()`` of each step, for the backoffs it starts
    step_times: list[float] = field(default_factory=list)
    convergence: float | None = None
    convergence_problems: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    rates: list[Rate] = field(default_factory=list)
    minutes: float = 0.0
    load: str = ""
    workdir: str = ""

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


@dataclass(frozen=True)
class Rate:
    """A service's requests to an endpoint while it was down, and what its backoff allows."""

    service: str
    endpoint: str
    total: int
    per_minute: tuple[int, ...]
    #: the most in any 60 s of the outage
    max_minute: int
    #: things retrying meanwhile: objects waiting at most (``capibus_objects_waiting``)
    #: plus the service's own retry loops (``background``)
    retrying: int
    #: ``retrying`` x the tries one backoff makes in its first 60 s
    bound: int
    #: the most in one minute once every backoff is at its cap (from minute ``SETTLED``),
    #: and ``retrying`` x the tries per minute at the cap; None: an outage too short
    settled: int | None
    settled_bound: int

    @property
    def ok(self) -> bool:
        return self.max_minute <= self.bound and (
            self.settled is None or self.settled <= self.settled_bound
        )


# --- the run --------------------------------------------------------------------------------


class Outage:
    def __init__(self, config: Config, world: OutageWorld) -> None:
        self.config = config
        self.world = world
        self.record = Record(config)
        self.intents: dict[str, Intent] = {}
        self.recorded = Facts()
        self.apiserver_up = True
        self.observer: Observer | None = None
        self.next_name = 0
        #: the Clusters converged before the outages, and those of them scaled since
        self.before: list[str] = []
        self.scaled: set[str] = set()

    async def run(self) -> Record:
        clock = time.monotonic()
        self.record.started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
        self.record.workdir = str(self.world.workdir)
        say(f"starting the world (one replica per service) in {self.world.workdir}")
        await self.world.start()
        self.observer = Observer(self.world.k, self.world.b, dict(TEMPLATES))
        sampler = asyncio.create_task(self.sample_forever())
        try:
            await self.setup()
            await self.outages()
            await self.converge()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        await self.sample()
        await self.judge()
        self.record.minutes = (time.monotonic() - clock) / 60
        self.record.load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        return self.record

    async def setup(self) -> None:
        say(f"creating {self.config.clusters} Clusters")
        for _ in range(self.config.clusters):
            await self.create()
        seconds, problems = await self.wait_converged(self.config.setup_minutes * 60)
        if seconds is None:
            raise SoakError(
                "the Clusters did not converge before the outages: " + "; ".join(problems[:5])
            )
        say(f"{self.config.clusters} Clusters converged in {seconds:.0f}s")
        self.before = list(self.intents)

    async def outages(self) -> None:
        cfg = self.config
        registrar_s, apiserver_s = cfg.registrar_minutes * 60, cfg.apiserver_minutes * 60
        start = time.monotonic()
        api_down_at = start + max(0.0, (registrar_s - apiserver_s) / 2)
        api_up_at = api_down_at + apiserver_s
        registrar_up_at = start + registrar_s
        await self.stop_peers()
        next_churn = start
        while True:
            now = time.monotonic()
            if (
                self.apiserver_up
                and not self.record.windows.get(APISERVER_ENDPOINT)
                and now >= api_down_at
            ):
                await self.stop_apiserver()
            elif not self.apiserver_up and now >= api_up_at:
                await self.start_apiserver()
            if self.peers_down() and now >= registrar_up_at:
                await self.start_peers()
            if not self.peers_down() and self.record.windows[APISERVER_ENDPOINT].up:
                return
            if now >= next_churn and self.apiserver_up and now < registrar_up_at:
                await self.churn()
                next_churn = now + cfg.churn_seconds
            await asyncio.sleep(0.5)

    def peers_down(self) -> bool:
        return not self.world.peers[REGISTRAR].alive()

    async def stop_peers(self) -> None:
        say(f"registrar and chart repository down for {self.config.registrar_minutes:g} min")
        for endpoint in (REGISTRAR, CHARTREPO):
            self.world.peers[endpoint].kill()
            self.record.windows[endpoint] = Window(endpoint, time.monotonic(), at=_now())

    async def start_peers(self) -> None:
        for endpoint in (REGISTRAR, CHARTREPO):
            self.world.peers[endpoint].start()
            self.record.windows[endpoint].up = time.monotonic()
        say("registrar and chart repository back")

    async def stop_apiserver(self) -> None:
        say(f"API server down for {self.config.apiserver_minutes:g} min")
        await asyncio.to_thread(self.world.stack.stop_component, APISERVER)
        self.apiserver_up = False
        self.record.windows[APISERVER_ENDPOINT] = Window(
            APISERVER_ENDPOINT, time.monotonic(), at=_now()
        )

    async def start_apiserver(self) -> None:
        await asyncio.to_thread(self.world.stack.start_component, APISERVER)
        self.record.windows[APISERVER_ENDPOINT].up = time.monotonic()
        self.apiserver_up = True
        say("API server back")

    # -- the workload --------------------------------------------------------------------

    async def create(self) -> None:
        name = f"outage-{self.next_name:03d}"
        lease = self.next_name % 2 == 0
        self.next_name += 1
        self.intents[name] = Intent(name)
        await self.issue(Step(name, "create", count=2, lease=lease))

    async def churn(self) -> None:
        """A create (a Zenith reservation and an install: the registrar's outage), a scale of
        a Cluster installed before the outages (a Helm upgrade: the chart repository's), a
        delete of the oldest other Cluster (maybe one still waiting to be created).

        Each Cluster is scaled once at most: changes made while the chart repository is down
        are rightly joined into one upgrade, so a second one would expect a revision that
        never comes (``soak.checks.helm_revisions``)."""
        live = [name for name, intent in self.intents.items() if intent.live]
        await self.create()
        unscaled = [name for name in live if name in self.before and name not in self.scaled]
        if unscaled:
            self.scaled.add(unscaled[-1])
            await self.issue(Step(unscaled[-1], "scale", count=3))
        deletable = [name for name in live if name not in self.scaled]
        if deletable and len(live) > max(1, self.config.clusters // 2):
            await self.record_deleted(deletable[0])
            await self.issue(Step(deletable[0], "delete"))

    async def issue(self, step: Step) -> None:
        await portal.issue(self.world.k, step, self.intents[step.cluster])
        self.record.steps.append(f"{_now()} {step.action} {step.cluster}")
        self.record.step_times.append(time.monotonic())
        say(f"{step.action} {step.cluster}")

    async def record_deleted(self, name: str) -> None:
        kube = self.world.k
        found = await portal.retried(lambda: observe.revisions(kube, release=name))
        self.recorded.revisions[name] = found.get(name, [])
        subdomain = await portal.retried(lambda: observe.subdomain(kube, name))
        if subdomain:
            self.recorded.subdomains[name] = subdomain

    # -- watching --------------------------------------------------------------------------

    async def sample_forever(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.config.sample_seconds)

    async def sample(self) -> None:
        self.check_processes()
        async with httpx.AsyncClient(timeout=SAMPLE_TIMEOUT) as client:
            for service, port in self.world.metrics_ports.items():
                try:
                    response = await client.get(f"http://127.0.0.1:{port}/metrics")
                    response.raise_for_status()
                except httpx.HTTPError:
                    self.record.scrape_failures += 1
                    continue
                self.record.samples.append(parse_sample(service, response.text))
        if self.apiserver_up:
            await self.read_conditions()

    def check_processes(self) -> None:
        for proc in self.world.all():
            if proc.label in (REGISTRAR, CHARTREPO) and self.peers_down():
                continue
            if not proc.alive():
                self.record.exits[proc.label] = self.record.exits.get(proc.label, 0) + 1
                say(f"{proc.label} exited; restarting it:\n{proc.log_tail()}")
                proc.start()

    async def read_conditions(self) -> None:
        try:
            clusters = await observe.listed(self.world.k, CLUSTER)
        except CapibusError:
            return
        for cluster in clusters:
            name = cluster["metadata"]["name"]
            for entry in (cluster.get("status") or {}).get("conditions") or []:
                if entry.get("status") != "True":
                    seen = self.record.waits.setdefault(name, set())
                    seen.add(
                        (
                            str(entry.get("type")),
                            str(entry.get("status")),
                            str(entry.get("reason")),
                            str(entry.get("message", ""))[:160],
                        )
                    )

    # -- the end ---------------------------------------------------------------------------

    async def converge(self) -> None:
        say("everything is back; waiting for convergence")
        seconds, problems = await self.wait_converged(self.config.converge_minutes * 60)
        self.record.convergence = seconds
        self.record.convergence_problems = problems
        shown = (
            f"{seconds:.1f}s" if seconds is not None else "not reached: " + "; ".join(problems[:3])
        )
        say(f"converged: {shown}")

    async def wait_converged(self, within: float) -> tuple[float | None, list[str]]:
        assert self.observer is not None
        start, first = time.monotonic(), None
        told = start
        while True:
            problems = await self.observer.problems(list(self.intents.values()))
            now = time.monotonic()
            if not problems:
                if first is not None:
                    return first - start, []
                first = now
                await asyncio.sleep(1.0)
                continue
            first = None
            if now - told > 30:
                told = now
                say(f"  {now - start:.0f}s: {len(problems)} to go: {'; '.join(problems[:3])}")
            if now - start > within:
                return None, await self.observer.problems(
                    list(self.intents.values()), thorough=True
                )
            await asyncio.sleep(POLL_SECONDS)

    async def judge(self) -> None:
        facts = await observe.gather(
            self.world.k,
            self.world.b,
            self.world.registrar_url,
            list(self.intents.values()),
            self.recorded,
        )
        self.record.rates = self.rates()
        self.record.verdicts = [
            *own_verdicts(self.record),
            no_dead_letter(facts),
            *judged(list(self.intents.values()), facts),
        ]

    def rates(self) -> list[Rate]:
        kinds = watched_kinds(self.world.services["watcher-a"].log())
        found = []
        for (service, endpoint), tap in sorted(self.world.taps.items()):
            window = self.record.windows[endpoint]
            waiting = max_waiting(self.record.samples, service, window)
            background = kinds if service == "watcher" else BACKGROUND
            # the workload's steps reach only the helm service while the API is up
            starts = self.record.step_times if service == "helm" else []
            found.append(
                rate(service, endpoint, tap, window, retrying=waiting + background, starts=starts)
            )
        return found


def _now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def parse_sample(service: str, text: str) -> Sample:
    waiting = retries = dead = 0.0
    errors: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "capibus_objects_waiting":
                waiting += s.value
            elif s.name == "capibus_handler_retries_total":
                retries += s.value
            elif s.name == "capibus_messages_handled_total" and s.labels.get("outcome") in (
                "dead_letter",
                "dropped",
            ):
                dead += s.value
            elif s.name == "capibus_handler_errors_total":
                kind = s.labels.get("kind", "?")
                errors[kind] = errors.get(kind, 0.0) + s.value
    return Sample(time.monotonic(), service, waiting, retries, dead, errors)


def max_waiting(samples: Sequence[Sample], service: str, window: Window) -> int:
    return int(
        max(
            (
                s.waiting
                for s in samples
                if s.service == service and window.down <= s.at <= window.up
            ),
            default=0,
        )
    )


#: retry loops of a consumer service outside its handlers (claims, timers, its start-up)
BACKGROUND = 4
#: a Cluster's step wakes the helm service's two subscriptions (clusters, prerequisites)
SUBSCRIPTIONS = 2
#: the outage minute from which every backoff is at its cap (0.5 s doubling to 60 s: ~2 min)
SETTLED = 3
WATCHED = re.compile(r"(\w+): listed at")


def watched_kinds(log: str) -> int:
    """The watcher's list-and-watch loops, each retrying on its own (one per kind listed)."""
    return len(set(WATCHED.findall(log)))


def cap_of(service: str) -> float:
    return WATCHER_BACKOFF_MAX if service == "watcher" else BACKOFF_MAX


def burst(seconds: float, cap: float) -> int:
    """Tries one retrying thing makes in its first ``seconds`` of backoff (the first at once,
    then after base, 2 base, 4 base ... capped at ``cap``)."""
    tries, at, delay = 1, 0.0, BACKOFF_BASE
    while at + delay <= seconds:
        at += delay
        tries += 1
        delay = min(cap, delay * 2)
    return tries


def rate(
    service: str,
    endpoint: str,
    tap: Tap,
    window: Window,
    *,
    retrying: int,
    starts: Sequence[float] = (),
) -> Rate:
    """``service``'s requests to ``endpoint`` during ``window`` against its backoff's bounds.

    Once settled, each thing retrying since before the minute began tries at most
    ``ceil(60 / cap)`` times in it; a thing that began waiting within the minute before
    (a step of the workload ``starts``, one thing per subscription of the helm service)
    may still be in its first 60 s of backoff, ``burst(60)`` tries."""
    per_minute = tuple(tap.per_minute(window.down, window.up))
    cap = cap_of(service)
    settled, allowed = None, retrying * math.ceil(60.0 / cap)
    for minute in range(SETTLED, len(per_minute) - 1):  # the last minute is partial
        begins = window.down + 60.0 * minute
        fresh = sum(1 for at in starts if begins - 60.0 <= at < begins + 60.0)
        bound = retrying * math.ceil(60.0 / cap) + fresh * SUBSCRIPTIONS * burst(60.0, cap)
        if settled is None or per_minute[minute] - bound > settled - allowed:
            settled, allowed = per_minute[minute], bound
    return Rate(
        service,
        endpoint,
        sum(per_minute),
        per_minute,
        tap.max_window(window.down, window.up),
        retrying,
        retrying * burst(60.0, cap),
        settled,
        allowed,
    )


def own_verdicts(record: Record) -> list[Verdict]:
    return [
        _no_exit(record),
        _no_dead_letter(record),
        _bounded(record),
        _visible(record),
        _converged_in_time(record),
    ]


def _no_exit(record: Record) -> Verdict:
    problems = tuple(f"{label} exited {n} times" for label, n in sorted(record.exits.items()))
    return Verdict(
        "no-exit",
        "no process exited during the outages (no crash loop)",
        problems,
        f"{len(SERVICES)} services, sampled every {record.config.sample_seconds:g}s",
    )


def judged(intents: Sequence[Intent], facts: Facts) -> list[Verdict]:
    """``soak.checks``' invariants, with what an outage rightly changes for deleted Clusters.

    In the fault soak every Cluster is installed and reserved before anything else happens to
    it. Here a Cluster may be deleted while it still waits for the registrar or the chart
    repository, or scaled and then deleted before the upgrade could run: it is then gone
    with no revision, no reservation or fewer revisions than changes, which is right. So the
    Helm revisions and reservations of deleted Clusters are judged by ``deleted_at_most``
    (never more than the changes, never a repeat, at most one reservation); live Clusters
    keep the exact rules."""
    live = [i for i in intents if not i.deleted]
    narrowed = {
        "helm-revisions": helm_revisions(live, facts),
        "one-of-each": one_of_each(live, _without_deleted(facts, intents)),
    }
    verdicts = [narrowed.get(v.name, v) for v in all_verdicts(intents, facts)]
    return [*verdicts, deleted_at_most([i for i in intents if i.deleted], facts)]


def _without_deleted(facts: Facts, intents: Sequence[Intent]) -> Facts:
    """``facts`` with the reservations of deleted Clusters' subdomains left out, so they are
    neither counted for a live Cluster nor taken for orphans."""
    gone = {facts.subdomains.get(i.name) for i in intents if i.deleted}
    kept = {s: n for s, n in facts.reservations.items() if s not in gone}
    subdomains = {name: s for name, s in facts.subdomains.items() if s not in gone}
    return dataclasses.replace(facts, reservations=kept, subdomains=subdomains)


def deleted_at_most(deleted: Sequence[Intent], facts: Facts) -> Verdict:
    problems: list[str] = []
    for intent in deleted:
        revisions = facts.revisions.get(intent.name, [])
        completed = [r for r in revisions if r.description in COMPLETED]
        if len(completed) > 1 + intent.changes:
            problems.append(
                f"{intent.name}: {len(completed)} completed revisions for "
                f"{1 + intent.changes} changes"
            )
        found, _ = revision_problems(intent, revisions)
        problems += [p for p in found if " repeats " in p]
        subdomain = facts.subdomains.get(intent.name)
        if subdomain and facts.reservations.get(subdomain, 0) > 1:
            problems.append(f"{intent.name}: {facts.reservations[subdomain]} reservations")
    return Verdict(
        "deleted-at-most",
        "a deleted Cluster has at most one Helm revision per change and one reservation",
        tuple(problems),
        f"{len(deleted)} deleted Clusters",
    )


def no_dead_letter(facts: Facts) -> Verdict:
    """Every cause in this run is temporary, so the dead-letter stream must stay empty."""
    problems = tuple(
        f"{d.service} {d.subject}: {d.reason}: {d.error[:200]}" for d in facts.dead_letters
    )
    return Verdict(
        "no-dead-letter",
        "no dead letter (every cause here is temporary)",
        problems,
        f"{len(facts.dead_letters)} on the dead-letter stream",
    )


def _no_dead_letter(record: Record) -> Verdict:
    latest: dict[str, float] = {}
    for s in record.samples:
        latest[s.service] = s.dead_letters
    problems = tuple(f"{svc}: {n:.0f} dead-lettered" for svc, n in sorted(latest.items()) if n)
    return Verdict(
        "no-dead-letter-metric",
        "no service dead-lettered or dropped a message (messages_handled outcome)",
        problems,
        f"{len(record.samples)} scrapes, {record.scrape_failures} failed",
    )


def _bounded(record: Record) -> Verdict:
    problems = tuple(
        f"{r.service} -> {r.endpoint}: {r.max_minute} in 60 s (bound {r.bound}), "
        f"settled {r.settled} a minute (bound {r.settled_bound})"
        for r in record.rates
        if not r.ok
    )
    worst = max(record.rates, key=lambda r: r.max_minute, default=None)
    summary = ""
    if worst is not None:
        summary = f"most: {worst.service} -> {worst.endpoint} {worst.max_minute} in 60 s"
    return Verdict(
        "bounded-requests",
        "requests to each dead endpoint bounded by the backoff, per thing retrying",
        problems,
        summary,
    )


def _visible(record: Record) -> Verdict:
    waiting = max((s.waiting for s in record.samples if s.service == "helm"), default=0)
    problems = [] if waiting else ["the helm service never reported an object waiting"]
    shown = {w for found in record.waits.values() for w in found if w[0] == "Reconciled"}
    if not shown:
        problems.append("no Cluster's Reconciled condition showed the wait")
    return Verdict(
        "wait-visible",
        "the wait shows in metrics (objects waiting) and in the Clusters' status",
        tuple(problems),
        f"helm objects waiting at most {waiting:.0f}; {len(shown)} distinct Reconciled waits",
    )


def _converged_in_time(record: Record) -> Verdict:
    problems = tuple(record.convergence_problems[:20]) if record.convergence is None else ()
    if record.convergence is None and not problems:
        problems = ("not converged",)
    shown = "-" if record.convergence is None else f"{record.convergence:.1f}s"
    return Verdict(
        "converged-after",
        "quiet and every Cluster at its expected state once everything was back",
        problems,
        f"in {shown}",
    )


# --- the report -------------------------------------------------------------------------------


def render(record: Record) -> str:
    cfg = record.config
    verdict = "PASS" if record.ok else "FAIL"
    lines = [
        "# Long outages: latest run",
        "",
        f'**{verdict}**: `{cfg.command()}` (`make outage OUTAGE_ARGS="..."`).',
        "",
        f"Started {record.started} UTC, {record.minutes:.1f} minutes; one replica per service; "
        f"load average at the end {record.load}. How to read this: `docs/operations.md`, "
        '"Long outages".',
        "",
        *_render_windows(record),
        *_render_verdicts(record),
        *_render_rates(record),
        *_render_metrics(record),
        *_render_waits(record),
        "## The workload",
        "",
        *[f"- {step}" for step in record.steps],
        "",
    ]
    return "\n".join(lines) + "\n"


def _render_windows(record: Record) -> list[str]:
    lines = ["## The outages", "", "| endpoint | down at (UTC) | minutes |", "| --- | --- | ---: |"]
    for w in record.windows.values():
        lines.append(f"| {w.endpoint} | {w.at} | {w.minutes:.1f} |")
    shown = "not reached" if record.convergence is None else f"{record.convergence:.1f} s"
    return [*lines, "", f"Converged and quiet after everything was back: **{shown}**.", ""]


def _render_verdicts(record: Record) -> list[str]:
    lines = ["## Verdicts", "", "| invariant | verdict | figures |", "| --- | --- | --- |"]
    for v in record.verdicts:
        state = "pass" if v.ok else f"**FAIL** ({len(v.problems)})"
        lines.append(f"| {v.what} (`{v.name}`) | {state} | {v.summary} |")
    for v in record.verdicts:
        if v.problems:
            lines += ["", f"`{v.name}`:", "", *[f"- {p}" for p in v.problems[:25]]]
    return [*lines, ""]


def _render_rates(record: Record) -> list[str]:
    lines = [
        "## Requests to the dead endpoints",
        "",
        "Connections each service opened to an endpoint while it was down, counted by its own "
        "tap (`soak/taps.py`): per minute of the outage, the most in any 60 s, and the "
        "bounds its backoff sets. *Retrying*: the objects it had waiting at most "
        f"(`capibus_objects_waiting`) plus its own retry loops ({BACKGROUND} per consumer "
        "service; for the watcher, one list-and-watch per kind). *Bound*: retrying x the tries "
        f"of one backoff's first 60 s ({burst(60.0, BACKOFF_MAX)}: base {BACKOFF_BASE:g} s "
        f"doubling to the cap, {BACKOFF_MAX:g} s for consumers, {WATCHER_BACKOFF_MAX:g} s for "
        f"the watcher). *Settled*: the most in one whole minute from minute {SETTLED} on, when "
        "every backoff is at its cap (the worst minute shown), against retrying x the tries "
        f"per minute at the cap, plus {SUBSCRIPTIONS} x {burst(60.0, BACKOFF_MAX)} for each "
        "step of the workload in that minute or the one before (a Cluster that began waiting "
        "then is still in its first minute of backoff).",
        "",
        "| service | endpoint | total | per minute | max in 60 s | retrying | bound | settled "
        "| settled bound |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in record.rates:
        minutes = " ".join(str(n) for n in r.per_minute)
        settled = "-" if r.settled is None else str(r.settled)
        lines.append(
            f"| {r.service} | {r.endpoint} | {r.total} | {minutes} | {r.max_minute} | "
            f"{r.retrying} | {r.bound} | {settled} | {r.settled_bound} |"
        )
    return [*lines, ""]


def _render_metrics(record: Record) -> list[str]:
    lines = [
        "## What the services exported",
        "",
        "From each service's `/metrics` at the end: retries (`capibus_handler_retries_total`), "
        "the most objects waiting at once (`capibus_objects_waiting`), errors by kind.",
        "",
        "| service | retries | max waiting | errors by kind |",
        "| --- | ---: | ---: | --- |",
    ]
    for service in SERVICES:
        own = [s for s in record.samples if s.service == service]
        if not own:
            continue
        last = own[-1]
        errors = ", ".join(f"{k} {v:.0f}" for k, v in sorted(last.errors.items())) or "-"
        waiting = max(s.waiting for s in own)
        lines.append(f"| {service} | {last.retries:.0f} | {waiting:.0f} | {errors} |")
    return [*lines, ""]


def _render_waits(record: Record) -> list[str]:
    lines = [
        "## The wait in the Clusters' status",
        "",
        "Each distinct condition not True seen on a Cluster while the API server answered.",
        "",
        "| Cluster | condition | status | reason | message |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in sorted(record.waits):
        for kind, status, reason, message in sorted(record.waits[name]):
            text = message.replace("|", "\\|")
            lines.append(f"| {name} | {kind} | {status} | {reason} | {text} |")
    return [*lines, ""]


# --- the command ----------------------------------------------------------------------------


async def outage(config: Config, *, keep: bool = False) -> Record:
    """One run from the world's start to its verdicts; the world is closed on every exit."""
    bin_dir = ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="capibus-outage-"))
    world = OutageWorld(stack_for(workdir, bin_dir), workdir, bin_dir, Sizes())
    record: Record | None = None
    try:
        record = await Outage(config, world).run()
    finally:
        await world.close()
        if record is not None and record.ok and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"logs kept in {workdir}")
    return record


def parse(argv: Sequence[str] | None) -> tuple[Config, bool, Path]:
    default = Config()
    parser = argparse.ArgumentParser(
        prog="python -m soak.outage", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--apiserver-minutes", type=float, default=default.apiserver_minutes)
    parser.add_argument("--registrar-minutes", type=float, default=default.registrar_minutes)
    parser.add_argument("--clusters", type=int, default=default.clusters)
    parser.add_argument("--churn-seconds", type=float, default=default.churn_seconds)
    parser.add_argument("--converge-minutes", type=float, default=default.converge_minutes)
    parser.add_argument("--keep", action="store_true", help="keep the logs even after a pass")
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    config = Config(
        apiserver_minutes=args.apiserver_minutes,
        registrar_minutes=args.registrar_minutes,
        clusters=args.clusters,
        churn_seconds=args.churn_seconds,
        converge_minutes=args.converge_minutes,
    )
    return config, bool(args.keep), Path(args.report)


def main(argv: Sequence[str] | None = None) -> int:
    config, keep, report = parse(argv)
    try:
        record = asyncio.run(outage(config, keep=keep))
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    text = render(record)
    report.write_text(text)
    print(text)
    return 0 if record.ok else 1


if __name__ == "__main__":
    sys.exit(main())
