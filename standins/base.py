"""What every stand-in controller shares: knobs, a list-then-watch loop, per-object workers.

Stand-ins play controllers that are not ours (identity operator, schedule operator, Zenith,
Cluster API and its addon provider) against the real API server, never through the bus. They
are deliberately simple, but they behave like the real thing where capibus can observe it:
separate status writes per step, a configurable delay between steps (so ordering bugs
surface), and failure knobs.

``Controller`` runs one ``reconcile(obj)`` at a time per object. An event that arrives while
that object's reconcile runs marks it dirty, and the reconcile runs once more with the newest
state afterwards: the same level-triggered shape as a real controller's work queue. A
reconcile that raises ``TemporaryError`` is requeued after the error's delay, like a
controller's rate-limited retry; other errors are logged and wait for the next event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shared.errors import CapibusError, KubeNotFound, TemporaryError
from shared.kube import KubeClient, ResourceKind, WatchExpired

log = logging.getLogger("standins")

Json = dict[str, Any]
Reconcile = Callable[[Json], Awaitable[None]]


def configure_logging() -> None:
    """One line per step on stderr, at ``STANDIN_LOG_LEVEL``; httpx's per-request lines off."""
    logging.basicConfig(
        level=os.environ.get("STANDIN_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_set(name: str) -> set[str]:
    """A comma-separated knob, e.g. ``STANDIN_IDENTITY_NEVER_READY=ns/realm,ns2/other``."""
    return {item.strip() for item in os.environ.get(name, "").split(",") if item.strip()}


@dataclass
class Knobs:
    """Shared knobs; each stand-in adds its own ``STANDIN_<NAME>_*`` variables."""

    step_delay: float = field(default_factory=lambda: env_float("STANDIN_STEP_DELAY", 0.05))

    async def step(self) -> None:
        if self.step_delay > 0:
            await asyncio.sleep(self.step_delay)


def key_of(obj: Json) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


class Controller:
    """List-then-watch ``kind`` and run ``reconcile`` per object, one run at a time each."""

    def __init__(
        self,
        kube: KubeClient,
        kind: ResourceKind,
        reconcile: Reconcile,
        *,
        on_delete: Reconcile | None = None,
        namespace: str | None = None,
        name: str = "",
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.reconcile = reconcile
        self.on_delete = on_delete
        self.namespace = namespace
        self.name = name or kind.plural
        self._latest: dict[str, Json] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._stopped = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                items, version = await self.kube.list(self.kind, namespace=self.namespace)
                for item in items:
                    self.offer(item)
                await self._watch(version, stop)
            except WatchExpired:
                continue
            except CapibusError as exc:
                log.warning("%s: %s; listing again shortly", self.name, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        # A requeue timer firing after the stop would start work on a client being closed.
        self._stopped = True
        for timer in self._timers:
            timer.cancel()
        # Wait for cancelled reconciles to unwind: a request cut short must release its
        # connection before the caller closes the client, or its socket leaks.
        running = list(self._running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _watch(self, version: str, stop: asyncio.Event) -> None:
        events = self.kube.watch(self.kind, resource_version=version, namespace=self.namespace)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                step = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({step, stopping}, return_when="FIRST_COMPLETED")
                if stopping in done:
                    # Let the cancelled read finish first: a generator still running cannot
                    # be closed, and its HTTP stream (a socket) would leak.
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    return
                try:
                    event = step.result()
                except StopAsyncIteration:
                    return
                if event.type == "BOOKMARK":
                    continue
                if event.type == "DELETED":
                    self._latest.pop(key_of(event.object), None)
                    if self.on_delete:
                        await self._guard(self.on_delete, event.object)
                else:
                    self.offer(event.object)
        finally:
            stopping.cancel()
            with contextlib.suppress(Exception):
                await events.aclose()

    def offer(self, obj: Json) -> None:
        if self._stopped:
            return
        key = key_of(obj)
        self._latest[key] = obj
        if key in self._running:
            self._dirty.add(key)
            return
        self._running[key] = asyncio.create_task(self._work(key))

    def requeue(self, obj: Json, after: float) -> None:
        """Look at ``obj`` again later, like a controller's rate-limited requeue."""
        key = key_of(obj)

        def fire() -> None:
            self._timers.discard(timer)
            if key in self._latest:
                self.offer(self._latest[key])

        timer = asyncio.get_running_loop().call_later(after, fire)
        self._timers.add(timer)

    def known(self) -> list[Json]:
        """The newest state of every object this controller has seen."""
        return list(self._latest.values())

    async def _work(self, key: str) -> None:
        try:
            while True:
                self._dirty.discard(key)
                obj = self._latest.get(key)
                if obj is None:
                    return
                await self._guard(self.reconcile, obj)
                if key not in self._dirty:
                    return
        finally:
            self._running.pop(key, None)

    async def _guard(self, fn: Reconcile, obj: Json) -> None:
        try:
            await fn(obj)
        except KubeNotFound:
            pass  # the object went while we worked on it; its DELETED event follows
        except TemporaryError as exc:
            # An API hiccup or a lost race: nothing else would bring this object back.
            delay = exc.delay if exc.delay is not None else 1.0
            log.warning("%s %s: %s; again in %.1fs", self.name, key_of(obj), exc, delay)
            self.requeue(obj, delay)
        except CapibusError as exc:
            log.warning("%s %s: %s", self.name, key_of(obj), exc)
        except Exception:
            log.exception("%s %s: reconcile failed", self.name, key_of(obj))


async def run_all(controllers: list[Controller], stop: asyncio.Event) -> None:
    await asyncio.gather(*(c.run(stop) for c in controllers))


def selected(knob: set[str], obj: Json) -> bool:
    """Whether a ``ns/name`` list knob names ``obj``; ``*`` names every object."""
    return "*" in knob or key_of(obj) in knob


def phase_of(obj: Json) -> str:
    """Upstream omits default-valued status fields, so a missing phase reads as ``Unknown``."""
    return str((obj.get("status") or {}).get("phase") or "Unknown")


async def fresh(kube: KubeClient, kind: ResourceKind, obj: Json) -> Json:
    """``obj`` as the API server has it now.

    A reconcile may be handed a cached copy older than our own last write (its event has not
    arrived yet); acting on that copy would repeat finished steps and flap the status.
    """
    meta = obj["metadata"]
    return await kube.get(kind, meta.get("namespace"), meta["name"])


async def write_status(kube: KubeClient, kind: ResourceKind, obj: Json, status: Json) -> Json:
    """One status step as a merge patch of the status subresource; ``None`` removes a key."""
    meta = obj["metadata"]
    patch = {"status": status}
    return await kube.patch_merge(
        kind, meta.get("namespace"), meta["name"], patch, subresource="status"
    )
