"""The NATS JetStream adapter: connect, declare streams, publish with deduplication.

A message over the server's maximum payload is refused before sending as ``MessageTooLarge``,
a permanent error: sending it again cannot help, so it must never pass for an outage
(``shared.oversize`` keeps resource events within the limit).

Streams are declared idempotently at every start (create, or update when the config
drifted), with ``Retention.replicas`` copies (one per server of a JetStream cluster), file
storage and limits retention so history stays for listing, tracing and
replay until it ages out (``max_age``) or the stream outgrows ``max_bytes``. Every publish
carries ``Nats-Msg-Id``: JetStream drops a repeat inside the duplicate window, which is what
makes two watcher replicas, or a watcher's re-list after a restart, store each change once.
It also carries the trace context (``traceparent``, ``shared.tracing``): the current span's
when a handler publishes, else a new trace's; the size check counts those headers too.

``follow`` is the read side for state that is *derived from* a stream rather than worked off
it (the exporter's view of every object): an ordered, ephemeral, unacknowledged consumer that
starts with the newest message of every subject and then tails the stream. It is recreated
from the next stream sequence after a reconnect or when the server lost it, so the reader
sees every message after the ones it already has, in order, never one twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from shared import subjects, tracing
from shared.errors import BadMessage, BusUnavailable, MessageTooLarge
from shared.messages import Message, decode, encode

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

NATS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    nats.js.errors.Error,
    asyncio.TimeoutError,
    OSError,
)


@dataclass(frozen=True)
class Retention:
    max_age_seconds: float = 7 * 24 * 3600
    max_bytes: int = 1 << 30
    duplicate_window_seconds: float = subjects.DUPLICATE_WINDOW.total_seconds()
    #: copies of each stream, one per server of a JetStream cluster (1: a single server)
    replicas: int = 1


@dataclass(frozen=True)
class Published:
    sequence: int
    duplicate: bool


class Bus:
    """One NATS connection and its JetStream context; build with ``Bus.connect``."""

    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js
        self._reconnect_listeners: list[Callable[[], None]] = []

    def add_reconnect_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after each reconnect: pull requests waiting at the server did
        not survive it (a restarted server forgets them), so long polls must be asked again.
        Returns what removes it."""
        self._reconnect_listeners.append(listener)
        return lambda: self._reconnect_listeners.remove(listener)

    def _reconnected(self) -> None:
        for listener in self._reconnect_listeners:
            listener()

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        **options: Any,
    ) -> Bus:
        made: list[Bus] = []

        async def reconnected() -> None:
            log.info("nats reconnected", extra={"url": url})
            for bus in made:
                bus._reconnected()
            if on_reconnect:
                await on_reconnect()

        async def error_cb(exc: Exception) -> None:
            log.warning("nats connection error: %r", exc)

        # A JetStream cluster is reached through any of its servers: ``nats://a,nats://b``.
        servers = [server.strip() for server in url.split(",") if server.strip()]
        try:
            nc = await nats.connect(
                servers,
                name=name,
                reconnected_cb=reconnected,
                error_cb=error_cb,
                # Services wait for NATS forever; a one-shot command passes a bound instead.
                **{"max_reconnect_attempts": -1, "reconnect_time_wait": 0.5, **options},
            )
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"cannot connect to {url}: {exc!r}") from exc
        made.append(cls(nc, nc.jetstream(timeout=5.0)))
        return made[0]

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except NATS_ERRORS:
            await self.nc.close()

    async def ensure_streams(self, retention: Retention = Retention()) -> None:
        for spec in subjects.ALL_STREAMS:
            await self.ensure_stream(spec, retention)

    async def ensure_stream(self, spec: subjects.StreamSpec, retention: Retention) -> None:
        config = StreamConfig(
            name=spec.name,
            description=spec.description,
            subjects=list(spec.subjects),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=retention.max_age_seconds,
            max_bytes=retention.max_bytes,
            duplicate_window=retention.duplicate_window_seconds,
            num_replicas=retention.replicas,
        )
        try:
            try:
                await self.js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                await self.js.add_stream(config)
                log.info("created stream %s", spec.name)
                return
            await self.js.update_stream(config)
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"cannot declare stream {spec.name}: {exc!r}") from exc

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        """Store ``message`` on ``subject``; ``msg_id`` (default: the message id) dedupes.

        Raises ``MessageTooLarge`` (permanent) for a message over the server's maximum
        payload, ``BusUnavailable`` (temporary) when the server does not answer.
        """
        headers = {"Nats-Msg-Id": msg_id or message.id}
        tracing.publishing(headers, subject, message)
        payload = self._encoded(subject, message, headers)
        try:
            ack = await self.js.publish(subject, payload, headers=headers)
        except nats.errors.MaxPayloadError as exc:
            raise self._too_large(subject, len(payload)) from exc
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"publish {subject}: {exc!r}") from exc
        return Published(sequence=ack.seq, duplicate=bool(ack.duplicate))

    @property
    def max_payload(self) -> int:
        """The largest message body the connected server accepts (its ``max_payload``)."""
        return int(self.nc.max_payload)

    def _encoded(self, subject: str, message: Message, headers: dict[str, str]) -> bytes:
        """The body to send; refused here, before anything is sent, when it cannot fit.

        The server counts headers against its limit and answers a violation by closing the
        connection; nats-py checks the body alone and raises ``MaxPayloadError``, a
        connection-level error like any other that, taken for an outage, would be retried
        forever.
        """
        payload = encode(message.model_copy(update={"subject": subject}))
        size = len(payload) + _header_size(headers)
        if size > self.max_payload:
            raise self._too_large(subject, size)
        return payload

    def _too_large(self, subject: str, size: int) -> MessageTooLarge:
        return MessageTooLarge(
            f"publish {subject}: {size} bytes exceed the server's maximum payload of "
            f"{self.max_payload} bytes"
        )

    async def publish_many(
        self, items: list[tuple[str, Message, str | None]], *, ack_timeout: float = 10.0
    ) -> list[Published]:
        """Pipelined publish, in order: all sent at once, then all acknowledgements awaited.

        A request/reply per message caps one publisher at a few thousand per second; keeping
        acknowledgements in flight is what lets a re-list of thousands of objects finish fast.
        Messages leave in list order over one connection, so the stream stores them in order.
        """
        headers = [{"Nats-Msg-Id": msg_id or message.id} for _, message, msg_id in items]
        for (subject, message, _), header in zip(items, headers, strict=True):
            tracing.publishing(header, subject, message)
        bodies = [
            self._encoded(subject, message, header)
            for (subject, message, _), header in zip(items, headers, strict=True)
        ]
        try:
            futures = [
                await self.js.publish_async(subject, body, headers=header, wait_stall=ack_timeout)
                for (subject, _, _), body, header in zip(items, bodies, headers, strict=True)
            ]
            acks = await asyncio.wait_for(asyncio.gather(*futures), ack_timeout)
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"publish of {len(items)} messages: {exc!r}") from exc
        return [Published(sequence=a.seq, duplicate=bool(a.duplicate)) for a in acks]

    async def durable_pull(self, stream: str, config: ConsumerConfig) -> Any:
        """A pull subscription bound to the durable consumer ``config`` names, created or
        updated to ``config`` first (the shape of a consumer is declared at every start)."""
        await self.js.add_consumer(stream, config)
        return await self.js.pull_subscribe_bind(durable=config.durable_name, stream=stream)

    async def last_message(self, stream: str, subject: str) -> bytes | None:
        """The newest body stored on exactly ``subject``, or None: one request, no consumer."""
        try:
            raw = await self.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"read last of {subject}: {exc!r}") from exc
        return raw.data

    async def last_per_subject(self, stream: str, filter_subject: str) -> list[bytes]:
        """The newest message body of every subject matching ``filter_subject``, oldest first."""
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
        )
        try:
            psub = await self.js.pull_subscribe(filter_subject, stream=stream, config=config)
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"read {filter_subject}: {exc!r}") from exc
        try:
            return await _drain(psub)
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"read {filter_subject}: {exc!r}") from exc
        finally:
            with contextlib.suppress(*NATS_ERRORS):
                await psub.unsubscribe()

    async def follow(
        self,
        stream: str,
        filter_subjects: Sequence[str],
        model: type[M],
        *,
        caught_up: Callable[[], None] = lambda: None,
        batch: int = 500,
        idle_seconds: float = 5.0,
    ) -> AsyncIterator[M]:
        """The newest message of every matching subject, then every later one, decoded.

        ``caught_up`` is called whenever the reader has everything the stream held (after the
        initial read, again after each catch-up, and after every quiet ``idle_seconds`` in
        which the consumer proved alive with nothing pending), so a caller can tell a reader
        that is current from one that is behind or cut off. Undecodable messages are logged and
        skipped: a follower has no dead letters of its own. Runs until the caller stops
        iterating; the consumer is deleted on the way out.
        """
        reader = _Follower(self, stream, list(filter_subjects))
        try:
            while True:
                for msg in await reader.next_batch(batch, idle_seconds, caught_up):
                    try:
                        yield decode(msg.data, model)
                    except BadMessage as exc:
                        log.warning("skipping %s: %s", msg.subject, exc)
        finally:
            await reader.close()


