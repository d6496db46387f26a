"""The writer's one job: turn a batch of status patches for one Cluster into one status write.

The batch arrives in stream order from ``shared.consumer``; its patches are composed into one
JSON merge patch and sent to the ``status`` subresource, preconditioned on the Cluster's uid so
a patch meant for a deleted Cluster never lands on a new one of the same name.

- 404, or a uid that no longer matches: the Cluster is gone; the updates are dropped (logged).
- 409 or 422: re-read the Cluster and try again, ``conflict_retries`` times; a 422 that
  survives a fresh read is the publisher's bug and becomes a dead letter with the server's
  message.
- 429, 5xx, connection errors: ``TemporaryError`` from the adapter; the consumer backs off.

A write is recorded as ``ClusterStatusWritten`` in the journal with the ids of every update it
carried, and with ``skipped`` when the cache shows the patch would change nothing.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from services.writer import logic
from shared import subjects
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.messages import ClusterStatusWritten, Message, ObjectRef, PatchClusterStatus, stable_id
from shared.resources import CLUSTER

log = logging.getLogger(__name__)

Json = dict[str, Any]


class StatusApi(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json: ...


class Journal(Protocol):
    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published: ...


async def write_status(
    *,
    batch: Batch[PatchClusterStatus],
    kube: StatusApi,
    journal: Journal,
    cache: logic.StatusCache,
    writer: str,
    conflict_retries: int = 3,
) -> None:
    started = datetime.now(UTC)
    ref = batch.latest.ref
    current, stale = logic.split_incarnations(list(batch.messages))
    if stale:
        log.info("%s: dropped %d status update(s) for a replaced Cluster", ref.key, len(stale))
    patch = logic.compose_all([m.patch for m in current])
    cached = cache.get(ref.key, ref.uid)
    if cached is not None and logic.changes_nothing(cached, patch):
        await _record(batch, journal, writer, started, version=None, skipped=True)
        return
    try:
        written = await _patch_with_retries(ref, patch, kube=kube, retries=conflict_retries)
    except KubeNotFound as exc:
        cache.forget(ref.key)
        log.info("%s: dropped %d status update(s): %s", ref.key, len(batch.messages), exc)
        return
    meta = written["metadata"]
    cache.put(ref.key, meta["uid"], written.get("status") or {})
    await _record(batch, journal, writer, started, version=meta["resourceVersion"], skipped=False)


async def _patch_with_retries(
    ref: ObjectRef, patch: Json, *, kube: StatusApi, retries: int
) -> Json:
    body: Json = {"status": patch}
    if ref.uid:
        body["metadata"] = {"uid": ref.uid}
    for attempt in range(retries + 1):
        try:
            return await kube.patch_merge(
                CLUSTER, ref.namespace, ref.name, body, subresource="status"
            )
        except (KubeConflict, KubeInvalid) as exc:
            current = await kube.get(CLUSTER, ref.namespace, ref.name)
            if ref.uid and current["metadata"]["uid"] != ref.uid:
                raise KubeNotFound(f"{ref.key} was replaced (uid {ref.uid} is gone)") from exc
            if attempt == retries:
                if isinstance(exc, KubeInvalid):
                    raise PermanentError(f"status rejected: {exc}", reason="InvalidStatus") from exc
                raise
    raise AssertionError("unreachable")


async def _record(
    batch: Batch[PatchClusterStatus],
    journal: Journal,
    writer: str,
    started: datetime,
    *,
    version: str | None,
    skipped: bool,
) -> None:
    ids = [m.id for m in batch.messages]
    ref = batch.latest.ref
    entry = ClusterStatusWritten(
        id=stable_id("written", *ids),
        source=f"writer/{writer}",
        correlation_id=batch.latest.correlation_id,
        causation_id=batch.latest.id,
        ref=ref,
        update_ids=ids,
        resource_version=version,
        writer=writer,
        skipped=skipped,
        started=started,
        finished=datetime.now(UTC),
    )
    await journal.publish(subjects.journal("statuswritten", ref.namespace, ref.name), entry)
