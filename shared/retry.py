"""Retrying work that no message carries: capped exponential backoff, one helper.

A consumer retries a handler by holding its messages (``shared.consumer``). Work outside any
handler (a list at start-up, a claim's work, a timer's publish) has nobody to redeliver it, so
it retries itself here until it succeeds; the caller cancels it to give up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.errors import TemporaryError

log = logging.getLogger(__name__)

T = TypeVar("T")


def backoff(attempt: int, *, base: float, cap: float, hint: float | None = None) -> float:
    """Exponential delay for the ``attempt``-th retry (1-based), or the error's own hint."""
    if hint is not None:
        return min(hint, cap)
    return float(min(cap, base * 2 ** max(0, attempt - 1)))


async def retry_until_done(
    work: Callable[[], Awaitable[T]], *, what: str, cap: float, base: float = 1.0
) -> T:
    """``work()``, again with backoff after each ``TemporaryError``, until it succeeds; any
    other error propagates."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await work()
        except TemporaryError as exc:
            delay = backoff(attempt, base=base, cap=cap, hint=exc.delay)
            log.warning("cannot %s, retrying in %.1fs: %s", what, delay, exc)
            await asyncio.sleep(delay)
