"""``capibus status``: who runs, who holds which partition, what waits, what was given up on.

Everything shown is already kept somewhere; the command only reads it:

- **Replicas and partitions** come from the partition leases in Redis (``shared.coordination``):
  ``capibus:<service>:members`` is a sorted set of member ids scored by when their heartbeat
  expires (so a heartbeat's age is the lease TTL minus what is left of it; the TTL is
  ``CAPIBUS_LEASE_TTL``, as the services read it), and ``capibus:<service>:partition:<n>``
  holds ``<member>:<fencing token>`` while a member holds the partition, ``released:…`` for a
  moment after it handed the partition over, nothing once it lapsed. Redis is read with the
  services' own client (``shared.resp``): ``SCAN`` for the services, ``ZRANGE`` and one
  ``MGET`` per service.
- **Lag** comes from JetStream's consumer info of the durable consumers, named
  ``<service>-<subscription>-p<partition>`` (``shared.consumer``): pending (not yet delivered),
  ack pending (delivered, not yet acknowledged), redelivered. The oldest unacknowledged
  message is the first one after the consumer's ack floor that matches its filters, read by
  subject from the stream (one request per filter of each consumer with a backlog), so its
  age is how long the oldest work has waited.
- **Dead letters** are counted per service from the dead-letter stream's per-subject counts
  (``capibus.dlq.<service>.…``), without reading the letters (``capibus dlq list`` does).

Services are whatever these name: a member set in Redis, a durable consumer, a dead letter. The
command imports no service (the subscription tables live in ``services/*/app.py``, which
``cli`` may not import), so a consumer name is split by the services Redis knows, else at its
first ``-``: no service name has one.

The module is in two halves: ``observe`` reads (Redis, JetStream) into an ``Observed`` of plain
values, ``assemble`` turns that into a ``Status`` with its warnings, and ``lines``/``as_json``
show it. The second half is pure, so every rule is unit-tested without a server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats.js.errors

from cli.errors import Unreachable
from cli.render import Style, table
from shared import subjects
from shared.bus import NATS_ERRORS, Bus
from shared.errors import BusUnavailable
from shared.resp import Redis, RedisError, Reply
from shared.settings import transport_security

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_DURABLE = re.compile(r"^(?P<rest>.+)-p(?P<partition>\d+)$")
_KEY = re.compile(r"^capibus:(?P<service>[^:]+):members$")
#: consumers listed per request (JetStream's page size)
_PAGE = 256


# --- what was read --------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerState:
    """One durable consumer as JetStream reports it."""

    stream: str
    name: str
    pending: int
    ack_pending: int
    redelivered: int
    #: when the oldest message not yet acknowledged was stored (None: nothing waits)
    oldest_unacked: datetime | None = None


@dataclass(frozen=True)
class Observed:
    """Everything ``observe`` read, as plain values."""

    now: datetime
    partitions: int
    lease_ttl: float
    #: service -> member -> when its heartbeat expires (epoch seconds)
    members: Mapping[str, Mapping[str, float]]
    #: service -> partition -> the lease key's value
    leases: Mapping[str, Mapping[int, str]]
    consumers: Sequence[ConsumerState]
    #: service -> dead letters stored
    dead_letters: Mapping[str, int] = field(default_factory=dict)


# --- the assembled status -------------------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    name: str
    partitions: tuple[int, ...]
    #: seconds since its last heartbeat; None for a holder that no longer heartbeats
    heartbeat_age: float | None
    live: bool


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    holder: str | None
    pending: int
    ack_pending: int
    redelivered: int
    oldest_unacked_age: float | None

    @property
    def waiting(self) -> int:
        return self.pending + self.ack_pending


@dataclass(frozen=True)
class SubscriptionLag:
    subscription: str
    stream: str
    partitions: tuple[PartitionLag, ...]

    @property
    def pending(self) -> int:
        return sum(p.pending for p in self.partitions)

    @property
    def ack_pending(self) -> int:
        return sum(p.ack_pending for p in self.partitions)

    @property
    def redelivered(self) -> int:
        return sum(p.redelivered for p in self.partitions)

    @property
    def oldest_unacked_age(self) -> float | None:
        return max(
            (p.oldest_unacked_age for p in self.partitions if p.oldest_unacked_age is not None),
            default=None,
        )


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    replicas: tuple[Replica, ...]
    subscriptions: tuple[SubscriptionLag, ...]
    #: partitions no replica holds (only for a service that takes partitions)
    unheld: tuple[int, ...]
    dead_letters: int

    @property
    def pending(self) -> int:
        return sum(s.pending for s in self.subscriptions)

    @property
    def ack_pending(self) -> int:
        return sum(s.ack_pending for s in self.subscriptions)

    @property
    def live_replicas(self) -> int:
        return sum(r.live for r in self.replicas)


@dataclass(frozen=True)
class Alert:
    service: str
    text: str


@dataclass(frozen=True)
class Status:
    services: tuple[ServiceStatus, ...]
    alerts: tuple[Alert, ...]
    partitions: int

    @property
    def totals(self) -> dict[str, int]:
        return {
            "services": len(self.services),
            "replicas": sum(s.live_replicas for s in self.services),
            "pending": sum(s.pending for s in self.services),
            "ack_pending": sum(s.ack_pending for s in self.services),
            "redelivered": sum(sub.redelivered for s in self.services for sub in s.subscriptions),
            "dead_letters": sum(s.dead_letters for s in self.services),
        }


def split_consumer(name: str, known: Iterable[str] = ()) -> tuple[str, str, int] | None:
    """(service, subscription, partition) of a durable consumer's name, or None for a name
    not of that shape (an ephemeral reader's). A service Redis knows wins; else the name is
    split at its first ``-``."""
    match = _DURABLE.match(name)
    if match is None:
        return None
    rest, partition = match["rest"], int(match["partition"])
    for service in sorted(known, key=len, reverse=True):
        if rest.startswith(f"{service}-") and len(rest) > len(service) + 1:
            return service, rest[len(service) + 1 :], partition
    service, sep, subscription = rest.partition("-")
    return (service, subscription, partition) if sep and subscription else None


def holder_of(value: str | None) -> str | None:
    """The member a lease key's value names; None when free or just handed over."""
    if not value or value.startswith("released:"):
        return None
    member, sep, _token = value.rpartition(":")
    return member if sep else None


def assemble(seen: Observed) -> Status:
    """The status of every service ``seen`` names, with what needs a person's eye."""
    known = set(seen.members) | set(seen.leases)
    by_service: dict[str, list[tuple[ConsumerState, str, int]]] = defaultdict(list)
    for consumer in seen.consumers:
        parts = split_consumer(consumer.name, known)
        if parts is not None:
            service, subscription, partition = parts
            by_service[service].append((consumer, subscription, partition))
    names = sorted(known | set(by_service) | {s for s, n in seen.dead_letters.items() if n})
    services = tuple(_service(name, seen, by_service.get(name, [])) for name in names)
    alerts = tuple(alert for status in services for alert in _alerts(status))
    return Status(services, alerts, seen.partitions)


def _service(
    name: str, seen: Observed, consumers: list[tuple[ConsumerState, str, int]]
) -> ServiceStatus:
    holders = {p: holder_of(v) for p, v in seen.leases.get(name, {}).items()}
    replicas = _replicas(name, seen, holders)
    partitioned = bool(consumers or seen.members.get(name) or holders)
    held = {p for p, h in holders.items() if h is not None}
    unheld = tuple(p for p in range(seen.partitions) if p not in held) if partitioned else ()
    return ServiceStatus(
        name=name,
        replicas=replicas,
        subscriptions=_subscriptions(consumers, holders, seen.now),
        unheld=unheld,
        dead_letters=seen.dead_letters.get(name, 0),
    )


def _replicas(name: str, seen: Observed, holders: Mapping[int, str | None]) -> tuple[Replica, ...]:
    now = seen.now.timestamp()
    expiries = seen.members.get(name, {})
    held: dict[str, list[int]] = defaultdict(list)
    for partition, holder in sorted(holders.items()):
        if holder is not None:
            held[holder].append(partition)
    out = []
    for member in sorted(set(expiries) | set(held)):
        expiry = expiries.get(member)
        age = None if expiry is None else max(0.0, now - (expiry - seen.lease_ttl))
        live = expiry is not None and expiry > now
        out.append(Replica(member, tuple(held.get(member, ())), age, live))
    return tuple(out)


def _subscriptions(
    consumers: list[tuple[ConsumerState, str, int]],
    holders: Mapping[int, str | None],
    now: datetime,
) -> tuple[SubscriptionLag, ...]:
    grouped: dict[tuple[str, str], list[PartitionLag]] = defaultdict(list)
    for consumer, subscription, partition in consumers:
        oldest = consumer.oldest_unacked
        grouped[(subscription, consumer.stream)].append(
            PartitionLag(
                partition=partition,
                holder=holders.get(partition),
                pending=consumer.pending,
                ack_pending=consumer.ack_pending,
                redelivered=consumer.redelivered,
                oldest_unacked_age=None
                if oldest is None
                else max(0.0, (now - oldest).total_seconds()),
            )
        )
    return tuple(
        SubscriptionLag(sub, stream, tuple(sorted(lags, key=lambda p: p.partition)))
        for (sub, stream), lags in sorted(grouped.items())
    )


def _alerts(status: ServiceStatus) -> list[Alert]:
    name, out = status.name, []
    if status.unheld and not status.live_replicas:
        out.append(Alert(name, f"no live replica: {len(status.unheld)} partition(s) held by none"))
    elif status.unheld:
        out.append(Alert(name, f"partition(s) {ranges(status.unheld)} held by no replica"))
    for sub in status.subscriptions:
        for lag in sub.partitions:
            if lag.waiting and lag.holder is None:
                out.append(
                    Alert(
                        name,
                        f"{sub.subscription} p{lag.partition}: {lag.waiting} message(s) waiting "
                        "and no replica holds the partition",
                    )
                )
    if status.dead_letters:
        out.append(
            Alert(
                name,
                f"{status.dead_letters} dead letter(s): capibus dlq list --service {name}",
            )
        )
    return out


# --- showing it -----------------------------------------------------------------------------


def ranges(numbers: Iterable[int]) -> str:
    """``0-2,5,7-9``: sorted numbers with runs folded; ``-`` for none."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "-"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


_REPLICA_HEADER = ("REPLICA", "PARTITIONS", "HEARTBEAT")
_LAG_HEADER = ("SUBSCRIPTION", "STREAM", "PENDING", "ACK PENDING", "REDELIVERED", "OLDEST UNACKED")


def lines(status: Status, style: Style) -> list[str]:
    """A block per service (replicas, then lag per subscription), totals, then warnings."""
    out: list[str] = []
    for service in status.services:
        out += [*_service_lines(service, status.partitions, style), ""]
    totals = status.totals
    out.append(
        style.paint(
            f"{totals['services']} service(s), {totals['replicas']} live replica(s), "
            f"{totals['pending']} pending, {totals['ack_pending']} ack pending, "
            f"{totals['redelivered']} redelivered, {totals['dead_letters']} dead letter(s)",
            "bold",
        )
    )
    for alert in status.alerts:
        out.append(style.paint(f"warning: {alert.service}: {alert.text}", "yellow"))
    return out


def _service_lines(service: ServiceStatus, partitions: int, style: Style) -> list[str]:
    held = partitions - len(service.unheld) if service.unheld or service.replicas else 0
    head = f"{service.name}: {service.live_replicas} live replica(s)"
    if service.replicas or service.unheld:
        head += f", {held}/{partitions} partitions held"
    if service.dead_letters:
        head += f", {service.dead_letters} dead letter(s)"
    out = [style.paint(head, "bold")]
    if service.replicas:
        rows = [
            [
                r.name if r.live else f"{r.name} (gone)",
                ranges(r.partitions),
                "-" if r.heartbeat_age is None else f"{age(r.heartbeat_age)} ago",
            ]
            for r in service.replicas
        ]
        out += ["  " + line for line in table(rows, _REPLICA_HEADER, style)]
    if service.subscriptions:
        rows = [
            [
                s.subscription,
                s.stream.removeprefix("CAPIBUS_").lower(),
                str(s.pending),
                str(s.ack_pending),
                str(s.redelivered),
                age(s.oldest_unacked_age),
            ]
            for s in service.subscriptions
        ]
        out += ["  " + line for line in table(rows, _LAG_HEADER, style)]
    return out


def _partition_json(lag: PartitionLag) -> dict[str, Any]:
    return {
        "partition": lag.partition,
        "holder": lag.holder,
        "pending": lag.pending,
        "ack_pending": lag.ack_pending,
        "redelivered": lag.redelivered,
        "oldest_unacked_age_seconds": lag.oldest_unacked_age,
    }


def as_json(status: Status) -> str:
    """The whole status as one line of JSON."""
    services = []
    for service in status.services:
        subscriptions = [
            {
                "subscription": s.subscription,
                "stream": s.stream,
                "pending": s.pending,
                "ack_pending": s.ack_pending,
                "redelivered": s.redelivered,
                "oldest_unacked_age_seconds": s.oldest_unacked_age,
                "partitions": [_partition_json(p) for p in s.partitions],
            }
            for s in service.subscriptions
        ]
        services.append(
            {
                "service": service.name,
                "replicas": [
                    {
                        "name": r.name,
                        "live": r.live,
                        "partitions": list(r.partitions),
                        "heartbeat_age_seconds": r.heartbeat_age,
                    }
                    for r in service.replicas
                ],
                "unheld_partitions": list(service.unheld),
                "subscriptions": subscriptions,
                "pending": service.pending,
                "ack_pending": service.ack_pending,
                "dead_letters": service.dead_letters,
            }
        )
    return json.dumps(
        {
            "partitions": status.partitions,
            "services": services,
            "totals": status.totals,
            "warnings": [asdict(a) for a in status.alerts],
        },
        separators=(",", ":"),
    )


# --- reading --------------------------------------------------------------------------------


async def observe(
    bus: Bus, redis: Redis, *, partitions: int, lease_ttl: float, redis_url: str
) -> Observed:
    """Read the leases (Redis first: an unreachable Redis is said before anything is read
    from JetStream), the durable consumers and the dead-letter counts."""
    now = datetime.now(UTC)
    reader = _RedisReader(redis, redis_url)
    members = await reader.members()
    consumers = await _consumers(bus)
    named = {parts[0] for c in consumers if (parts := split_consumer(c.name, members))}
    leases = await reader.leases(sorted(set(members) | named), partitions)
    dead = await _dead_letter_counts(bus)
    return Observed(now, partitions, lease_ttl, members, leases, consumers, dead)


@dataclass(frozen=True)
class _RedisReader:
    redis: Redis
    url: str

    async def members(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for key in await self._scan("capibus:*:members"):
            match = _KEY.match(key)
            if match is None:
                continue
            flat = _strings(await self._call("ZRANGE", key, 0, -1, "WITHSCORES"))
            scores = {m: float(s) / 1000 for m, s in zip(flat[::2], flat[1::2], strict=True)}
            out[match["service"]] = scores
        return out

    async def leases(self, services: Sequence[str], partitions: int) -> dict[str, dict[int, str]]:
        out: dict[str, dict[int, str]] = {}
        for service in services:
            keys = [f"capibus:{service}:partition:{p}" for p in range(partitions)]
            values = await self._call("MGET", *keys)
            held = values if isinstance(values, list) else []
            out[service] = {p: v.decode() for p, v in enumerate(held) if isinstance(v, bytes) and v}
        return out

    async def _scan(self, pattern: str) -> list[str]:
        cursor, keys = b"0", []
        while True:
            reply = await self._call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            if not isinstance(reply, list) or len(reply) != 2:
                raise Unreachable(f"Redis at {self.url} answered SCAN with {reply!r}")
            cursor = reply[0] if isinstance(reply[0], bytes) else b"0"
            keys += _strings(reply[1])
            if cursor == b"0":
                return sorted(set(keys))

    async def _call(self, *args: str | bytes | int) -> Reply:
        try:
            return await self.redis.execute(*args)
        except (RedisError, OSError) as exc:
            reason = exc.__cause__ if exc.__cause__ is not None and str(exc.__cause__) else exc
            raise Unreachable(f"cannot reach Redis at {self.url}: {reason}") from exc


def _strings(reply: Reply) -> list[str]:
    items = reply if isinstance(reply, list) else []
    return [i.decode() for i in items if isinstance(i, bytes)]


async def _consumers(bus: Bus) -> list[ConsumerState]:
    infos = [
        (spec.name, info) for spec in subjects.ALL_STREAMS for info in await _listed(bus, spec.name)
    ]
    durable = [(stream, info) for stream, info in infos if info.config.durable_name]
    slots = asyncio.Semaphore(16)

    async def state(stream: str, info: Any) -> ConsumerState:
        async with slots:
            oldest = await _oldest_unacked(bus, stream, info)
        return ConsumerState(
            stream=stream,
            name=str(info.name),
            pending=int(info.num_pending or 0),
            ack_pending=int(info.num_ack_pending or 0),
            redelivered=int(info.num_redelivered or 0),
            oldest_unacked=oldest,
        )

    return list(await asyncio.gather(*(state(s, i) for s, i in durable)))


async def _listed(bus: Bus, stream: str) -> list[Any]:
    """Every consumer of ``stream`` (JetStream lists them a page at a time)."""
    out: list[Any] = []
    while True:
        try:
            page = await bus.js.consumers_info(stream, offset=len(out) or None)
        except nats.js.errors.NotFoundError:
            return out  # no such stream: nothing was ever published to it
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"list consumers of {stream}: {exc!r}") from exc
        out += page
        if len(page) < _PAGE:
            return out


async def _oldest_unacked(bus: Bus, stream: str, info: Any) -> datetime | None:
    """When the first message after the ack floor that the consumer's filters match was
    stored: the oldest work not yet done. None when nothing waits."""
    if not (info.num_pending or info.num_ack_pending):
        return None
    config = info.config
    filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
    after = int(info.ack_floor.stream_seq if info.ack_floor else 0) + 1
    found = []
    for subject in filters:
        try:
            raw = await bus.js.get_msg(stream, seq=after, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            continue
        except NATS_ERRORS as exc:
            raise BusUnavailable(f"read {stream} after #{after}: {exc!r}") from exc
        if raw.time is not None:
            found.append(raw.time)
    return min(found, default=None)


async def _dead_letter_counts(bus: Bus) -> dict[str, int]:
    """Dead letters per service, from the stream's per-subject counts."""
    name = subjects.DEADLETTER.name
    try:
        info = await bus.js.stream_info(name, subjects_filter=subjects.dead_letter("*", ">"))
    except nats.js.errors.NotFoundError:
        return {}
    except NATS_ERRORS as exc:
        raise BusUnavailable(f"count dead letters: {exc!r}") from exc
    out: dict[str, int] = defaultdict(int)
    for subject, count in (info.state.subjects or {}).items():
        out[subject.split(".")[2]] += int(count)
    return dict(out)


# --- the command ------------------------------------------------------------------------------


async def command(args: argparse.Namespace, bus: Bus) -> int:
    tls = transport_security().context(args.redis_url)
    redis = Redis.from_url(args.redis_url, timeout=args.timeout, tls=tls)
    try:
        seen = await observe(
            bus,
            redis,
            partitions=args.partitions,
            lease_ttl=args.lease_ttl,
            redis_url=args.redis_url,
        )
    finally:
        await redis.aclose()
    status = assemble(seen)
    if args.json:
        print(as_json(status))
    else:
        print("\n".join(lines(status, Style.for_stream(sys.stdout, args.color))))
    return 0


def defaults() -> dict[str, Any]:
    """The options' defaults, from the variables the services read."""
    return {
        "redis_url": os.environ.get("REDIS_URL")
        or os.environ.get("CAPIBUS_REDIS_URL", DEFAULT_REDIS_URL),
        "partitions": int(os.environ.get("CAPIBUS_PARTITIONS", "16")),
        "lease_ttl": float(os.environ.get("CAPIBUS_LEASE_TTL", "6")),
    }
