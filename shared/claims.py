"""Work that follows partition claims: started on a claim, cancelled the moment it is lost.

Some work is not carried by any message but belongs to the partitions a replica holds:
seeding a cache, arming the timers of the objects in a partition, a resync that prunes what
nothing backs any more, a watch per object. A service declares it as a ``ClaimFollower``;
the consumer (``shared.consumer``) drives it, so no service diffs fencing tokens or keeps
task sets of its own:

* ``claimed(claim)`` runs in a task of its own for each new claim (a partition, or the same
  partition taken again after another replica held it: a new fencing token). A
  ``TemporaryError`` retries it with capped backoff for as long as the claim lasts; any other
  exception is logged (claim work is a safety net beside the messages, never a step whose
  failure would stop them).
* When a partition is lost, its task is cancelled at once, before ``lost`` is told: work
  computed from a view of the partition must not publish after another replica took over.
* ``lost(partitions)`` is awaited with the partitions that went (all of them when the replica
  stops), for cleanup such as dropping their timers.

Claims made together (a start, a rebalance) share a ``ClaimRound``: ``once`` runs one costly
read (a list of every Cluster) for all of them, so N partitions claimed at start cost one
list, while each partition's task can still be cancelled alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from shared.retry import retry_until_done

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClaimRound:
    """What the claims of one rebalance share: each named read runs once for all of them."""

    def __init__(self) -> None:
        self._results: dict[str, Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def once(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """``work()``'s result, computed by the first claim that asks; a first asker cancelled
        midway (its partition lost) leaves the read to the next one."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._results:
                self._results[key] = await work()
            result: T = self._results[key]
            return result


@dataclass(frozen=True)
class Claim:
    """One partition as claimed under one fencing token."""

    partition: int
    token: int
    round: ClaimRound = field(default_factory=ClaimRound, compare=False, repr=False)


class ClaimFollower(Protocol):
    async def claimed(self, claim: Claim) -> None: ...

    async def lost(self, partitions: frozenset[int]) -> None: ...


class ClaimTracker:
    """Drives a ``ClaimFollower`` from the partitions a consumer holds (``follow``)."""

    def __init__(
        self, follower: ClaimFollower, *, service: str, retry_base: float, retry_max: float
    ) -> None:
        self.follower = follower
        self.service = service
        self.retry_base = retry_base
        self.retry_max = retry_max
        self._held: dict[int, int] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def follow(self, held: Mapping[int, int]) -> None:
        """Tell the follower what changed since the last call; ``held``: partition -> token."""
        # A partition taken again under a new token was held by another replica meanwhile:
        # its old work is stale, so it goes like a lost one and starts afresh.
        gone = frozenset(p for p, t in self._held.items() if held.get(p) != t)
        fresh = {p: t for p, t in held.items() if self._held.get(p) != t}
        self._held = dict(held)
        for partition in gone:
            await self.cancel(partition)
        if gone:
            await self._tell_lost(gone)
        claim_round = ClaimRound()
        for partition, token in sorted(fresh.items()):
            claim = Claim(partition, token, claim_round)
            task = asyncio.create_task(self._run(claim), name=f"claim:{self.service}:{partition}")
            self._tasks[partition] = task

    async def close(self) -> None:
        await self.follow({})

    async def _tell_lost(self, partitions: frozenset[int]) -> None:
        try:
            await self.follower.lost(partitions)
        except Exception:
            log.exception("%s: cleanup after losing partitions %s failed", self.service, partitions)

    async def cancel(self, partition: int) -> None:
        """Stop ``partition``'s work now (it is being let go); ``follow`` tells ``lost``."""
        task = self._tasks.pop(partition, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, claim: Claim) -> None:
        try:
            await retry_until_done(
                lambda: self.follower.claimed(claim),
                what=f"do the work of claimed partition {claim.partition} ({self.service})",
                base=self.retry_base,
                cap=self.retry_max,
            )
        except Exception:
            log.exception("%s: work for claimed partition %s failed", self.service, claim.partition)
