"""Pure rules of the catalog: when a template is due, which versions, which label, which status.

**When.** A template needs a sync when its spec has not been concluded on yet
(``metadata.generation`` differs from ``status.observedGeneration``: created, spec changed,
or written by an operator that did not record it) and otherwise ``spec.syncFrequency`` seconds
after the last *concluded* attempt (``status.lastAttempt``, falling back to ``lastSync``). A
concluded attempt is one that found an answer: versions, or a repository that is malformed or
lacks the chart. ``syncFrequency`` counts as at most ``SYNC_FREQUENCY_MAX`` (the CRD's maximum,
which objects stored before it existed may exceed): a larger one would overflow the date
arithmetic and mean "never" anyway.

**Retries.** An unreachable repository concludes nothing: the due time stays where it was and
the template is tried again after ``retry_delay`` (the repository's ``Retry-After`` if it sent
one, else a doubling backoff up to a cap), until it answers. ``tried_unreachable`` tells an
event that already carries such a try (the echo of that very status write) from one that does
not (a redelivery of the event that led to the try): only the latter syncs.

**Which versions** (as upstream's ``reconcile_app_template``, azimuth-cloud/azimuth-capi-operator
``azimuth_capi/operator.py``): the index entries of ``spec.chart.name`` whose version is
in ``spec.versionRange`` (``services.catalog.versions``), newest first, the first
``keepVersions``. Entries whose version is not SemVer are ignored, as are repeats of a version.

Known versions are reused only while ``spec.chart`` is the chart the status says they came
from (``status.chart``, ``same_chart``); a status without that record (written by upstream or
an earlier capibus) counts as another chart. A status holds at most ``max_status_schema_bytes``
of schemas (``schema_bytes``), so it fits the API server's request limit; and it travels to the
writer as one message, so a status the bus refuses as too large is reported as too large
(``unsendable_message``) rather than lost.

**Which label, logo and description**: a non-empty spec value wins; else the value the status
already has (unless the chart changed); else the chart's (the ``azimuth.stackhpc.com/label``
annotation or the chart name, ``icon``, ``description``), taken from the newest version not
known before, or, unlike upstream (which left it empty), from the newest selected version when
all are known.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from services.catalog.versions import Range, Version
from shared import subjects
from shared.charts import ChartEntry
from shared.mergepatch import apply
from shared.messages import stable_id
from shared.models import (
    AppTemplate,
    AppTemplateChartSpec,
    AppTemplateSpec,
    AppTemplateStatus,
    AppTemplateVersion,
)
from shared.models.azimuth import SYNC_FREQUENCY_MAX, Condition
from shared.resources import APP_TEMPLATE, cluster_key

Json = dict[str, Any]

SYNCED = "Synced"
UNREACHABLE = "RepositoryUnreachable"
TOO_LARGE = "StatusTooLarge"
PRESENTATION = ("label", "logo", "description")
#: the longest ``Retry-After`` honoured as given; beyond it the repository is tried anyway
RETRY_AFTER_MAX = 86400.0
#: the due time of a spec that has not been concluded on: at once
IMMEDIATELY = datetime(1970, 1, 1, tzinfo=UTC)
#: condition messages are for humans; the API server caps them at 32768 characters
MESSAGE_LIMIT = 2000


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def partition_of(obj: Json, partitions: int) -> int:
    """The partition the watcher files this template's events under (and so its commands)."""
    return subjects.partition_of(cluster_key(APP_TEMPLATE, obj), partitions)


@dataclass(frozen=True)
class Due:
    """When a template's next sync is due, and the id every scheduler of it agrees on."""

    at: datetime
    generation: int
    uid: str

    @property
    def command_id(self) -> str:
        return stable_id(self.uid, "sync", str(self.generation), iso(self.at))

    def reached(self, now: datetime) -> bool:
        return self.at <= now


def due(obj: Json) -> Due:
    template = AppTemplate.model_validate(obj)
    meta = obj["metadata"]
    generation = int(meta.get("generation") or 0)
    status = template.status
    last = status.last_attempt or status.last_sync
    if status.observed_generation != generation or last is None:
        at = IMMEDIATELY
    else:
        at = last + timedelta(seconds=sync_period(template.spec))
    return Due(at=at, generation=generation, uid=str(meta.get("uid") or ""))


def sync_period(spec: AppTemplateSpec) -> int:
    return min(spec.sync_frequency, SYNC_FREQUENCY_MAX)


def tried_unreachable(seen: Json, generation: int) -> bool:
    """True if ``seen`` (an event's copy) records a try of ``generation`` that met an
    unreachable repository.

    Such a copy was made after the try, whose retry is already scheduled: the echo of its own
    status write, or a later metadata change. A copy made before it (the redelivered event
    that led to the try) records no such try, and is synced again.
    """
    conditions = AppTemplateStatus.model_validate(seen.get("status") or {}).conditions
    synced = next((c for c in conditions if c.type == SYNCED), None)
    return (
        synced is not None
        and synced.reason == UNREACHABLE
        and synced.observed_generation == generation
    )


def retry_delay(attempt: int, *, retry_after: float | None, first: float, cap: float) -> float:
    """Seconds until the ``attempt``-th retry (1-based) of an unreachable repository.

    The repository's ``Retry-After`` wins (up to a day, and never sooner than ``first``: each
    try's command id names its due second); otherwise ``first`` doubles per attempt up to
    ``cap``.
    """
    if retry_after is not None:
        return max(first, min(retry_after, RETRY_AFTER_MAX))
    return float(min(cap, first * 2 ** min(max(attempt - 1, 0), 32)))


# --- versions ------------------------------------------------------------------------------


