"""``uv run python -m bench [--quick]``: measure, print and write ``bench/RESULTS.md``.

Sequence: build or reuse the stack binaries, start a fresh local stack in a temporary
directory (never an external one named by ``KUBECONFIG``/``NATS_URL``/``REDIS_URL``, so the
figures always come from the same setup), apply the CRDs, then measure (a) the watcher and
(b) the writer in rounds of baseline-then-candidate, and write the figures. A phase that
fails is recorded in the results and the other phase still runs. The exit status is 0 even
when a target is missed; missed targets are printed. On any exit, including exceptions,
Ctrl-C and SIGTERM, the services are stopped first (process groups), then the stack, and the
temporary directory is removed (``--keep`` keeps it, with every program's log).
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
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import report, watcher, writer
from bench.common import CONCURRENCY, Clients
from bench.procs import Children
from bench.report import Comparison
from bench.watcher import WatcherSizes
from bench.writer import WriterSizes
from testenv.crds import OURS, apply_crds
from testenv.harness import LocalStack, ensure_binaries


@dataclass(frozen=True)
class Plan:
    mode: str
    watcher: WatcherSizes
    writer: WriterSizes


FULL = Plan(
    "full",
    WatcherSizes(clusters=50, changes=2000, rounds=3),
    WriterSizes(distinct=500, hot_per_partition=3, hot_updates=2000, rounds=3),
)
QUICK = Plan(
    "quick",
    WatcherSizes(clusters=50, changes=300, rounds=1),
    WriterSizes(distinct=200, hot_per_partition=3, hot_updates=300, rounds=1),
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (~1 minute)")
    parser.add_argument("--keep", action="store_true", help="keep the stack's logs and data")
    args = parser.parse_args(argv)
    # SIGTERM tears down exactly like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    plan = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="capibus-bench-"))
    started = time.monotonic()
    try:
        outcome = run(plan, workdir)
    except KeyboardInterrupt:
        print("interrupted; services and stack stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"logs and data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    publish(plan, outcome, time.monotonic() - started)
    return 0


@dataclass
class Outcome:
    comparisons: list[Comparison] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run(plan: Plan, workdir: Path) -> Outcome:
    bin_dir = ensure_binaries()
    children = Children(log_dir=workdir)
    with LocalStack(workdir / "stack", bin_dir=bin_dir, use_env_stack=False) as stack:
        try:
            return asyncio.run(measure_all(plan, stack, children))
        finally:
            children.stop_all()


async def measure_all(plan: Plan, stack: LocalStack, children: Children) -> Outcome:
    outcome = Outcome()
    clients = await Clients.connect(stack)
    try:
        await apply_crds(clients.kube, [OURS], field_manager="capibus-bench")
        _progress("CRDs established")
        await _phase(
            outcome, "(a) watcher", watcher.compare(clients, stack, children, plan.watcher)
        )
        children.stop_all()
        await _phase(outcome, "(b) writer", writer.compare(clients, stack, children, plan.writer))
        return outcome
    finally:
        children.stop_all()
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


def publish(plan: Plan, outcome: Outcome, took: float) -> None:
    facts = [*report.machine_facts(plan.mode), ("run took", f"{took:.0f} s")]
    text = report.render(outcome.comparisons, facts, NOTES, outcome.errors)
    report.RESULTS.write_text(text)
    print(text)
    failed = report.missed(outcome.comparisons)
    for c in failed:
        print(f"[bench] MISSED {c.key}: {c.title}: ratio {c.ratio:.2f} ({c.verdict})")
    for error in outcome.errors:
        print(f"[bench] FAILED {error.splitlines()[0]}")
    if not failed and not outcome.errors:
        print("[bench] all targets met")
    print(f"[bench] written to {report.RESULTS}")


if __name__ == "__main__":
    sys.exit(main())
