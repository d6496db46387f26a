"""Which replica owns which partition: leases in Redis, placed by rendezvous hashing.

Why partitions and not a lock per object: a lock per object costs Redis round trips on every
message and still lets two replicas pull different messages of one object from a shared
consumer, which breaks ordering (a status patch applied before an older one). With partitions,
each (service, partition) has its own durable consumer and only the lease holder pulls from
it, so one replica sees an object's messages in stream order and can coalesce them in memory.

The protocol, per service:

- Every replica heartbeats its member id into a sorted set (score = expiry time). The live
  members define, by rendezvous (highest-random-weight) hashing, who *should* own each
  partition; a member joining or leaving moves only about ``1/n`` of the partitions.
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


def rendezvous_owner(partition: int, members: Iterable[str]) -> str | None:
    """The member with the highest hash weight for ``partition`` (None if no members)."""

    def weight(member: str) -> bytes:
        return hashlib.blake2b(f"{member}/{partition}".encode(), digest_size=8).digest()

    return max(members, key=weight, default=None)


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
        return {p for p in range(self.partitions) if rendezvous_owner(p, members) == self.member}

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
