"""The live feed: one line per message on ``capibus.>`` (see ``demo.render``), as it arrives.

A core NATS subscription (not a JetStream consumer) sees every publish the moment the server
routes it, across all five streams, in one order; it costs the streams nothing and leaves no
consumer behind. The price: it also sees a publish that JetStream then drops as a duplicate.
Services give a decision a stable message id precisely so that deciding it again (the helm
service re-deciding the same metadata on every run, say) is one message in the stream; the
feed shows such a repeat dimmed, marked ``dup``, and does not count it as seen.

Everything seen is also kept, so the story can wait for an effect (a write, a watch event, a
dead letter) without racing the feed: a message that arrived before the wait began counts.
Observers run on every message right after its line, which is how the story's own
one-line summaries ("the Cluster is now ...") appear in place among the messages that caused
them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from demo.render import render, render_undecodable
from shared import subjects
from shared.bus import Bus
from shared.errors import BadMessage
from shared.messages import Message, decode_any

T = TypeVar("T")
Observer = Callable[[Message], None]


class DemoTimeout(Exception):
    """An expected effect did not show up in time."""


@contextlib.asynccontextmanager
async def within(seconds: float, what: str, *, hint: str = "") -> AsyncIterator[None]:
    """``asyncio.timeout`` that says what the demo was waiting for when it ran out."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise DemoTimeout(f"no sign of {what} within {seconds:.0f}s{hint}") from None


class Feed:
    """Prints and remembers every capibus message; ``wait_until`` waits for an effect."""

    def __init__(self) -> None:
        self.seen: list[Message] = []
        self.observers: list[Observer] = []
        self._ids: set[str] = set()
        self._changed = asyncio.Condition()
        self._sub: Subscription | None = None

    async def start(self, bus: Bus) -> None:
        self._sub = await bus.nc.subscribe(f"{subjects.PREFIX}.>", cb=self._on_message)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    @contextlib.contextmanager
    def observing(self, observer: Observer) -> Iterator[None]:
        self.observers.append(observer)
        try:
            yield
        finally:
            self.observers.remove(observer)

    async def wait_until(self, check: Callable[[list[Message]], T | None]) -> T:
        """The first non-None ``check(seen)``, re-evaluated whenever a message arrives.

        Unbounded: callers bound it with ``within``.
        """
        found: T | None = None

        def ready() -> bool:
            nonlocal found
            found = check(self.seen)
            return found is not None

        async with self._changed:
            await self._changed.wait_for(ready)
        assert found is not None
        return found

    async def _on_message(self, msg: Msg) -> None:
        try:
            message = decode_any(msg.data)
        except BadMessage as exc:
            print(render_undecodable(msg.subject, str(exc)), flush=True)
            return
        duplicate = message.id in self._ids
        print(render(msg.subject, message, duplicate=duplicate), flush=True)
        if duplicate:
            return
        self._ids.add(message.id)
        for observer in list(self.observers):
            observer(message)
        async with self._changed:
            self.seen.append(message)
            self._changed.notify_all()
