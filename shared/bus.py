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

**Nothing unconsumed is discarded at the limits.** Retention stays limits-based with
discard-old, so history (``capibus events``/``trace``/``replay``, the exporter's ``follow``)
and work share one stream and every consumer's durable config stays as it is. What discard-old
would lose is work a stopped consumer has not handled yet, so the publisher guards it
(``_StreamGuard``): once a stream is above ``HIGH_WATER`` of its ``max_bytes`` or
``max_msgs``, a publish is refused with ``StreamFull`` (a ``BusUnavailable``, so a temporary
error every publisher already retries with capped backoff, and the watcher re-lists after it)
while a *durable* consumer with work pending still needs one of the oldest messages, the
share (``1 - HIGH_WATER``) discard-old would drop next; that consumer's own handlers may
still publish there as long as nothing is discarded (``consuming``), or a handler that
publishes to the stream it consumes could never finish. Ephemeral and unacknowledged
consumers (the followers, the command line's readers) are history readers and never hold a
publisher back, and a durable consumer with nothing pending is caught up whatever its ack
floor (a filtered consumer's floor stays at its last matching message). Once the consumers
have caught up, publishing resumes and the consumed history ages out. The check is cheap:
stream info is cached for ``GUARD_SECONDS``, or until this publisher alone has added half
the distance to the mark (half the protected share above it), and consumers are listed only
above the mark. Separate work (work-queue) and history streams were weighed and not taken:
they double every write and the storage, and change every durable consumer, ``capibus
events``/``replay``/``dlq`` and the exporter. The cost of this design: a durable consumer
nobody runs any more holds publishers back once its stream nears the limit, which
``capibus_stream_held_back`` and its alert report (``docs/operations.md``: delete it). A
publisher that cannot list the consumers holds back too: unknown is not safe (each
service's NATS user is granted ``$JS.API.CONSUMER.LIST.<stream>`` for the streams it
publishes to, ``shared.access``). The age limit is not
guarded: what outlives ``max_age`` goes, consumed or not.

**Lost pulls.** The consumers' long polls (``shared.consumer``: 120 s) wait at the server
leading their consumer. On a JetStream cluster, a SIGKILLed node takes the requests it held
with it and tells nobody, so a partition sat idle until its poll expired (the fault soak:
104-110 s to recover from a NATS node's death, ``soak/RESULTS.md``). The new leader announces
itself (``LEADER_ADVISORIES``); the bus subscribes to those advisories once per connection and
tells its reconnect listeners, which ask their polls again, now and once more after
``LEADER_SETTLE_SECONDS`` (a request sent before the new leader listens is lost too). A
pull ``idle_heartbeat`` was weighed and not taken: it is a message per poll every few
seconds (416 polls in the all-in-one process: the idle CPU the long polls saved, back),
and nats-py's ``fetch`` skips heartbeats without ever noticing one missing, so it would
also need a fetch of our own. An advisory costs nothing while nothing happens (a NATS user
must be allowed to subscribe to it, ``shared.access``; without, polls end on their timeout).

``follow`` is the read side for state that is *derived from* a stream rather than worked off
it (the exporter's view of every object): an ordered, ephemeral, unacknowledged consumer that
starts with the newest message of every subject and then tails the stream. It is recreated
from the next stream sequence after a reconnect or when the server lost it, so the reader
sees every message after the ones it already has, in order, never one twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

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
from shared.access import (
    TRANSIENT_TLS_ERRORS,
    CredentialsRejected,
    ServerNotTrusted,
    inbox,
    tls_failure,
    without_login,
)
from shared.errors import BadMessage, BusUnavailable, MessageTooLarge, StreamFull
from shared.messages import Message, decode, encode
from shared.metrics import StreamMetrics

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

NATS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    nats.js.errors.Error,
    asyncio.TimeoutError,
    OSError,
)


#: what a JetStream cluster announces when it elected a consumer's leader (any stream, any
#: consumer): ``$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.<stream>.<consumer>``
LEADER_ADVISORIES = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.>"
#: after the first of a burst of leader elections, when the polls are asked once more
LEADER_SETTLE_SECONDS = 1.0


@dataclass(frozen=True)
class Retention:
    max_age_seconds: float = 7 * 24 * 3600
    max_bytes: int = 1 << 30
    duplicate_window_seconds: float = subjects.DUPLICATE_WINDOW.total_seconds()
    #: copies of each stream, one per server of a JetStream cluster (1: a single server)
    replicas: int = 1
    #: a cap on the message count too (-1: none); small in tests of the limits
    max_msgs: int = -1


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
        self.guard = _StreamGuard(js, subjects.ALL_STREAMS)
        self._settling: asyncio.TimerHandle | None = None
        #: (stream, durable) of every consumer this connection pulls from (``durable_pull``)
        self._pulling: set[tuple[str, str]] = set()

    def add_reconnect_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` whenever the pull requests waiting at the servers may be gone,
        so long polls must be asked again: after each reconnect (a restarted server forgets
        them), and when a JetStream cluster elected a new leader for a consumer (the old
        leader held them; killed, it cannot say so). Returns what removes it."""
        self._reconnect_listeners.append(listener)
        return lambda: self._reconnect_listeners.remove(listener)

    def _reconnected(self) -> None:
        for listener in self._reconnect_listeners:
            listener()

    async def _watch_leaders(self) -> None:
        """Subscribe to the consumer leader advisories (the module docstring: lost pulls)."""
        try:
            await self.nc.subscribe(LEADER_ADVISORIES, cb=self._leader_elected)
        except NATS_ERRORS as exc:
            log.warning("cannot follow consumer leader changes: %r", exc)

    async def _leader_elected(self, msg: Any) -> None:
        # A node's death elects new leaders for many consumers at once: the first advisory
        # ends the polls now, one more round after the burst settles asks again those sent
        # before their consumer's new leader was listening. Other processes' consumers (and
        # ephemeral ones, created all the time) are none of this connection's business.
        stream, _, durable = msg.subject.removeprefix(LEADER_ADVISORIES[:-1]).partition(".")
        if self._settling is not None or (stream, durable) not in self._pulling:
            return
        self._reconnected()
        loop = asyncio.get_running_loop()
        self._settling = loop.call_later(LEADER_SETTLE_SECONDS, self._settled)

    def _settled(self) -> None:
        self._settling = None
        self._reconnected()

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        login: tuple[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
        **options: Any,
    ) -> Bus:
        """Connect to any server of ``url``, as ``login`` (user, password) if given, else as
        the URLs say. A server that refuses the login raises ``CredentialsRejected`` at once:
        nats-py would otherwise try again forever, and a wrong password is no outage.

        ``tls://`` servers are reached over TLS (``tls``: whom to trust, default the system's
        CAs), and only over TLS: nats-py upgrades a connection only when the server asks for
        it, so one that does not would be spoken to in plaintext; it raises
        ``ServerNotTrusted`` instead, as a certificate that fails verification does."""
        made: list[Bus] = []
        # A JetStream cluster is reached through any of its servers: ``nats://a,nats://b``.
        servers = [server.strip() for server in url.split(",") if server.strip()]
        shown = ",".join(without_login(server) for server in servers)
        # A login in the URL holds for that URL only: nats-py would reconnect to the servers a
        # cluster announces without it (an authorization violation on every one of them).
        login = login or _url_login(servers[0])
        refused: asyncio.Future[CredentialsRejected] = asyncio.get_running_loop().create_future()
        secure = any(urlsplit(server).scheme == "tls" for server in servers)

        async def reconnected() -> None:
            log.info("nats reconnected", extra={"url": shown})
            for bus in made:
                bus._reconnected()
            if on_reconnect:
                await on_reconnect()

        async def error_cb(exc: Exception) -> None:
            if not refused.done():
                rejected = _rejected(exc, login=login, servers=servers, shown=shown)
                if rejected is not None:
                    refused.set_result(rejected)
            log.warning("nats connection error: %r", exc)

        if login is not None:
            servers = [without_login(server) for server in servers]
        options = _connection_options(login, tls, secure, options)
        connecting = asyncio.ensure_future(
            nats.connect(
                servers,
                name=name,
                reconnected_cb=reconnected,
                error_cb=error_cb,
                # Services wait for NATS forever; a one-shot command passes a bound instead.
                **{"max_reconnect_attempts": -1, "reconnect_time_wait": 0.5, **options},
            )
        )
        try:
            waits: set[asyncio.Future[Any]] = {connecting, refused}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not connecting.done():
                connecting.cancel()
                raise refused.result()
            nc = connecting.result()
            await _refuse_plaintext(nc, shown, secure=secure)
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"cannot connect to {shown}: {exc!r}") from exc
        finally:
            refused.cancel()
        made.append(cls(nc, nc.jetstream(timeout=5.0)))
        await made[0]._watch_leaders()
        return made[0]

    async def close(self) -> None:
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None
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
            max_msgs=retention.max_msgs,
            duplicate_window=retention.duplicate_window_seconds,
            num_replicas=retention.replicas,
        )
        self.guard.know(spec)
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
        payload, ``BusUnavailable`` (temporary) when the server does not answer, and
        ``StreamFull`` (temporary) while the stream is too full to take it without discarding
        work a consumer has not handled yet (the module docstring).
        """
        headers = {"Nats-Msg-Id": msg_id or message.id}
        tracing.publishing(headers, subject, message)
        payload = self._encoded(subject, message, headers)
        await self.guard.admit({subject: (1, len(payload))})
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
        adding: dict[str, tuple[int, int]] = {}
        for (subject, _, _), body in zip(items, bodies, strict=True):
            count, size = adding.get(subject, (0, 0))
            adding[subject] = (count + 1, size + len(body))
        await self.guard.admit(adding)
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
        self._pulling.add((stream, str(config.durable_name)))
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


# --- the publisher's guard at the stream limits (the module docstring) ----------------------

#: above this share of its max_bytes or max_msgs, a stream takes a publish only when no durable
#: consumer still needs its oldest ``1 - HIGH_WATER`` share of messages
HIGH_WATER = 0.9
#: how long a stream's fill, read from the server, is trusted by a publisher
GUARD_SECONDS = 5.0
#: the durable consumer whose handler is running here, if any (``consuming``)
_CONSUMING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "capibus_consuming", default=None
)


@contextlib.contextmanager
def consuming(durable: str) -> Iterator[None]:
    """Publishes inside are a handler run of the durable consumer ``durable``: should the
    guard wait for that very consumer, they still pass while they fit without discarding
    anything, since the run, and so the catching up, cannot finish without them."""
    token = _CONSUMING.set(durable)
    try:
        yield
    finally:
        _CONSUMING.reset(token)


@dataclass(frozen=True)
class StreamFill:
    """How full a stream is, as its info told."""

    stream: str
    messages: int
    bytes: int
    max_msgs: int
    max_bytes: int
    first_seq: int

    @property
    def ratio(self) -> float:
        """The fuller of the two limits, as a share (0 when neither is set)."""
        return self.share(self.messages, self.bytes)

    def share(self, count: int, size: int) -> float:
        """What ``count`` messages of ``size`` bytes take of the tighter limit."""
        by_msgs = count / self.max_msgs if self.max_msgs > 0 else 0.0
        by_bytes = size / self.max_bytes if self.max_bytes > 0 else 0.0
        return max(by_msgs, by_bytes)

    def protected_through(self, adding: int, high_water: float = HIGH_WATER) -> int:
        """The newest stream sequence among the oldest messages, the ones discard-old drops
        next: the oldest ``1 - high_water`` share, or as many as are being added if more."""
        oldest = max(1, math.ceil(self.messages * (1 - high_water)), adding)
        return self.first_seq + oldest - 1


@dataclass(frozen=True)
class ConsumerPosition:
    """Where one consumer of a stream is, as its info told."""

    name: str
    #: a durable consumer acknowledges its work; ephemeral and unacked ones read history
    durable: bool
    #: messages not delivered yet plus messages delivered and not acknowledged
    pending: int
    #: the stream sequence up to which every message is acknowledged
    ack_floor: int


def waiting_on(
    fill: StreamFill,
    consumers: Sequence[ConsumerPosition],
    *,
    adding: int = 1,
    high_water: float = HIGH_WATER,
) -> list[str]:
    """The durable consumers a publish of ``adding`` messages must wait for: the stream is
    above ``high_water`` and they have not acknowledged every message discard-old drops next.

    A consumer with nothing pending is caught up, whatever its floor: a filtered consumer's
    floor stays at its last matching message however far the stream has moved on.
    """
    if fill.ratio < high_water:
        return []
    through = fill.protected_through(adding, high_water)
    return sorted(
        c.name for c in consumers if c.durable and c.pending > 0 and c.ack_floor < through
    )


def admitted(
    waiting: Sequence[str],
    fill: StreamFill,
    consuming: str | None,
    *,
    count: int = 1,
    size: int = 0,
) -> bool:
    """Whether a publish of ``count`` messages (``size`` bytes) may go on: nobody is waited
    on, or the publisher is a handler of a consumer waited on (its run must finish for the
    consumer to catch up) and the stream takes them without discarding anything.

    The room between the high-water mark and the limit is what lets a consumer whose
    handlers publish to its own stream catch up; one that publishes there more than it
    consumes can still be held at the limit (``docs/operations.md``: raise the limit).
    """
    if not waiting:
        return True
    return consuming in waiting and fill.share(fill.messages + count, fill.bytes + size) <= 1


def position(info: Any) -> ConsumerPosition:
    """A consumer's position from nats-py's ``ConsumerInfo``."""
    config = info.config
    return ConsumerPosition(
        name=str(info.name),
        durable=bool(config.durable_name) and config.ack_policy != AckPolicy.NONE,
        pending=int(info.num_pending or 0) + int(info.num_ack_pending or 0),
        ack_floor=int(info.ack_floor.stream_seq if info.ack_floor else 0),
    )


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or token not in ("*", have[index]):
            return False
    return len(want) == len(have)


@dataclass
class _Seen:
    """One stream as this publisher last checked it, and what it has added since."""

    fill: StreamFill
    at: float
    waiting: list[str]
    #: the share this publisher may add before checking again
    budget: float
    added: float = 0.0


@dataclass
class _StreamGuard:
    """Refuses a publish that would make discard-old drop work a consumer still needs."""

    js: JetStreamContext
    specs: Sequence[subjects.StreamSpec]
    high_water: float = HIGH_WATER
    seconds: float = GUARD_SECONDS
    _streams: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _metrics: StreamMetrics = field(default_factory=StreamMetrics)

    def __post_init__(self) -> None:
        for spec in self.specs:
            self.know(spec)

    def know(self, spec: subjects.StreamSpec) -> None:
        self._streams[spec.name] = spec.subjects

    def stream_of(self, subject: str) -> str | None:
        for name, patterns in self._streams.items():
            for pattern in patterns:
                # Every capibus stream is ``<literal>.>``: a prefix test, on the publish path.
                literal = pattern[:-1]
                if pattern.endswith(".>") and "*" not in literal and ">" not in literal:
                    if subject.startswith(literal) and len(subject) > len(literal):
                        return name
                elif subject_matches(pattern, subject):
                    return name
        return None

    async def admit(self, adding: dict[str, tuple[int, int]]) -> None:
        """Raise ``StreamFull`` unless every stream can take ``adding`` (per subject:
        messages and bytes) without losing unconsumed work."""
        per_stream: dict[str, tuple[int, int]] = {}
        for subject, (count, size) in adding.items():
            stream = self.stream_of(subject)
            if stream is not None:
                had = per_stream.get(stream, (0, 0))
                per_stream[stream] = (had[0] + count, had[1] + size)
        for stream, (count, size) in per_stream.items():
            await self._admit(stream, count, size)

    async def _admit(self, stream: str, count: int, size: int) -> None:
        seen = self._seen.get(stream)
        share = seen.fill.share(count, size) if seen else 0.0
        if seen is None or seen.waiting or self._stale(seen, share):
            seen = await self._check(stream, count)
            if seen is None:
                return
            share = seen.fill.share(count, size)
        if not admitted(seen.waiting, seen.fill, _CONSUMING.get(), count=count, size=size):
            raise StreamFull(
                f"stream {stream} is {seen.fill.ratio:.0%} full and discarding its oldest "
                f"messages would lose work {', '.join(seen.waiting)} has not handled yet",
                stream=stream,
            )
        seen.added += share

    def _stale(self, seen: _Seen, share: float) -> bool:
        return time.monotonic() - seen.at > self.seconds or seen.added + share > seen.budget

    async def _check(self, stream: str, adding: int) -> _Seen | None:
        try:
            info = await self.js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return None  # not declared (yet): the publish itself says what is wrong
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"stream info of {stream}: {exc!r}") from exc
        fill = StreamFill(
            stream=stream,
            messages=int(info.state.messages),
            bytes=int(info.state.bytes),
            max_msgs=int(info.config.max_msgs or -1),
            max_bytes=int(info.config.max_bytes or -1),
            first_seq=int(info.state.first_seq),
        )
        waiting: list[str] = []
        if fill.ratio >= self.high_water:
            try:
                consumers = await self._consumers(stream, int(info.state.consumer_count))
            except BusUnavailable:
                # Unknown is not safe: held back, and said so (a NATS user needs
                # ``$JS.API.CONSUMER.LIST.<stream>`` for this check).
                self._metrics.checked(stream, fill.ratio, held=True)
                raise
            waiting = waiting_on(fill, consumers, adding=adding, high_water=self.high_water)
        self._metrics.checked(stream, fill.ratio, held=bool(waiting))
        if waiting:
            log.warning("holding back publishes to %s: %s behind", stream, ", ".join(waiting))
        below = self.high_water - fill.ratio
        budget = below / 2 if below > 0 else (1 - self.high_water) / 2
        seen = _Seen(fill=fill, at=time.monotonic(), waiting=waiting, budget=budget)
        self._seen[stream] = seen
        return seen

    async def _consumers(self, stream: str, count: int) -> list[ConsumerPosition]:
        found: list[ConsumerPosition] = []
        try:
            while len(found) < count:
                page = await self.js.consumers_info(stream, offset=len(found))
                if not page:
                    break
                found += [position(info) for info in page]
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"consumers of {stream}: {exc!r}") from exc
        return found


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
    return await fetch_behind(psub, await psub.fetch(1, timeout=wait), batch)


async def fetch_behind(psub: Any, msgs: list[Any], batch: int) -> list[Any]:
    """``msgs`` (just fetched) and up to ``batch - len(msgs)`` messages already behind them.

    Once ``msgs`` are taken, the server counts them delivered: nothing may drop them now, or
    they come back only after ``ack_wait``, behind newer messages of their object. So an error
    here ends the batch early instead of losing it, and a caller that must be able to
    interrupt its wait (``shared.consumer``: long polls) interrupts the first fetch only:
    nats-py's batch fetch keeps what arrived in a local list, which a cancellation drops.
    """
    pending = msgs[-1].metadata.num_pending if msgs else 0
    if pending and batch > len(msgs):
        with contextlib.suppress(*NATS_ERRORS):
            msgs = msgs + await psub.fetch(min(pending, batch - len(msgs)), timeout=0.2)
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


def _url_login(server: str) -> tuple[str, str] | None:
    parts = urlsplit(server)
    if parts.username is None:
        return None
    return unquote(parts.username), unquote(parts.password or "")


def _rejected(
    exc: Exception, *, login: tuple[str, str] | None, servers: list[str], shown: str
) -> CredentialsRejected | None:
    """The configuration error behind a connection error, if it is one (not an outage)."""
    if "authorization violation" in str(exc).lower():
        user = login[0] if login else urlsplit(servers[0]).username
        return CredentialsRejected(system="nats", user=user, server=shown, detail=str(exc))
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, TRANSIENT_TLS_ERRORS):
        return ServerNotTrusted(system="nats", server=shown, detail=tls_failure(exc))
    return None


def _connection_options(
    login: tuple[str, str] | None,
    tls: ssl.SSLContext | None,
    secure: bool,
    options: dict[str, Any],
) -> dict[str, Any]:
    """nats-py's options for ``login`` and TLS, under the caller's own ``options``."""
    ours: dict[str, Any] = {}
    if login is not None:
        ours |= {"user": login[0], "password": login[1], "inbox_prefix": inbox(login[0])}
    if secure or tls is not None:
        ours["tls"] = tls or ssl.create_default_context()
    return ours | options


async def _refuse_plaintext(nc: NatsClient, shown: str, *, secure: bool) -> None:
    """A ``tls://`` server that did not ask for TLS got a plaintext connection: drop it."""
    # nats-py keeps the server's INFO only in a private attribute; it is what decided.
    if secure and not nc._server_info.get("tls_required"):
        await nc.close()
        detail = "the server does not require TLS"
        raise ServerNotTrusted(system="nats", server=shown, detail=detail)
