"""``uv run python -m bench [--quick] [--only a,...,o]``: measure, print, write ``RESULTS.md``.

Sequence: build or reuse the stack binaries, start a fresh local stack in a temporary
directory (never an external one named by ``KUBECONFIG``/``NATS_URL``/``REDIS_URL``, so the
figures always come from the same setup), apply the CRDs, then measure (a) the watcher and
(b) the writer in rounds of baseline-then-candidate. The lifecycle benchmarks, (c)
prerequisite latency, (d) many Clusters at once, (s) the first step (``bench.firststep``:
created → Helm install started, Clusters with Leases deleted), (e) status from CAPI (writes
until Ready, the idle cost once Ready, node Ready lag), (m) metal-stack and (o) OpenShift Assisted
(``bench.metalstack``, ``bench.assisted``: bare-metal providers against their stand-ins) and
(l) CB-Ladybug (``bench.ladybug``: its REST API and provisioner against the Tumblebug stand-in
with real sshd nodes), (f) the footprint (``bench.footprint``: resident memory of the
services, one process each and all in one), (w) scaling out (``bench.scaling``: the helm
service at 1, 2 and 4 replicas, one added and one killed, each count on a fresh stack) and (g)
memory (``bench.memory``: every service's memory with thousands of Clusters, and after most
are deleted), run
the whole system (``bench.deployment``) and
each gets a stack of its own: the durable consumers of services started on a used stack
would replay every earlier event, and earlier phases' Clusters would be theirs to reconcile.
A phase that fails is recorded in the results and the other phases still run. The exit
status is 0 even when a target is missed; missed targets are printed. ``RESULTS.md`` is only
written when every phase ran (no ``--only``). On any exit, including exceptions, Ctrl-C and
SIGTERM, the services are stopped first (process groups), then the stack, and the temporary
directory is removed (``--keep`` keeps it, with every program's log).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import (
    assisted,
    firststep,
    fleet,
    footprint,
    ladybug,
    lifecycle,
    memory,
    metalstack,
    prerequisites,
    report,
    scaling,
    status,
    watcher,
    writer,
)
from bench.assisted import AssistedSizes
from bench.common import CONCURRENCY, Clients
from bench.fleet import FleetSizes
from bench.ladybug import LadybugSizes
from bench.lifecycle import Section
from bench.memory import MemorySizes
from bench.metalstack import MetalSizes
from bench.prerequisites import PrerequisiteSizes
from bench.procs import Children
from bench.report import Comparison
from bench.scaling import ScalingSizes
from bench.status import StatusSizes
from bench.watcher import WatcherSizes
from bench.writer import WriterSizes
from testenv.crds import OURS, apply_crds
from testenv.harness import LocalStack, ensure_binaries

PHASES = ("a", "b", "c", "d", "s", "e", "m", "o", "l", "f", "w", "g")
#: A lifecycle phase, given the benchmark's clients and its own stack.
Measure = Callable[[Clients, LocalStack], Coroutine[Any, Any, Section]]


@dataclass(frozen=True)
class Plan:
    mode: str
    watcher: WatcherSizes
    writer: WriterSizes
    prerequisites: PrerequisiteSizes
    fleet: FleetSizes
    status: StatusSizes
    metal: MetalSizes
    assisted: AssistedSizes
    ladybug: LadybugSizes
    scaling: ScalingSizes
    memory: MemorySizes


FULL = Plan(
    "full",
    WatcherSizes(clusters=50, changes=2000, rounds=3),
    WriterSizes(distinct=500, hot_per_partition=3, hot_updates=2000, rounds=3),
    PrerequisiteSizes(clusters=100, in_flight=1),
    FleetSizes(clusters=100),
    StatusSizes(clusters=100, window=330.0, together=True),
    MetalSizes(clusters=5, workers=9, window=60.0),
    AssistedSizes(clusters=10, control_planes=3, workers=2, window=60.0),
    LadybugSizes(clusters=10, workers=2),
    # 4 s per install: long enough that the burst of creates every run starts with (5 s of
    # a 19 s four-replica run at 2 s) no longer decides the ratio (bench/ANALYSIS.md, "w").
    ScalingSizes(clusters=100, latency=4.0),
    MemorySizes(clusters=2000, deleted=1500),
)
QUICK = Plan(
    "quick",
    WatcherSizes(clusters=50, changes=300, rounds=1),
    WriterSizes(distinct=200, hot_per_partition=3, hot_updates=300, rounds=1),
    PrerequisiteSizes(clusters=20, in_flight=1),
    FleetSizes(clusters=10),
    StatusSizes(clusters=10, window=30.0),
    MetalSizes(clusters=5, workers=9, window=10.0),
    AssistedSizes(clusters=10, control_planes=3, workers=2, window=10.0),
    LadybugSizes(clusters=3, workers=2),
    ScalingSizes(clusters=20, latency=1.0, rounds=1),
    MemorySizes(clusters=300, deleted=225),
)

NOTES = f"""
## Reading these numbers

