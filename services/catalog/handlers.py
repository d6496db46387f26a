"""The catalog's work: keep each AppTemplate's versions in step with its chart repository.

Three things lead to ``converge``, always under the template's lock and against a fresh read
(an event's copy may be older than the status this service last reported):

- an AppTemplate event (created, spec changed, status written, deleted);
- a ``SyncAppTemplate`` command, published by this service's own timer when a template's due
  time comes (``services.catalog.timers``);
- a partition claim: ``arm_claimed`` lists the templates (one list for all the partitions
  claimed together) and arms the timers of the claimed partition's; an overdue one fires at
  once. That is the start-up sync of upstream's resume.

``converge`` syncs when the template is due (``logic.due``) and otherwise arms its timer, so
nothing polls and a template with nothing to do costs nothing until its time comes.

A sync reads ``index.yaml``, selects the versions, reuses what the status already knows of the
same chart and downloads only new versions' archives. Its outcome is a JSON merge patch of the
status, reported (``StatusReporter``) to the writer, which writes the status of every kind
capibus owns (``shared.status.WRITTEN``). The catalog does not wait for the write: it arms the
next sync from the status it asked for (``logic.with_status``), and the write's echo (the
AppTemplate event it causes) finds the template not due and re-arms the same moment. Every
report, and every one skipped because the status already says the same, is counted in
``capibus_catalog_status_writes_total``:

====================================  ===========================================================
outcome                               status
====================================  ===========================================================
versions found                        versions, ``chart``, label/logo/description, ``lastSync``,
                                      ``lastAttempt``, ``observedGeneration``, Synced=True
none in range / chart not listed      Synced=False ``NoVersions`` / ``ChartNotFound``, known
                                      versions kept; ``lastAttempt`` moves: next try at the next
                                      scheduled sync or spec change
malformed index, chart or schema      Synced=False ``RepositoryInvalid`` / ``ChartInvalid``; as
                                      above
schemas larger than a status may      Synced=False ``StatusTooLarge``; as above (downloads stop
hold, or a status larger than one     at the limit; the bus refuses a message over its maximum
message can carry                     payload as ``MessageTooLarge``)
repository unreachable, 5xx, 429      Synced=False ``RepositoryUnreachable``, nothing else moves;
                                      the template's timer tries again after ``Retry-After`` or a
                                      doubling backoff, until the repository answers
====================================  ===========================================================

**Unreachable repositories** are retried by the template's own timer, not by the consumer:
the message is acked once the condition is reported and the retry armed. The retry survives
what a consumer's would not: the due time has not moved, so whichever replica claims the
partition next finds the template overdue and tries at once. The backoff's exponent lives in
this process (``UnreachableTries``); a restart or handover only starts it over. An event that
already carries such a try (the echo of the condition write) leaves the retry to the timer;
any other event, such as a redelivery of the one that led to the try, reads the index again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from services.catalog import logic
from services.catalog.timers import SyncTimers
from services.catalog.versions import Range
from shared.charts import ChartEntry, ChartSchemas, RepositoryInvalid, RepositoryUnavailable
from shared.claims import Claim
from shared.consumer import Batch
from shared.errors import KubeNotFound, MessageTooLarge, PermanentError
from shared.locks import KeyedLocks
from shared.messages import Message, ObjectRef, ResourceChanged, SyncAppTemplate
from shared.metrics import counter
from shared.models import AppTemplate, AppTemplateStatus, AppTemplateVersion
from shared.ports import KubeReader
from shared.resources import APP_TEMPLATE, ref_to
from shared.status import StatusReporter

log = logging.getLogger(__name__)

Json = dict[str, Any]
Clock = Callable[[], datetime]

#: Every status update reported to the writer (written), and those skipped because the status
#: already said the same (skipped).
STATUS_WRITES = counter(
    "capibus_catalog_status_writes",
    "AppTemplate status updates reported to the writer, or skipped, by outcome",
    ["outcome"],
)


class ChartSource(Protocol):
    """``shared.charts.ChartRepositories`` in production."""

    async def versions(self, repo: str, chart: str) -> list[ChartEntry] | None: ...

    async def schemas(self, repo: str, entry: ChartEntry) -> ChartSchemas: ...


@dataclass(frozen=True)
class Config:
    partitions: int
    #: first wait after an unreachable repository; doubles per failure up to the next
    retry_first_seconds: float = 2.0
    retry_max_seconds: float = 600.0
    #: the most schema JSON one status may carry (downloads stop there)
    max_status_schema_bytes: int = 1 << 20


def utcnow() -> datetime:
    return datetime.now(UTC)


class UnreachableTries:
    """How many tries in a row met an unreachable repository, per template, in this process."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def another(self, key: str) -> int:
        self._count[key] = self._count.get(key, 0) + 1
        return self._count[key]

    def forget(self, key: str) -> None:
        self._count.pop(key, None)


