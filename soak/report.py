"""The soak's report: the verdict per invariant, the faults and how long recovery took.

Written to ``soak/RESULTS.md`` after every run (it is the latest run's) and printed. A
recovery is timed from the end of a fault (the failed thing back) to the first moment the
system is quiet (no durable consumer has a message waiting or unacknowledged) and every
Cluster is at its expected state, confirmed by a second look a second later; a fault after
which that did not happen within the episode's timeout counts as not recovered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.common import percentile
from soak.checks import Verdict
from soak.plan import KINDS, Fault, Plan, Step

PROBLEMS_SHOWN = 25


@dataclass
class EpisodeResult:
    index: int
    fault: Fault
    steps: tuple[Step, ...]
    #: wall-clock time (UTC, HH:MM:SS) the fault began
    at: str
    note: str
    #: seconds from the fault's end to quiet and expected; None: not within the timeout
    recovery: float | None
    #: what still stood in the way at the timeout
    problems: list[str] = field(default_factory=list)


@dataclass
class RunSummary:
    plan: Plan
    started: str
    minutes: float
    load: str
    episodes: list[EpisodeResult]
    verdicts: list[Verdict]
    final_convergence: float | None
    quarantined: list[str]
    workdir: str

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def recovered_verdict(episodes: Sequence[EpisodeResult]) -> Verdict:
    problems = tuple(
        f"fault {e.index} ({e.fault.kind} {e.fault.target}): not quiet and converged; "
        + "; ".join(e.problems[:5])
        for e in episodes
        if e.recovery is None
    )
    return Verdict(
        "recovered",
        "after every fault the system became quiet and every Cluster reached its expected state",
        problems,
        f"{sum(1 for e in episodes if e.recovery is not None)} of {len(episodes)} faults",
    )


def command(plan: Plan) -> str:
    sizes = plan.sizes
    args = f"--seed {plan.seed} --clusters {sizes.clusters} --minutes {sizes.minutes:g}"
    args += "".join(f" --set {setting}" for setting in sizes.settings)
    args += " --tls" if sizes.tls else ""
    return f"python -m soak {args}" + (" --quick" if sizes.quick else "")


def render(run: RunSummary) -> str:
    plan = run.plan
    verdict = "PASS" if run.ok else "FAIL"
    lines = [
        "# The fault soak: latest run",
        "",
        f"**{verdict}**, seed {plan.seed}: `{command(plan)}` (`make soak "
        f'SOAK_ARGS="..."`) repeats it.',
        "",
        f"Started {run.started} UTC, {run.minutes:.1f} minutes; {plan.sizes.clusters} Clusters "
        f"through {len(plan.steps())} steps; {len(run.episodes)} faults, one at a time; NATS "
        f"and Redis over {'TLS' if plan.sizes.tls else 'plaintext'}; load "
        f"average at the end {run.load}. How to read this: `docs/operations.md`, "
        '"The fault soak".',
        "",
        *_verdicts(run.verdicts),
        *_faults(run.episodes),
        *_timeline(run.episodes),
        *_final(run),
    ]
    return "\n".join(lines) + "\n"


def _verdicts(verdicts: Sequence[Verdict]) -> list[str]:
    lines = ["## Invariants", "", "| invariant | verdict | figures |", "| --- | --- | --- |"]
    for v in verdicts:
        state = "pass" if v.ok else f"**FAIL** ({len(v.problems)})"
        lines.append(f"| {v.what} (`{v.name}`) | {state} | {v.summary} |")
    for v in verdicts:
        if v.problems:
            lines += ["", f"`{v.name}`:", ""]
            lines += [f"- {p}" for p in v.problems[:PROBLEMS_SHOWN]]
            if len(v.problems) > PROBLEMS_SHOWN:
                lines.append(f"- ... and {len(v.problems) - PROBLEMS_SHOWN} more")
    return [*lines, ""]


def _faults(episodes: Sequence[EpisodeResult]) -> list[str]:
    by_kind: dict[str, list[EpisodeResult]] = defaultdict(list)
    for e in episodes:
        by_kind[e.fault.kind].append(e)
    lines = [
        "## Faults and recovery",
        "",
        "Seconds from the end of a fault to quiet and every Cluster at its expected state.",
        "",
        "| fault | count | recovered | p50 s | p99 s | max s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in [*KINDS, "all"]:
        group = episodes if kind == "all" else by_kind.get(kind, [])
        if not group:
            continue
        times = [e.recovery for e in group if e.recovery is not None]
        lines.append(
            f"| {kind} | {len(group)} | {len(times)} | {_s(percentile(times, 50))} | "
            f"{_s(percentile(times, 99))} | {_s(max(times, default=float('nan')))} |"
        )
    return [*lines, ""]


def _s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"  # NaN: no recovered fault


def _timeline(episodes: Sequence[EpisodeResult]) -> list[str]:
    lines = [
        "## Every fault",
        "",
        "| # | at (UTC) | fault | steps in flight | what happened | recovery s |",
        "| ---: | --- | --- | --- | --- | ---: |",
    ]
    for e in episodes:
        steps = ", ".join(f"{s.action} {s.cluster}" for s in e.steps) or "-"
        recovery = "not recovered" if e.recovery is None else f"{e.recovery:.1f}"
        lines.append(f"| {e.index} | {e.at} | {e.fault.kind} | {steps} | {e.note} | {recovery} |")
    return [*lines, ""]


def _final(run: RunSummary) -> list[str]:
    final = "not reached" if run.final_convergence is None else f"{run.final_convergence:.1f} s"
    lines = ["## After the last fault", "", f"Converged and quiet after the last steps: {final}."]
    if run.quarantined:
        lines += [
            "",
            "Left out of the convergence waits after they timed out once (the invariants "
            "still judge them): " + ", ".join(sorted(run.quarantined)) + ".",
        ]
    return [*lines, ""]
