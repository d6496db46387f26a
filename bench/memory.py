"""(g) memory: what every service keeps with thousands of Clusters, and what it lets go.

A management cluster may hold thousands of Clusters; a service whose memory grows with every
object it ever saw is OOM-killed in the end. This phase runs every service with background
work (``deployment.EVERY_SERVICE``: the lifecycle six, discovery, catalog and the exporter)
against ``MemorySizes.clusters`` Azimuth Clusters, first one process per service, then all in
one process (``services.allinone``), each mode on a fresh stack, and reads ``VmRSS`` and
``VmHWM`` (``/proc/<pid>/status``) at four moments:

1. **idle**: every service serving (the watcher listed every kind, each consumer owns every
   partition), no Cluster yet, ``SETTLE`` seconds later;
2. **at N**: ``clusters`` Clusters created (spread over namespaces of ``PER_NAMESPACE``), each
   carrying the helm service's finalizer and a condition, and the services quiet (together
   under ``QUIET_CORES`` over ``QUIET_WINDOW`` seconds);
3. **restarted at N**: the watcher process (all in one: the whole process) stopped and
   started again: the time from its start to "cluster: listed at" is the watcher's list time
   for N Clusters (process start and imports included), then its memory once quiet;
4. **after deleting**: ``deleted`` of the Clusters deleted at once and gone, the services
   quiet: a service whose memory keeps what was deleted shows it here. CPython rarely gives
   freed memory back to the system, so RSS not shrinking proves nothing by itself; what the
   caches keep is bounded by the unit tests named in ``docs/operations.md`` ("Memory: what
   each service keeps"), and this shows the whole process stays flat.

**No Helm work.** All but every ``UNPAUSED_EVERY``-th Cluster are created with
``spec.paused``: the helm service adds its finalizer and reports ``Paused`` without running
helm. The unpaused ones have a credentials Secret (as has every ``CREDENTIALS_EVERY``-th
Cluster) and are installed by the helm stand-in (``standins/helmbin.py``, no wait): nothing of
the chart is applied, so no Cluster API object exists and they stay Reconciling. Deleting a
Cluster runs the helm service's whole deletion (uninstall through the stand-in, the finalizer
removed by the writer).

The exporter keeps every exported object by design (``docs/operations.md``): its figure is the
memory it gains per Cluster between idle and N.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import deployment
from bench.common import PARTITIONS, Clients, run_pool
from bench.deployment import (
    EVERY_SERVICE,
    Deployment,
    cluster_object,
    create_credentials,
    create_template,
    deployment_env,
    load_average,
    mib,
    vm_status,
    wait_for_count,
)
from bench.lifecycle import Figure, Section, Verdict
from bench.procs import Child, Children, CpuSnapshot
from shared.errors import KubeConflict, KubeNotFound, TemporaryError
from shared.kube import KubeClient
from shared.resources import CLUSTER, KINDS, NAMESPACE
from standins import helmbin
from testenv.crds import apply_crds
from testenv.harness import LocalStack, ensure_binaries

TEMPLATE = "kube-1-34"
PER_NAMESPACE = 100
UNPAUSED_EVERY = 50
CREDENTIALS_EVERY = 10
#: seconds of idleness before the idle reading
SETTLE = 10.0
QUIET_CORES = 0.05
QUIET_WINDOW = 5.0
#: how long the services may take to handle the Clusters created or deleted
SETTLE_TIMEOUT = 1200.0
#: twice the idle RSS of one service process (``bench/RESULTS.md``, f2: about 70 MiB)
PER_SERVICE_TARGET = 140 << 20
FINALIZER = "azimuth.stackhpc.com/finalizer"
Json = dict[str, Any]
LISTED = f"{CLUSTER.token}: listed at"


@dataclass(frozen=True)
class MemorySizes:
    clusters: int
    deleted: int


@dataclass(frozen=True)
class Reading:
    """``VmRSS`` and ``VmHWM`` of one process at one moment, bytes."""

    rss: int
    peak: int


@dataclass
class Run:
    """One mode's readings, by moment and process label."""

    mode: str
    readings: dict[str, dict[str, Reading]] = field(default_factory=dict)
    list_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def rss(self, moment: str, name: str) -> int:
        return self.readings[moment][name].rss


