"""The catalog's work: keep each AppTemplate's versions in step with its chart repository.

Three things lead to ``converge``, always under the template's lock and against a fresh read
(an event's copy may be older than the status this service just wrote):

- an AppTemplate event (created, spec changed, status written, deleted);
- a ``SyncAppTemplate`` command, published by this service's own timer when a template's due
  time comes (``services.catalog.timers``);
- a partition claim: ``rearm`` lists the templates of the owned partitions and arms their
  timers; an overdue one fires at once. That is the start-up sync of upstream's resume.

``converge`` syncs when the template is due (``logic.due``) and otherwise arms its timer, so
nothing polls and a template with nothing to do costs nothing until its time comes.

A sync reads ``index.yaml``, selects the versions, reuses what the status already knows and
downloads only new versions' archives. Its outcome is written to ``apptemplates/status`` with
a JSON merge patch (this service is the only writer of AppTemplate status):

====================================  ===========================================================
outcome                               status
====================================  ===========================================================
versions found                        versions, label/logo/description, ``lastSync``,
                                      ``lastAttempt``, ``observedGeneration``, Synced=True
none in range / chart not listed      Synced=False ``NoVersions`` / ``ChartNotFound``, known
                                      versions kept; ``lastAttempt`` moves: next try at the next
                                      scheduled sync or spec change
malformed index, chart or schema      Synced=False ``RepositoryInvalid`` / ``ChartInvalid``; as
                                      above
repository unreachable, 5xx, 429      Synced=False ``RepositoryUnreachable``, nothing else moves;
                                      the ``TemporaryError`` goes to the consumer, which retries
                                      with backoff; a fallback timer tries again later still in
                                      case the consumer gives up
====================================  ===========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from services.catalog import logic
from services.catalog.versions import Range
from shared.charts import ChartEntry, ChartSchemas, RepositoryInvalid, RepositoryUnavailable
from shared.errors import KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import ObjectRef, ResourceChanged, SyncAppTemplate
from shared.models import AppTemplate, AppTemplateVersion
from shared.resources import APP_TEMPLATE, correlation_id

log = logging.getLogger(__name__)

Json = dict[str, Any]
Clock = Callable[[], datetime]


class TemplateApi(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def list(
        self, kind: ResourceKind, *, namespace: str | None = None
    ) -> tuple[list[Json], str]: ...

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json: ...


class ChartSource(Protocol):
    """``shared.charts.ChartRepositories`` in production."""

    async def versions(self, repo: str, chart: str) -> list[ChartEntry] | None: ...

    async def schemas(self, repo: str, entry: ChartEntry) -> ChartSchemas: ...


class Timers(Protocol):
    """One pending sync per template (``services.catalog.timers.SyncTimers``)."""

    def arm(
        self, ref: ObjectRef, due: logic.Due, *, partition: int, correlation_id: str
    ) -> None: ...

    def cancel(self, key: str, uid: str | None = None) -> None: ...


@dataclass(frozen=True)
class Config:
    partitions: int
    #: after an unreachable repository, try again this much later at the latest
    retry_unreachable_seconds: float = 600.0


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Deps:
    kube: TemplateApi
    charts: ChartSource
    timers: Timers
    locks: KeyedLocks
    config: Config
    clock: Clock = utcnow


async def on_template_event(*, event: ResourceChanged, deps: Deps) -> None:
    async with deps.locks(event.ref.key):
        if event.event == "DELETED":
            deps.timers.cancel(event.ref.key, event.ref.uid)
            return
        await converge(event.ref, deps=deps, now=deps.clock(), from_event=True)


async def on_sync_command(*, command: SyncAppTemplate, deps: Deps) -> None:
    # The command says the sync is due at ``command.due``: judged at that moment, a timer
    # that fired a hair early (monotonic and wall clocks differ) still counts.
    async with deps.locks(command.ref.key):
        await converge(command.ref, deps=deps, now=max(deps.clock(), command.due))


async def converge(ref: ObjectRef, *, deps: Deps, now: datetime, from_event: bool = False) -> None:
    obj = await _read(deps.kube, ref)
    if obj is None:
        deps.timers.cancel(ref.key, ref.uid)
        return
    try:
        due = logic.due(obj)
        retrying = logic.awaiting_retry(obj)
    except ValidationError as exc:
        raise PermanentError(f"{ref.key} does not parse: {exc}", reason="InvalidTemplate") from exc
    if not due.reached(now):
        _arm(deps, obj, due)
    elif not (from_event and retrying):
        await sync(obj, deps=deps)


async def rearm(owned: frozenset[int], *, deps: Deps) -> int:
    """Arm the timer of every template in ``owned`` partitions; returns how many."""
    items, _ = await deps.kube.list(APP_TEMPLATE)
    armed = 0
    for obj in items:
        partition = logic.partition_of(obj, deps.config.partitions)
        if partition not in owned:
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
    deps.timers.arm(
        logic.ref_of(obj),
        due,
        partition=logic.partition_of(obj, deps.config.partitions),
        correlation_id=correlation_id(APP_TEMPLATE, obj),
    )


async def _read(kube: TemplateApi, ref: ObjectRef) -> Json | None:
    """The template now, or None when it is gone or was replaced by a new incarnation."""
    try:
        obj = await kube.get(APP_TEMPLATE, None, ref.name)
    except KubeNotFound:
        return None
    if ref.uid and obj["metadata"].get("uid") != ref.uid:
        return None
    return obj


# --- one sync ------------------------------------------------------------------------------


async def sync(obj: Json, *, deps: Deps) -> None:
    template = AppTemplate.model_validate(obj)
    name = obj["metadata"]["name"]
    try:
        patch = await _outcome(obj, template, deps.charts, deps.clock)
    except RepositoryUnavailable as exc:
        now = deps.clock()
        message = f"{exc}; retrying"
        await _write(
            deps.kube,
            obj,
            logic.unconcluded(obj, reason=logic.UNREACHABLE, message=message, now=now),
        )
        _arm_fallback(deps, obj, template, now)
        log.info("%s: repository unreachable, will retry: %s", name, exc)
        raise
    except RepositoryInvalid as exc:
        log.warning("%s: %s", name, exc)
        patch = _failed(obj, deps.clock(), exc.reason, str(exc))
    result = await _write(deps.kube, obj, patch)
    if result is not None:
        _arm(deps, result, logic.due(result))


async def _outcome(obj: Json, template: AppTemplate, charts: ChartSource, clock: Clock) -> Json:
    """The status patch a sync produces; raises the repository errors it cannot conclude on."""
    spec, status = template.spec, template.status
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
        message = logic.no_versions_message(spec, len(entries), status)
        return _failed(obj, clock(), "NoVersions", message)
    known = logic.known_versions(status)
    versions = [known.get(e.version) or await _fetch(charts, repo, e) for e in selected]
    shown = logic.presentation(spec, status, logic.source_entry(selected, known))
    message = logic.synced_message(spec, versions)
    return logic.synced_patch(obj, versions=versions, shown=shown, message=message, now=clock())


async def _fetch(charts: ChartSource, repo: str, entry: ChartEntry) -> AppTemplateVersion:
    schemas = await charts.schemas(repo, entry)
    return AppTemplateVersion(
        name=entry.version, values_schema=schemas.values_schema, ui_schema=schemas.ui_schema
    )


def _failed(obj: Json, now: datetime, reason: str, message: str) -> Json:
    return logic.concluded(obj, status="False", reason=reason, message=message, now=now)


def _arm_fallback(deps: Deps, obj: Json, template: AppTemplate, now: datetime) -> None:
    """A later try in case the consumer's retries run out while the repository is down."""
    delay = min(float(template.spec.sync_frequency), deps.config.retry_unreachable_seconds)
    current = logic.due(obj)
    retry = logic.Due(
        at=now + timedelta(seconds=delay), generation=current.generation, uid=current.uid
    )
    _arm(deps, obj, retry)


async def _write(kube: TemplateApi, obj: Json, patch: Json) -> Json | None:
    """Apply ``patch`` to the status (uid-guarded); the resulting object, None if it is gone."""
    meta = obj["metadata"]
    if logic.changes_nothing(obj, patch):
        return obj
    body = {"metadata": {"uid": meta["uid"]}, "status": patch}
    try:
        return await kube.patch_merge(APP_TEMPLATE, None, meta["name"], body, subresource="status")
    except KubeNotFound:
        log.info("%s: deleted during its sync", meta["name"])
        return None