@dataclass(frozen=True)
class Deps:
    kube: KubeReader
    charts: ChartSource
    timers: SyncTimers
    reporter: StatusReporter
    config: Config
    clock: Clock = utcnow
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    retries: UnreachableTries = field(default_factory=UnreachableTries)


async def on_template_event(batch: Batch[ResourceChanged], deps: Deps) -> None:
    event = batch.latest
    async with deps.locks(event.ref.key):
        if event.event == "DELETED":
            _forget(deps, event.ref)
            return
        await converge(event.ref, deps=deps, now=deps.clock(), cause=event, seen=event.object)


async def on_sync_command(batch: Batch[SyncAppTemplate], deps: Deps) -> None:
    # The command says the sync is due at ``command.due``: judged at that moment, a timer
    # that fired a hair early (monotonic and wall clocks differ) still counts.
    command = batch.latest
    async with deps.locks(command.ref.key):
        await converge(command.ref, deps=deps, now=max(deps.clock(), command.due), cause=command)


async def converge(
    ref: ObjectRef, *, deps: Deps, now: datetime, cause: Message, seen: Json | None = None
) -> None:
    """Sync ``ref`` if due, else arm its timer; ``seen`` is the copy an event carried."""
    obj = await _read(deps.kube, ref)
    if obj is None:
        _forget(deps, ref)
        return
    try:
        due = logic.due(obj)
        retry_armed = seen is not None and logic.tried_unreachable(seen, due.generation)
    except ValidationError as exc:
        raise PermanentError(f"{ref.key} does not parse: {exc}", reason="InvalidTemplate") from exc
    if not due.reached(now):
        _arm(deps, obj, due)
    elif not retry_armed:
        await sync(obj, deps=deps, cause=cause)


def _forget(deps: Deps, ref: ObjectRef) -> None:
    deps.timers.cancel(ref.key, ref.uid)
    deps.retries.forget(ref.key)


async def arm_claimed(claim: Claim, deps: Deps) -> int:
    """Arm the timers of the templates in ``claim``'s partition, from the one list of
    AppTemplates the claims of this rebalance share; returns how many."""
    items, _ = await claim.round.once("apptemplates", lambda: deps.kube.list(APP_TEMPLATE))
    armed = 0
    for obj in items:
        if logic.partition_of(obj, deps.config.partitions) != claim.partition:
            continue
        try:
            due = logic.due(obj)
        except ValidationError as exc:
            log.warning("%s does not parse, not scheduled: %s", obj["metadata"]["name"], exc)
            continue
        _arm(deps, obj, due)
        armed += 1
    return armed


def _arm(deps: Deps, obj: Json, due: logic.Due) -> None:
    partition = logic.partition_of(obj, deps.config.partitions)
    deps.timers.arm(ref_to(APP_TEMPLATE, obj), due, partition=partition)


async def _read(kube: KubeReader, ref: ObjectRef) -> Json | None:
    """The template now, or None when it is gone or was replaced by a new incarnation."""
    try:
        obj = await kube.get(APP_TEMPLATE, None, ref.name)
    except KubeNotFound:
        return None
    if ref.uid and obj["metadata"].get("uid") != ref.uid:
        return None
    return obj


# --- one sync ------------------------------------------------------------------------------


