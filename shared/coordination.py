"""Which replica owns which partition: leases in Redis, placed by bounded-load rendezvous.

Why partitions and not a lock per object: a lock per object costs Redis round trips on every
message and still lets two replicas pull different messages of one object from a shared
consumer, which breaks ordering (a status patch applied before an older one). With partitions,
each (service, partition) has its own durable consumer and only the lease holder pulls from
it, so one replica sees an object's messages in stream order and can coalesce them in memory.

The protocol, per service:

- Every replica heartbeats its member id into a sorted set (score = expiry time). The live
  members define, by ``placement`` (below), who *should* own each partition.
- Owning is a Redis key ``SET NX PX ttl`` holding ``<member>:<fencing token>``; the token comes
  from ``INCR`` and only grows, so anything stamped with it can tell a stale owner apart.
- Leases are renewed every ``ttl/3`` with compare-and-extend. A replica stops consuming a
  partition as soon as its *local* deadline (last successful renewal + ``ttl`` - margin)
  passes, so it has stopped before the key can expire and be taken by someone else.
- A handed-over partition is released with a short-lived ``released`` tombstone; the next owner
  may start at once. A partition whose key simply *vanished* (holder crashed, or Redis restarted
  and lost its data) is claimed, but consumed only after one ``ttl`` of grace, because the old
  holder may still believe in its local deadline for that long.

Redis down means no renewals, so every replica stops consuming until it is back: capibus
chooses exclusivity over availability, and JetStream keeps the messages meanwhile.

Placement: rendezvous hashing with bounded loads. Every (member, partition) pair has a hash
weight; taking the pairs from the highest weight down, each partition goes to the first member
it meets that still has room. With ``n`` members each has room for ``partitions // n``, and the
first ``partitions % n`` to fill up have room for one more, so no member holds more than
``ceil(partitions / n)`` nor fewer than ``partitions // n``. Every replica computes it from the
member set and the partition count alone, so they agree without talking, and a member joining
or leaving moves few partitions beyond the ones it takes or gives up: on average 1.0-1.5
times its own share, about twice where the bound drops (16 partitions, 7 to 8 members: every
holder of 3 must give one up), never more than half (``tests/unit/test_coordination.py``).

Why not plain rendezvous (each partition to its highest-weight member): over 16 partitions it
spreads unevenly, and a burst lasts as long as the busiest replica's share. The benchmark's
replica names got 7 and 9 partitions with two replicas and 1, 7, 2 and 6 with four, so two
replicas could be at most 1.75x and four 2.27x as fast as one (``bench/ANALYSIS.md``, w:
"What limits: where the partitions land"); over random names the median was 1.72x and 2.63x.
Now they hold 8 and 8, and 4 each.

Why a floor as well as the cap: with the cap alone (``ceil(16/7)`` = 3), 7 replicas left one
of them without a partition in a quarter of the name sets tried. Why the pairs by weight
rather than the partitions one by one in index order, each to its best member with room: the
result does not hang on how partitions are numbered, and over random names it moved slightly
fewer partitions on a join or leave (16 partitions, 4 to 5 members: 4.2 moves on average
against 4.4, the newcomer's own share being 3.2). The bound is on partitions, not on work: a
partition holds whatever Clusters hash to it.

The placement is a contract between the replicas of a service, old builds included: while a
rolling upgrade runs builds that place differently side by side, a partition can be wanted by
two replicas (whoever holds it keeps it) or by none (it waits, its messages kept in JetStream,
until the replicas agree again). The placement of known names is pinned by a unit test.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from shared.errors import LockUnavailable
from shared.resp import Redis, RedisError, RedisUnavailable, Reply

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError)

# Take the key if it is free or tombstoned: 0 = held by another, +token = was tombstoned
# (handed over, no grace needed), -token = was absent (grace needed).
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 9) ~= 'released:' then return 0 end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
if current then return token else return -token end
"""
# Every lease of one member in one call (a balancing round costs one round trip, not one per
# partition): ARGV[1] the TTL, ARGV[i + 1] the value KEYS[i] must hold; 1 renewed, 0 lost.
_RENEW_ALL = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[1])
  else
    out[i] = 0
  end
