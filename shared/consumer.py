"""The one way services consume the bus: partitioned pull consumers, per-object batches.

A service declares ``Subscription``s; ``Consumer.run`` does the rest:

1. **Ownership.** It keeps the partition leases of ``shared.coordination`` current and pulls,
   for each partition it holds, from that partition's durable consumer
   (``<service>-<subscription>-p<partition>``). One replica at a time per partition means one
   replica at a time per object. Work that follows the partitions rather than messages is a
   ``shared.claims.ClaimFollower`` (``claims=``), which the consumer starts on each claim and
   cancels the moment a partition starts to move.
2. **Per-object batches.** Fetched messages are queued per object (the subject's namespace and
   name). An object runs at most one handler at a time; whatever arrives for it meanwhile is
   handed to the *next* run as one batch, in stream order, duplicates (same message id)
   removed. A burst of N events for one object therefore costs at most two runs, and a
   level-triggered handler only ever looks at ``batch.latest``.
3. **Acknowledgement.** A message is acked only after the run that carried it succeeded.
   While a run is slow, the messages are kept alive with ``in_progress``.

   ============================  ==============================================================
   outcome of the run            what happens to each message
   ============================  ==============================================================
   returned                      ack
   ``TemporaryError``            retried in process with capped backoff for as long as it
                                 takes, the messages held (``in_progress``) and newly arrived
                                 ones joining the retry; never dead-lettered. If the partition
                                 goes meanwhile, ``nak`` so the next owner carries on at once
   ``PermanentError``            dead letter with the reason, then ``term``
   any other exception           logged with traceback, ``nak(delay)``; never acked as success;
                                 dead-lettered once ``max_deliver`` deliveries are used up
   undecodable message           dead letter with the decoding error, ``term``; the rest of
                                 the batch still runs
   delivered more than           dead letter without running the handler (every earlier run
   ``max_deliver`` times         crashed or hung the process)
   ============================  ==============================================================

   The newer messages of an object whose run raised go back with it (``nak``, same delay)
   unrun, so they never overtake it; those deliveries are not counted against
   ``max_deliver`` (``_Deferred``): the newer message still gets its runs once the older one
   is settled or dead-lettered.

   An acknowledgement is sent without waiting for an answer, so it can be lost: a NATS
   server or the consumer's leader changing at that moment drops it, and JetStream delivers
   the message again after ``ack_wait``, *after* the object's newer messages were handled.
   Running it again would then undo newer work (an old event's object overwriting a newer
   one's status, an old status patch written over a newer one). So each subscription
   remembers the stream sequences it acked within two ``ack_wait`` periods; a redelivered
   message it finds there is acked again and not run.

   **Lost deliveries.** A pull's answer that reaches a request the client already gave up
   (a leader change, a reconnect) stays pending at the server and comes back after
   ``ack_wait``, just as late, but was never run. Skipping it would lose what it says; running
   it alone would undo the newer messages. So each subscription also remembers, for two
   ``ack_wait`` periods, what its runs of each object carried, and a redelivered message older
   than the newest of its object runs again *with those after it*, in stream order
   (``Batch.replayed`` counts them): the handler sees what stream order would have shown it.
   For a ``partial`` model (a status or metadata patch: every message counts) that is every
   newer message; otherwise the newest one, the only one a run after it looks at.

4. **Every ending is recorded.** A dead-letter entry always fits on the bus: the original
   body is kept up to ``DEAD_LETTER_PAYLOAD_LIMIT`` bytes, with its size, SHA-256 and stream
   sequence, so the whole original stays addressable while retention keeps it. JetStream's
   own delivery limit is off: the consumer counts deliveries itself, so a dead letter that
   cannot be stored yet (NATS down) is retried rather than silently never delivered again.
   Should storing it fail for good, an error log line names the message and the ``dropped``
   outcome counts it.
5. **Long polls.** A pull request waits up to ``fetch_timeout`` (120 s) at the server,
   which answers the moment a message arrives: waiting costs an idle replica nothing, where
   short waits made every partition and subscription a wake-up every 2 s (the all-in-one
   process holds 26 subscriptions x 16 partitions: 416 polls, which at 30 s were most of its
   idle CPU, ``bench/ANALYSIS.md`` f). Nothing waits on the timeout: letting a partition go
   and a NATS reconnect (the server forgot the held requests) end the waits at once, and a
   server whose consumer moves (a new leader, a deleted consumer) answers a held request
   with a 409 status, which ends the wait too; a consumer leader elected after its old one
   died unannounced (a JetStream cluster node killed) ends them through the bus's leader
   advisories (``shared.bus``: lost pulls); what a wait brings after the lease lapsed
   goes back (``nak``) to the next holder unrun. A handler's own publishes carry its
   durable consumer's name (``shared.bus.consuming``), so a stream held back at its limit
   for that consumer still takes what the consumer needs to catch up.
6. **Traced.** Each handler run is a span, the child of the newest message's trace context
   (its ``traceparent`` header), linked to every other message it carries; a dead letter keeps
   the header of its original (``shared.tracing``).
7. **Whole objects.** A resource event too large for one message arrives trimmed
   (``shared.oversize``); the consumer reads the object back through ``objects`` before the
   handler runs, so no handler ever decides on part of an object.

Why not FastStream: its NATS default acknowledgement is ``REJECT_ON_ERROR`` (an unexpected
exception terms the message, silently dropping it), and a pull subscriber with several workers
over-fetches and redelivers duplicates. Both are exactly the guarantees this module exists for,
so the small amount of glue is ours and tested.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared import subjects, tracing
from shared.bus import NATS_ERRORS, consuming, fetch_behind
from shared.claims import ClaimFollower, ClaimTracker
from shared.coordination import Lease
from shared.errors import BadMessage, LockUnavailable, PermanentError, TemporaryError
from shared.messages import (
    DEAD_LETTER_ERROR_LIMIT,
    DEAD_LETTER_PAYLOAD_LIMIT,
    Message,
    MessageDeadLettered,
    decode,
)
from shared.metrics import ConsumerMetrics, Stopwatch, SubscriptionMetrics
from shared.oversize import any_trimmed, complete_all
from shared.ports import KubeGetter, Publisher
from shared.retry import backoff

log = logging.getLogger(__name__)

#: how long after a disturbance polls stay short, in ``ack_wait`` periods (``_long_poll``)
WARY_ACK_WAITS = 3
#: the messages of one object of a ``partial`` model kept for a late one to run under
HANDLED_PER_OBJECT = 256

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def park(parked: dict[T, float], key: T, delay: float, now: float) -> None:
    """Note that ``key``'s messages come back after ``delay``, and forget the objects whose
    delay is over: an entry is otherwise cleared only by that object's next message, which a
    partition handed over meanwhile brings to another replica."""
    for done in [k for k, until in parked.items() if until <= now]:
        del parked[done]
    parked[key] = now + delay


@dataclass(frozen=True)
class Batch(Generic[M]):
    """The messages for one object that one handler run carries, oldest first."""

    key: str
    partition: int
    messages: tuple[M, ...]
    lease_token: int = 0
    #: each message's stream sequence
    sequences: tuple[int, ...] = ()
    #: how many of the messages ran before: they follow one that arrived late (``Consumer``)
    replayed: int = 0

    @property
    def latest(self) -> M:
        return self.messages[-1]


@dataclass(frozen=True)
class Subscription(Generic[M]):
    """What a service consumes and which handler runs for it."""

    name: str
    stream: subjects.StreamSpec
    filters: Callable[[int], list[str]]
    model: type[M]
    handle: Callable[[Batch[M]], Awaitable[None]]
    #: wait this long after an object's first message before running, so a burst coalesces
    coalesce_seconds: float = 0.0


class ConsumerBus(Publisher, Protocol):
    """What the consumer needs of ``shared.bus.Bus``: dead letters, pulling, and word of a
    reconnect (the server forgot the pull requests waiting there)."""

    async def durable_pull(self, stream: str, config: ConsumerConfig) -> Any: ...

    def add_reconnect_listener(self, listener: Callable[[], None]) -> Callable[[], None]: ...


class Leases(Protocol):
    """What the consumer needs of ``shared.coordination.PartitionLeases``."""

    ttl: float

    async def heartbeat(self) -> list[str]: ...

    def desired(self, members: list[str]) -> set[int]: ...

    async def acquire(self, partition: int) -> Lease | None: ...

    async def renew_all(self, leases: list[Lease]) -> list[bool]: ...

    async def release(self, lease: Lease) -> None: ...

    async def leave(self) -> None: ...


@dataclass(frozen=True)
class ConsumerSettings:
    ack_wait: float = 30.0
    max_deliver: int = 8
    max_ack_pending: int = 1000
    fetch_batch: int = 200
    fetch_timeout: float = 120.0
    backoff_base: float = 0.5
    backoff_max: float = 60.0


@dataclass
class _Work:
    """One message waiting in an object's queue."""

    msg: Msg
    sequence: int
    deliveries: int
    #: of those, the deliveries handed back here unrun, behind an older message (``_Deferred``)
    deferred: int = 0
    #: redelivered after newer messages of its object ran here (``_Handled``)
    late: bool = False

    @property
    def tries(self) -> int:
        """Deliveries that ran, or could have: what ``max_deliver`` counts."""
        return self.deliveries - self.deferred


