"""One timer per AppTemplate, set for its next sync: scheduled, never polled.

Upstream woke every template on a timer and compared ``lastSync`` with the clock. Here each
template in an owned partition has exactly one ``loop.call_later`` handle, set for the moment
its sync is due; when it fires it publishes a ``SyncAppTemplate`` command into the template's
partition, and the catalog's own subscription runs the sync there. Nothing happens between.

- **Ids.** A command's id is derived from the template's uid, generation and due time
  (``logic.Due.command_id``), so replicas that arm the same due time while ownership moves,
  and a publish retried after a NATS hiccup, store one command (JetStream's duplicate window).
  A due time already past when the timer is armed (found overdue when a partition is claimed)
  gets an id naming the arming moment as well: the earlier command for that due time may have
  been given up on, and a second copy costs one GET.
- **Ownership.** Timers live in one process and follow the partitions it holds:
  ``retain`` drops the timers of partitions given up, and the composition root re-arms from a
  list of AppTemplates whenever partitions are claimed (``handlers.rearm``). After a crash,
  the new owner's claim re-arms everything, so no timer state needs persisting.
- **Failure.** A publish that fails is tried again a few seconds later (the timer is the only
  thing that will remember it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from services.catalog import logic
from shared import subjects
from shared.messages import Message, ObjectRef, SyncAppTemplate, stable_id

log = logging.getLogger(__name__)

Publish = Callable[[str, Message], Awaitable[Any]]


@dataclass
class _Armed:
    uid: str | None
    partition: int
    at: datetime
    handle: asyncio.TimerHandle


class SyncTimers:
    def __init__(
        self,
        *,
        publish: Publish,
        source: str,
        publish_retry_seconds: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.publish = publish
        self.source = source
        self.publish_retry_seconds = publish_retry_seconds
        self.clock = clock
        self._armed: dict[str, _Armed] = {}
        self._firing: set[asyncio.Task[None]] = set()

    def arm(self, ref: ObjectRef, due: logic.Due, *, partition: int, correlation_id: str) -> None:
        now = self.clock()
        command_id = due.command_id
        if due.at <= now:
            command_id = stable_id(command_id, "overdue", logic.iso(now))
        command = SyncAppTemplate(
            id=command_id,
            source=self.source,
            correlation_id=correlation_id,
            ref=ref,
            due=due.at,
        )
        self._schedule(command, partition, delay=(due.at - now).total_seconds())

    def _schedule(self, command: SyncAppTemplate, partition: int, *, delay: float) -> None:
        key = command.ref.key
        self.cancel(key)
        handle = asyncio.get_running_loop().call_later(
            max(0.0, delay), self._fire, command, partition
        )
        self._armed[key] = _Armed(command.ref.uid, partition, command.due, handle)

    def cancel(self, key: str, uid: str | None = None) -> None:
        """Drop ``key``'s timer; with ``uid``, only if it belongs to that incarnation."""
        armed = self._armed.get(key)
        if armed is None or (uid is not None and armed.uid not in (None, uid)):
            return
        armed.handle.cancel()
        del self._armed[key]

    def retain(self, owned: frozenset[int]) -> None:
        for key, armed in list(self._armed.items()):
            if armed.partition not in owned:
                self.cancel(key)

    def cancel_all(self) -> None:
        for key in list(self._armed):
            self.cancel(key)

    def due_times(self) -> dict[str, datetime]:
        """When each armed template's sync is due (for tests and logs)."""
        return {key: armed.at for key, armed in self._armed.items()}

    def _fire(self, command: SyncAppTemplate, partition: int) -> None:
        self._armed.pop(command.ref.key, None)
        task = asyncio.create_task(self._publish(command, partition))
        self._firing.add(task)
        task.add_done_callback(self._firing.discard)

    async def _publish(self, command: SyncAppTemplate, partition: int) -> None:
        subject = subjects.app_template_sync(partition, command.ref.name)
        try:
            await self.publish(subject, command)
        except Exception as exc:
            log.warning(
                "could not publish the sync of %s, retrying in %.0fs: %r",
                command.ref.name,
                self.publish_retry_seconds,
                exc,
            )
            if command.ref.key not in self._armed:
                self._schedule(command, partition, delay=self.publish_retry_seconds)