class _Follower:
    """The consumer behind ``Bus.follow``: where it is, and how to get back there."""

    def __init__(self, bus: Bus, stream: str, filter_subjects: list[str]) -> None:
        self.bus = bus
        self.stream = stream
        self.filter_subjects = filter_subjects
        #: stream sequence of the last message handed out; 0 before the first
        self.last = 0
        self.psub: Any = None
        self.name = ""
        self.reconnects = 0

    async def next_batch(
        self, batch: int, idle_seconds: float, caught_up: Callable[[], None]
    ) -> list[Any]:
        """The next messages in stream order (possibly none after a quiet ``idle_seconds``)."""
        try:
            if self.psub is None or self.bus.nc.stats["reconnects"] != self.reconnects:
                await self._recreate(caught_up)
            msgs = await fetch_some(self.psub, batch, idle_seconds)
        except (TimeoutError, nats.errors.TimeoutError):
            # Quiet, or the server lost the consumer (restart, inactivity): ask, cheaply.
            await self._check_alive(caught_up)
            return []
        except NATS_ERRORS as exc:
            log.warning("following %s: %r; recreating", self.filter_subjects, exc)
            await self._discard()
            await asyncio.sleep(0.5)  # back off before asking a struggling server again
            return []
        fresh = [m for m in msgs if m.metadata.sequence.stream > self.last]
        if fresh:
            self.last = fresh[-1].metadata.sequence.stream
        if msgs and msgs[-1].metadata.num_pending == 0:
            caught_up()
        return fresh

    async def _recreate(self, caught_up: Callable[[], None]) -> None:
        await self._discard()
        self.reconnects = self.bus.nc.stats["reconnects"]
        config = ConsumerConfig(
            filter_subjects=self.filter_subjects,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=60.0,
            mem_storage=True,
            num_replicas=1,
            **_start_after(self.last),
        )
        info = await self.bus.js.add_consumer(self.stream, config)
        self.name = info.name
        self.psub = await self.bus.js.pull_subscribe_bind(consumer=info.name, stream=self.stream)
        if not info.num_pending:
            caught_up()

    async def _check_alive(self, caught_up: Callable[[], None]) -> None:
        try:
            info = await self.psub.consumer_info()
        except nats.js.errors.NotFoundError:
            log.info("following %s: consumer gone; recreating", self.filter_subjects)
            await self._discard()
        except NATS_ERRORS as exc:
            log.warning("following %s: %r; recreating", self.filter_subjects, exc)
            await self._discard()
        else:
            if not info.num_pending:
                caught_up()

    async def _discard(self) -> None:
        psub, name, self.psub, self.name = self.psub, self.name, None, ""
        if psub is None:
            return
        with contextlib.suppress(*NATS_ERRORS):
            await psub.unsubscribe()
        with contextlib.suppress(*NATS_ERRORS):
            await self.bus.js.delete_consumer(self.stream, name)

    async def close(self) -> None:
        await self._discard()