async def sync(obj: Json, *, deps: Deps, cause: Message) -> None:
    template = AppTemplate.model_validate(obj)
    name = obj["metadata"]["name"]
    try:
        patch = await _outcome(obj, template, deps)
    except RepositoryUnavailable as exc:
        await _unreachable(obj, template, exc, deps=deps, cause=cause)
        return
    except RepositoryInvalid as exc:
        log.warning("%s: %s", name, exc)
        patch = _failed(obj, deps.clock(), exc.reason, str(exc))
    deps.retries.forget(ref_to(APP_TEMPLATE, obj).key)
    try:
        expected = await _report(obj, patch, deps=deps, cause=cause)
    except MessageTooLarge as exc:
        # The schemas fit the limit, but the whole status does not fit one message.
        log.warning("%s: %s", name, exc)
        message = logic.unsendable_message(template.spec, len(patch.get("versions") or []), exc)
        failed = _failed(obj, deps.clock(), logic.TOO_LARGE, message)
        expected = await _report(obj, failed, deps=deps, cause=cause)
    _arm(deps, expected, logic.due(expected))


async def _outcome(obj: Json, template: AppTemplate, deps: Deps) -> Json:
    """The status patch a sync produces; raises the repository errors it cannot conclude on."""
    spec, charts, clock = template.spec, deps.charts, deps.clock
    repo, chart = str(spec.chart.repo), spec.chart.name
    try:
        version_range = Range.parse(spec.version_range)
    except ValueError as exc:
        return _failed(obj, clock(), "InvalidVersionRange", str(exc))
    entries = await charts.versions(repo, chart)
    if entries is None:
        return _failed(obj, clock(), "ChartNotFound", f"{repo} lists no chart named {chart!r}")
    selected = logic.select(entries, version_range, spec.keep_versions)
    if not selected:
        message = logic.no_versions_message(spec, len(entries), template.status)
        return _failed(obj, clock(), "NoVersions", message)
    # What the status knows of another chart is no help: its versions and presentation go.
    same = logic.same_chart(spec, template.status)
    basis = template.status if same else AppTemplateStatus()
    known = logic.known_versions(basis)
    limit = deps.config.max_status_schema_bytes
    versions: list[AppTemplateVersion] = []
    size = 0
    for entry in selected:
        version = known.get(entry.version) or await _fetch(charts, repo, entry)
        versions.append(version)
        size += logic.schema_bytes(version)
        if size > limit:
            message = logic.too_large_message(spec, len(versions), limit)
            return _failed(obj, clock(), logic.TOO_LARGE, message)
    shown = logic.presentation(spec, basis, logic.source_entry(selected, known))
    return logic.synced_patch(
        obj,
        versions=versions,
        chart=spec.chart,
        shown=shown if same else logic.replacing(shown),
        message=logic.synced_message(spec, versions),
        now=clock(),
    )


async def _fetch(charts: ChartSource, repo: str, entry: ChartEntry) -> AppTemplateVersion:
    schemas = await charts.schemas(repo, entry)
    return AppTemplateVersion(
        name=entry.version, values_schema=schemas.values_schema, ui_schema=schemas.ui_schema
    )


def _failed(obj: Json, now: datetime, reason: str, message: str) -> Json:
    return logic.concluded(obj, status="False", reason=reason, message=message, now=now)


async def _unreachable(
    obj: Json, template: AppTemplate, exc: RepositoryUnavailable, *, deps: Deps, cause: Message
) -> None:
    """Say so on the status and arm the next try; the due time itself does not move."""
    ref, now = ref_to(APP_TEMPLATE, obj), deps.clock()
    message = f"{exc}; retrying"
    patch = logic.unconcluded(obj, reason=logic.UNREACHABLE, message=message, now=now)
    await _report(obj, patch, deps=deps, cause=cause)
    delay = logic.retry_delay(
        deps.retries.another(ref.key),
        retry_after=exc.delay,
        first=deps.config.retry_first_seconds,
        cap=min(float(logic.sync_period(template.spec)), deps.config.retry_max_seconds),
    )
    current = logic.due(obj)
    retry = logic.Due(
        at=now + timedelta(seconds=delay), generation=current.generation, uid=current.uid
    )
    _arm(deps, obj, retry)
    log.info("%s: repository unreachable, next try in %.0fs: %s", ref.name, delay, exc)


async def _report(obj: Json, patch: Json, *, deps: Deps, cause: Message) -> Json:
    """Ask the writer to merge ``patch`` into the status (unless it changes nothing); the
    template as it will be once written."""
    if logic.changes_nothing(obj, patch):
        STATUS_WRITES.inc("skipped")
        return obj
    await deps.reporter.report(ref_to(APP_TEMPLATE, obj), patch=patch, cause=cause)
    STATUS_WRITES.inc("written")
    return logic.with_status(obj, patch)