@dataclass
class _Deferred:
    """How often each message was handed back unrun behind an older message of its object
    (``offer`` while the object is parked, ``_defer_pending``). Those deliveries are no
    failures, so ``max_deliver`` must not count them: it would dead-letter a newer message as
    never settled without its handler having run once. Known only to the replica that handed
    them back; forgotten ``keep`` seconds after the last one."""

    keep: float
    _counts: dict[int, tuple[int, float]] = field(default_factory=dict)

    def add(self, work: list[_Work], now: float) -> None:
        for item in work:
            count, _ = self._counts.get(item.sequence, (0, now))
            self._counts[item.sequence] = (count + 1, now)
        if len(self._counts) > 256:
            for sequence, (_, then) in list(self._counts.items()):
                if then < now - self.keep:
                    del self._counts[sequence]

    def of(self, work: _Work, now: float) -> int:
        count, then = self._counts.get(work.sequence, (0, now))
        return min(count, work.deliveries - 1) if now - then <= self.keep else 0

    def forget(self, work: list[_Work]) -> None:
        for item in work:
            self._counts.pop(item.sequence, None)


@dataclass
class _Acked:
    """Stream sequences acked lately (``keep`` seconds): a redelivery of one is a lost ack."""

    keep: float
    _when: dict[int, float] = field(default_factory=dict)
    _order: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)

    def add(self, sequences: list[int], now: float) -> None:
        for sequence in sequences:
            self._when[sequence] = now
            self._order.append((now, sequence))
        while self._order and self._order[0][0] < now - self.keep:
            then, sequence = self._order.popleft()
            if self._when.get(sequence) == then:
                del self._when[sequence]

    def __contains__(self, sequence: int) -> bool:
        when = self._when.get(sequence)
        return when is not None and time.monotonic() - when <= self.keep


