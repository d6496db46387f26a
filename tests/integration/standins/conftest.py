"""Fixtures for the stand-in peer controllers, run in-process against the real API server.

``standins(*names)`` builds the named stand-ins' controllers for the test's namespace (knobs
are read from the environment then, so set them with ``monkeypatch.setenv`` first) and runs
them until the test ends. ``phase_log(*kinds)`` records every phase each object of those kinds
passes through, with the resourceVersion of the write, so tests can assert the separate status
steps and their order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import LEASE
from standins import identity, schedule, zenith
from standins.base import Controller, run_all

Json = dict[str, Any]


def build(
    kube: KubeClient, namespace: str, names: tuple[str, ...], registrar: zenith.Registrar | None
) -> list[Controller]:
    found: list[Controller] = []
    if "identity" in names:
        found += identity.controllers(kube, namespace=namespace)
    if "schedule" in names:
        found += schedule.controllers(kube, namespace=namespace)
    if "zenith" in names:
        found += zenith.controllers(kube, registrar=registrar, namespace=namespace)
    return found


async def release_leases(kube: KubeClient, namespace: str) -> None:
    """Leases keep finalizers; drop them so the namespace can go once the stand-ins stop."""
    items, _ = await kube.list(LEASE, namespace=namespace)
    for item in items:
        if item["metadata"].get("finalizers"):
            with contextlib.suppress(KubeNotFound):
                patch = {"metadata": {"finalizers": None}}
                await kube.patch_merge(LEASE, namespace, item["metadata"]["name"], patch)


@pytest.fixture
async def standins(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., None]]:
    monkeypatch.setenv("STANDIN_STEP_DELAY", "0.02")
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def start(*names: str, registrar: zenith.Registrar | None = None) -> None:
        controllers = build(kube, namespace, names, registrar)
        tasks.append(asyncio.create_task(run_all(controllers, stop)))

    yield start
    await release_leases(kube, namespace)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)


class PhaseLog:
    """Every distinct phase each object passes through, with the resourceVersion of the write."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.seen: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, kinds: tuple[ResourceKind, ...]) -> None:
        for kind in kinds:
            _, version = await self.kube.list(kind, namespace=self.namespace)
            self._tasks.append(asyncio.create_task(self._follow(kind, version)))

    async def _follow(self, kind: ResourceKind, version: str) -> None:
        async for event in self.kube.watch(
            kind, resource_version=version, namespace=self.namespace
        ):
            obj = event.object
            phase = (obj.get("status") or {}).get("phase")
            history = self.seen[(kind.kind, obj["metadata"]["name"])]
            if phase and (not history or history[-1][0] != phase):
                history.append((phase, int(obj["metadata"]["resourceVersion"])))

    def phases(self, kind: ResourceKind, name: str) -> list[str]:
        return [phase for phase, _ in self.seen[(kind.kind, name)]]

    def written_at(self, kind: ResourceKind, name: str, phase: str) -> int:
        """The resourceVersion of the write that set ``phase``: one etcd orders them all."""
        return next(rv for p, rv in self.seen[(kind.kind, name)] if p == phase)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def phase_log(
    kube: KubeClient, namespace: str
) -> AsyncIterator[Callable[..., Awaitable[PhaseLog]]]:
    logs: list[PhaseLog] = []

    async def start(*kinds: ResourceKind) -> PhaseLog:
        log = PhaseLog(kube, namespace)
        await log.start(kinds)
        logs.append(log)
        return log

    yield start
    for log in logs:
        await log.stop()
