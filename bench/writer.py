"""(b) Writer throughput: Cluster status updates applied to the API server.

Every update is a distinct status change (``kubernetesVersion`` takes a value never used
before; not ``nodeCount`` or ``phase``, which the writer derives on every write and would turn
the update into a skipped no-op), sent as the same JSON merge patch body the writer sends
(``status`` plus the ``metadata.uid`` precondition) to the ``status`` subresource. All updates
of a run are issued at once (a burst) at ``t0``; the clock stops when the last one is applied.

- **baseline**: a bare loop in this process, ``CONCURRENCY`` concurrent workers taking the
  next update from the burst and PATCHing it (client without rate limit). One update is one
  write. Latency of an update = PATCH answered - ``t0``; the PATCH round trip is also shown.
- **candidate**: the real writer (``python -m services.writer``, ``CAPIBUS_KUBE_QPS=1000``,
  ``CAPIBUS_KUBE_BURST=1000``, default 16 partitions and lease settings). The burst is
  published as ``PatchStatus`` messages (``Bus.publish_many``, 256 in flight) on the
  subject of each Cluster's partition. An update counts as applied when a
  ``StatusWritten`` journal entry listing its id is stored in ``CAPIBUS_JOURNAL``
  (seen by an ordered JetStream consumer). Latency = entry ``finished`` - message ``time``;
  the writer's PATCH round trip is entry ``finished - started``. Before the clock starts the
  writer is warmed up with one update per hot Cluster, which also proves it owns and
  consumes all 16 partitions.

Three workloads:

- **b1** one update per Cluster (no Cluster gets two), writer with coalescing off. Nothing
  can be merged, so both sides issue exactly one PATCH per update: writes/s is apples to
  apples.
- **b2** a burst of many updates on few Clusters (evenly spread over the 16 partitions),
  writer with coalescing off. The writer still merges whatever queued up for a Cluster while
  its previous write was in flight, so it issues fewer PATCHes; reported as updates/s, with
  the PATCH count shown.
- **b3** the same burst, writer with its default coalescing window.

Each side has Clusters of its own, equal in number and spread. The writer is the only writer of
Cluster status and names the ``resourceVersion`` its patch was computed from, so a baseline
PATCHing the candidate's Clusters between rounds would be a second status writer: every
candidate write would then meet a 409 and pay a GET and a retry (b1 measured 0.32 that way),
a situation the writer guards against but production never has.

Each comparison runs in rounds of baseline-then-candidate. One writer process (coalescing 0)
serves the b1 and b2 rounds and another (default settings) the b3 rounds; it stays up, idle,
while the baseline of a round runs, so both sides share the machine alike. "CPU per write" is
the CPU time of the bench process (baseline) or of the writer process (candidate) divided by
the API writes issued: on a machine shared with others it is steadier than the rates.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nats.js.api import DeliverPolicy

from bench.common import (
    CONCURRENCY,
    PARTITIONS,
    Clients,
    create_clusters,
    new_namespace,
    p50_p99,
    run_pool,
)
from bench.procs import Child, Children, CpuSnapshot, labels_for
from bench.report import Comparison, Side
from services.writer.settings import WriterTuning
from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient
from shared.messages import Message, ObjectRef, PatchStatus
from shared.resources import CLUSTER
from testenv.harness import LocalStack

Json = dict[str, Any]
TIMEOUT = 120.0
WARM_UP_TIMEOUT = 60.0
#: Values are never reused, so every update really changes the status.
_SEQUENCE = itertools.count(1)


@dataclass(frozen=True)
class WriterSizes:
    distinct: int
    hot_per_partition: int
    hot_updates: int
    rounds: int

    @property
    def hot_clusters(self) -> int:
        return self.hot_per_partition * PARTITIONS


@dataclass(frozen=True)
class Update:
    ref: ObjectRef
    status: Json

    def body(self) -> Json:
        return {"metadata": {"uid": self.ref.uid}, "status": self.status}

    def message(self) -> tuple[str, Message, str | None]:
        assert self.ref.namespace
        partition = subjects.partition_of(self.ref.key, PARTITIONS)
        subject = subjects.cluster_status(partition, self.ref.namespace, self.ref.name)
        message = PatchStatus(
            source="bench",
            correlation_id=f"cluster:{self.ref.key}",
            ref=self.ref,
            patch=self.status,
        )
        return subject, message, None


def updates_for(refs: list[ObjectRef], count: int) -> list[Update]:
    """``count`` distinct status changes, round-robin over ``refs``."""
    return [
        Update(refs[i % len(refs)], {"kubernetesVersion": f"1.{next(_SEQUENCE)}.0"})
        for i in range(count)
    ]


@dataclass
class Workload:
    namespace: str
    hot: list[ObjectRef]
    distinct: list[ObjectRef]
    #: the baseline's own twins of ``hot`` and ``distinct``
    bare_hot: list[ObjectRef]
    bare_distinct: list[ObjectRef]


def balanced_names(namespace: str, per_partition: int, prefix: str = "h") -> list[str]:
    """Cluster names spread evenly over the partitions (``per_partition`` each)."""
    taken: Counter[int] = Counter()
    names: list[str] = []
    for index in itertools.count():
        name = f"{prefix}{index}"
        partition = subjects.partition_of(f"{namespace}/{name}", PARTITIONS)
        if taken[partition] < per_partition:
            taken[partition] += 1
            names.append(name)
        if len(names) == per_partition * PARTITIONS:
            return names
    raise AssertionError("unreachable")


async def prepare(kube: KubeClient, sizes: WriterSizes) -> Workload:
    namespace = await new_namespace(kube, "bench-w")
    hot = balanced_names(namespace, sizes.hot_per_partition)
    distinct = [f"d{i:05d}" for i in range(sizes.distinct)]
    bare_hot = balanced_names(namespace, sizes.hot_per_partition, prefix="bh")
    bare_distinct = [f"bd{i:05d}" for i in range(sizes.distinct)]
    uids = await create_clusters(kube, namespace, hot + distinct + bare_hot + bare_distinct)

    def refs(names: list[str]) -> list[ObjectRef]:
        return [
            ObjectRef(
                api_version=CLUSTER.api_version,
                kind=CLUSTER.kind,
                namespace=namespace,
                name=n,
                uid=uids[n],
            )
            for n in names
        ]

    return Workload(
        namespace=namespace,
        hot=refs(hot),
        distinct=refs(distinct),
        bare_hot=refs(bare_hot),
        bare_distinct=refs(bare_distinct),
    )


# -- baseline -------------------------------------------------------------------------------


async def _patch(kube: KubeClient, update: Update) -> None:
    ref = update.ref
    await kube.patch_merge(CLUSTER, ref.namespace, ref.name, update.body(), subresource="status")


async def run_baseline(
    kube: KubeClient, warm: list[ObjectRef], updates: list[Update], writer: Child
) -> Side:
    """The burst through a bare loop of ``CONCURRENCY`` PATCH workers."""
    for update in updates_for(warm, len(warm)):
        await _patch(kube, update)  # keep connections open and the API server's caches warm
    round_trips: list[float] = []
    answered: list[float] = []
    before = CpuSnapshot.take(labels_for(writer))
    started = time.monotonic()

    async def write(index: int) -> None:
        sent = time.monotonic()
        await _patch(kube, updates[index])
        now = time.monotonic()
        round_trips.append(now - sent)
        answered.append(now - started)

    await run_pool(len(updates), write, concurrency=CONCURRENCY)
    after = CpuSnapshot.take(labels_for(writer))
    return Side(
        done=len(updates),
        expected=len(updates),
        elapsed=max(answered),
        details=[
            f"update latency (burst sent -> PATCH answered): {p50_p99(answered)}",
            f"PATCH round trip: {p50_p99(round_trips)}",
            after.cpu_line(before),
            f"bench process CPU per write: "
            f"{after.seconds_of(os.getpid(), before) / len(updates) * 1000:.2f} ms",
        ],
    )


# -- candidate ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """The parts of one ``StatusWritten`` the benchmark needs."""

    update_ids: list[str]
    skipped: bool
    started: datetime
    finished: datetime
    stored: float


@dataclass
class Journal:
    """Every ``StatusWritten`` of one namespace stored from now on, by update id."""

    by_update: dict[str, Entry] = field(default_factory=dict)
    _waiting: set[str] = field(default_factory=set)
    _done: asyncio.Event = field(default_factory=asyncio.Event)
    _sub: Any = None

    async def open(self, bus: Bus, namespace: str) -> None:
        self._sub = await bus.js.subscribe(
            f"capibus.journal.statuswritten.cluster.{namespace}.*",
            stream=subjects.JOURNAL.name,
            cb=self._stored,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
        )

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _stored(self, msg: Any) -> None:
        raw = json.loads(msg.data)
        entry = Entry(
            update_ids=list(raw["update_ids"]),
            skipped=bool(raw["skipped"]),
            started=datetime.fromisoformat(raw["started"]),
            finished=datetime.fromisoformat(raw["finished"]),
            stored=time.monotonic(),
        )
        for update_id in entry.update_ids:
            self.by_update.setdefault(update_id, entry)
        self._waiting.difference_update(entry.update_ids)
        if not self._waiting:
            self._done.set()

    async def wait(self, ids: set[str], within: float, alive: Callable[[], bool]) -> bool:
        """Until every id in ``ids`` is journaled; False after ``within`` s or on writer death."""
        self._waiting = ids - self.by_update.keys()
        self._done = asyncio.Event()
        if not self._waiting:
            return True
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and alive():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), 0.5)
                return True
        return False


def _writer_env(stack: LocalStack, coalesce: float | None) -> dict[str, str]:
    env = {**stack.env(), "CAPIBUS_KUBE_QPS": "1000", "CAPIBUS_KUBE_BURST": "1000"}
    if coalesce is not None:
        env["CAPIBUS_WRITER__COALESCE_SECONDS"] = str(coalesce)
    return env


@dataclass
class WriterRun:
    """One writer process and the journal it is measured by."""

    clients: Clients
    child: Child
    journal: Journal

    async def warm_up(self, refs: list[ObjectRef]) -> None:
        messages = [u.message() for u in updates_for(refs, len(refs))]
        await self.clients.bus.publish_many(messages)
        ids = {m.id for _, m, _ in messages}
        if not await self.journal.wait(ids, WARM_UP_TIMEOUT, self.child.alive):
            raise RuntimeError(f"writer did not warm up; log tail:\n{self.child.log_tail()}")

    async def measure(self, updates: list[Update]) -> Side:
        labels = labels_for(self.child)
        before = CpuSnapshot.take(labels)
        started = time.monotonic()
        messages = [u.message() for u in updates]
        await self.clients.bus.publish_many(messages)
        published = time.monotonic() - started
        await self.journal.wait({m.id for _, m, _ in messages}, TIMEOUT, self.child.alive)
        after = CpuSnapshot.take(labels)
        side, writes = _describe(self.journal, messages, started)
        cpu = after.seconds_of(self.child.proc.pid, before)
        side.details += [
            f"burst published to JetStream in {published:.2f} s",
            after.cpu_line(before),
            f"writer CPU per write: {cpu / max(writes, 1) * 1000:.2f} ms, "
            f"per update: {cpu / len(updates) * 1000:.2f} ms",
        ]
        return side


def _describe(
    journal: Journal, messages: list[tuple[str, Message, str | None]], started: float
) -> tuple[Side, int]:
    """The round as seen in the journal, and how many API writes the writer issued."""
    found = [(m, journal.by_update[m.id]) for _, m, _ in messages if m.id in journal.by_update]
    entries = {id(e): e for _, e in found}.values()
    writes = [e for e in entries if not e.skipped]
    elapsed = max((e.stored for e in entries), default=started + TIMEOUT) - started
    latencies = [(e.finished - m.time).total_seconds() for m, e in found]
    round_trips = [(e.finished - e.started).total_seconds() for e in writes]
    side = Side(
        done=len(found),
        expected=len(messages),
        elapsed=elapsed,
        details=[
            f"API writes issued: {len(writes)} ({len(writes) / elapsed:,.0f} writes/s), "
            f"skipped as no-ops: {len(entries) - len(writes)}, "
            f"updates per write: {len(found) / max(len(writes), 1):.1f}",
            f"update latency (message time -> journal `finished`): {p50_p99(latencies)}",
            f"writer's PATCH round trip (journal `finished - started`): {p50_p99(round_trips)}",
        ],
    )
    return side, len(writes)


@contextlib.asynccontextmanager
async def writer_process(
    clients: Clients,
    stack: LocalStack,
    children: Children,
    work: Workload,
    coalesce: float | None,
) -> Any:
    """A warmed-up writer (``coalesce`` None = its default) and a journal reader."""
    journal = Journal()
    await journal.open(clients.bus, work.namespace)
    label = "bench-writer-" + ("default" if coalesce is None else f"coalesce-{coalesce:g}")
    child = children.start("writer", _writer_env(stack, coalesce), label=label)
    try:
        run = WriterRun(clients=clients, child=child, journal=journal)
        await run.warm_up(work.hot)
        yield run
    finally:
        children.stop(child)
        await journal.close()


# -- the comparisons ------------------------------------------------------------------------


def _comparisons(sizes: WriterSizes) -> list[Comparison]:
    burst = f"{sizes.hot_updates} updates on {sizes.hot_clusters} Clusters"
    baseline = f"baseline: bare loop, {CONCURRENCY} concurrent PATCH workers"
    no_coalescing = "candidate: python -m services.writer, COALESCE_SECONDS=0"
    default = WriterTuning().coalesce_seconds
    return [
        Comparison(
            key="b1",
            title=f"writer: {sizes.distinct} updates, 1 per Cluster, no coalescing",
            unit="writes/s",
            method=METHOD_DISTINCT,
            baseline_label=baseline,
            candidate_label=no_coalescing,
        ),
        Comparison(
            key="b2",
            title=f"writer: {burst}, no coalescing",
            unit="updates/s",
            method=METHOD_BURST,
            baseline_label=baseline,
            candidate_label=no_coalescing,
        ),
        Comparison(
            key="b3",
            title=f"writer: {burst}, default coalescing",
            unit="updates/s",
            method=METHOD_COALESCED,
            baseline_label=baseline,
            candidate_label=f"candidate: python -m services.writer, default coalescing "
            f"({default} s)",
        ),
    ]


async def _round(
    comparison: Comparison,
    run: WriterRun,
    work: Workload,
    refs: tuple[list[ObjectRef], list[ObjectRef]],
    count: int,
) -> None:
    """One baseline-then-candidate round; ``refs``: (the baseline's, the candidate's)."""
    bare, own = refs
    kube = run.clients.kube
    baseline = await run_baseline(kube, work.bare_hot, updates_for(bare, count), run.child)
    comparison.rounds.append((baseline, await run.measure(updates_for(own, count))))


async def compare(
    clients: Clients, stack: LocalStack, children: Children, sizes: WriterSizes
) -> list[Comparison]:
    work = await prepare(clients.kube, sizes)
    distinct, burst, coalesced = _comparisons(sizes)
    async with writer_process(clients, stack, children, work, 0.0) as run:
        for _ in range(sizes.rounds):
            await _round(distinct, run, work, (work.bare_distinct, work.distinct), sizes.distinct)
            await _round(burst, run, work, (work.bare_hot, work.hot), sizes.hot_updates)
    async with writer_process(clients, stack, children, work, None) as run:
        for _ in range(sizes.rounds):
            await _round(coalesced, run, work, (work.bare_hot, work.hot), sizes.hot_updates)
    return [distinct, burst, coalesced]


METHOD_DISTINCT = (
    "Each update goes to a different Cluster, so nothing can be merged: both sides issue "
    "exactly one status PATCH per update and the rate is writes/s on both sides. The whole "
    "burst is issued at t0; rate = updates / (last applied - t0). Baseline: bare loop of "
    f"{CONCURRENCY} concurrent PATCH workers. Candidate: burst published to JetStream, the "
    "writer (coalescing window 0) applies it; applied = its `StatusWritten` journal "
    "entry is stored."
)
METHOD_BURST = (
    "Many updates per Cluster. The baseline still issues one PATCH per update (a bare loop has "
    "no way to merge). The writer with coalescing window 0 merges whatever queued up for a "
    "Cluster while its previous write was in flight (per-object batches of `shared.consumer`), "
    "so it issues fewer PATCHes: the comparable figure is updates applied/s; the writer's PATCH "
    "count and writes/s are listed below."
)
METHOD_COALESCED = (
    "As b2, with the writer's default coalescing window (it waits that long after a Cluster's "
    "first queued update so a burst becomes one write). The baseline is measured again in "
    "each b3 round (same workload as b2), right before the candidate."
)