@dataclass
class _Handled:
    """What the runs of each object carried lately (``keep`` seconds), by stream sequence: a
    redelivered message older than the newest of its object is late, and runs again with
    those after it (the module docstring: lost deliveries). For a ``partial`` model the last
    ``HANDLED_PER_OBJECT`` messages of each object are kept; otherwise its newest, all a run
    after it looks at. Adding a run costs what the object keeps, never more."""

    keep: float
    every: bool
    _kept: dict[str, list[tuple[int, float, Message]]] = field(default_factory=dict)
    _touched: dict[str, float] = field(default_factory=dict)
    _order: collections.deque[tuple[float, str]] = field(default_factory=collections.deque)

    def add(self, key: str, ran: list[tuple[int, Message]], now: float) -> None:
        horizon = now - self.keep
        kept = [entry for entry in self._kept.get(key, ()) if entry[1] >= horizon]
        known = {entry[0] for entry in kept}
        for sequence, message in ran:
            if sequence not in known:
                # A late message goes where it belongs: the next late one replays it too.
                bisect.insort(kept, (sequence, now, message), key=lambda entry: entry[0])
        self._kept[key] = kept[-HANDLED_PER_OBJECT:] if self.every else kept[-1:]
        self._touched[key] = now
        self._order.append((now, key))
        while self._order and self._order[0][0] < horizon:
            _, old = self._order.popleft()
            if self._touched.get(old, now) < horizon:
                del self._kept[old], self._touched[old]

    def newest(self, key: str, now: float) -> int:
        """The newest stream sequence a run of ``key`` carried within ``keep``; 0 if none."""
        fresh = (entry[0] for entry in self._kept.get(key, ()) if entry[1] >= now - self.keep)
        return max(fresh, default=0)

    def after(self, key: str, sequence: int) -> list[tuple[int, Message]]:
        return [(seq, message) for seq, _, message in self._kept.get(key, ()) if seq > sequence]


