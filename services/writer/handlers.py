"""The writer's one job: turn a batch of status patches for one Cluster into one status write.

The batch arrives in stream order from ``shared.consumer``; its patches are composed into one
JSON merge patch and sent to the ``status`` subresource, preconditioned on the Cluster's uid so
a patch meant for a deleted Cluster never lands on a new one of the same name, and on the
``resourceVersion`` it was computed from: conditions are merged and the phase derived from
that snapshot, so if anything moved the Cluster since, the server refuses (409) instead of
letting a stale merge overwrite it. Partition leases make one replica the writer of a Cluster;
the precondition is what makes that true at the API server too, without trusting clocks.

- 404, or a uid that no longer matches: the Cluster is gone; the updates are dropped (logged).
- 409 or 422: re-read the Cluster and try again, ``conflict_retries`` times; a 422 that
  survives a fresh read is the publisher's bug and becomes a dead letter with the server's
  message.
- 429, 5xx, connection errors: ``TemporaryError`` from the adapter; the consumer backs off.

A write is recorded as ``StatusWritten`` in the journal with the ids of every update it
carried, and with ``skipped`` when the cache shows the patch would change nothing.

The cache (``logic.StatusCache``) is seeded from one LIST whenever this replica claims
partitions, so the first write to each Cluster after a claim needs no GET. The same list arms
the claimed Clusters' timeouts (``deadlines``), as does every write, skipped or not.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from services.writer import logic
from shared import subjects
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    Message,
    MetadataChanged,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    StatusWritten,
    stable_id,
)
from shared.metrics import counter
from shared.resources import CLUSTER, cluster_key, ref_to

log = logging.getLogger(__name__)

#: Every status PATCH by result (written, conflict, invalid, not_found, error), and the writes
#: the cache showed would change nothing (skipped).
STATUS_WRITES = counter("capibus_status_writes", "Cluster status writes by outcome", ["outcome"])
_OUTCOMES: tuple[tuple[type[Exception], str], ...] = (
    (KubeConflict, "conflict"),
    (KubeInvalid, "invalid"),
    (KubeNotFound, "not_found"),
)

Json = dict[str, Any]


class StatusApi(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def list(self, kind: ResourceKind) -> tuple[list[Json], str]: ...

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


#: ``(status, lease_name, deleting, now) -> derived keys``; production passes
#: ``shared.phase.derive``.
DeriveStatus = Callable[[Json, "str | None", bool, datetime], Json]


class Deadlines(Protocol):
    """Wakes a Cluster when its derived status would change by time alone (the timeout)."""

    def arm(self, ref: ObjectRef, status: Json, *, after: str | None = None) -> None: ...


async def write_status(
    *,
    batch: Batch[PatchStatus],
    kube: StatusApi,
    journal: Journal,
    cache: logic.StatusCache,
    writer: str,
    derive: DeriveStatus,
    deadlines: Deadlines | None = None,
    conflict_retries: int = 3,
) -> None:
    started = datetime.now(UTC)
    ref = batch.latest.ref
    current, stale = logic.split_incarnations(list(batch.messages))
    if stale:
        log.info("%s: dropped %d status update(s) for a replaced Cluster", ref.key, len(stale))
    try:
        written, snapshot = await _write(
            current,
            ref,
            kube=kube,
            cache=cache,
            token=batch.lease_token,
            derive=derive,
            retries=conflict_retries,
        )
    except KubeNotFound as exc:
        cache.forget(ref.key)
        log.info("%s: dropped %d status update(s): %s", ref.key, len(batch.messages), exc)
        return
    version = written["metadata"]["resourceVersion"] if written else None
    if written is None:
        STATUS_WRITES.inc("skipped")
    if deadlines is not None:
        # Written or not: a nudge that came before its deadline (another replica's clock)
        # changed nothing, and only a new timer brings the timeout now.
        deadlines.arm(ref, snapshot.status, after=logic.last_nudge(current))
    await _record(batch, journal, writer, started, version=version, skipped=written is None)


async def _write(
    messages: list[PatchStatus],
    ref: ObjectRef,
    *,
    kube: StatusApi,
    cache: logic.StatusCache,
    token: int,
    derive: DeriveStatus,
    retries: int,
) -> tuple[Json | None, logic.Snapshot]:
    """Write the composed patch (plus derived keys): (the Cluster written, or None when it
    would change nothing; the Cluster as it now is)."""
    snapshot = cache.get(ref.key, ref.uid, token) or await _read(kube, ref)
    written: Json | None = None
    for attempt in range(retries + 1):
        patch = _patch_for(messages, snapshot, derive)
        if logic.changes_nothing(snapshot.status, patch):
            return written, snapshot
        try:
            written = await _patch(kube, ref, patch, snapshot.resource_version)
        except (KubeConflict, KubeInvalid) as exc:
            snapshot = await _read(kube, ref)
            if attempt == retries:
                if isinstance(exc, KubeInvalid):
                    raise PermanentError(f"status rejected: {exc}", reason="InvalidStatus") from exc
                raise
            continue
        snapshot = logic.Snapshot.of(written)
        cache.put(ref.key, snapshot, token)
        # The spec may have moved on since our snapshot (a lease added): derive once more
        # from what the server returned; usually this changes nothing and costs no request.
        messages = []
    return written, snapshot


def _patch_for(messages: list[PatchStatus], snapshot: logic.Snapshot, derive: DeriveStatus) -> Json:
    now = datetime.now(UTC)
    patch = logic.compose_all([m.patch for m in messages])
    conditions = [c for m in messages for c in m.conditions]
    if conditions:
        have = snapshot.status.get("conditions") or []
        patch["conditions"] = logic.merge_conditions(have, conditions, now)
    return logic.with_derived(
        snapshot.status,
        patch,
        lambda status: derive(status, snapshot.lease_name, snapshot.deleting, now),
    )


async def _read(kube: StatusApi, ref: ObjectRef) -> logic.Snapshot:
    current = await kube.get(CLUSTER, ref.namespace, ref.name)
    if ref.uid and current["metadata"]["uid"] != ref.uid:
        raise KubeNotFound(f"{ref.key} was replaced (uid {ref.uid} is gone)")
    return logic.Snapshot.of(current)


async def _patch(kube: StatusApi, ref: ObjectRef, patch: Json, version: str | None) -> Json:
    preconditions = {"uid": ref.uid, "resourceVersion": version}
    body: Json = {"status": patch}
    if any(preconditions.values()):
        body["metadata"] = {k: v for k, v in preconditions.items() if v}
    try:
        written = await kube.patch_merge(
            CLUSTER, ref.namespace, ref.name, body, subresource="status"
        )
    except Exception as exc:
        STATUS_WRITES.inc(next((o for t, o in _OUTCOMES if isinstance(exc, t)), "error"))
        raise
    STATUS_WRITES.inc("written")
    return written


async def seed_cache(
    *,
    claims: Mapping[int, int],
    kube: StatusApi,
    cache: logic.StatusCache,
    partitions: int,
    deadlines: Deadlines | None = None,
) -> int:
    """Prime the cache for the partitions just claimed (``claims``: partition -> token), and
    arm the timeouts of their Clusters: the replica that armed them before may be gone."""
    if not claims:
        return 0
    clusters, _ = await kube.list(CLUSTER)
    seeded = 0
    for obj in clusters:
        key = cluster_key(CLUSTER, obj)
        token = claims.get(subjects.partition_of(key, partitions))
        if token is None:
            continue
        listed = logic.Snapshot.of(obj)
        if cache.seed(key, listed, token):
            seeded += 1
        if deadlines is not None:
            # Our own write under this claim is newer than the list, if there was one.
            known = cache.get(key, listed.uid, token) or listed
            deadlines.arm(ref_to(CLUSTER, obj), known.status)
    return seeded


async def write_metadata(
    *,
    batch: Batch[PatchMetadata],
    kube: StatusApi,
    journal: Journal,
    writer: str,
    cache: logic.StatusCache | None = None,
    conflict_retries: int = 3,
) -> None:
    """Carry out metadata commands one by one, each against a fresh read (they are rare).

    What the server returns goes into the status cache: the next status write then names
    the new ``resourceVersion`` instead of losing a round to our own change.
    """
    for command in batch.messages:
        try:
            current = await _apply_metadata(command, kube=kube, retries=conflict_retries)
        except KubeNotFound as exc:
            log.info("%s: dropped metadata change: %s", command.ref.key, exc)
            continue
        ref = command.ref
        if cache is not None:
            cache.put(ref.key, logic.Snapshot.of(current), batch.lease_token)
        entry = MetadataChanged(
            id=stable_id("metadata", command.id),
            source=f"writer/{writer}",
            **command.caused(),
            ref=ref,
            command=command.model_dump(mode="json", exclude={"subject"}),
        )
        await journal.publish(
            subjects.journal("metadata", CLUSTER.token, ref.namespace, ref.name), entry
        )


async def _apply_metadata(command: PatchMetadata, *, kube: StatusApi, retries: int) -> Json:
    """The Cluster after ``command`` (unchanged if it asked for nothing new)."""
    ref = command.ref
    for attempt in itertools.count():
        current = await kube.get(CLUSTER, ref.namespace, ref.name)
        if ref.uid and current["metadata"]["uid"] != ref.uid:
            raise KubeNotFound(f"{ref.key} was replaced (uid {ref.uid} is gone)")
        patch = logic.metadata_patch(current, command)
        if patch is None:
            return current
        try:
            return await kube.patch_merge(CLUSTER, ref.namespace, ref.name, patch)
        except KubeConflict:
            if attempt == retries:
                raise
    raise AssertionError("itertools.count() never ends")


async def _record(
    batch: Batch[PatchStatus],
    journal: Journal,
    writer: str,
    started: datetime,
    *,
    version: str | None,
    skipped: bool,
) -> None:
    ids = [m.id for m in batch.messages]
    ref = batch.latest.ref
    entry = StatusWritten(
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
    await journal.publish(
        subjects.journal("statuswritten", CLUSTER.token, ref.namespace, ref.name), entry
    )
