"""The live feed: one compact line per message on ``capibus.>``, printed as it arrives.

A core NATS subscription (not a JetStream consumer) sees every publish the moment the server
routes it, across all four streams, in one order; it costs the streams nothing and leaves no
consumer behind. The price: it would also show a publish that JetStream then drops as a
duplicate (a restarted watcher re-listing, say), which nothing in the demo's run produces.

Everything seen is also kept, so the story can wait for an effect (a write, a watch event, a
dead letter) without racing the feed: a message that arrived before the wait began counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, TypeVar

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from demo.style import BLUE, BOLD, CYAN, DIM, GREEN, MAGENTA, RED, STYLE, YELLOW
from shared import subjects
from shared.bus import Bus
from shared.errors import BadMessage
from shared.messages import (
    ClusterStatusWritten,
    Message,
    MessageDeadLettered,
    PatchClusterStatus,
    ResourceChanged,
    ResourcesListed,
    decode_any,
)

T = TypeVar("T")

CATEGORIES = {
    "evt": ("EVENT", CYAN),
    "status": ("STATUS", YELLOW),
    "journal": ("JOURNAL", GREEN),
    "dlq": ("DEADLETTER", RED),
}
EVENT_COLOURS = {"ADDED": GREEN, "MODIFIED": BLUE, "DELETED": RED}
DETAIL_WIDTH = 56


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
        self._changed = asyncio.Condition()
        self._sub: Subscription | None = None

    async def start(self, bus: Bus) -> None:
        self._sub = await bus.nc.subscribe(f"{subjects.PREFIX}.>", cb=self._on_message)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

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
        print(render(msg.subject, message), flush=True)
        async with self._changed:
            self.seen.append(message)
            self._changed.notify_all()


# -- rendering ------------------------------------------------------------------------------


def render(subject: str, message: Message) -> str:
    event, obj, detail = describe(message)
    return _line(
        subject,
        type_name=type(message).__name__,
        event=(event, EVENT_COLOURS.get(event, MAGENTA)),
        obj=obj,
        detail=detail,
        message=message,
    )


def render_undecodable(subject: str, error: str) -> str:
    obj = _where(subjects.object_key(subject)) if subject.count(".") >= 4 else subject
    # "<undecodable>" already says what decode_any's prefix would.
    detail = error.removeprefix("not a capibus message: ")
    return _line(
        subject, type_name="<undecodable>", event=("BAD", RED), obj=obj, detail=detail, message=None
    )


def _line(
    subject: str,
    *,
    type_name: str,
    event: tuple[str, str],
    obj: str,
    detail: str,
    message: Message | None,
) -> str:
    label, colour = CATEGORIES.get(subject.split(".")[1], ("?", MAGENTA))
    if len(detail) > DETAIL_WIDTH:
        detail = detail[: DETAIL_WIDTH - 1] + "…"
    correlation = message.correlation_id if message else ""
    return " ".join(
        (
            STYLE.paint(datetime.now().strftime("%H:%M:%S.%f")[:-3], DIM),
            STYLE.pad(label, 10, colour, BOLD),
            STYLE.pad(type_name, 20, colour),
            STYLE.pad(event[0], 10, event[1]),
            STYLE.pad(obj, 26),
            STYLE.pad(detail, DETAIL_WIDTH, RED if message is None else ""),
            STYLE.paint(correlation, DIM),
        )
    ).rstrip()


def describe(message: Message) -> tuple[str, str, str]:
    """(event, object, detail) columns for one message."""
    if isinstance(message, ResourceChanged):
        obj = f"{message.ref.kind} {_where(message.ref.key)}"
        return message.event, obj, _change_detail(message)
    if isinstance(message, ResourcesListed):
        # The group tells Azimuth's Cluster from Cluster API's.
        group = message.api_version.rpartition("/")[0].split(".")[0] or "core"
        obj = f"{message.kind} [{group}]"
        return "LISTED", obj, f"rv={message.resource_version} count={message.count}"
    if isinstance(message, PatchClusterStatus):
        return "PATCH", message.ref.key, f"id={short(message.id)} {summarise_patch(message.patch)}"
    if isinstance(message, ClusterStatusWritten):
        return _written(message)
    if isinstance(message, MessageDeadLettered):
        obj = subjects.object_key(message.original_subject)
        return message.reason, obj, f"by {message.service}: {message.error}"
    return "?", "?", ""


def _change_detail(message: ResourceChanged) -> str:
    detail = f"rv={message.resource_version}"
    if message.ref.kind == "Cluster":
        phase = (message.object.get("status") or {}).get("phase")
        detail += f" phase={phase}" if phase else ""
    if message.ref.kind == "Secret":
        # The watcher strips data before publishing; say so, since that is the point.
        detail += " (data stripped: never on the bus)"
    return detail


def _written(message: ClusterStatusWritten) -> tuple[str, str, str]:
    ids = [short(i) for i in message.update_ids]
    shown = " ".join(ids[:3]) + (f" +{len(ids) - 3}" if len(ids) > 3 else "")
    count = f"{len(ids)} update{'s' if len(ids) != 1 else ''}"
    where = "no-op" if message.skipped else f"rv={message.resource_version}"
    return (
        ("SKIPPED" if message.skipped else "WRITTEN"),
        message.ref.key,
        f"{where} ← {count} [{shown}]",
    )


def summarise_patch(patch: dict[str, Any]) -> str:
    """``phase=Ready nodes{a,b}``: scalars with their value, objects with their keys."""
    parts = []
    for key, value in patch.items():
        if value is None:
            parts.append(f"-{key}")
        elif isinstance(value, dict):
            parts.append(f"{key}{{{','.join(value)}}}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def _where(key: str) -> str:
    """``namespace/name``, or just ``name`` for a cluster-scoped object (key ``/name``)."""
    return key.removeprefix("/")


def short(message_id: str) -> str:
    return message_id[:8]