@dataclass
class _ObjectQueue:
    partition: int
    pending: list[_Work] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class Consumer:
    """Runs a service's subscriptions on the partitions this replica owns."""

    def __init__(
        self,
        *,
        bus: ConsumerBus,
        leases: Leases,
        service: str,
        subscriptions: list[Subscription[Any]],
        settings: ConsumerSettings | None = None,
        objects: KubeGetter | None = None,
        claims: ClaimFollower | None = None,
    ) -> None:
        self.bus = bus
        #: reads back objects whose events arrived trimmed (``shared.oversize``)
        self.objects = objects
        self.leases = leases
        self.service = service
        self.subscriptions = subscriptions
        self.settings = settings or ConsumerSettings()
        #: work that follows the partitions held (``shared.claims``)
        self.claims: ClaimTracker | None = None
        if claims is not None:
            self.claims = ClaimTracker(
                claims,
                service=service,
                retry_base=self.settings.backoff_base,
                retry_max=self.settings.backoff_max,
            )
        self._partitions: dict[int, _PartitionRunner] = {}
        #: partitions being handed over: pulls stopped, handlers finishing, lease still renewed
        self._handing: dict[int, _PartitionRunner] = {}
        self._handovers: dict[int, asyncio.Task[None]] = {}
        #: every claim until its queues are drained, by (partition, token): a handler waiting
        #: to retry learns from it that its partition is being let go
        self._runners: dict[tuple[int, int], _PartitionRunner] = {}
        self._queues: dict[tuple[str, str], _ObjectQueue] = {}
        #: objects whose messages were just handed back with a delay, and until when
        self._parked: dict[tuple[str, str], float] = {}
        self._background: set[asyncio.Task[None]] = set()
        #: per subscription, what was acked lately (the module docstring: lost acks)
        self._acked = {s.name: _Acked(keep=2 * self.settings.ack_wait) for s in subscriptions}
        #: per subscription, what the runs carried lately (the module docstring: lost deliveries)
        self._handled = {
            s.name: _Handled(keep=2 * self.settings.ack_wait, every=s.model.partial)
            for s in subscriptions
        }
        #: per subscription, deliveries spent waiting behind older messages (``_Deferred``)
        keep = 4 * (self.settings.backoff_max + self.settings.ack_wait)
        self._deferred = {s.name: _Deferred(keep=keep) for s in subscriptions}
        self.metrics = ConsumerMetrics(service, (s.name for s in subscriptions))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @property
    def owned(self) -> set[int]:
        return set(self._partitions)

    async def run(self, stop: asyncio.Event) -> None:
        """Balance partitions until ``stop`` is set, then hand everything back cleanly."""
        forget = self.bus.add_reconnect_listener(self._reconnected)
        try:
            while not stop.is_set():
                await self._rebalance()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.leases.ttl / 3)
        finally:
            forget()
            for partition in list(self._partitions):
                self._hand_over(partition)
            await self._announce()
            await self.leases.leave()
            await self._finish_handovers()

    def _reconnected(self) -> None:
        for runner in self._partitions.values():
            runner.wake()

    async def _announce(self) -> None:
        """Tell the claim work which partitions are held now, under which tokens."""
        if self.claims is not None:
            await self.claims.follow({p: r.lease.token for p, r in self._partitions.items()})

    async def _rebalance(self) -> None:
        try:
            members = await self.leases.heartbeat()
        except LockUnavailable as exc:
            log.warning(
                "%s: cannot reach Redis, keeping leases until they lapse: %s", self.service, exc
            )
            await self._renew_all()
            await self._announce()
            return
        desired = self.leases.desired(members)
        for partition in sorted(set(self._partitions) - desired):
            self._hand_over(partition)
        await self._renew_all()
        for partition in sorted(desired - set(self._partitions) - set(self._handing)):
            await self._claim(partition)
        await self._announce()

    def _hand_over(self, partition: int) -> None:
        """Let ``partition`` go without holding this loop up.

        Its pulls stop now, but its lease stays ours, renewed with the others every round,
        until the handlers already running for it have finished; only then is it released,
        so the next holder never starts on an object while one of ours still acts on it. A
        hand-over awaited here instead (as it once was) stopped the renewals and heartbeats
        of a replica with long handlers (helm installs): its leases lapsed, a new replica took
        every partition as if this one had died, and both acted on the same Clusters
        (``bench/ANALYSIS.md``, w).
        """
        runner = self._partitions.pop(partition)
        self._handing[partition] = runner
        started = time.monotonic()

        async def let_go() -> None:
            try:
                await self._let_go(partition, runner)
            finally:
                self._handing.pop(partition, None)
                self._handovers.pop(partition, None)
            took = time.monotonic() - started
            if took > self.leases.ttl / 3:
                log.info(
                    "%s: handed partition %s over after %.1fs (its running handlers finishing)",
                    self.service,
                    partition,
                    took,
                )

        self._handovers[partition] = asyncio.create_task(let_go())

    async def _finish_handovers(self) -> None:
        """Until every hand-over is done, renewing the leases it still holds meanwhile."""
        while self._handovers:
            await asyncio.wait(list(self._handovers.values()), timeout=self.leases.ttl / 3)
            if self._handovers:
                await self._renew_all()

    async def _renew_all(self) -> None:
        held = [*self._partitions.items(), *self._handing.items()]
        renewed = await self.leases.renew_all([runner.lease for _, runner in held])
        for (partition, runner), still in zip(held, renewed, strict=True):
            if self._handing.get(partition) is runner:
                if not still:
                    log.warning(
                        "%s: lost partition %s while handing it over; its running handlers "
                        "finish without it",
                        self.service,
                        partition,
                    )
                continue
            if not still:
                log.warning("%s: lost partition %s", self.service, partition)
                await self._drop(partition, release=False)
            elif runner.resume():
                # The local deadline (0.8 of the TTL) passed before this round came, so the
                # pulls stopped; the key was still ours in Redis, so nobody took it meanwhile.
                log.warning(
                    "%s: partition %s renewed after its lease lapsed locally; pulling again",
                    self.service,
                    partition,
                )

    async def _claim(self, partition: int) -> None:
        try:
            lease = await self.leases.acquire(partition)
        except LockUnavailable as exc:
            log.warning("%s: cannot claim partition %s: %s", self.service, partition, exc)
            return
        if lease is None:
            return
        runner = _PartitionRunner(self, lease)
        self._partitions[partition] = runner
        self._runners[(partition, lease.token)] = runner
        self.metrics.owned.set(len(self._partitions))
        runner.start()
        log.info("%s: owns partition %s (token %s)", self.service, partition, lease.token)

    async def _drop(self, partition: int, *, release: bool = True) -> None:
        runner = self._partitions.pop(partition, None)
        if runner is None:
            return
        await self._let_go(partition, runner, release=release)

    async def _let_go(
        self, partition: int, runner: _PartitionRunner, *, release: bool = True
    ) -> None:
        if self.claims is not None:
            # First: claim work must not act on the partition once it starts to move.
            await self.claims.cancel(partition)
        self.metrics.owned.set(len(self._partitions))
        await runner.stop()
        await self._drain_queues(partition)
        self._runners.pop((partition, runner.lease.token), None)
        if release and not runner.settled:
            # A hand-over tells the next holder nothing is in flight; here the vanished
            # holder's messages still are. Letting the lease expire makes the next holder
            # wait for them as this one did (a takeover, not a hand-over).
            log.warning(
                "%s: partition %s not handed over: messages of its previous holder are still "
                "in flight; it passes on when its lease expires",
                self.service,
                partition,
            )
            release = False
        if release:
            await self.leases.release(runner.lease)

    async def _drain_queues(self, partition: int) -> None:
        tasks = [q.task for q in self._queues.values() if q.partition == partition and q.task]
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- per-object queues -------------------------------------------------------------

    def offer(self, sub: Subscription[Any], lease: Lease, msg: Msg) -> None:
        work = _work_of(msg)
        work.deferred = self._deferred[sub.name].of(work, time.monotonic())
        key = subjects.object_key(msg.subject)
        if work.deliveries > 1:
            self.metrics.of[sub.name].redelivered.inc()
            if work.sequence in self._acked[sub.name]:
                self._ack_again(sub, work)
                return
            work.late = work.sequence < self._handled[sub.name].newest(key, time.monotonic())
            if work.late:
                self.metrics.of[sub.name].late.inc()
        queue_key = (sub.name, key)
        parked = self._parked.get(queue_key, 0.0) - time.monotonic()
        if parked > 0:
            # Its older messages come back after this delay; this one must not overtake them.
            self._deferred[sub.name].add([work], time.monotonic())
            self._spawn(_settle([work], "nak", parked + 0.05))
            return
        self._parked.pop(queue_key, None)
        queue = self._queues.setdefault(queue_key, _ObjectQueue(partition=lease.partition))
        queue.pending.append(work)
        if queue.task is None or queue.task.done():
            queue.task = asyncio.create_task(self._run_queue(sub, lease, queue_key, queue))

    def _ack_again(self, sub: Subscription[Any], work: _Work) -> None:
        log.info(
            "%s %s: already handled here (its acknowledgement was lost); acked again: %s",
            sub.name,
            subjects.object_key(work.msg.subject),
            _named(work),
        )
        self._acked[sub.name].add([work.sequence], time.monotonic())
        self._spawn(_settle([work], "ack"))

    async def _run_queue(
        self, sub: Subscription[Any], lease: Lease, queue_key: tuple[str, str], queue: _ObjectQueue
    ) -> None:
        try:
            while queue.pending:
                if sub.coalesce_seconds:
                    # A debounce, not a poll: let the rest of a burst join this run.
                    await asyncio.sleep(sub.coalesce_seconds)
                work, queue.pending = queue.pending, []
                await self._process(sub, lease, queue_key[1], work, queue)
        finally:
            if not queue.pending:
                self._queues.pop(queue_key, None)

    async def _process(
        self,
        sub: Subscription[Any],
        lease: Lease,
        key: str,
        work: list[_Work],
        queue: _ObjectQueue,
    ) -> None:
        """Run the handler over ``work`` until it settles; a ``TemporaryError`` is retried here,
        with capped backoff, for as long as it takes (or until the partition goes)."""
        attempt = 0
        stats = self.metrics.of[sub.name]
        async with _kept_alive(lambda: work, self.settings.ack_wait / 3), _Waiting(stats) as wait:
            while True:
                batch, work = await self._decode(sub, lease, key, work)
                if batch is None:
                    return
                if not lease.valid():
                    await _settle(work, "nak", 0.0)
                    return
                try:
                    with (
                        Stopwatch(stats.latency),
                        self._span(sub, key, batch, work),
                        consuming(durable_name(self.service, sub, lease.partition)),
                    ):
                        await sub.handle(await self._completed(batch))
                except TemporaryError as exc:
                    attempt += 1
                    wait.started(exc)
                    if not await self._pause_holding(sub, lease, key, exc, attempt):
                        # The partition is going: its next owner takes the work over at once.
                        work, queue.pending = _merge(work, queue.pending), []
                        await _settle(work, "nak", 0.0)
                        return
                    work, queue.pending = _merge(work, queue.pending), []
                    continue
                except PermanentError as exc:
                    stats.error(exc)
                    log.error("%s %s: permanent error: %s", sub.name, key, exc)
                    await self._dead_letter(sub, work, exc, reason=exc.reason)
                except Exception as exc:
                    stats.error(exc)
                    log.exception("%s %s: unexpected error", sub.name, key)
                    delay = self._delay_for(work)
                    await self._give_back(sub, work, exc, delay)
                    self._deferred[sub.name].add(queue.pending, time.monotonic())
                    await self._defer_pending(queue, delay)
                    park(self._parked, (sub.name, key), delay, time.monotonic())
                else:
                    await _settle(work, "ack")
                    self._deferred[sub.name].forget(work)
                    now = time.monotonic()
                    self._acked[sub.name].add([w.sequence for w in work], now)
                    self._handled[sub.name].add(
                        key, list(zip(batch.sequences, batch.messages, strict=True)), now
                    )
                    stats.settled("ok", len(work))
                return

    def _span(
        self, sub: Subscription[Any], key: str, batch: Batch[Any], work: list[_Work]
    ) -> contextlib.AbstractContextManager[object]:
        """The run's span (``shared.tracing``), a child of the newest message's publisher."""
        return tracing.handling(
            self.service,
            sub.name,
            key,
            batch.messages,
            [w.msg.headers for w in work],
            deliveries=max(w.deliveries for w in work),
            exhausted=any(w.tries >= self.settings.max_deliver for w in work),
        )

    async def _pause_holding(
        self, sub: Subscription[Any], lease: Lease, key: str, exc: TemporaryError, attempt: int
    ) -> bool:
        """Wait before the next try while holding the messages; False if the partition goes.

        Holding, not ``nak``: every redelivery counts against ``max_deliver``, which is kept for
        messages that crash the process, so waiting out an outage must not spend deliveries.
        """
        delay = backoff(
            attempt, base=self.settings.backoff_base, cap=self.settings.backoff_max, hint=exc.delay
        )
        level = logging.INFO if attempt <= 3 else logging.WARNING
        log.log(
            level,
            "%s %s: temporary error (try %d), retrying in %.2fs: %s",
            sub.name,
            key,
            attempt,
            delay,
            exc,
        )
        runner = self._runners.get((lease.partition, lease.token))
        if runner is None:
            # A lease this consumer did not claim itself (messages offered directly).
            await asyncio.sleep(delay)
            return lease.valid()
        await runner.pause(delay)
        return not runner.stopping and lease.valid()

    async def _completed(self, batch: Batch[Any]) -> Batch[Any]:
        """``batch`` with every trimmed resource event made whole from the API server."""
        if not any_trimmed(batch.messages):
            return batch
        if self.objects is None:
            raise PermanentError(
                f"{self.service} received a trimmed resource event but has no API reader",
                reason="ObjectTrimmed",
            )
        messages = await complete_all(batch.messages, objects=self.objects)
        return dataclasses.replace(batch, messages=messages)

    @staticmethod
    async def _defer_pending(queue: _ObjectQueue, delay: float) -> None:
        # Newer messages must not overtake the ones just handed back, or a writer could apply
        # an older status patch after a newer one: they go back with the same delay.
        later, queue.pending = queue.pending, []
        await _settle(later, "nak", delay)

    def _delay_for(self, work: list[_Work]) -> float:
        most = max(w.deliveries for w in work)
        return backoff(most, base=self.settings.backoff_base, cap=self.settings.backoff_max)

    async def _decode(
        self, sub: Subscription[Any], lease: Lease, key: str, work: list[_Work]
    ) -> tuple[Batch[Any] | None, list[_Work]]:
        """Decode ``work`` in stream order; bad messages go to the dead letters right away, and
        so do messages delivered more often than ``max_deliver`` without being settled."""
        good: list[_Work] = []
        messages: dict[str, tuple[int, Message]] = {}
        for item in sorted(work, key=lambda w: w.sequence):
            if item.tries > self.settings.max_deliver:
                # Every earlier delivery ended without a settlement: the handler crashed or
                # hung the process. Running it again would only do that again.
                unsettled = Unsettled(f"run {item.tries} times, never settled")
                await self._dead_letter(sub, [item], unsettled, reason="RetriesExhausted")
                continue
            try:
                message = decode(item.msg.data, sub.model)
            except BadMessage as exc:
                self.metrics.of[sub.name].error(exc)
                await self._dead_letter(sub, [item], exc, reason="BadMessage")
                continue
            good.append(item)
            messages.setdefault(message.id, (item.sequence, message))
        if not good:
            return None, []
        late = [item.sequence for item in good if item.late]
        replayed = self._handled[sub.name].after(key, min(late)) if late else []
        if replayed:
            log.info(
                "%s %s: stream sequence %s arrived after newer ones of its object ran; "
                "it runs again with the %d after it",
                sub.name,
                key,
                min(late),
                len(replayed),
            )
        for sequence, message in replayed:
            messages.setdefault(message.id, (sequence, message))
        ordered = sorted(messages.values(), key=lambda entry: entry[0])
        batch = Batch(
            key=key,
            partition=lease.partition,
            messages=tuple(message for _, message in ordered),
            lease_token=lease.token,
            sequences=tuple(sequence for sequence, _ in ordered),
            replayed=len(replayed),
        )
        return batch, good

    async def _give_back(
        self,
        sub: Subscription[Any],
        work: list[_Work],
        exc: BaseException,
        delay: float,
    ) -> None:
        """Hand back after an unexpected exception; dead-letter what used up its deliveries."""
        exhausted = [w for w in work if w.tries >= self.settings.max_deliver]
        retry = [w for w in work if w.tries < self.settings.max_deliver]
        if exhausted:
            await self._dead_letter(sub, exhausted, exc, reason="RetriesExhausted")
        await _settle(retry, "nak", delay)
        self.metrics.of[sub.name].settled("error", len(retry))

    async def _dead_letter(
        self, sub: Subscription[Any], work: list[_Work], exc: BaseException, *, reason: str
    ) -> None:
        stats = self.metrics.of[sub.name]
        for item in work:
            entry = _dead_letter_entry(self.service, sub.stream.name, item, exc, reason)
            subject = subjects.dead_letter(self.service, item.msg.subject)
            try:
                # The entry keeps the original's trace header, so a retry can continue it.
                with tracing.continuing(item.msg.headers):
                    await self.bus.publish(
                        subject, entry, msg_id=f"dlq:{self.service}:{sub.name}:{item.sequence}"
                    )
            except TemporaryError:
                # Not recorded, so not given up on: JetStream delivers it again (its consumers
                # have no delivery limit of their own, so it cannot silently stop).
                log.warning("could not dead-letter %s; will retry", _named(item))
                await _settle([item], "nak", self.settings.backoff_base)
                stats.settled("retry")
                continue
            except PermanentError as failure:
                # The last record left: the log line and the metric name the message.
                log.error(
                    "dropped %s without a dead letter (%s: %s): %s",
                    _named(item),
                    reason,
                    entry.error,
                    failure,
                )
                await _settle([item], "term")
                stats.settled("dropped")
                continue
            log.warning("dead-lettered %s: %s", _named(item), entry.error)
            self._deferred[sub.name].forget([item])
            await _settle([item], "term")
            stats.settled("dead_letter")