def select(entries: Iterable[ChartEntry], version_range: Range, keep: int) -> list[ChartEntry]:
    """The newest ``keep`` entries in range, newest first; one entry per version."""
    chosen: dict[Version, ChartEntry] = {}
    for entry in entries:
        version = Version.parse_or_none(entry.version)
        if version is not None and version in version_range:
            chosen.setdefault(version, entry)
    newest_first = sorted(chosen, reverse=True)
    return [chosen[v] for v in newest_first[:keep]]


def same_chart(spec: AppTemplateSpec, status: AppTemplateStatus) -> bool:
    """True if the status's versions came from the chart the spec names."""
    return status.chart is not None and status.chart == spec.chart


def known_versions(status: AppTemplateStatus) -> dict[str, AppTemplateVersion]:
    return {v.name: v for v in status.versions}


def schema_bytes(version: AppTemplateVersion) -> int:
    """What a version's schemas add to the status, as compact JSON."""
    return sum(
        len(json.dumps(schema, separators=(",", ":")).encode())
        for schema in (version.values_schema, version.ui_schema)
    )


def presentation(
    spec: AppTemplateSpec, status: AppTemplateStatus, source: ChartEntry | None
) -> Json:
    """``label``, ``logo`` and ``description`` for the status; empty values are left out."""
    chart = {
        "label": source.label if source else "",
        "logo": source.icon if source else "",
        "description": source.description if source else "",
    }
    result: Json = {}
    for field, from_chart in chart.items():
        value = getattr(spec, field) or getattr(status, field) or from_chart
        if value:
            result[field] = value
    return result


def replacing(shown: Json) -> Json:
    """``shown`` as a merge patch that also removes the presentation fields it leaves out."""
    return {field: shown.get(field) for field in PRESENTATION}


def source_entry(selected: Sequence[ChartEntry], known: Iterable[str]) -> ChartEntry | None:
    seen = set(known)
    fresh = [e for e in selected if e.version not in seen]
    if fresh:
        return fresh[0]
    return selected[0] if selected else None


# --- status --------------------------------------------------------------------------------


def synced_patch(
    obj: Json,
    *,
    versions: list[AppTemplateVersion],
    chart: AppTemplateChartSpec,
    shown: Json,
    message: str,
    now: datetime,
) -> Json:
    """The status after a successful sync: versions and their chart, presentation, times,
    Synced=True."""
    return {
        **shown,
        "versions": [v.model_dump(mode="json", by_alias=True) for v in versions],
        "chart": chart.model_dump(mode="json", by_alias=True),
        "lastSync": iso(now),
        **concluded(obj, status="True", reason=SYNCED, message=message, now=now),
    }


def concluded(obj: Json, *, status: str, reason: str, message: str, now: datetime) -> Json:
    """The keys every concluded attempt writes; the next sync is due from ``lastAttempt``."""
    generation = int(obj["metadata"].get("generation") or 0)
    return {
        "lastAttempt": iso(now),
        "observedGeneration": generation,
        "conditions": with_condition(obj, status=status, reason=reason, message=message, now=now),
    }


def unconcluded(obj: Json, *, reason: str, message: str, now: datetime) -> Json:
    """Only the condition: versions, times and the due time stay as they were."""
    return {
        "conditions": with_condition(obj, status="False", reason=reason, message=message, now=now)
    }


def with_condition(
    obj: Json, *, status: str, reason: str, message: str, now: datetime
) -> list[Json]:
    """The status conditions with ``Synced`` set; ``lastTransitionTime`` moves on flips only."""
    current = AppTemplateStatus.model_validate(obj.get("status") or {}).conditions
    before = next((c for c in current if c.type == SYNCED), None)
    since = before.last_transition_time if before and before.status == status else now
    updated = Condition.model_validate(
        {
            "type": SYNCED,
            "status": status,
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "lastTransitionTime": since.replace(microsecond=0),
            "observedGeneration": int(obj["metadata"].get("generation") or 0),
        }
    )
    merged = [updated if c.type == SYNCED else c for c in current]
    if before is None:
        merged.append(updated)
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in merged]


def changes_nothing(obj: Json, patch: Json) -> bool:
    status = obj.get("status") or {}
    return bool(apply(status, patch) == status)


def with_status(obj: Json, patch: Json) -> Json:
    """``obj`` as it will be once the writer has merged ``patch`` into its status."""
    return {**obj, "status": apply(obj.get("status") or {}, patch)}


def synced_message(spec: AppTemplateSpec, versions: list[AppTemplateVersion]) -> str:
    return (
        f"{len(versions)} version(s) of {spec.chart.name} from {spec.chart.repo}, "
        f"newest {versions[0].name}"
    )


def no_versions_message(spec: AppTemplateSpec, listed: int, status: AppTemplateStatus) -> str:
    kept = f"; keeping the {len(status.versions)} known version(s)" if status.versions else ""
    return (
        f"none of the {listed} listed version(s) of {spec.chart.name} is in range "
        f"{spec.version_range!r} (prereleases count only if the lower bound has one){kept}"
    )


def too_large_message(spec: AppTemplateSpec, counted: int, limit: int) -> str:
    return (
        f"the schemas of the newest {counted} version(s) of {spec.chart.name} exceed "
        f"{limit} bytes, the most one status may hold (CAPIBUS_CATALOG__MAX_STATUS_SCHEMA_BYTES);"
        " lower keepVersions or narrow versionRange"
    )


def unsendable_message(spec: AppTemplateSpec, counted: int, refusal: Exception) -> str:
    return (
        f"the status with {counted} version(s) of {spec.chart.name} is larger than one message"
        f" to the writer may be ({refusal}); lower keepVersions or narrow versionRange"
    )
