"""What every step of the story uses: the clients, the feed, the processes; and how to wait.

Waiting is on the feed (an effect shows up as a message), bounded by a timeout and guarded
against a crashed process: if a service or the stand-ins exit while the demo waits, the wait
fails at once with the tail of that process's log instead of running into its timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from demo.feed import DemoTimeout, Feed
from demo.processes import Services
from shared.bus import Bus
from shared.kube import KubeClient
from shared.messages import Message

T = TypeVar("T")

GUARD_INTERVAL = 0.5


@dataclass(frozen=True)
class Scene:
    kube: KubeClient
    bus: Bus
    feed: Feed
    services: Services
    workdir: Path
    bin_dir: Path
    #: the caller's environment plus the stack's (``KUBECONFIG``...), for the helm CLI
    env: dict[str, str]

    async def expect(
        self, check: Callable[[list[Message]], T | None], what: str, *, seconds: float = 20.0
    ) -> T:
        """Wait for the feed to show an effect of the step that was just taken."""
        return await self.guarded(self.feed.wait_until(check), what, seconds=seconds)

    async def guarded(self, awaitable: Awaitable[T], what: str, *, seconds: float) -> T:
        """``awaitable``'s result within ``seconds``, failing early if a started process exits."""
        task = asyncio.ensure_future(awaitable)
        deadline = asyncio.get_running_loop().time() + seconds
        try:
            while not task.done():
                self.services.check()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise DemoTimeout(f"no sign of {what} within {seconds:.0f}s")
                await asyncio.wait({task}, timeout=min(GUARD_INTERVAL, left))
            return task.result()
        finally:
            task.cancel()

    def logs(self) -> str:
        return ", ".join(s.log_path.name for s in self.services.started) + f" in {self.workdir}"