- Every comparison runs in rounds; a round measures the baseline and then the candidate on
  the same workload, on the same stack, in the same process run, with the same driver
  ({CONCURRENCY} concurrent requests from the benchmark process). Rates in the table are
  medians over the rounds; the ratio is the median of the per-round ratios (the rounds' own
  ratios in brackets); workload sizes in the titles are per round. The ratio says how much
  of what a bare Python client achieves on this machine survives the trip through capibus,
  not how fast the machine is.
- On a small machine every program competes for the same cores: the candidate's service
  process takes CPU away from the API server and etcd, which is part of its real cost. The
  CPU lines show cores busy on average during each measurement per program (1.00 = one core
  saturated); a single-threaded Python service near 1.00 is CPU-bound. "other processes" is
  CPU used by programs that are not part of the benchmark (other tenants of the machine):
  when it is high, that round is noisy, and "CPU per write/change" is the steadier figure.
- Latencies are under a burst (everything issued at once), so they are mostly queueing time
  and scale with the burst size; compare them between sides, not with a single request.
- The writer runs with `CAPIBUS_KUBE_QPS=1000` / `CAPIBUS_KUBE_BURST=1000` and otherwise
  default settings; the baseline client has no rate limit at all.
- Why a target is missed, and what would fix it: `bench/ANALYSIS.md` (hand-written, dated).
"""


LIFECYCLE_NOTES = """
## Reading the lifecycle figures (c, d, s, e)

- They are not ratios: (c) is latency against an absolute target, (d) absolute times and
  counts, with a bare sequential `helm install` of the same releases as a reference for this
  machine's speed, (e) counts, request rates and a latency. Each runs the services as
  processes on a stack of its own (c and d the six of a Cluster's lifecycle, e also those
  with background work of their own: discovery, catalog, exporter), with the settings a
  deployment gives them and otherwise their defaults.
- Every moment is a watch event reaching the benchmark process, on its monotonic clock.
  What each latency includes, and what looked slow: `bench/ANALYSIS.md`.
