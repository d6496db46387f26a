"""Which tenant watches run in this replica: one per Cluster of the partitions it holds.

A Cluster gets a watch when it is not being deleted and its ``<cluster>-kubeconfig`` Secret
exists. The watch is keyed by the Cluster's uid and the Secret's resourceVersion: a Cluster
event for a watched incarnation costs nothing (no API call), a rotated Secret restarts the
watch with the new kubeconfig, and a replaced Cluster gets a watch of its own. All changes for
one Cluster are serialised by a per-Cluster lock.

Partitions are followed as a ``shared.claims.ClaimFollower`` (``Consumer(claims=...)``):

- **claimed**: the Clusters are listed once for all the partitions of one rebalance
  (``claim.round``), and those of the claimed partition get their watches. The consumer runs
  this in a task of its own, so the lease heartbeat never waits on the API server, and cancels
  it the moment the partition starts to move. Whatever the list raises (a 5xx, but also a 403
  while RBAC is being fixed, or a bug) becomes a ``TemporaryError``, which the consumer retries
  with capped backoff for as long as the claim lasts: a replica that holds partitions but
  watches none of their Clusters would look healthy while discovery stood still for them. A
  Cluster that cannot be watched for good (its Secret unreadable) is logged and skipped, so it
  does not hold up the others.
- **lost**: the watches of those partitions stop (all of them when the replica stops).

When a replica dies its leases lapse, and the new owner's claim starts the watches again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from services.discovery import handlers, logic
from shared.claims import Claim
from shared.errors import CapibusError, KubeNotFound, TemporaryError
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
    """The tenant watches of this replica: a ``handlers.Tracker`` and a ``ClaimFollower``."""

    def __init__(self, *, kube: handlers.ManagementApi, spawn: Spawn, partitions: int) -> None:
        self.kube = kube
        self.spawn = spawn
        self.partitions = partitions
        self.owned: set[int] = set()
        self.running: dict[str, Runner] = {}
        self._locks = KeyedLocks()

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

    # --- shared.claims.ClaimFollower -----------------------------------------------------

    async def claimed(self, claim: Claim) -> None:
        """Watch the Clusters of the claimed partition (module docstring)."""
        self.owned.add(claim.partition)
        clusters = await claim.round.once("clusters", self._clusters)
        for cluster in clusters:
            if self._partition(cluster) == claim.partition:
                await self._adopt(cluster)
        watched = sum(r.target.partition == claim.partition for r in self.running.values())
        log.info("watching %d cluster(s) of claimed partition %s", watched, claim.partition)

    async def lost(self, partitions: frozenset[int]) -> None:
        self.owned -= partitions
        for key, running in list(self.running.items()):
            if running.target.partition in partitions:
                async with self._locks(key):
                    await self._stop(key)

    async def _clusters(self) -> list[Json]:
        try:
            clusters, _ = await self.kube.list(CLUSTER)
        except Exception as exc:  # CancelledError is not an Exception: a lost claim still ends
            if not isinstance(exc, CapibusError):
                log.exception("listing Clusters failed unexpectedly")
            raise TemporaryError(f"cannot list Clusters: {type(exc).__name__}: {exc}") from exc
        return clusters

    async def _adopt(self, cluster: Json) -> None:
        """Start one Cluster's watch; only a ``TemporaryError`` makes the claim retry."""
        try:
            await self.cluster_changed(cluster)
        except TemporaryError:
            raise
        except Exception:
            log.exception("%s: cannot watch", cluster_key(CLUSTER, cluster))

    def _partition(self, cluster: Json) -> int:
        return partition_of(cluster_key(CLUSTER, cluster), self.partitions)

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
