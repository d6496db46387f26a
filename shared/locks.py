"""Per-key mutual exclusion inside one process.

The consumer already runs one handler at a time per *object*; a lifecycle service also reacts
to objects that are not the Cluster (its Lease, its OIDCClient, its CAPI Cluster), each in its
own queue. All of them hash to the Cluster's partition, so one replica sees them all and an
in-process lock per Cluster is enough to make every step for one Cluster run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class KeyedLocks:
    """``async with locks(key):`` serialises work per key; idle keys cost nothing."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
