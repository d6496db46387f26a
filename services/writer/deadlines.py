"""Timers that make a stuck Cluster show Unhealthy at its deadline, within seconds.

Upstream re-saved every non-stable Cluster's status once a minute so its timeout could fire.
Here, whenever the writer learns a Cluster's status (its own write, a write it skipped, the
list it seeds its cache from when it claims a partition), it arms a timer
if that status would turn Unhealthy at ``lastUpdated + cluster_timeout_seconds``. The timer
publishes an empty status patch (a *nudge*) for that Cluster, and the ordinary write path
derives the new phase. Nothing is rewritten while nothing changes.

A timer lives in one process, so several replicas may arm the same deadline. The nudge's
message id is derived from the Cluster's uid, its ``lastUpdated`` and which nudge it is, so
JetStream stores one per deadline however many replicas arm it. Which nudge:

- the first, armed before the deadline: every replica computes the same id;
- one armed after a nudge was consumed without reaching the deadline (``after``): the owner
  of the partition derives with its own clock, and another replica's clock may run ahead.
  Without a new id that second nudge would be a duplicate of the first and never delivered;
- one armed past the deadline (a partition claimed late, a restart): named by the second it
  was armed in, so a first nudge that was consumed early does not swallow it.

Each timer fires ``GRACE_SECONDS`` after the deadline, so a small clock difference between
replicas costs no extra round. The timers themselves are ``shared.timers.Timers`` (dropped
with their partition, re-armed by the next owner's claim) and the nudge is addressed by the
``StatusReporter`` like any status patch; the deadline comes from the kind's rule
(``rules.Rule.deadline``), so any kind with a time-dependent status gets the same treatment.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from services.writer.rules import Rule
from shared import phase
from shared.messages import ObjectRef, stable_id
from shared.status import StatusReporter
from shared.timers import Timers

Json = dict[str, Any]

GRACE_SECONDS = 1.0


class DeadlineTimers:
    """One timer per object whose derived status would change by time alone."""

    def __init__(
        self, *, timers: Timers, reporter: StatusReporter, grace_seconds: float = GRACE_SECONDS
    ) -> None:
        self.timers = timers
        self.reporter = reporter
        self.grace_seconds = grace_seconds
        #: the deadline each armed timer stands for, by key
        self._deadlines: dict[str, datetime] = {}

    def arm(self, ref: ObjectRef, status: Json, rule: Rule, *, after: str | None = None) -> None:
        """Nudge ``ref`` when ``status`` times out by ``rule``; ``after``: the id of a nudge
        consumed early. A timer already armed for the same deadline is kept, unless a nudge
        was consumed."""
        key = f"{ref.kind}/{ref.key}"
        at = rule.deadline(status)
        armed = key in self.timers.pending() and self._deadlines.get(key) == at
        if armed and after is None:
            return
        self._deadlines.pop(key, None)
        if at is None:
            self.timers.cancel(key)
            return
        now = datetime.now(UTC)
        message_id = nudge_id(ref, status, at=at, now=now, after=after)
        subject, message = self.reporter.status(ref, message_id=message_id)
        message = message.model_copy(update={"causation_id": after})
        when = max(at, now) + timedelta(seconds=self.grace_seconds)
        self.timers.at(key, when, subject, message, partition=self.reporter.partition(ref))
        self._deadlines[key] = at

    def forget(self, ref: ObjectRef) -> None:
        """``ref`` is gone: no timer, no deadline kept for it."""
        key = f"{ref.kind}/{ref.key}"
        self.timers.cancel(key)
        self._deadlines.pop(key, None)

    def drop(self, partitions: Collection[int]) -> None:
        """Forget the timers of ``partitions`` (lost), and every deadline whose timer is gone.

        A deadline outlives its timer when the timer fired and nothing armed the key again (a
        Cluster deleted meanwhile, or its nudge handled by the partition's next owner); kept,
        those would grow with every Cluster this replica ever armed.
        """
        self.timers.drop(partitions)
        armed = self.timers.pending()
        self._deadlines = {k: at for k, at in self._deadlines.items() if k in armed}

    def __len__(self) -> int:
        return len(self._deadlines)

    def pending(self) -> dict[str, tuple[datetime, str]]:
        """The armed deadlines by key, with the id of the nudge each will send."""
        armed = self.timers.pending()
        return {k: (at, armed[k].message.id) for k, at in self._deadlines.items() if k in armed}


def nudge_id(
    ref: ObjectRef, status: Json, *, at: datetime, now: datetime, after: str | None
) -> str:
    """The id of the empty patch that makes the writer derive ``ref``'s status again at ``at``."""
    if after:
        which = f"after:{after}"
    elif now >= at:
        which = f"late:{phase.format_time(now)}"
    else:
        which = "first"
    return stable_id(str(ref.uid), "timeout", str(status.get("lastUpdated")), which)