def _header_size(headers: dict[str, str]) -> int:
    """Bytes the headers take on the wire (``NATS/1.0`` line, ``key: value`` lines, blank)."""
    return len("NATS/1.0\r\n\r\n") + sum(len(f"{k}: {v}\r\n") for k, v in headers.items())


def _start_after(last: int) -> dict[str, Any]:
    """Newest per subject for a first read; afterwards everything after ``last``, in order."""
    if last == 0:
        return {"deliver_policy": DeliverPolicy.LAST_PER_SUBJECT}
    return {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": last + 1}


async def fetch_some(psub: Any, batch: int, wait: float) -> list[Any]:
    """Wait up to ``wait`` for one message, then take up to ``batch - 1`` already behind it.

    A long-poll for a whole batch can hold a message that has already arrived until the poll
    times out (seen up to the full timeout with nats-py and dozens of pull loops on one
    connection); waiting for one and then asking for exactly ``num_pending`` more delivers
    the first at once and still batches a backlog.
    """
    msgs: list[Any] = await psub.fetch(1, timeout=wait)
    pending = msgs[-1].metadata.num_pending if msgs else 0
    if pending and batch > 1:
        with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
            msgs += await psub.fetch(min(pending, batch - 1), timeout=0.2)
    return msgs


async def _drain(psub: Any) -> list[bytes]:
    info = await psub.consumer_info()
    remaining = int(info.num_pending)
    bodies: list[bytes] = []
    while remaining > 0:
        msgs = await psub.fetch(min(remaining, 1000), timeout=5.0)
        bodies.extend(m.data for m in msgs)
        remaining -= len(msgs)
    return bodies
