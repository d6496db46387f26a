"""One timer per AppTemplate, set for its next sync: scheduled, never polled.

Upstream woke every template on a timer and compared ``lastSync`` with the clock. Here each
template in a held partition has exactly one timer (``shared.timers.Timers``, keyed by the
template), set for the moment its sync is due; when it fires it publishes a
``SyncAppTemplate`` command into the template's partition, and the catalog's own
subscription runs the sync there. Nothing happens between.

- **Ids.** A command's id is derived from the template's uid, generation and due time
  (``logic.Due.command_id``), so replicas that arm the same due time while ownership moves,
  and a publish retried after a NATS hiccup, store one command (JetStream's duplicate window).
  A due time already past when the timer is armed (found overdue when a partition is claimed)
  gets an id naming the arming moment as well: the earlier command for that due time may have
  been given up on, and a second copy costs one GET.
- **Ownership.** Each timer names the template's partition; ``drop`` forgets the timers of
  partitions lost, and the claim of a partition re-arms its templates from a list
  (``handlers.SyncClaims``). After a crash, the new owner's claim re-arms everything, so no
  timer state needs persisting.
- **Failure.** ``Timers`` retries a publish that fails for a temporary reason until it is
  stored (the timer is the only thing that remembers it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import UTC, datetime

from services.catalog import logic
from shared import subjects
from shared.messages import ObjectRef, SyncAppTemplate, stable_id
from shared.status import story_of
from shared.timers import Timers


class SyncTimers:
    def __init__(
        self,
        timers: Timers,
        *,
        source: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.timers = timers
        self.source = source
        self.clock = clock

    def arm(self, ref: ObjectRef, due: logic.Due, *, partition: int) -> None:
        """Publish ``ref``'s ``SyncAppTemplate`` into ``partition`` when ``due`` comes."""
        now, command_id = self.clock(), due.command_id
        if due.reached(now):
            command_id = stable_id(command_id, "overdue", logic.iso(now))
        command = SyncAppTemplate(
            id=command_id,
            source=self.source,
            correlation_id=story_of(ref),
            ref=ref,
            due=due.at,
        )
        subject = subjects.app_template_sync(partition, ref.name)
        self.timers.at(ref.key, due.at, subject, command, partition=partition)

    def cancel(self, key: str, uid: str | None = None) -> None:
        """Drop ``key``'s timer; with ``uid``, only if it belongs to that incarnation."""
        armed = self.timers.pending().get(key)
        if armed is None:
            return
        mine = armed.message.ref.uid if isinstance(armed.message, SyncAppTemplate) else None
        if uid is None or mine in (None, uid):
            self.timers.cancel(key)

    def drop(self, partitions: Collection[int]) -> None:
        """Forget the timers of ``partitions`` (lost: their next owner re-arms them)."""
        self.timers.drop(partitions)

    def cancel_all(self) -> None:
        self.timers.cancel_all()

    def due_times(self) -> dict[str, datetime]:
        """When each armed template's sync is due (for tests and logs)."""
        return {key: armed.at for key, armed in self.timers.pending().items()}
