"""Composition root of the watcher: the only place its concrete clients are chosen.

Production calls ``run(settings, stop)``; tests call ``build(...)`` with their own clients
(real ones pointed at the local stack, or fakes) and drive the returned tasks.
"""

from __future__ import annotations

import asyncio

from services.watcher.app import Deps, watch_kind
from services.watcher.handlers import KubeReader, Publisher, Scope
from services.watcher.settings import WatcherSettings
from shared.resources import KINDS
from shared.runtime import Infrastructure, provided

SERVICE = "watcher"


def scopes(settings: WatcherSettings) -> list[Scope]:
    unknown = set(settings.watcher.kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}; known: {sorted(KINDS)}")
    return [
        Scope(
            kind=KINDS[token],
            source=f"{SERVICE}/{settings.replica}",
            partitions=settings.partitions,
            namespace=settings.watcher.namespace,
            watch_timeout_seconds=settings.watcher.watch_timeout_seconds,
        )
        for token in settings.watcher.kinds
    ]


async def serve(
    settings: WatcherSettings, stop: asyncio.Event, *, kube: KubeReader, bus: Publisher
) -> None:
    deps = Deps(kube=kube, bus=bus, retry_max_seconds=settings.watcher.retry_max_seconds)
    async with asyncio.TaskGroup() as group:
        for scope in scopes(settings):
            group.create_task(watch_kind(scope, deps, stop))


async def run(
    settings: WatcherSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    async with provided(infra, settings, service=SERVICE) as clients:
        # On a shared client this is every management-cluster watch's silence limit; the
        # watcher's are the ones it exists for.
        clients.kube.watch_idle_timeout = settings.watcher.idle_timeout_seconds
        await serve(settings, stop, kube=clients.kube, bus=clients.bus)