def read(children: dict[str, Child]) -> dict[str, Reading]:
    return {
        name: Reading(vm_status(c.proc.pid, "VmRSS"), vm_status(c.proc.pid, "VmHWM"))
        for name, c in children.items()
        if c.alive()
    }


async def quiet(children: dict[str, Child], *, within: float = SETTLE_TIMEOUT) -> float:
    """Until the services use less than ``QUIET_CORES`` together over ``QUIET_WINDOW`` s;
    returns how long it took (``within`` if they never did)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        before = CpuSnapshot.take()
        await asyncio.sleep(QUIET_WINDOW)
        after = CpuSnapshot.take()
        used = sum(after.seconds_of(c.proc.pid, before) for c in children.values())
        if used / (after.wall - before.wall) < QUIET_CORES:
            break
    return time.monotonic() - started


async def until(
    check: Callable[[], Awaitable[bool]], what: str, *, within: float = SETTLE_TIMEOUT
) -> float:
    """Poll ``check`` every 2 s until it is true; seconds taken."""
    started = time.monotonic()
    while not await _suppressed(check):
        if time.monotonic() - started > within:
            raise TimeoutError(f"{what}: not after {within:.0f} s")
        await asyncio.sleep(2.0)
    return time.monotonic() - started


async def _suppressed(check: Callable[[], Awaitable[bool]]) -> bool:
    """``check()``, false on a temporary error (the next poll asks again)."""
    try:
        return await check()
    except TemporaryError:
        return False


def names(sizes: MemorySizes) -> list[tuple[str, str]]:
    """(namespace, name) of every Cluster, in creation order."""
    return [(f"mem-{i // PER_NAMESPACE:03d}", f"c{i:05d}") for i in range(sizes.clusters)]


async def create(kube: KubeClient, sizes: MemorySizes) -> None:
    everything = names(sizes)
    for namespace in sorted({ns for ns, _ in everything}):
        await kube.create(NAMESPACE, {"metadata": {"name": namespace}})
    credentialed = [
        (i, ns, n) for i, (ns, n) in enumerate(everything) if i % CREDENTIALS_EVERY == 0
    ]

    async def secret(index: int) -> None:
        _, namespace, name = credentialed[index]
        await patiently(lambda: create_credentials(kube, namespace, name))

    async def cluster(index: int) -> None:
        namespace, name = everything[index]
        body = cluster_object(namespace, name, TEMPLATE, paused=index % UNPAUSED_EVERY != 0)
        await patiently(lambda: kube.create(CLUSTER, body))

    await run_pool(len(credentialed), secret)
    await run_pool(len(everything), cluster)


async def patiently(request: Callable[[], Awaitable[object]], *, tries: int = 10) -> None:
    """``request()``, tried again on a temporary error (the API server of a loaded machine
    drops a connection now and then); a create whose first answer was lost finds its object
    there (409) and counts as done."""
    for attempt in range(tries):
        try:
            await request()
            return
        except KubeConflict:
            return
        except TemporaryError:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(1.0 + attempt)


async def clusters(kube: KubeClient, sizes: MemorySizes) -> list[Json]:
    found: list[Json] = []
    for namespace in sorted({ns for ns, _ in names(sizes)}):
        items, _ = await kube.list(CLUSTER, namespace=namespace)
        found += items
    return found


def handled(cluster: Json) -> bool:
    """The helm service added its finalizer and something reported a condition."""
    meta, status = cluster.get("metadata") or {}, cluster.get("status") or {}
    return FINALIZER in (meta.get("finalizers") or []) and bool(status.get("conditions"))


async def delete(kube: KubeClient, sizes: MemorySizes) -> list[tuple[str, str]]:
    """Delete ``sizes.deleted`` Clusters spread over every namespace (three of four)."""
    everything = names(sizes)
    chosen = [c for i, c in enumerate(everything) if i % 4 != 0]
    chosen = (chosen + [c for i, c in enumerate(everything) if i % 4 == 0])[: sizes.deleted]

    async def one(index: int) -> None:
        namespace, name = chosen[index]
        with contextlib.suppress(KubeNotFound):
            await patiently(lambda: kube.delete(CLUSTER, namespace, name))

    await run_pool(len(chosen), one)
    return chosen


async def restart(
    children: Children, running: Deployment, env: dict[str, str], *, together: bool, prefix: str
) -> tuple[float, Child]:
    """Stop the watcher (all in one: the process) and start it again: (seconds from its start
    to the Clusters listed, the new process)."""
    name = "allinone" if together else "watcher"
    children.stop(running.services[name])
    if together:
        one = {**env, "CAPIBUS_SERVICES": ",".join(EVERY_SERVICE)}
        child = children.start("allinone", one, label=f"{prefix}-allinone-2")
    else:
        child = children.start("watcher", env, label=f"{prefix}-watcher-2")
    started = time.monotonic()
    await wait_for_count(child, LISTED, 1)
    took = time.monotonic() - started
    await wait_for_count(child, "listed at", len(KINDS))
    if together:
        consumers = [s for s in EVERY_SERVICE if s not in ("watcher", "exporter")]
        await wait_for_count(child, "caught up with the event stream", 1)
        await wait_for_count(child, "owns partition", PARTITIONS * len(consumers))
    running.services[name] = child
    return took, child


async def one_mode(
    clients: Clients,
    stack: LocalStack,
    children: Children,
    helm: Path,
    sizes: MemorySizes,
    *,
    together: bool,
) -> Run:
    mode = "all in one" if together else "one process each"
    prefix = "g1" if together else "g"
    run = Run(mode)
    kube = clients.kube
    _progress(f"{mode}: starting {len(EVERY_SERVICE)} services")
    await create_template(kube, TEMPLATE)
    running = await deployment.start(
        children,
        stack,
        helm=helm,
        oidc=False,
        prefix=prefix,
        services=EVERY_SERVICE,
        together=together,
    )
    try:
        await asyncio.sleep(SETTLE)
        run.readings["idle"] = read(running.services)
        _progress(f"{mode}: creating {sizes.clusters} Clusters")
        started = time.monotonic()
        await create(kube, sizes)
        run.timings["create"] = time.monotonic() - started

        async def all_handled() -> bool:
            found = await clusters(kube, sizes)
            return len(found) == sizes.clusters and all(handled(c) for c in found)

        run.timings["handled"] = await until(all_handled, "every Cluster handled")
        run.timings["quiet"] = await quiet(running.services)
        run.readings["at N"] = read(running.services)
        run.notes.append(f"load average at N: {load_average()}")
        _progress(f"{mode}: restarting the watcher")
        env = {**stack.env(), **deployment_env(helm, oidc=False)}
        run.list_seconds, _ = await restart(
            children, running, env, together=together, prefix=prefix
        )
        await quiet(running.services)
        run.readings["restarted"] = read(running.services)
        _progress(f"{mode}: deleting {sizes.deleted} Clusters")
        started = time.monotonic()
        await delete(kube, sizes)

        async def all_gone() -> bool:
            return len(await clusters(kube, sizes)) == sizes.clusters - sizes.deleted

        run.timings["deleted"] = await until(all_gone, "the deleted Clusters gone")
        run.timings["delete quiet"] = await quiet(running.services)
        run.readings["after delete"] = read(running.services)
        run.notes.append(f"load average after deleting: {load_average()}")
        for line in _details(run):
            _progress(line)  # kept in the output should the other mode fail
        return run
    finally:
        running.stop(children)


# --- figures ---------------------------------------------------------------------------------


def _verdict(over: bool) -> Verdict:
    return "MISSED" if over else "pass"


def _story(run: Run, name: str) -> str:
    """idle → at N → restarted → after delete (peak), for one process."""
    moments = [m for m in ("idle", "at N", "restarted", "after delete") if name in run.readings[m]]
    path = " → ".join(mib(run.rss(m, name)).removesuffix(" MiB") for m in moments)
    peak = max(run.readings[m][name].peak for m in moments)
    return f"{name} {path} MiB (peak {mib(peak)})"


def _per_object(run: Run, name: str, count: int) -> str:
    gained = run.rss("at N", name) - run.rss("idle", name)
    return f"{gained / count / 1024:.1f} KiB"


def figures(separate: Run, together: Run, sizes: MemorySizes) -> list[Figure]:
    n = sizes.clusters
    services = [s for s in EVERY_SERVICE if s in separate.readings["at N"]]
    bounded = [s for s in services if s != "exporter"]
    worst = max(separate.rss("at N", s) for s in bounded)
    after = max(separate.rss("after delete", s) for s in bounded)
    one = together.readings["at N"]["allinone"]
    return [
        Figure(
            "g1",
            f"watcher: process start → {n} Clusters listed (restart at N; one process each, "
            "all in one)",
            f"{separate.list_seconds:.1f} s, {together.list_seconds:.1f} s",
        ),
        Figure(
            "g2",
            f"RSS per service, one process each: idle → {n} Clusters → watcher restarted → "
            f"{sizes.deleted} deleted (MiB)",
            "; ".join(_story(separate, s) for s in services),
            "≤ 140 MiB each at N (exporter: per object)",
            _verdict(worst > PER_SERVICE_TARGET or after > PER_SERVICE_TARGET),
        ),
        Figure(
            "g3",
            f"exporter: RSS gained per Cluster, idle → {n} (its view is O(objects))",
            f"{_per_object(separate, 'exporter', n)} one process; all in one "
            f"{_per_object(together, 'allinone', n)} for every service together",
        ),
        Figure(
            "g4",
            f"RSS of the same services in one process: idle → {n} → restarted → "
            f"{sizes.deleted} deleted",
            _story(together, "allinone") + f"; at N {mib(one.rss)}",
        ),
    ]


async def measure(
    clients: Clients, stack: LocalStack, children: Children, sizes: MemorySizes
) -> Section:
    wrapper = helmbin.write_wrapper(children.log_dir / "helm-g", latency=0.0)
    separate = await one_mode(clients, stack, children, wrapper, sizes, together=False)
    # A fresh stack for the second mode: the first's streams and objects would be its history.
    with LocalStack(
        stack.workdir.parent / "stack-g-together", bin_dir=ensure_binaries(), use_env_stack=False
    ) as second:
        other = await Clients.connect(second)
        try:
            await apply_crds(other.kube, field_manager="capibus-bench")
            together = await one_mode(other, second, children, wrapper, sizes, together=True)
        finally:
            await other.aclose()
    return Section(
        "g",
        "memory",
        __doc__.split("\n\n", 1)[1].strip(),
        figures(separate, together, sizes),
        [*_details(separate), *_details(together), f"load average at the end: {load_average()}"],
    )


def _details(run: Run) -> list[str]:
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in run.timings.items())
    readings = {
        moment: {name: [r.rss >> 20, r.peak >> 20] for name, r in found.items()}
        for moment, found in run.readings.items()
    }
    return [
        f"{run.mode}: {timings}; watcher list at restart {run.list_seconds:.1f} s",
        f"{run.mode}: VmRSS, VmHWM (MiB) by moment: {json.dumps(readings)}",
        *(f"{run.mode}: {note}" for note in run.notes),
    ]


def _progress(text: str) -> None:
    print(f"[bench] (g) {text}", file=sys.stderr, flush=True)
