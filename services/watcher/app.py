"""The list-then-watch cycle for each kind, one task per kind.

The cycle is kopf's and client-go's: list (publishing what changed since the stream's last
word), watch from the list's resourceVersion with bookmarks, resume from the newest version
after a normal end or a silent stream, and list again after 410 Gone. Failures back off
exponentially; the wait ends early when the service is asked to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from services.watcher import handlers
from services.watcher.handlers import KubeReader, Publisher, Scope
from services.watcher.logic import Known
from shared.errors import BusUnavailable, KubeNotFound, TemporaryError
from shared.kube import WatchExpired
from shared.retry import backoff

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deps:
    kube: KubeReader
    bus: Publisher
    retry_max_seconds: float = 30.0


async def watch_kind(
    scope: Scope, deps: Deps, stop: asyncio.Event, *, iterations: int | None = None
) -> None:
    """Keep the stream in step with one kind until ``stop``; ``iterations`` bounds it for tests."""
    known: dict[str, Known] | None = None
    version: str | None = None
    failures = 0
    while not stop.is_set() and (iterations is None or iterations > 0):
        iterations = None if iterations is None else iterations - 1
        try:
            if known is None:
                known = await handlers.load_known(scope=scope, bus=deps.bus)
            if version is None:
                version = await handlers.relist(
                    scope=scope, known=known, kube=deps.kube, bus=deps.bus
                )
                log.info("%s: listed at %s (%d known)", scope.kind.token, version, len(known))
            follow = handlers.follow(
                scope=scope, known=known, kube=deps.kube, bus=deps.bus, resource_version=version
            )
            version = await _unless_stopped(follow, stop, default=version)
            failures = 0
        except WatchExpired as exc:
            log.info("%s: watch expired (%s), re-listing", scope.kind.token, exc)
            version = None
        except (TemporaryError, KubeNotFound) as exc:
            failures += 1
            if isinstance(exc, BusUnavailable):
                version = None  # we no longer know what reached the stream: re-list

            delay = backoff(failures, base=0.5, cap=deps.retry_max_seconds)
            log.warning("%s: %s; retrying in %.1fs", scope.kind.token, exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)


async def _unless_stopped(
    work: Coroutine[Any, Any, str], stop: asyncio.Event, *, default: str
) -> str:
    """``work``'s result, or ``default`` if ``stop`` is set first (``work`` is cancelled).

    A watch can be silent for minutes; shutdown must not wait for its next event.
    """
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        return await task
    return default
