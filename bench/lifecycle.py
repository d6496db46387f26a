"""Figures of the lifecycle benchmarks (c, d) and how they are rendered into ``RESULTS.md``.

The throughput benchmarks (a, b) are ratios of rates; these are latencies, counts and
durations of the whole system, so they get their own table. A ``Figure`` is one line of it:
a value, a target in words, a verdict. A missed target is reported, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bench.common import percentile

Verdict = Literal["pass", "MISSED", "info", "INCOMPLETE"]


@dataclass
class Figure:
    key: str
    title: str
    value: str
    target: str = "—"
    verdict: Verdict = "info"


@dataclass
class Section:
    """One lifecycle benchmark: its figures, how they were measured, and the run's details."""

    key: str
    title: str
    method: str
    figures: list[Figure] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def latency_figure(
    key: str, title: str, samples: list[float], *, expected: int, limit: float
) -> Figure:
    """p50/p99 of ``samples`` (seconds) against "p99 < ``limit``"."""
    p50, p99 = percentile(samples, 50), percentile(samples, 99)
    value = f"p50 {p50 * 1000:.0f} ms / p99 {p99 * 1000:.0f} ms (n={len(samples)})"
    verdict: Verdict = "pass" if p99 < limit else "MISSED"
    if len(samples) < expected:
        verdict = "INCOMPLETE"
    return Figure(key, title, value, f"p99 < {limit:g} s", verdict)


def spread(samples: list[float], unit: str = "ms", scale: float = 1000.0, digits: int = 0) -> str:
    """min / p50 / p99 / max of ``samples`` (times ``scale``), in ``unit``."""
    if not samples:
        return "no samples"
    points = (min(samples), percentile(samples, 50), percentile(samples, 99), max(samples))
    text = " / ".join(f"{p * scale:.{digits}f}" for p in points)
    return f"min / p50 / p99 / max {text} {unit} (n={len(samples)})"


def table(sections: list[Section]) -> list[str]:
    lines = ["| # | measurement | result | target | verdict |", "|---|---|---|---|---|"]
    for section in sections:
        for f in section.figures:
            lines.append(f"| {f.key} | {f.title} | {f.value} | {f.target} | {f.verdict} |")
    return lines


def missed(sections: list[Section]) -> list[Figure]:
    return [f for s in sections for f in s.figures if f.verdict in ("MISSED", "INCOMPLETE")]


def details(section: Section) -> list[str]:
    return [
        f"### {section.key}. {section.title}",
        "",
        section.method,
        "",
        *[f"- {line}" for line in section.details],
        "",
    ]
