"""Timers that make a stuck Cluster show Unhealthy at its deadline, within seconds.

Upstream re-saved every non-stable Cluster's status once a minute so its timeout could fire.
Here, after every write the writer knows the status it produced; if that status would turn
Unhealthy at ``lastUpdated + cluster_timeout_seconds``, a timer publishes an empty status patch
for that Cluster at that moment, and the ordinary write path derives the new phase. Nothing is
rewritten while nothing changes.

A timer lives in one process. The message id is derived from the Cluster's uid and its
``lastUpdated``, so if several replicas arm the same deadline JetStream stores one nudge; after
a restart, ``arm_existing`` re-arms every Cluster it can see (the cost is one list at start).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from shared import phase, subjects
from shared.messages import Message, ObjectRef, PatchClusterStatus, stable_id
from shared.resources import CLUSTER

log = logging.getLogger(__name__)

Json = dict[str, Any]
Publish = Callable[[str, Message], Awaitable[Any]]


class DeadlineTimers:
    def __init__(
        self, *, publish: Publish, timeout_seconds: float, partitions: int, source: str
    ) -> None:
        self.publish = publish
        self.timeout_seconds = timeout_seconds
        self.partitions = partitions
        self.source = source
        self._timers: dict[str, tuple[datetime, asyncio.TimerHandle]] = {}
        self._firing: set[asyncio.Task[None]] = set()

    def arm(self, ref: ObjectRef, status: Json) -> None:
        at = phase.deadline(status, self.timeout_seconds)
        current = self._timers.pop(ref.key, None)
        if current is not None:
            current[1].cancel()
        if at is None:
            return
        delay = max(0.0, (at - datetime.now(UTC)).total_seconds())
        nudge = PatchClusterStatus(
            id=stable_id(str(ref.uid), "timeout", str(status.get("lastUpdated"))),
            source=self.source,
            correlation_id=f"cluster:{ref.key}",
            ref=ref,
        )
        handle = asyncio.get_running_loop().call_later(delay, self._fire, ref, nudge)
        self._timers[ref.key] = (at, handle)

    def _fire(self, ref: ObjectRef, nudge: PatchClusterStatus) -> None:
        self._timers.pop(ref.key, None)
        subject = subjects.cluster_status(
            subjects.partition_of(ref.key, self.partitions), ref.namespace or "", ref.name
        )
        task = asyncio.create_task(self._publish(subject, nudge))
        self._firing.add(task)
        task.add_done_callback(self._firing.discard)

    async def _publish(self, subject: str, nudge: PatchClusterStatus) -> None:
        try:
            await self.publish(subject, nudge)
        except Exception:
            log.exception("could not publish the timeout of %s", nudge.ref.key)

    def arm_existing(self, clusters: list[Json]) -> None:
        for cluster in clusters:
            meta = cluster["metadata"]
            ref = ObjectRef(
                api_version=CLUSTER.api_version,
                kind=CLUSTER.kind,
                namespace=meta["namespace"],
                name=meta["name"],
                uid=meta["uid"],
            )
            self.arm(ref, cluster.get("status") or {})

    def cancel_all(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
