"""Looking at an object again after a while, when nothing outside will send an event.

A ``RecheckObject`` armed on the shared ``Timers`` (one per object, re-arming replaces it),
published into the object's partition after a delay that doubles with each look that found
the wait not over (``attempt``), up to a cap. Its id names the object, the reason, the attempt
and the moment, so a replica and its successor arming the same look store it once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from shared import subjects
from shared.messages import ObjectRef, RecheckObject, stable_id
from shared.retry import backoff
from shared.status import story_of
from shared.timers import Timers


class TimedRechecks:
    def __init__(
        self,
        timers: Timers,
        *,
        service: str,
        source: str,
        base_seconds: float,
        max_seconds: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.timers = timers
        self.service = service
        self.source = source
        self.base = base_seconds
        self.cap = max_seconds
        self._clock = clock

    def later(self, ref: ObjectRef, *, partition: int, attempt: int, reason: str) -> None:
        delay = backoff(attempt + 1, base=self.base, cap=self.cap)
        when = (self._clock() + timedelta(seconds=delay)).replace(microsecond=0)
        message = RecheckObject(
            id=stable_id("recheck", str(ref.uid), reason, str(attempt), when.isoformat()),
            source=self.source,
            correlation_id=story_of(ref),
            ref=ref,
            reason=reason,
            attempt=attempt,
        )
        subject = subjects.recheck(self.service, partition, ref.namespace, ref.name)
        self.timers.at(_key(ref), when, subject, message, partition=partition)

    def cancel(self, ref: ObjectRef) -> None:
        self.timers.cancel(_key(ref))


def _key(ref: ObjectRef) -> str:
    return f"recheck/{ref.kind}/{ref.key}"