class Unsettled(Exception):
    """What a message delivered too often without a settlement is dead-lettered with."""


def durable_name(service: str, sub: Subscription[Any], partition: int) -> str:
    """The durable consumer of ``service``'s ``sub`` on ``partition``."""
    return f"{service}-{sub.name}-p{partition}"


def _dead_letter_entry(
    service: str, stream: str, item: _Work, exc: BaseException, reason: str
) -> MessageDeadLettered:
    """The entry for ``item``: always within the bus's limits, whatever the original's size."""
    data = item.msg.data
    kept = data[:DEAD_LETTER_PAYLOAD_LIMIT]
    original_id = (item.msg.headers or {}).get("Nats-Msg-Id")
    return MessageDeadLettered(
        source=service,
        correlation_id=f"deadletter:{item.msg.subject}",
        causation_id=original_id,
        service=service,
        original_subject=item.msg.subject,
        original_id=original_id,
        error=f"{type(exc).__name__}: {exc}"[:DEAD_LETTER_ERROR_LIMIT],
        reason=reason,
        deliveries=item.deliveries,
        payload=kept.decode("utf-8", errors="replace"),
        payload_size=len(data),
        payload_sha256=hashlib.sha256(data).hexdigest(),
        payload_truncated=len(kept) < len(data),
        stream=stream,
        stream_sequence=item.sequence,
    )


