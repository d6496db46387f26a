"""A service told to stop while it still waits for its connections stops."""

from __future__ import annotations

import asyncio

import pytest

from shared.runtime import unless_stopped

pytestmark = pytest.mark.timeout(5)


async def test_the_work_result_when_it_finishes_first() -> None:
    async def quick() -> str:
        return "connected"

    assert await unless_stopped(quick(), asyncio.Event()) == "connected"


async def test_stopping_cancels_work_that_waits_for_ever() -> None:
    cancelled = asyncio.Event()

    async def never() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "unreachable"

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await unless_stopped(never(), stop) is None
    assert cancelled.is_set()


async def test_a_failure_of_the_work_propagates() -> None:
    async def broken() -> str:
        raise ValueError("bad password")

    with pytest.raises(ValueError, match="bad password"):
        await unless_stopped(broken(), asyncio.Event())
