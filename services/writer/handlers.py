"""The writer's one job: turn a batch of status patches for one object into one status write.

The batch arrives in stream order from ``shared.consumer``; its patches are composed into one
JSON merge patch (``logic.plan``, with what the kind's rule derives) and sent to the
``status`` subresource, preconditioned on the object's uid, so a patch meant for a deleted
object never lands on a new one of the same name, and on the ``resourceVersion`` it was
computed from: conditions are merged and derived keys computed from that snapshot, so if
anything moved the object since, the server refuses (409) instead of letting a stale merge
overwrite it. Partition leases make one replica the writer of an object; the precondition is
what makes that true at the API server too, without trusting clocks.

- 404, or a uid that no longer matches: the object is gone; the updates are dropped (logged).
- 409 or 422: re-read the object and try again, ``conflict_retries`` times; a 422 that
  survives a fresh read is the publisher's bug and becomes a dead letter with the server's
  message.
- 429, 5xx, connection errors: ``TemporaryError`` from the adapter; the consumer backs off.

A write is recorded as ``StatusWritten`` in the journal with the ids of every update it
carried, and with ``skipped`` when the cache shows the patch would change nothing.

The cache (``logic.StatusCache``) is seeded from one LIST per kind whenever this replica
claims partitions (``Seeding``), so the first write to each object after a claim needs no GET.
The same list arms the claimed objects' deadlines (``deadlines``), as does every write,
skipped or not.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from services.writer import logic
from services.writer.rules import Rule, Rules
from shared import subjects
from shared.claims import Claim
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    MetadataChanged,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    StatusWritten,
    stable_id,
)
from shared.metrics import counter
from shared.ports import KubeMergePatcher, KubeReader, Publisher
from shared.resources import ref_to

log = logging.getLogger(__name__)

#: Every status PATCH by result (written, conflict, invalid, not_found, error), and the writes
#: the cache showed would change nothing (skipped).
STATUS_WRITES = counter("capibus_status_writes", "Status writes by outcome", ["outcome"])
_OUTCOMES: tuple[tuple[type[Exception], str], ...] = (
    (KubeConflict, "conflict"),
    (KubeInvalid, "invalid"),
    (KubeNotFound, "not_found"),
)

Json = dict[str, Any]


class StatusApi(KubeReader, KubeMergePatcher, Protocol):
    """Reads objects and patches their status and metadata."""


class Deadlines(Protocol):
    """Wakes an object when its derived status would change by time alone (a timeout)."""

    def arm(
        self, ref: ObjectRef, status: Json, rule: Rule, *, after: str | None = None
    ) -> None: ...

    def forget(self, ref: ObjectRef) -> None: ...

    def drop(self, partitions: Collection[int]) -> None: ...


@dataclass(frozen=True)
class Deps:
    kube: StatusApi
    journal: Publisher
    cache: logic.StatusCache
    rules: Rules
    #: this replica's name, recorded on every journal entry
    writer: str
    deadlines: Deadlines | None = None
    conflict_retries: int = 3
    partitions: int = 1


# --- status ---------------------------------------------------------------------------------


async def write_status(batch: Batch[PatchStatus], deps: Deps) -> None:
    started = datetime.now(UTC)
    ref = batch.latest.ref
    rule = deps.rules.of(ref)
    current, stale = logic.split_incarnations(list(batch.messages))
    if stale:
        log.info("%s: dropped %d status update(s) for a replaced object", ref.key, len(stale))
    try:
        written, snapshot = await _write(current, ref, rule, deps, token=batch.lease_token)
    except KubeNotFound as exc:
        deps.cache.forget(_cache_key(ref))
        if deps.deadlines is not None:
            deps.deadlines.forget(ref)
        log.info("%s: dropped %d status update(s): %s", ref.key, len(batch.messages), exc)
        return
    version = written["metadata"]["resourceVersion"] if written else None
    if written is None:
        STATUS_WRITES.inc("skipped")
    if deps.deadlines is not None:
        # Written or not: a nudge that came before its deadline (another replica's clock)
        # changed nothing, and only a new timer brings the timeout now.
        deps.deadlines.arm(ref, snapshot.status, rule, after=logic.last_nudge(current))
    await _record(batch, rule, deps, started, version=version, skipped=written is None)


async def _write(
    messages: list[PatchStatus], ref: ObjectRef, rule: Rule, deps: Deps, *, token: int
) -> tuple[Json | None, logic.Snapshot]:
    """Write the planned patch: (the object written, or None when it would change nothing;
    the object as it now is)."""
    key = _cache_key(ref)
    snapshot = deps.cache.get(key, ref.uid, token) or await _read(deps.kube, ref, rule)
    written: Json | None = None
    for attempt in range(deps.conflict_retries + 1):
        patch = logic.plan(snapshot, messages, rule.derive, datetime.now(UTC))
        if patch is None:
            return written, snapshot
        try:
            written = await _patch(deps.kube, ref, rule.kind, patch, snapshot.resource_version)
        except (KubeConflict, KubeInvalid) as exc:
            snapshot = await _read(deps.kube, ref, rule)
            if attempt == deps.conflict_retries:
                if isinstance(exc, KubeInvalid):
                    raise PermanentError(f"status rejected: {exc}", reason="InvalidStatus") from exc
                raise
            continue
        snapshot = logic.Snapshot.of(written, rule.facts)
        deps.cache.put(key, snapshot, token)
        # The spec may have moved on since our snapshot (a lease added): derive once more
        # from what the server returned; usually this changes nothing and costs no request.
        messages = []
    return written, snapshot


async def _read(kube: StatusApi, ref: ObjectRef, rule: Rule) -> logic.Snapshot:
    return logic.Snapshot.of(await _current(kube, ref, rule.kind), rule.facts)


async def _current(kube: StatusApi, ref: ObjectRef, kind: ResourceKind) -> Json:
    current = await kube.get(kind, ref.namespace, ref.name)
    if ref.uid and current["metadata"]["uid"] != ref.uid:
        raise KubeNotFound(f"{ref.key} was replaced (uid {ref.uid} is gone)")
    return current


async def _patch(
    kube: StatusApi, ref: ObjectRef, kind: ResourceKind, patch: Json, version: str | None
) -> Json:
    preconditions = {"uid": ref.uid, "resourceVersion": version}
    body: Json = {"status": patch}
    if any(preconditions.values()):
        body["metadata"] = {k: v for k, v in preconditions.items() if v}
    try:
        subresource = "status" if kind.status_subresource else None
        written = await kube.patch_merge(
            kind, ref.namespace, ref.name, body, subresource=subresource
        )
    except Exception as exc:
        STATUS_WRITES.inc(next((o for t, o in _OUTCOMES if isinstance(exc, t)), "error"))
        raise
    STATUS_WRITES.inc("written")
    return written


async def _record(
    batch: Batch[PatchStatus],
    rule: Rule,
    deps: Deps,
    started: datetime,
    *,
    version: str | None,
    skipped: bool,
) -> None:
    ids = [m.id for m in batch.messages]
    ref = batch.latest.ref
    entry = StatusWritten(
        id=stable_id("written", *ids),
        source=f"writer/{deps.writer}",
        correlation_id=batch.latest.correlation_id,
        causation_id=batch.latest.id,
        ref=ref,
        update_ids=ids,
        resource_version=version,
        writer=deps.writer,
        skipped=skipped,
        started=started,
        finished=datetime.now(UTC),
    )
    await deps.journal.publish(_journal_subject("statuswritten", rule, ref), entry)


def _journal_subject(what: str, rule: Rule, ref: ObjectRef) -> str:
    return subjects.journal(what, rule.kind.token, ref.namespace, ref.name)


def _cache_key(ref: ObjectRef) -> str:
    return f"{ref.kind}/{ref.key}"


# --- metadata -------------------------------------------------------------------------------


async def write_metadata(batch: Batch[PatchMetadata], deps: Deps) -> None:
    """Carry out metadata commands one by one, each against a fresh read (they are rare).

    What the server returns goes into the status cache: the next status write then names
    the new ``resourceVersion`` instead of losing a round to our own change.
    """
    for command in batch.messages:
        ref = command.ref
        rule = deps.rules.of(ref)
        try:
            current = await _apply_metadata(command, rule.kind, deps)
        except KubeNotFound as exc:
            log.info("%s: dropped metadata change: %s", ref.key, exc)
            continue
        deps.cache.put(_cache_key(ref), logic.Snapshot.of(current, rule.facts), batch.lease_token)
        entry = MetadataChanged(
            id=stable_id("metadata", command.id),
            source=f"writer/{deps.writer}",
            **command.caused(),
            ref=ref,
            command=command.model_dump(mode="json", exclude={"subject"}),
        )
        await deps.journal.publish(_journal_subject("metadata", rule, ref), entry)


async def _apply_metadata(command: PatchMetadata, kind: ResourceKind, deps: Deps) -> Json:
    """The object after ``command`` (unchanged if it asked for nothing new)."""
    ref = command.ref
    for attempt in range(deps.conflict_retries + 1):
        current = await _current(deps.kube, ref, kind)
        patch = logic.metadata_patch(current, command)
        if patch is None:
            return current
        try:
            return await deps.kube.patch_merge(kind, ref.namespace, ref.name, patch)
        except KubeConflict:
            if attempt == deps.conflict_retries:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


# --- claims ---------------------------------------------------------------------------------


async def seed(claim: Claim, deps: Deps) -> int:
    """Prime the cache for a partition just claimed and arm its objects' deadlines: the
    replica that armed them before may be gone. One list per kind serves the whole round."""
    seeded = 0
    for rule in deps.rules:
        kind = rule.kind
        try:
            objects, _ = await claim.round.once(kind.token, functools.partial(deps.kube.list, kind))
        except KubeNotFound:
            # A provider whose CRDs this installation does not serve: nothing of it to seed.
            continue
        for obj in objects:
            ref = ref_to(kind, obj)
            if subjects.partition_of(ref.key, deps.partitions) != claim.partition:
                continue
            seeded += _seed_one(ref, logic.Snapshot.of(obj, rule.facts), rule, claim, deps)
    return seeded


def _seed_one(ref: ObjectRef, listed: logic.Snapshot, rule: Rule, claim: Claim, deps: Deps) -> int:
    key = _cache_key(ref)
    seeded = deps.cache.seed(key, listed, claim.token)
    if deps.deadlines is not None:
        # Our own write under this claim is newer than the list, if there was one.
        known = deps.cache.get(key, listed.uid, claim.token) or listed
        deps.deadlines.arm(ref, known.status, rule)
    return int(seeded)