async def _unsubscribe(psub: Any) -> None:
    if psub is not None:
        with contextlib.suppress(*NATS_ERRORS):
            await psub.unsubscribe()


def _named(item: _Work) -> str:
    """How a log line names one message: subject, stream sequence and id."""
    msg_id = (item.msg.headers or {}).get("Nats-Msg-Id")
    return f"{item.msg.subject} (stream sequence {item.sequence}, id {msg_id})"


def _merge(work: list[_Work], pending: list[_Work]) -> list[_Work]:
    return sorted([*work, *pending], key=lambda w: w.sequence)


def _work_of(msg: Msg) -> _Work:
    meta = msg.metadata
    return _Work(msg=msg, sequence=meta.sequence.stream, deliveries=meta.num_delivered)


async def _settle(work: list[_Work], how: str, delay: float | None = None) -> None:
    for item in work:
        try:
            if how == "ack":
                await item.msg.ack()
            elif how == "nak":
                await item.msg.nak(delay=delay or None)
            else:
                await item.msg.term()
        except NATS_ERRORS as exc:
            # The server will redeliver after ack_wait; handlers are idempotent.
            log.warning("could not %s %s: %r", how, item.msg.subject, exc)


@contextlib.asynccontextmanager
async def _kept_alive(work: Callable[[], list[_Work]], every: float) -> Any:
    """Tell JetStream we are still working on ``work()`` while a slow run, or a wait between
    retries, goes on (``work`` is read each time: messages that arrive meanwhile join it).

    Most runs finish long before ``every``; a timer, not a task, keeps them cheap.
    """

    async def heartbeat() -> None:
        while True:
            for item in work():
                with contextlib.suppress(*NATS_ERRORS):
                    await item.msg.in_progress()
            await asyncio.sleep(every)

    beating: list[asyncio.Task[None]] = []
    timer = asyncio.get_running_loop().call_later(
        every, lambda: beating.append(asyncio.create_task(heartbeat()))
    )
    try:
        yield
    finally:
        timer.cancel()
        for task in beating:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Waiting:
    """While an object's handler waits out a ``TemporaryError``: counted in the waiting gauge,
    every try in the retry counter, and a line when it heals."""

    def __init__(self, stats: SubscriptionMetrics) -> None:
        self.stats = stats
        self.since: float | None = None

    def started(self, exc: TemporaryError) -> None:
        self.stats.error(exc)
        self.stats.retried()
        if self.since is None:
            self.since = time.monotonic()
            self.stats.waiting.inc()

    async def __aenter__(self) -> _Waiting:
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.since is not None:
            self.stats.waiting.dec()
            log.info(
                "%s: waited %.1fs through temporary errors",
                self.stats.subscription,
                time.monotonic() - self.since,
            )