end
return out
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], 'released:' .. ARGV[1], 'PX', ARGV[2]) and 1
end
return 0
"""


def _integer(reply: Reply) -> int:
    if not isinstance(reply, int):
        raise RedisUnavailable(f"expected an integer reply, got {reply!r}")
    return reply


def _weight(member: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{member}/{partition}".encode(), digest_size=8).digest()


def placement(partitions: int, members: Iterable[str]) -> dict[int, str]:
    """The owner of each of ``partitions`` among ``members`` (empty if there are none): the
    (member, partition) pairs from the highest weight down, each partition to the first member
    it meets with room; every member has room for ``partitions // members``, and the first
    ``partitions % members`` of them to fill up for one more (the module docstring)."""
    names = sorted(set(members))
    if not names:
        return {}
    floor = partitions // len(names)
    one_more = partitions - floor * len(names)
    held = dict.fromkeys(names, 0)
    owners: dict[int, str] = {}
    pairs = sorted(((_weight(m, p), p, m) for p in range(partitions) for m in names), reverse=True)
    for _, partition, member in pairs:
        if partition in owners or held[member] > floor:
            continue
        if held[member] == floor:
            if not one_more:
                continue
            one_more -= 1
        owners[partition] = member
        held[member] += 1
    return owners


def share(member: str, partitions: int, members: Iterable[str]) -> set[int]:
    """The partitions ``placement`` gives ``member``."""
    return {p for p, owner in placement(partitions, members).items() if owner == member}


@dataclass
class Lease:
    partition: int
    token: int
    value: str
    deadline: float
    usable_from: float
    #: False when the previous holder vanished instead of handing over (it may have crashed
    #: with messages in flight)
    handed_over: bool = True

    def valid(self, now: float | None = None) -> bool:
        return (now or time.monotonic()) < self.deadline

    def usable(self, now: float | None = None) -> bool:
        now = now or time.monotonic()
        return self.usable_from <= now < self.deadline


class PartitionLeases:
    """Lease bookkeeping for one member of one service; all I/O is Redis."""

    def __init__(
        self,
        client: Redis,
        *,
        service: str,
        member: str,
        partitions: int,
        ttl: float = 10.0,
    ) -> None:
        self.redis = client
        self.service = service
        self.member = member
        self.partitions = partitions
        self.ttl = ttl
        self.held: dict[int, Lease] = {}

    def _key(self, suffix: str) -> str:
        return f"capibus:{self.service}:{suffix}"

    async def heartbeat(self) -> list[str]:
        """Refresh our membership and return the live members (sorted)."""
        now_ms = int(time.time() * 1000)
        key = self._key("members")
        try:
            *_, members = await self.redis.transaction(
                ("ZADD", key, now_ms + int(self.ttl * 1000), self.member),
                ("ZREMRANGEBYSCORE", key, "-inf", now_ms),
                ("ZRANGE", key, 0, -1),
            )
        except REDIS_ERRORS as exc:
            raise LockUnavailable(f"membership heartbeat: {exc!r}") from exc
        if not isinstance(members, list):
            raise LockUnavailable(f"membership heartbeat: ZRANGE answered {members!r}")
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    async def leave(self) -> None:
        try:
            await self.redis.zrem(self._key("members"), self.member)
        except REDIS_ERRORS as exc:
            log.warning("could not leave membership: %r", exc)

    def desired(self, members: list[str]) -> set[int]:
        return share(self.member, self.partitions, members)

    async def acquire(self, partition: int) -> Lease | None:
        started = time.monotonic()
        try:
            result = _integer(
                await self.redis.eval(
                    _ACQUIRE,
                    2,
                    self._key(f"partition:{partition}"),
                    self._key(f"fence:{partition}"),
                    self.member,
                    int(self.ttl * 1000),
                )
            )
        except REDIS_ERRORS as exc:
            raise LockUnavailable(f"acquire partition {partition}: {exc!r}") from exc
        if result == 0:
            return None
        token = abs(result)
        # A vanished key may mean an old holder that still trusts its deadline: wait it out.
        grace = 0.0 if result > 0 else self.ttl
        lease = Lease(
            partition=partition,
            token=token,
            value=f"{self.member}:{token}",
            deadline=started + self.ttl * 0.8,
            usable_from=started + grace,
            handed_over=result > 0,
        )
        self.held[partition] = lease
        return lease

    async def renew(self, lease: Lease) -> bool:
        (renewed,) = await self.renew_all([lease])
        return renewed

    async def renew_all(self, leases: list[Lease]) -> list[bool]:
        """Renew ``leases`` in one round trip; for each, whether it is still held. When Redis
        cannot be reached, each stays held until its local deadline."""
        if not leases:
            return []
        started = time.monotonic()
        keys = [self._key(f"partition:{lease.partition}") for lease in leases]
        try:
            reply = await self.redis.eval(
                _RENEW_ALL,
                len(keys),
                *keys,
                int(self.ttl * 1000),
                *(lease.value for lease in leases),
            )
        except REDIS_ERRORS as exc:
            log.warning("renewing %d partition(s) failed: %r", len(leases), exc)
            return [lease.valid() for lease in leases]
        if not isinstance(reply, list) or len(reply) != len(leases):
            log.warning("renewing partitions: unexpected reply %r", reply)
            return [lease.valid() for lease in leases]
        results = []
        for lease, ok in zip(leases, reply, strict=True):
            if ok:
                lease.deadline = started + self.ttl * 0.8
            else:
                self.held.pop(lease.partition, None)
            results.append(bool(ok))
        return results

    async def release(self, lease: Lease) -> None:
        self.held.pop(lease.partition, None)
        try:
            await self.redis.eval(
                _RELEASE,
                1,
                self._key(f"partition:{lease.partition}"),
                lease.value,
                int(self.ttl * 1000),
            )
        except REDIS_ERRORS as exc:
            log.warning("release partition %s failed (it will expire): %r", lease.partition, exc)
