"""Results: one ``Comparison`` per measured figure, rendered as the Markdown of ``RESULTS.md``.

A comparison is measured in rounds; each round runs the baseline and then the candidate on
the same workload, back to back, so slow drift of the machine (other tenants, a growing
etcd) hits both sides of a round alike. The reported rates are the medians over the rounds
and the reported ratio is the median of the per-round ratios (candidate/baseline of the same
round). A comparison passes when every round completed (everything expected was observed
before the deadline) and that ratio is at least the target. A missed target is reported,
never raised: this is a benchmark, not a test.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


@dataclass
class Side:
    """One measurement: ``done`` of ``expected`` items in ``elapsed`` seconds."""

    done: int
    expected: int
    elapsed: float
    details: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.done >= self.expected

    def summary(self) -> str:
        text = f"{self.done}/{self.expected} in {self.elapsed:.2f} s = {self.rate:,.0f}/s"
        return text if self.complete else f"{text} (INCOMPLETE)"


@dataclass
class Comparison:
    key: str
    title: str
    unit: str
    method: str
    baseline_label: str
    candidate_label: str
    rounds: list[tuple[Side, Side]] = field(default_factory=list)
    #: None: informational, the ratio is shown but not judged
    target: float | None = 0.8

    @property
    def ratios(self) -> list[float]:
        return [c.rate / b.rate if b.rate else 0.0 for b, c in self.rounds]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.rounds else 0.0

    @property
    def baseline_rate(self) -> float:
        return statistics.median(b.rate for b, _ in self.rounds) if self.rounds else 0.0

    @property
    def candidate_rate(self) -> float:
        return statistics.median(c.rate for _, c in self.rounds) if self.rounds else 0.0

    @property
    def verdict(self) -> str:
        if not self.rounds or not all(b.complete and c.complete for b, c in self.rounds):
            return "INCOMPLETE"
        if self.target is None:
            return "info"
        return "pass" if self.ratio >= self.target else "MISSED"


def machine_facts(mode: str) -> list[tuple[str, str]]:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("mode", mode),
        ("nproc", str(len(os.sched_getaffinity(0)))),
        ("cpu", _cpu_model()),
        ("python", sys.version.split()[0]),
        ("kernel", platform.release()),
        ("load average at the end (1/5/15 min)", load),
    ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summary_table(comparisons: list[Comparison]) -> list[str]:
    lines = [
        "| # | measurement | baseline | candidate | ratio (rounds) | target | result |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for c in comparisons:
        spread = ", ".join(f"{r:.2f}" for r in c.ratios)
        target = "—" if c.target is None else f"≥ {c.target:.2f}"
        lines.append(
            f"| {c.key} | {c.title} | {c.baseline_rate:,.0f} {c.unit} | "
            f"{c.candidate_rate:,.0f} {c.unit} | **{c.ratio:.2f}** ({spread}) | "
            f"{target} | {c.verdict} |"
        )
    return lines


def _side_lines(label: str, sides: list[Side]) -> list[str]:
    lines = [f"- **{label}**"]
    for number, side in enumerate(sides, 1):
        lines.append(f"  - round {number}: {side.summary()}")
        lines += [f"    - {d}" for d in side.details]
    return lines


def detail_section(c: Comparison) -> list[str]:
    return [
        f"### {c.key}. {c.title}",
        "",
        c.method,
        "",
        *_side_lines(c.baseline_label, [b for b, _ in c.rounds]),
        *_side_lines(c.candidate_label, [s for _, s in c.rounds]),
        "",
    ]


def missed(comparisons: list[Comparison]) -> list[Comparison]:
    return [c for c in comparisons if c.verdict not in ("pass", "info")]


def render(
    comparisons: list[Comparison], facts: list[tuple[str, str]], notes: str, errors: list[str]
) -> str:
    lines = ["# capibus benchmark results", ""]
    lines += [f"- {k}: {v}" for k, v in facts]
    lines += ["", *summary_table(comparisons), ""]
    failed = missed(comparisons)
    if failed:
        lines += ["**Missed: " + ", ".join(f"{c.key} ({c.verdict})" for c in failed) + "**", ""]
    if errors:
        lines += ["**Phases that failed (their figures are missing):**", ""]
        lines += [f"    {line}" for error in errors for line in error.splitlines()[:20]]
        lines += [""]
    if not failed and not errors:
        lines += ["All targets met.", ""]
    lines += [notes.strip(), ""]
    lines += ["## How each number was measured, round by round", ""]
    for c in comparisons:
        lines += detail_section(c)
    return "\n".join(lines)
