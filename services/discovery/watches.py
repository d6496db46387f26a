"""Which tenant watches run in this replica: one per Cluster of the partitions it owns.

A Cluster gets a watch when it is not being deleted and its ``<cluster>-kubeconfig`` Secret
exists. The watch is keyed by the Cluster's uid and the Secret's resourceVersion: a Cluster
event for a watched incarnation costs nothing (no API call), a rotated Secret restarts the
watch with the new kubeconfig, and a replaced Cluster gets a watch of its own.

Ownership follows ``shared.consumer``'s ``on_ownership``: losing a partition stops its
watches; gaining one lists the Clusters once and starts theirs, in a background task so
the lease heartbeat never waits on the API server. Whatever the list raises (a 5xx, but also
a 403 while RBAC is being fixed, or a bug) is logged and retried with a capped backoff for as
long as the partitions stay ours: a replica that owns partitions but watches none of their
Clusters would look healthy while discovery stood still for them. A Cluster that cannot be
watched for good (its Secret unreadable) is logged and skipped, so it does not hold up the
others. A done-callback logs anything that still escapes the task instead of dropping it.
When a replica dies its leases lapse and the new owner's gain starts the watches again.
All changes for one Cluster are serialised by a per-Cluster lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from services.discovery import handlers, logic
from shared.consumer import backoff
from shared.errors import KubeNotFound, PermanentError, TemporaryError
from shared.locks import KeyedLocks
from shared.resources import CLUSTER, SECRET, cluster_key
from shared.subjects import partition_of

log = logging.getLogger(__name__)

Json = handlers.Json


class Runner(Protocol):
    target: logic.Target

    def nudge(self) -> None: ...

    async def stop(self) -> None: ...


#: Starts a watch of ``target`` with the kubeconfig text.
Spawn = Callable[[logic.Target, str], Runner]


class Watches:
    """The tenant watches of this replica (``handlers.Tracker``)."""

    def __init__(
        self,
        *,
        kube: handlers.ManagementApi,
        spawn: Spawn,
        partitions: int,
        retry_max_seconds: float = 60.0,
    ) -> None:
        self.kube = kube
        self.spawn = spawn
        self.partitions = partitions
        self.retry_max_seconds = retry_max_seconds
        self.owned: frozenset[int] = frozenset()
        self.running: dict[str, Runner] = {}
        self._locks = KeyedLocks()
        self._adoptions: set[asyncio.Task[None]] = set()

    # --- handlers.Tracker ----------------------------------------------------------------

    async def cluster_changed(self, cluster: Json) -> None:
        key = cluster_key(CLUSTER, cluster)
        if logic.is_deleting(cluster):
            await self.forget(*key.split("/", 1))
            return
        if partition_of(key, self.partitions) not in self.owned:
            return
        async with self._locks(key):
            running = self.running.get(key)
            if running is not None and running.target.uid == cluster["metadata"].get("uid"):
                return
            await self._start(cluster)

    async def secret_changed(self, namespace: str, cluster: str, version: str) -> None:
        key = f"{namespace}/{cluster}"
        if partition_of(key, self.partitions) not in self.owned:
            return
        async with self._locks(key):
            running = self.running.get(key)
            if running is not None and running.target.secret_version == version:
                return
            try:
                found = await self.kube.get(CLUSTER, namespace, cluster)
            except KubeNotFound:
                await self._stop(key)
                return
            if logic.is_deleting(found):
                await self._stop(key)
                return
            await self._start(found)

    async def forget(self, namespace: str, cluster: str) -> None:
        key = f"{namespace}/{cluster}"
        async with self._locks(key):
            await self._stop(key)

    def nudge(self, namespace: str, cluster: str) -> None:
        running = self.running.get(f"{namespace}/{cluster}")
        if running is not None:
            running.nudge()

    # --- ownership -----------------------------------------------------------------------

    async def follow_ownership(self, owned: frozenset[int]) -> None:
        """``Consumer.on_ownership``: stop what is no longer ours, adopt what became ours."""
        gained = owned - self.owned
        self.owned = owned
        if not owned:
            await self.close()  # the replica is stopping (or lost everything)
            return
        for key, running in list(self.running.items()):
            if running.target.partition not in owned:
                async with self._locks(key):
                    await self._stop(key)
        if gained:
            task = asyncio.create_task(self._adopt(gained), name=f"adopt:{sorted(gained)}")
            self._adoptions.add(task)
            task.add_done_callback(self._adopted)

    def _adopted(self, task: asyncio.Task[None]) -> None:
        self._adoptions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended unexpectedly", task.get_name(), exc_info=task.exception())

    async def close(self) -> None:
        for task in list(self._adoptions):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for key in list(self.running):
            await self._stop(key)

    async def _adopt(self, partitions: frozenset[int]) -> None:
        failures = 0
        while partitions & self.owned:
            try:
                await self._adopt_once(partitions)
                return
            except Exception as exc:  # CancelledError is not an Exception: close() still works
                failures += 1
                delay = backoff(failures, base=0.5, cap=self.retry_max_seconds)
                log.log(
                    logging.WARNING if isinstance(exc, TemporaryError) else logging.ERROR,
                    "cannot adopt partitions %s: %s: %s; again in %.1fs",
                    sorted(partitions),
                    type(exc).__name__,
                    exc,
                    delay,
                    exc_info=not isinstance(exc, TemporaryError | PermanentError),
                )
                await asyncio.sleep(delay)  # a retry delay, not a poll

    async def _adopt_once(self, partitions: frozenset[int]) -> None:
        clusters, _ = await self.kube.list(CLUSTER)
        for cluster in clusters:
            if partition_of(cluster_key(CLUSTER, cluster), self.partitions) in partitions:
                await self._adopt_one(cluster)
        log.info("watching %d cluster(s) after claiming %s", len(self.running), sorted(partitions))

    async def _adopt_one(self, cluster: Json) -> None:
        """Start one Cluster's watch; only a ``TemporaryError`` makes the adoption retry."""
        try:
            await self.cluster_changed(cluster)
        except TemporaryError:
            raise
        except Exception:
            log.exception("%s: cannot watch", cluster_key(CLUSTER, cluster))

    # --- start and stop ------------------------------------------------------------------

    async def _start(self, cluster: Json) -> None:
        """(Re)start the watch of ``cluster`` if its kubeconfig exists; caller holds the lock."""
        meta = cluster["metadata"]
        key = cluster_key(CLUSTER, cluster)
        try:
            secret = await self.kube.get(SECRET, meta["namespace"], f"{meta['name']}-kubeconfig")
        except KubeNotFound:
            await self._stop(key)  # its Secret event starts the watch once it exists
            return
        text = logic.kubeconfig_text(secret)
        if text is None:
            log.warning("%s: kubeconfig Secret has no usable 'value'", key)
            await self._stop(key)
            return
        target = logic.Target(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=str(meta.get("uid", "")),
            partition=partition_of(key, self.partitions),
            secret_version=str(secret["metadata"].get("resourceVersion", "")),
        )
        running = self.running.get(key)
        if running is not None and running.target == target:
            return
        await self._stop(key)
        if target.partition not in self.owned:
            return  # lost while the Secret was read
        self.running[key] = self.spawn(target, text)
        log.info("%s: watching tenant reservations", key)

    async def _stop(self, key: str) -> None:
        running = self.running.pop(key, None)
        if running is not None:
            await running.stop()
            log.info("%s: stopped watching tenant reservations", key)
