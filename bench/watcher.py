"""(a) Watcher throughput: changes made in the API server, observed on the consuming side.

The baseline and the candidate each get their own namespace with the same number of
Clusters. A *change* is one JSON merge patch setting a distinct annotation value on the next
Cluster (round-robin), so every change is exactly one MODIFIED watch event with its own
resourceVersion. The *consuming side* is:

- **baseline**: a bare list-watch in the benchmark process (``KubeClient.list`` for the
  resourceVersion, then ``KubeClient.watch`` on the namespace's Clusters, counting MODIFIED
  events). The best any watcher written on the same client can do; it stores nothing.
- **candidate**: the real watcher (``python -m services.watcher``, Clusters of its namespace
  only), started once and waited for until it logged ``listed at``. A change counts when its
  message is *stored* in ``CAPIBUS_EVENTS``, as seen by an ordered JetStream consumer on
  ``capibus.evt.cluster.*.<ns>.*`` (JetStream delivers only stored messages); the message id
  header ``<uid>:<resourceVersion>:MODIFIED`` says which change it is. After every round the
  stream's per-subject counts are checked: one message per Cluster (the initial list) plus one
  per change made so far, i.e. nothing lost and nothing stored twice.

Two measurements:

- **a1, live**: the same driver (``CONCURRENCY`` concurrent PATCHes from the benchmark
  process) makes the changes while the consuming side runs; changes/s = changes / (last change
  observed - first PATCH sent). This is the end-to-end figure, and on a small machine it is
  usually bounded by how fast the API server accepts the PATCHes, for both sides alike.
- **a2, backlog**: the changes are made first while the consuming side is not reading (the
  baseline has not started watching yet; the watcher is frozen with SIGSTOP); then the clock
  starts and the consuming side catches up (the bare watch starts from the resourceVersion
  before the changes; the watcher gets SIGCONT). changes/s = changes / (last observed - clock
  start). This is the consuming side's own capacity, which a1 cannot show when the driver is
  the slower part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from nats.js.api import DeliverPolicy

from bench.common import (
    CONCURRENCY,
    Clients,
    create_clusters,
    new_namespace,
    p50_p99,
    run_pool,
    stop_task,
)
from bench.procs import Child, Children, CpuSnapshot, labels_for, wait_for_log
from bench.report import Comparison, Side
from shared import subjects
from shared.kube import KubeClient
from shared.resources import CLUSTER
from testenv.harness import LocalStack

ANNOTATION = "bench.capibus.io/seq"
TIMEOUT = 120.0


@dataclass(frozen=True)
class WatcherSizes:
    clusters: int
    changes: int
    rounds: int


@dataclass
class Tally:
    """Distinct changes observed (by resourceVersion) and when each was first seen."""

    expected: int
    seen: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, resource_version: str) -> None:
        self.seen.setdefault(resource_version, time.monotonic())
        if len(self.seen) >= self.expected:
            self.done.set()

    async def wait(self, within: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), within)

    def elapsed_since(self, start: float) -> float:
        return max(self.seen.values(), default=start + TIMEOUT) - start


@dataclass
class Target:
    """A namespace of Clusters to change, and how many changes were made there so far."""

    namespace: str
    names: list[str]
    made: int = 0


@dataclass
class Drive:
    """The driver's record: when it started and when each change's PATCH was answered."""

    started: float
    finished: float = 0.0
    answered: dict[str, float] = field(default_factory=dict)


async def drive_changes(kube: KubeClient, target: Target, count: int) -> Drive:
    drive = Drive(started=time.monotonic())
    first = target.made
    target.made += count

    async def change(index: int) -> None:
        name = target.names[index % len(target.names)]
        patch = {"metadata": {"annotations": {ANNOTATION: str(first + index)}}}
        patched = await kube.patch_merge(CLUSTER, target.namespace, name, patch)
        drive.answered[str(patched["metadata"]["resourceVersion"])] = time.monotonic()

    await run_pool(count, change, concurrency=CONCURRENCY)
    drive.finished = time.monotonic()
    return drive


async def _prepare(kube: KubeClient, prefix: str, sizes: WatcherSizes) -> Target:
    namespace = await new_namespace(kube, prefix)
    names = [f"c{i:03d}" for i in range(sizes.clusters)]
    await create_clusters(kube, namespace, names)
    return Target(namespace=namespace, names=names)


# -- the two consuming sides ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def bare_watch(kube: KubeClient, target: Target, version: str, tally: Tally) -> Any:
    """Count MODIFIED events of ``target`` after ``version`` while the block runs."""

    async def watch() -> None:
        async for event in kube.watch(
            CLUSTER, resource_version=version, namespace=target.namespace, timeout_seconds=600
        ):
            if event.type == "MODIFIED":
                tally.add(event.resource_version)
                if tally.done.is_set():
                    return

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        await stop_task(task)


@contextlib.asynccontextmanager
async def stored_changes(clients: Clients, target: Target, tally: Tally) -> Any:
    """Count changes of ``target`` stored in JetStream from now on while the block runs."""

    async def stored(msg: Any) -> None:
        parts = (msg.headers or {}).get("Nats-Msg-Id", "").split(":")
        if len(parts) == 3 and parts[2] == "MODIFIED":
            tally.add(parts[1])

    sub = await clients.bus.js.subscribe(
        f"capibus.evt.cluster.*.{target.namespace}.*",
        stream=subjects.EVENTS.name,
        cb=stored,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
        headers_only=True,
    )
    try:
        yield
    finally:
        await sub.unsubscribe()


async def _stream_check(clients: Clients, target: Target) -> str:
    info = await clients.bus.js.stream_info(
        subjects.EVENTS.name, subjects_filter=f"capibus.evt.cluster.*.{target.namespace}.*"
    )
    stored = sum((info.state.subjects or {}).values())
    expected = len(target.names) + target.made
    verdict = "exact" if stored == expected else "MISMATCH"
    return (
        f"messages stored for the namespace so far: {stored} (expected {len(target.names)} "
        f"from the initial list + {target.made} changes = {expected}: {verdict})"
    )


def _cpu_per_change(after: CpuSnapshot, before: CpuSnapshot, pid: int, what: str, n: int) -> str:
    return f"{what} CPU per change: {after.seconds_of(pid, before) / n * 1000:.2f} ms"


# -- a1: live -------------------------------------------------------------------------------


async def _live(kube: KubeClient, target: Target, tally: Tally, labels: dict[int, str]) -> Side:
    """Drive the changes while ``tally`` is being fed; describe the round."""
    before = CpuSnapshot.take(labels)
    drive = await drive_changes(kube, target, tally.expected)
    await tally.wait(TIMEOUT)
    after = CpuSnapshot.take(labels)
    lags = [tally.seen[rv] - t for rv, t in drive.answered.items() if rv in tally.seen]
    driven = drive.finished - drive.started
    return Side(
        done=len(tally.seen),
        expected=tally.expected,
        elapsed=tally.elapsed_since(drive.started),
        details=[
            f"driver: all PATCHes answered after {driven:.2f} s ({tally.expected / driven:,.0f}/s)",
            f"observed after the PATCH was answered: {p50_p99(lags)}",
            after.cpu_line(before),
        ],
    )


async def live_baseline(kube: KubeClient, target: Target, changes: int, watcher: Child) -> Side:
    _, version = await kube.list(CLUSTER, namespace=target.namespace)
    tally = Tally(expected=changes)
    async with bare_watch(kube, target, version, tally):
        return await _live(kube, target, tally, labels_for(watcher))


async def live_candidate(clients: Clients, target: Target, changes: int, watcher: Child) -> Side:
    tally = Tally(expected=changes)
    async with stored_changes(clients, target, tally):
        side = await _live(clients.kube, target, tally, labels_for(watcher))
    side.details.append(await _stream_check(clients, target))
    return side


# -- a2: backlog ----------------------------------------------------------------------------


async def backlog_baseline(kube: KubeClient, target: Target, changes: int, watcher: Child) -> Side:
    _, version = await kube.list(CLUSTER, namespace=target.namespace)
    await drive_changes(kube, target, changes)
    tally = Tally(expected=changes)
    before = CpuSnapshot.take(labels_for(watcher))
    async with bare_watch(kube, target, version, tally):
        await tally.wait(TIMEOUT)
    after = CpuSnapshot.take(labels_for(watcher))
    return Side(
        done=len(tally.seen),
        expected=changes,
        elapsed=tally.elapsed_since(before.wall),
        details=[
            after.cpu_line(before),
            _cpu_per_change(after, before, os.getpid(), "bench process (bare watch)", changes),
        ],
    )


def _signal_group(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.proc.pid, sig)


async def backlog_candidate(clients: Clients, target: Target, changes: int, watcher: Child) -> Side:
    tally = Tally(expected=changes)
    async with stored_changes(clients, target, tally):
        _signal_group(watcher, signal.SIGSTOP)
        try:
            await drive_changes(clients.kube, target, changes)
            before = CpuSnapshot.take(labels_for(watcher))
        finally:
            _signal_group(watcher, signal.SIGCONT)
        await tally.wait(TIMEOUT)
        after = CpuSnapshot.take(labels_for(watcher))
    pid = watcher.proc.pid
    return Side(
        done=len(tally.seen),
        expected=changes,
        elapsed=tally.elapsed_since(before.wall),
        details=[
            after.cpu_line(before),
            _cpu_per_change(after, before, pid, "watcher", changes),
            await _stream_check(clients, target),
        ],
    )


# -- the comparisons ------------------------------------------------------------------------


def _start_watcher(children: Children, stack: LocalStack, target: Target) -> Child:
    env = {
        **stack.env(),
        "CAPIBUS_WATCHER__KINDS": '["cluster"]',
        "CAPIBUS_WATCHER__NAMESPACE": target.namespace,
    }
    return children.start("watcher", env, label="bench-watcher")


def _comparisons(sizes: WatcherSizes) -> tuple[Comparison, Comparison]:
    work = f"{sizes.changes} changes to {sizes.clusters} Clusters"
    live = Comparison(
        key="a1",
        title=f"watcher, live: {work}",
        unit="changes/s",
        method=METHOD_LIVE,
        baseline_label="baseline: bare list-watch in the benchmark process",
        candidate_label="candidate: python -m services.watcher, counted when stored",
    )
    backlog = Comparison(
        key="a2",
        title=f"watcher, backlog: {work}",
        unit="changes/s",
        method=METHOD_BACKLOG,
        baseline_label="baseline: bare watch from before the changes",
        candidate_label="candidate: python -m services.watcher resumed (SIGCONT)",
        target=None,
    )
    return live, backlog


async def compare(
    clients: Clients, stack: LocalStack, children: Children, sizes: WatcherSizes
) -> list[Comparison]:
    base = await _prepare(clients.kube, "bench-wb", sizes)
    cand = await _prepare(clients.kube, "bench-wc", sizes)
    live, backlog = _comparisons(sizes)
    watcher = _start_watcher(children, stack, cand)
    try:
        await wait_for_log(watcher, "listed at")
        for _ in range(sizes.rounds):
            b = await live_baseline(clients.kube, base, sizes.changes, watcher)
            live.rounds.append((b, await live_candidate(clients, cand, sizes.changes, watcher)))
        for _ in range(sizes.rounds):
            b = await backlog_baseline(clients.kube, base, sizes.changes, watcher)
            c = await backlog_candidate(clients, cand, sizes.changes, watcher)
            backlog.rounds.append((b, c))
    finally:
        children.stop(watcher)
    return [live, backlog]


METHOD_LIVE = (
    f"A driver of {CONCURRENCY} concurrent merge PATCHes in the benchmark process makes the "
    "changes (round-robin over the Clusters of the side's namespace) while the consuming side "
    "runs. changes/s = changes / (last change observed - first PATCH sent). Baseline observes "
    "with a bare `KubeClient.watch`; the candidate observes a change when the watcher's message "
    "for it is stored in `CAPIBUS_EVENTS`. 'observed after the PATCH was answered' is the "
    "per-change delay from the PATCH response reaching the driver to the observation (negative "
    "when the watch event arrives before the PATCH response). The watcher process stays up "
    "(idle) during the baseline rounds."
)
METHOD_BACKLOG = (
    "The same number of changes is made first, while the consuming side does not read: the "
    "baseline has not started its watch; the watcher process is frozen with SIGSTOP (its watch "
    "stays open). Then the clock starts: the bare watch starts from the resourceVersion taken "
    "before the changes / the watcher gets SIGCONT. changes/s = changes / (last change "
    "observed - clock start): the consuming side's own capacity, without the driver in the way. "
    "Informational, no target: the bare watch only parses events, while the watcher must also "
    "convert, publish and get JetStream's acknowledgement for each one, so the ratio says how "
    "much that costs, and the candidate rate compared with a1's rates says how much headroom "
    "the watcher has over the rate at which this API server accepts changes."
)
