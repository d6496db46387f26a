"""One long-lived watch of a tenant cluster's Zenith Reservations (one per Cluster).

Two loops share the Reservations this watch knows:

- **follow** lists every Reservation (all namespaces), then watches from the list's
  resourceVersion. When the server ends a healthy watch (after ``resync_seconds``) the next
  one resumes from the newest version seen, bookmarks included, as client-go's reflector
  does: a watch from a version misses nothing, and a re-list every few minutes per Cluster
  was most of what an idle discovery cost (``bench/ANALYSIS.md``, e5). A 410 Gone
  (``WatchExpired``) re-lists at once; connection, TLS and API errors re-list after a capped
  exponential backoff, so an outage heals in full; nothing the watch knew is dropped while
  the tenant is unreachable.
- **recompute** waits for a change, lets the burst settle (``quiet_seconds`` of silence, at
  most ``max_delay_seconds`` after the first change: an initial list of N Reservations is one
  recompute) and runs ``handlers.sync``. A failed recompute is retried after a backoff.

The watch is started and stopped by ``watches.Watches``; its kubeconfig is fixed for its
lifetime (a rotated Secret means a new watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.discovery import handlers, logic
from services.discovery.settings import DiscoveryTuning
from shared.errors import KubeNotFound, PermanentError, TemporaryError
from shared.kube import WatchEvent, WatchExpired
from shared.resources import RESERVATION
from shared.retry import backoff
from shared.status import StatusReporter

log = logging.getLogger(__name__)

Json = handlers.Json
RETRY_BASE = 0.5


@dataclass(frozen=True)
class TenantDeps:
    kube: handlers.ManagementApi
    reporter: StatusReporter
    connect: handlers.Connect
    tuning: DiscoveryTuning
    clock: Callable[[], float] = time.monotonic


class TenantWatch:
    """Follows one tenant cluster's Reservations and keeps its Cluster's services current."""

    def __init__(self, target: logic.Target, kubeconfig: str, deps: TenantDeps) -> None:
        self.target = target
        self.deps = deps
        self._kubeconfig = kubeconfig
        self._reservations: dict[tuple[str, str], Json] = {}
        #: the tenant's resourceVersion of what ``_reservations`` holds
        self._version = ""
        self._listed = False
        self._reread = True
        self._changed = asyncio.Event()
        self._belief = logic.Belief(replay=deps.tuning.replay_seconds)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> TenantWatch:
        self._task = asyncio.create_task(self._run(), name=f"discovery:{self.target.key}")
        return self

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def nudge(self) -> None:
        """Recompute soon: something on the management side (an addon) changed."""
        if self._listed:
            self._changed.set()

    async def _run(self) -> None:
        try:
            tenant = self.deps.connect(self._kubeconfig)
        except PermanentError as exc:
            # The same Secret will not get better; a new version starts a new watch.
            log.error("%s: %s; waiting for a new kubeconfig", self.target.key, exc)
            return
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow(tenant))
                group.create_task(self._recompute())
        finally:
            await tenant.aclose()

    # --- follow --------------------------------------------------------------------------

    async def _follow(self, tenant: handlers.TenantApi) -> None:
        failures = 0
        listed = False
        while True:
            try:
                if not listed:
                    await self._relist(tenant)
                    listed = True
                async for event in tenant.watch(
                    RESERVATION,
                    resource_version=self._version,
                    timeout_seconds=self.deps.tuning.resync_seconds,
                ):
                    self._apply(event)
                failures = 0  # the server ended a healthy watch: resume from self._version
            except WatchExpired as exc:
                log.info("%s: reservations watch expired (%s); re-listing", self.target.key, exc)
                listed = False
            except (TemporaryError, PermanentError, KubeNotFound) as exc:
                failures, listed = failures + 1, False
                await self._reconnect_later(failures, exc)
            except Exception as exc:
                log.exception("%s: tenant watch failed unexpectedly", self.target.key)
                failures, listed = failures + 1, False
                await self._reconnect_later(failures, exc)

    async def _reconnect_later(self, failures: int, exc: Exception) -> None:
        delay = backoff(failures, base=RETRY_BASE, cap=self.deps.tuning.retry_max_seconds)
        log.warning("%s: tenant: %s; reconnecting in %.1fs", self.target.key, exc, delay)
        await asyncio.sleep(delay)  # a retry delay, not a poll

    async def _relist(self, tenant: handlers.TenantApi) -> str:
        items, version = await tenant.list(RESERVATION)
        self._reservations = {_key(item): item for item in items}
        self._version = version
        self._listed = True
        self._reread = True
        self._changed.set()
        log.debug("%s: %d reservation(s) at %s", self.target.key, len(items), version)
        return version

    def _apply(self, event: WatchEvent) -> None:
        version = (event.object.get("metadata") or {}).get("resourceVersion")
        if event.type == "BOOKMARK":
            # Nothing changed, but a resumed watch starts here (and not at a version the
            # server may have compacted meanwhile).
            self._version = version or self._version
            return
        key = _key(event.object)
        if event.type == "DELETED":
            self._reservations.pop(key, None)
        else:
            self._reservations[key] = event.object
        self._version = version or self._version
        self._changed.set()

    # --- recompute -----------------------------------------------------------------------

    async def _recompute(self) -> None:
        failures = 0
        while True:
            await self._settle()
            try:
                await self._sync()
            except PermanentError as exc:
                log.error("%s: recompute: %s; waiting for the next change", self.target.key, exc)
            except (TemporaryError, KubeNotFound) as exc:
                failures += 1
                await self._retry_later(failures, exc)
            except Exception as exc:
                log.exception("%s: recompute failed unexpectedly", self.target.key)
                failures += 1
                await self._retry_later(failures, exc)
            else:
                failures = 0

    async def _retry_later(self, failures: int, exc: Exception) -> None:
        delay = backoff(failures, base=RETRY_BASE, cap=self.deps.tuning.retry_max_seconds)
        log.warning("%s: recompute: %s; again in %.1fs", self.target.key, exc, delay)
        await asyncio.sleep(delay)  # a retry delay, not a poll
        self._changed.set()

    async def _settle(self) -> None:
        """Wait for a change, then for the burst it starts to go quiet (or for the cap)."""
        await self._changed.wait()
        tuning = self.deps.tuning
        deadline = self.deps.clock() + tuning.max_delay_seconds
        while True:
            self._changed.clear()
            wait = min(tuning.quiet_seconds, deadline - self.deps.clock())
            if wait <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=wait)
            except TimeoutError:
                return

    async def _sync(self) -> None:
        reread, self._reread = self._reread, False
        try:
            await handlers.sync(
                target=self.target,
                reservations=list(self._reservations.values()),
                tenant_version=self._version,
                belief=self._belief,
                reread=reread,
                kube=self.deps.kube,
                reporter=self.deps.reporter,
                now=self.deps.clock(),
            )
        except Exception:
            self._reread = self._reread or reread
            raise


def _key(obj: Json) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