class _PartitionRunner:
    """Pulls every subscription of one owned partition until stopped or the lease lapses."""

    def __init__(self, consumer: Consumer, lease: Lease) -> None:
        self.consumer = consumer
        self.lease = lease
        self._stop = asyncio.Event()
        #: set to end the long polls under way: on stop, and when the connection came back
        self._wake = asyncio.Event()
        #: polls wait at most ``ack_wait`` until then (``_long_poll``: after a disturbance)
        self._wary_until = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        #: subscriptions whose vanished previous holder's in-flight messages have not come
        #: back yet (``_await_orphans``); while any has not, a hand-over would let the next
        #: holder pull newer messages before them (``Consumer._drop`` does not hand over)
        self._unsettled = set() if lease.handed_over else {s.name for s in consumer.subscriptions}

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._pull(sub)) for sub in self.consumer.subscriptions]

    def wake(self) -> None:
        """End the waiting long polls now (the loops ask again, or stop)."""
        self._wake.set()
        self._be_wary()

    def _be_wary(self) -> None:
        self._wary_until = time.monotonic() + WARY_ACK_WAITS * self.consumer.settings.ack_wait

    def resume(self) -> bool:
        """Pull again where a lapse stopped the pulls; True if any had stopped."""
        if self._stop.is_set():
            return False
        stopped = [i for i, task in enumerate(self._tasks) if task.done()]
        for i in stopped:
            sub = self.consumer.subscriptions[i]
            self._tasks[i] = asyncio.create_task(self._pull(sub, resumed=True))
        return bool(stopped)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def settled(self) -> bool:
        """No message of a vanished previous holder can still come back after newer ones."""
        return not self._unsettled

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the partition is being let go meanwhile."""
        await self._pause(seconds)

    async def _wait_until_usable(self) -> None:
        wait = self.lease.usable_from - time.monotonic()
        if wait > 0:
            log.info(
                "%s: partition %s usable in %.1fs (previous owner unknown)",
                self.consumer.service,
                self.lease.partition,
                wait,
            )
            await self._pause(wait)

    async def _pull(self, sub: Subscription[Any], *, resumed: bool = False) -> None:
        c = self.consumer
        await self._wait_until_usable()
        psub = None
        stats = c.metrics.of[sub.name]
        if not self.lease.handed_over and not resumed:
            psub = await self._await_orphans(sub)
        while not self._stop.is_set() and self.lease.valid():
            try:
                psub = psub or await self._subscribe(sub)
                msgs = await self._long_poll(psub)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except NATS_ERRORS as exc:
                log.warning("%s p%s: fetch failed: %r", sub.name, self.lease.partition, exc)
                # Nothing reads it again: left subscribed it would only collect what the server
                # still answers into it, one stranded subscription per failure.
                await _unsubscribe(psub)
                psub = None
                self._be_wary()
                await self._pause(c.settings.backoff_base)
                continue
            if msgs:
                stats.lag(self.lease.partition, msgs[-1].metadata.num_pending)
            if not self.lease.valid():
                # The lease lapsed while the poll waited: whoever holds the partition next
                # gets these at once, and nothing runs here without the lease.
                self.consumer._spawn(_settle([_work_of(m) for m in msgs], "nak"))
                break
            for msg in msgs:
                c.offer(sub, self.lease, msg)
        if not self._stop.is_set():
            # Nobody renewed the lease in time (the balancing loop was held up, or Redis is
            # away): the partition's messages wait until the next round renews the lease
            # (``resume``) or gives the partition up.
            log.warning(
                "%s p%s: lease lapsed without renewal; not pulling until it is renewed or lost",
                sub.name,
                self.lease.partition,
            )
        stats.forget(self.lease.partition)
        await _unsubscribe(psub)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _long_poll(self, psub: Any) -> list[Msg]:
        """One poll (``shared.bus.fetch_some``'s two steps) that waits up to ``fetch_timeout``
        for the first message, ended early by ``wake`` (stop, reconnect); ``[]`` when woken
        before a message came.

        Idle pull loops are what an idle service spends its CPU on: each wait that times out
        is a request and an answer, per partition and subscription. A long wait costs nothing
        while it lasts, because the server holds the request and answers the moment a
        message arrives; only letting go must not wait for it, hence ``wake``.

        After a disturbance (a reconnect, a new consumer leader, a failed fetch) a poll waits
        at most ``ack_wait``, for ``WARY_ACK_WAITS`` ack waits: an answer lost on its way leaves
        its message pending at the server, which sends it again only to a request that is
        waiting once ``ack_wait`` has passed, and the client, still waiting on the lost one,
        would ask again only after ``fetch_timeout``. In quiet times the polls stay long.

        Only the wait for the first message is cut short: once one came, the batch behind it
        is fetched to the end (``fetch_behind``, 0.2 s at most) whatever wakes meanwhile. A
        wake that cancelled it dropped messages the server had delivered, which came back
        after ``ack_wait`` behind newer ones of their object: in ``test_outage`` a leader
        advisory did so to the writer, which then wrote two old IdentityReady False patches
        over the newer True.
        """
        c = self.consumer
        timeout = c.settings.fetch_timeout
        if time.monotonic() < self._wary_until:
            timeout = min(timeout, c.settings.ack_wait)
        first = asyncio.ensure_future(psub.fetch(1, timeout=timeout))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({first, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        interrupted = not first.done()
        if interrupted:
            first.cancel()
            # The request the server still holds goes with the subscription's interest (a
            # stop unsubscribes) or with the restarted server (a reconnect); a message that
            # arrives for it waits in the subscription for the next fetch.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, *NATS_ERRORS):
                await first
        taken: list[Msg] = []
        if not interrupted or not (first.cancelled() or first.exception()):
            taken = await fetch_behind(psub, first.result(), c.settings.fetch_batch)
        if not self._stop.is_set():
            # A wake asks for a new request, which the next poll is in any case.
            self._wake.clear()
        return taken

    async def _await_orphans(self, sub: Subscription[Any]) -> Any:
        """After a crash takeover, let the dead owner's in-flight messages come back first.

        They are redelivered only when their ack wait runs out, while undelivered messages
        would flow at once: an older status patch could then land after a newer one. JetStream
        serves redeliveries before new messages, so waiting one ack wait restores stream order.
        Until they are back, the partition is not handed over either (``settled``): the next
        holder would take a hand-over for a sign that nothing is in flight.
        """
        try:
            psub = await self._subscribe(sub)
            orphans = (await psub.consumer_info()).num_ack_pending
        except NATS_ERRORS as exc:
            log.warning("%s p%s: cannot inspect consumer: %r", sub.name, self.lease.partition, exc)
            return None
        if orphans:
            log.info(
                "%s p%s: %d message(s) in flight at the previous owner; waiting %.0fs for them",
                sub.name,
                self.lease.partition,
                orphans,
                self.consumer.settings.ack_wait,
            )
            await self._pause(self.consumer.settings.ack_wait)
        if not self._stop.is_set():
            self._unsettled.discard(sub.name)
        return psub

    async def _subscribe(self, sub: Subscription[Any]) -> Any:
        c = self.consumer
        durable = durable_name(c.service, sub, self.lease.partition)
        config = ConsumerConfig(
            name=durable,
            durable_name=durable,
            filter_subjects=sub.filters(self.lease.partition),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=c.settings.ack_wait,
            # Unlimited here: the consumer counts deliveries and dead-letters itself, and a
            # JetStream limit would end redeliveries silently, dead letter or not.
            max_deliver=-1,
            max_ack_pending=c.settings.max_ack_pending,
        )
        return await c.bus.durable_pull(sub.stream.name, config)
