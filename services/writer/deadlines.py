"""Timers that make a stuck Cluster show Unhealthy at its deadline, within seconds.

Upstream re-saved every non-stable Cluster's status once a minute so its timeout could fire.
Here, whenever the writer learns a Cluster's status (its own write, a write it skipped, the
list it seeds its cache from when it claims a partition, the list at start), it arms a timer
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
replicas costs no extra round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared import phase, subjects
from shared.messages import Message, ObjectRef, PatchStatus, stable_id
from shared.resources import CLUSTER, ref_to

log = logging.getLogger(__name__)

Json = dict[str, Any]
Publish = Callable[[str, Message], Awaitable[Any]]

GRACE_SECONDS = 1.0


class DeadlineTimers:
    def __init__(
        self,
        *,
        publish: Publish,
        timeout_seconds: float,
        partitions: int,
        source: str,
        grace_seconds: float = GRACE_SECONDS,
    ) -> None:
        self.publish = publish
        self.timeout_seconds = timeout_seconds
        self.partitions = partitions
        self.source = source
        self.grace_seconds = grace_seconds
        self._timers: dict[str, _Timer] = {}
        self._firing: set[asyncio.Task[None]] = set()

    def arm(self, ref: ObjectRef, status: Json, *, after: str | None = None) -> None:
        """Nudge ``ref`` when ``status`` times out; ``after``: the id of a nudge consumed early.

        A timer already armed for the same deadline is kept, unless a nudge was consumed.
        """
        at = phase.deadline(status, self.timeout_seconds)
        current = self._timers.get(ref.key)
        if current is not None and current.at == at and after is None:
            return
        self._cancel(ref.key)
        if at is None:
            return
        now = datetime.now(UTC)
        message = nudge(ref, status, at=at, now=now, after=after, source=self.source)
        delay = max(0.0, (at - now).total_seconds()) + self.grace_seconds
        handle = asyncio.get_running_loop().call_later(delay, self._fire, ref, message)
        self._timers[ref.key] = _Timer(at, message.id, handle)

    def pending(self) -> dict[str, tuple[datetime, str]]:
        """The armed deadlines by Cluster key, with the id of the nudge each will send."""
        return {key: (timer.at, timer.nudge_id) for key, timer in self._timers.items()}

    def _cancel(self, key: str) -> None:
        current = self._timers.pop(key, None)
        if current is not None:
            current.handle.cancel()

    def _fire(self, ref: ObjectRef, nudge: PatchStatus) -> None:
        self._timers.pop(ref.key, None)
        subject = subjects.cluster_status(
            subjects.partition_of(ref.key, self.partitions), ref.namespace or "", ref.name
        )
        task = asyncio.create_task(self._publish(subject, nudge))
        self._firing.add(task)
        task.add_done_callback(self._firing.discard)

    async def _publish(self, subject: str, nudge: PatchStatus) -> None:
        try:
            await self.publish(subject, nudge)
        except Exception:
            log.exception("could not publish the timeout of %s", nudge.ref.key)

    def arm_existing(self, clusters: list[Json]) -> None:
        for cluster in clusters:
            self.arm(ref_to(CLUSTER, cluster), cluster.get("status") or {})

    def cancel_all(self) -> None:
        for timer in self._timers.values():
            timer.handle.cancel()
        self._timers.clear()


def nudge(
    ref: ObjectRef, status: Json, *, at: datetime, now: datetime, after: str | None, source: str
) -> PatchStatus:
    """The empty patch that makes the writer derive ``ref``'s phase again at ``at``."""
    if after:
        which = f"after:{after}"
    elif now >= at:
        which = f"late:{phase.format_time(now)}"
    else:
        which = "first"
    return PatchStatus(
        id=stable_id(str(ref.uid), "timeout", str(status.get("lastUpdated")), which),
        source=source,
        correlation_id=f"cluster:{ref.key}",
        causation_id=after,
        ref=ref,
    )


@dataclass(frozen=True)
class _Timer:
    at: datetime
    nudge_id: str
    handle: asyncio.TimerHandle
