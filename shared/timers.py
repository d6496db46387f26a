"""Messages published at a moment: the one timer every service uses.

A wait for a moment (a Cluster's timeout, a deletion deadline, an AppTemplate's next sync) is
a message published when the moment comes, handled like any other message in the object's
partition. Nothing polls, and nothing sleeps in a handler. ``Timers`` is the one place that:

* keeps **one timer per key** (arming a key again replaces its timer, or keeps it when the
  moment and message are the same);
* **publishes with retries**: a publish that fails for a temporary reason (NATS briefly away)
  is tried again with capped backoff until it succeeds or the timer is cancelled, since the
  timer is the only thing that remembers it;
* follows **partition ownership**: a timer names the partition it belongs to, and ``drop``
  forgets the timers of partitions this replica no longer holds (their next owner re-arms them
  when it claims the partition, from the state it lists).

Timers live in one process, so several replicas may arm the same moment (around a handover).
The caller gives the message an id derived from what the moment means (the object's uid, the
deadline), so JetStream stores it once however many replicas publish it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.errors import PermanentError
from shared.messages import Message
from shared.ports import Publisher
from shared.retry import retry_until_done

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Armed:
    """One armed timer: when, what, where to, and in which partition."""

    at: datetime
    subject: str
    message: Message
    partition: int | None


class Timers:
    def __init__(
        self,
        bus: Publisher,
        *,
        retry_base: float = 1.0,
        retry_max: float = 30.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.bus = bus
        self.retry_base = retry_base
        self.retry_max = retry_max
        self._clock = clock
        self._armed: dict[str, tuple[Armed, asyncio.TimerHandle]] = {}
        self._firing: dict[str, asyncio.Task[None]] = {}

    def at(
        self,
        key: str,
        when: datetime,
        subject: str,
        message: Message,
        *,
        partition: int | None = None,
    ) -> None:
        """Publish ``message`` on ``subject`` at ``when`` (at once if it is past)."""
        armed = Armed(when, subject, message, partition)
        current = self._armed.get(key)
        if current is not None and current[0] == armed:
            return
        self.cancel(key)
        delay = max(0.0, (when - self._clock()).total_seconds())
        handle = asyncio.get_running_loop().call_later(delay, self._fire, key, armed)
        self._armed[key] = (armed, handle)

    def cancel(self, key: str) -> None:
        """Forget ``key``'s timer, and stop retrying its publish if it already fired."""
        current = self._armed.pop(key, None)
        if current is not None:
            current[1].cancel()
        firing = self._firing.pop(key, None)
        if firing is not None:
            firing.cancel()

    def drop(self, partitions: Collection[int]) -> None:
        """Forget every timer that belongs to one of ``partitions`` (lost: their next owner
        re-arms them when it claims them)."""
        for key, (armed, _) in list(self._armed.items()):
            if armed.partition is not None and armed.partition in partitions:
                self.cancel(key)

    def pending(self) -> dict[str, Armed]:
        """What is armed, by key (for logs and tests)."""
        return {key: armed for key, (armed, _) in self._armed.items()}

    def cancel_all(self) -> None:
        for key in [*self._armed, *self._firing]:
            self.cancel(key)

    def _fire(self, key: str, armed: Armed) -> None:
        self._armed.pop(key, None)
        task = asyncio.create_task(self._publish(key, armed))
        self._firing[key] = task
        task.add_done_callback(lambda done: self._fired(key, done))

    def _fired(self, key: str, task: asyncio.Task[None]) -> None:
        if self._firing.get(key) is task:
            del self._firing[key]

    async def _publish(self, key: str, armed: Armed) -> None:
        try:
            await retry_until_done(
                lambda: self.bus.publish(armed.subject, armed.message),
                what=f"publish timer {key}",
                base=self.retry_base,
                cap=self.retry_max,
            )
        except PermanentError as exc:
            log.error("timer %s: %s given up: %s", key, type(armed.message).__name__, exc)
