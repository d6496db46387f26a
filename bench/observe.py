"""What the lifecycle benchmarks see: list-then-watch of a few kinds in one namespace.

Every figure of the lifecycle benchmarks is a moment on the benchmark's own clock
(``time.monotonic()``) at which a watch event reached the benchmark process, so all moments
come from the same clock and the same kind of delivery path as the services' own watcher.
``Observer`` keeps the newest state of every object, when each was first seen and when it
went, and wakes everyone waiting on it at every event: a wait is a predicate over that state,
never a poll of the API server (polling would load the API server the services share).

A watch that ends, expires or goes quiet is resumed with a fresh list, and objects missing
from that list count as gone at that moment.

A wait sees the newest state only: several events may arrive before a waiter runs again. A
benchmark that needs every state an object went through (the first moment a nested field
took a value) adds a listener, called synchronously with each object state as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import stop_task
from shared.errors import CapibusError
from shared.kube import KubeClient, ResourceKind, WatchExpired

Json = dict[str, Any]
Key = tuple[str, str]  # (kind token, name)
#: Called with every object state seen (listed or watched) and the moment it arrived.
Listener = Callable[[Key, Json, float], None]


@dataclass
class Observer:
    kube: KubeClient
    namespace: str
    kinds: Sequence[ResourceKind]
    live: dict[Key, Json] = field(default_factory=dict)
    first_seen: dict[Key, float] = field(default_factory=dict)
    gone_at: dict[Key, float] = field(default_factory=dict)
    listeners: list[Listener] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> Observer:
        """List every kind (what exists now counts as seen now), then watch from there."""
        for kind in self.kinds:
            version = await self._list(kind)
            self._tasks.append(asyncio.create_task(self._follow(kind, version)))
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            await stop_task(task)
        self._tasks.clear()

    def get(self, kind: ResourceKind, name: str) -> Json | None:
        return self.live.get((kind.token, name))

    def names(self, kind: ResourceKind) -> list[str]:
        return [name for token, name in self.live if token == kind.token]

    def seen(self, kind: ResourceKind, name: str) -> float | None:
        return self.first_seen.get((kind.token, name))

    async def until(self, check: Callable[[], bool], within: float) -> bool:
        """Until ``check()`` holds (re-checked at every event); False after ``within`` s."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(check), within)
            return check()

    async def _list(self, kind: ResourceKind) -> str:
        items, version = await self.kube.list(kind, namespace=self.namespace)
        now = time.monotonic()
        listed = {(kind.token, item["metadata"]["name"]): item for item in items}
        for key in [k for k in self.live if k[0] == kind.token and k not in listed]:
            self._gone(key, now)
        for key, item in listed.items():
            self._saw(key, item, now)
        await self._notify()
        return version

    async def _follow(self, kind: ResourceKind, version: str) -> None:
        while True:
            try:
                async for event in self.kube.watch(
                    kind, resource_version=version, namespace=self.namespace, timeout_seconds=600
                ):
                    version = event.resource_version or version
                    if event.type == "BOOKMARK":
                        continue
                    key = (kind.token, event.object["metadata"]["name"])
                    if event.type == "DELETED":
                        self._gone(key, time.monotonic())
                    else:
                        self._saw(key, event.object, time.monotonic())
                    await self._notify()
            except (WatchExpired, CapibusError):
                version = await self._list(kind)

    def _saw(self, key: Key, obj: Json, now: float) -> None:
        self.live[key] = obj
        self.first_seen.setdefault(key, now)
        self.gone_at.pop(key, None)
        for listener in self.listeners:
            listener(key, obj, now)

    def _gone(self, key: Key, now: float) -> None:
        self.live.pop(key, None)
        self.gone_at.setdefault(key, now)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