- The machine is shared: the load averages and CPU lines in the details say how busy it was.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (~5 minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the stack's logs and data")
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases to run ({','.join(PHASES)}); RESULTS.md only for all",
    )
    args = parser.parse_args(argv)
    phases = tuple(p for p in PHASES if p in args.only.split(","))
    # SIGTERM tears down exactly like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    plan = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="capibus-bench-"))
    started = time.monotonic()
    try:
        outcome = run(plan, workdir, phases)
    except KeyboardInterrupt:
        print("interrupted; services and stack stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"logs and data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    publish(plan, outcome, time.monotonic() - started, write=phases == PHASES)
    return 0


@dataclass
class Outcome:
    comparisons: list[Comparison] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run(plan: Plan, workdir: Path, phases: tuple[str, ...] = PHASES) -> Outcome:
    bin_dir = ensure_binaries()
    children = Children(log_dir=workdir)
    outcome = Outcome()
    if "a" in phases or "b" in phases:
        with LocalStack(workdir / "stack", bin_dir=bin_dir, use_env_stack=False) as stack:
            try:
                asyncio.run(measure_all(plan, stack, children, outcome, phases))
            finally:
                children.stop_all()
    helm = bin_dir / "helm"
    lifecycle_phases: dict[str, tuple[str, Measure]] = {
        "c": (
            "(c) prerequisite latency",
            lambda c, s: prerequisites.measure(c, s, children, helm, plan.prerequisites),
        ),
        "d": (
            "(d) many Clusters at once",
            lambda c, s: fleet.measure(c, s, children, helm, plan.fleet),
        ),
        "s": (
            "(s) first step",
            lambda c, s: firststep.measure(c, s, children, helm),
        ),
        "e": (
            "(e) status from CAPI",
            lambda c, s: status.measure(c, s, children, helm, plan.status),
        ),
        "m": (
            "(m) metal-stack",
            lambda c, s: metalstack.measure(c, s, children, plan.metal),
        ),
        "o": (
            "(o) OpenShift Assisted",
            lambda c, s: assisted.measure(c, s, children, plan.assisted),
        ),
        "l": (
            "(l) CB-Ladybug",
            lambda c, s: ladybug.measure(c, s, children, plan.ladybug),
        ),
        "f": (
            "(f) footprint",
            lambda c, s: footprint.measure(c, s, children, helm),
        ),
        "w": (
            "(w) scaling out",
            lambda c, s: scaling.measure(c, s, children, plan.scaling),
        ),
        "g": (
            "(g) memory",
            lambda c, s: memory.measure(c, s, children, plan.memory),
        ),
    }
    for key, (name, measure) in lifecycle_phases.items():
        if key not in phases:
            continue
        # (e), (m), (o) and (w) say which client asked for what: their API server keeps an
        # audit log.
        extra = status.audit_args(workdir) if key in ("e", "m", "o", "w") else []
        with LocalStack(
            workdir / f"stack-{key}", bin_dir=bin_dir, use_env_stack=False, apiserver_args=extra
        ) as stack:
            try:
                asyncio.run(measure_lifecycle(name, measure, stack, outcome))
            finally:
                children.stop_all()
    return outcome


async def measure_all(
    plan: Plan, stack: LocalStack, children: Children, outcome: Outcome, phases: tuple[str, ...]
) -> None:
    clients = await Clients.connect(stack)
    try:
        await apply_crds(clients.kube, [OURS], field_manager="capibus-bench")
        _progress("CRDs established")
        if "a" in phases:
            await _phase(
                outcome, "(a) watcher", watcher.compare(clients, stack, children, plan.watcher)
            )
        children.stop_all()
        if "b" in phases:
            await _phase(
                outcome, "(b) writer", writer.compare(clients, stack, children, plan.writer)
            )
    finally:
        children.stop_all()
        await clients.aclose()


async def measure_lifecycle(
    name: str, measure: Measure, stack: LocalStack, outcome: Outcome
) -> None:
    """One lifecycle phase on its own stack, with our CRDs and the peers' applied."""
    _progress(f"measuring {name}")
    clients = await Clients.connect(stack)
    try:
        await apply_crds(clients.kube, field_manager="capibus-bench")
        outcome.sections.append(await measure(clients, stack))
    except Exception as exc:
        traceback.print_exc()
        outcome.errors.append(f"{name} failed: {type(exc).__name__}: {exc}")
    finally:
        await clients.aclose()


async def _phase(
    outcome: Outcome, name: str, measurement: Coroutine[Any, Any, list[Comparison]]
) -> None:
    """Run one phase; a failure is recorded and the next phase still runs."""
    _progress(f"measuring {name}")
    try:
        outcome.comparisons += await measurement
    except Exception as exc:
        traceback.print_exc()
        outcome.errors.append(f"{name} failed: {type(exc).__name__}: {exc}")


def _progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def render(outcome: Outcome, facts: list[tuple[str, str]]) -> str:
    """``report.render``'s layout with the lifecycle table and sections added."""
    lines = ["# capibus benchmark results", ""]
    lines += [f"- {k}: {v}" for k, v in facts]
    lines += ["", *report.summary_table(outcome.comparisons), ""]
    if outcome.sections:
        lines += [*lifecycle.table(outcome.sections), ""]
    failed = [c.key for c in report.missed(outcome.comparisons)]
    failed += [f.key for f in lifecycle.missed(outcome.sections)]
    if failed:
        lines += ["**Missed: " + ", ".join(failed) + "**", ""]
    if outcome.errors:
        lines += ["**Phases that failed (their figures are missing):**", ""]
        lines += [f"    {line}" for error in outcome.errors for line in error.splitlines()[:20]]
        lines += [""]
    if not failed and not outcome.errors:
        lines += ["All targets met.", ""]
    lines += [NOTES.strip(), "", LIFECYCLE_NOTES.strip(), ""]
    lines += ["## How each number was measured, round by round", ""]
    for c in outcome.comparisons:
        lines += report.detail_section(c)
    for section in outcome.sections:
        lines += lifecycle.details(section)
    return "\n".join(lines)


def publish(plan: Plan, outcome: Outcome, took: float, *, write: bool = True) -> None:
    facts = [*report.machine_facts(plan.mode), ("run took", f"{took:.0f} s")]
    text = render(outcome, facts)
    if write:
        report.RESULTS.write_text(text)
    print(text)
    for c in report.missed(outcome.comparisons):
        print(f"[bench] MISSED {c.key}: {c.title}: ratio {c.ratio:.2f} ({c.verdict})")
    for f in lifecycle.missed(outcome.sections):
        print(f"[bench] MISSED {f.key}: {f.title}: {f.value} ({f.verdict})")
    for error in outcome.errors:
        print(f"[bench] FAILED {error.splitlines()[0]}")
    missed = report.missed(outcome.comparisons) or lifecycle.missed(outcome.sections)
    if not missed and not outcome.errors:
        print("[bench] all targets met")
    where = report.RESULTS if write else "nowhere (--only: a partial run)"
    print(f"[bench] written to {where}")


if __name__ == "__main__":
    sys.exit(main())
