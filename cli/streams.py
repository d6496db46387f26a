"""How ``capibus`` reads the streams' history (``status`` reads only consumers' info).

Reads use an ephemeral, in-memory, unacknowledged consumer per stream with the object's
subject filters (``story.object_filters``): nothing is acknowledged, so reading never
disturbs the services' durable consumers, and the server sends only the matching messages
instead of the command scanning whole streams. A consumer left behind by a killed command
goes away by itself (``inactive_threshold``). ``--since`` starts the consumer at that time on
the server, so older history is never sent at all.

The consumer's ``num_pending`` says how much a read has left, which is what the progress line
counts; once it reaches zero the backlog is read, and ``--follow`` keeps fetching from the same
consumer, which hands out each later message once, in stream order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from cli.story import Record, record
from shared.bus import NATS_ERRORS, Bus
from shared.errors import BusUnavailable

Progress = Callable[[str, int, int], None]

_BATCH = 500


def _quiet(_stream: str, _done: int, _total: int) -> None:
    return None


class Reader:
    """One stream's matching messages: the backlog, then (for ``--follow``) what comes next."""

    def __init__(
        self, bus: Bus, stream: str, filters: Sequence[str], since: datetime | None = None
    ) -> None:
        self.bus = bus
        self.stream = stream
        self.filters = list(filters)
        self.since = since
        self.psub: Any = None
        self.name = ""
        self.pending = 0

    async def open(self) -> bool:
        """False when the stream does not exist (nothing was ever published to it)."""
        try:
            info = await self.bus.js.add_consumer(self.stream, self._config())
        except nats.js.errors.NotFoundError:
            return False
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"read {self.stream}: {exc!r}") from exc
        self.name, self.pending = info.name, int(info.num_pending or 0)
        self.psub = await self.bus.js.pull_subscribe_bind(consumer=self.name, stream=self.stream)
        return True

    def _config(self) -> ConsumerConfig:
        start: dict[str, Any] = {"deliver_policy": DeliverPolicy.ALL}
        if self.since is not None:
            start = {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": self.since}
        one = len(self.filters) == 1
        return ConsumerConfig(
            filter_subject=self.filters[0] if one else None,
            filter_subjects=None if one else self.filters,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
            **start,
        )

    async def backlog(self, progress: Progress = _quiet) -> list[Record]:
        """Everything stored when the reader opened (and whatever arrived meanwhile)."""
        total, out = self.pending, []
        while self.pending > 0:
            got = await self.fetch(min(self.pending, _BATCH), wait=5.0)
            if not got:  # counted but gone before delivery (deleted, aged out): done
                break
            out += got
            progress(self.stream, len(out), max(total, len(out)))
        return out

    async def fetch(self, batch: int, wait: float) -> list[Record]:
        """Up to ``batch`` next records; none when nothing came within ``wait`` seconds."""
        try:
            msgs = await self.psub.fetch(batch, timeout=wait)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"read {self.stream}: {exc!r}") from exc
        if msgs:
            self.pending = int(msgs[-1].metadata.num_pending)
        return [_record(self.stream, m) for m in msgs]

    async def close(self) -> None:
        if self.psub is None:
            return
        with contextlib.suppress(*NATS_ERRORS):
            await self.psub.unsubscribe()
        with contextlib.suppress(*NATS_ERRORS):
            await self.bus.js.delete_consumer(self.stream, self.name)


def _record(stream: str, msg: Any) -> Record:
    meta = msg.metadata
    headers = msg.headers or {}
    return record(
        stream,
        meta.sequence.stream,
        msg.subject,
        meta.timestamp,
        msg.data,
        msg_id=headers.get("Nats-Msg-Id"),
        headers=headers,
    )


async def read(
    bus: Bus,
    stream: str,
    filters: Sequence[str],
    since: datetime | None = None,
    progress: Progress = _quiet,
) -> list[Record]:
    """Every stored message of ``stream`` matching ``filters``, in stream order."""
    reader = Reader(bus, stream, filters, since)
    try:
        return await reader.backlog(progress) if await reader.open() else []
    finally:
        await reader.close()


async def get(bus: Bus, stream: str, sequence: int) -> Record | None:
    """One message by stream sequence, or None when it is gone (deleted, aged out)."""
    try:
        raw = await bus.js.get_msg(stream, sequence)
    except nats.js.errors.NotFoundError:
        return None
    except NATS_ERRORS as exc:
        raise BusUnavailable(f"get {stream} #{sequence}: {exc!r}") from exc
    headers = raw.headers or {}
    stored = raw.time or datetime.now(UTC)
    body = raw.data or b""
    msg_id = headers.get("Nats-Msg-Id")
    return record(stream, sequence, raw.subject or "", stored, body, msg_id=msg_id, headers=headers)


async def delete(bus: Bus, stream: str, sequence: int) -> bool:
    try:
        return bool(await bus.js.delete_msg(stream, sequence))
    except nats.js.errors.NotFoundError:
        return False
    except NATS_ERRORS as exc:
        raise BusUnavailable(f"delete {stream} #{sequence}: {exc!r}") from exc


async def purge(bus: Bus, stream: str, subject: str | None = None) -> None:
    try:
        await bus.js.purge_stream(stream, subject=subject)
    except nats.js.errors.NotFoundError:
        return  # no stream, nothing to purge
    except NATS_ERRORS as exc:
        raise BusUnavailable(f"purge {stream}: {exc!r}") from exc


async def publish_raw(bus: Bus, subject: str, body: bytes, headers: dict[str, str]) -> int:
    """Store a body no model decodes (a dead-lettered ``BadMessage``) as it was."""
    try:
        ack = await bus.js.publish(subject, body, headers=headers)
    except NATS_ERRORS as exc:
        raise BusUnavailable(f"publish {subject}: {exc!r}") from exc
    return int(ack.seq)
