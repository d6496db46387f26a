"""A token bucket: at most ``rate`` operations per second on average, ``burst`` at once.

Waiting here is a deliberate delay that bounds our request rate, not a poll: the caller is
released the moment a token is due.
"""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    def __init__(self, *, rate: float, burst: int) -> None:
        self.rate = rate
        self.capacity = float(burst)
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            wait = self._take()
            if wait > 0:
                await asyncio.sleep(wait)

    def _take(self) -> float:
        """Take one token, returning how long until it is actually due (0 if available)."""
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
