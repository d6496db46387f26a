"""What the helm service's log says about the helm commands it ran.

``shared.helm`` logs every command once it ended: ``helm <label>: <outcome> in <seconds>s``,
with the service's timestamp (wall clock, milliseconds) in front. That is enough to count
commands per verb and to place each one in time: it started ``seconds`` before the line.
The benchmarks use it to split a latency into capibus's part and helm's own.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

LINE = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ INFO "
    r"helm (?P<label>.+?): (?P<outcome>.+?) (?:in|after) (?P<secs>[\d.]+)s$"
)
VERBS = (
    "upgrade --install", "show chart", "get metadata", "get values", "uninstall", "history",
    "rollback", "template",
)  # fmt: skip


@dataclass(frozen=True)
class HelmRun:
    verb: str
    release: str | None
    outcome: str
    ended: float  # wall clock, seconds since the epoch
    seconds: float

    @property
    def started(self) -> float:
        return self.ended - self.seconds


def runs(log: str) -> list[HelmRun]:
    found: list[HelmRun] = []
    for line in log.splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        label = match["label"]
        verb = next((v for v in VERBS if label.startswith(v)), label)
        rest = label.removeprefix(verb).split()
        release = rest[0] if rest and verb != "show chart" else None
        # The services' log stamps are local time, like ``datetime.timestamp`` assumes.
        ended = datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found.append(HelmRun(verb, release, match["outcome"], ended, float(match["secs"])))
    return found


def counts(found: list[HelmRun]) -> Counter[str]:
    """Commands per verb, failures (a missing release is ``exit 1``) apart."""
    return Counter(r.verb + ("" if r.outcome == "ok" else f" ({r.outcome})") for r in found)


def durations(found: list[HelmRun]) -> dict[str, list[float]]:
    by_verb: dict[str, list[float]] = {}
    for r in found:
        by_verb.setdefault(r.verb, []).append(r.seconds)
    return by_verb
