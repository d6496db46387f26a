"""Pure rules of the catalog: when a template is due, which versions, which label, which status.

**When.** A template needs a sync when its spec has not been concluded on yet
(``metadata.generation`` differs from ``status.observedGeneration``: created, spec changed,
or written by an operator that did not record it) and otherwise ``spec.syncFrequency`` seconds
after the last *concluded* attempt (``status.lastAttempt``, falling back to ``lastSync``). A
concluded attempt is one that found an answer: versions, or a repository that is malformed or
lacks the chart. An unreachable repository concludes nothing: it is retried, and the due time
stays where it was.

**Which versions** (upstream H20): the index entries of ``spec.chart.name`` whose version is
in ``spec.versionRange`` (``services.catalog.versions``), newest first, the first
``keepVersions``. Entries whose version is not SemVer are ignored, as are repeats of a version.

**Which label, logo and description**: a non-empty spec value wins; else the value the status
already has; else the chart's (the ``azimuth.stackhpc.com/label`` annotation or the chart
name, ``icon``, ``description``), taken from the newest version not known before, or, unlike
upstream (which left it empty), from the newest selected version when all are known.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from services.catalog.versions import Range, Version
from shared import subjects
from shared.charts import ChartEntry
from shared.mergepatch import apply
from shared.messages import ObjectRef, stable_id
from shared.models import AppTemplate, AppTemplateSpec, AppTemplateStatus, AppTemplateVersion
from shared.models.azimuth import Condition
from shared.resources import APP_TEMPLATE, cluster_key

Json = dict[str, Any]

SYNCED = "Synced"
UNREACHABLE = "RepositoryUnreachable"
#: the due time of a spec that has not been concluded on: at once
IMMEDIATELY = datetime(1970, 1, 1, tzinfo=UTC)
#: condition messages are for humans; the API server caps them at 32768 characters
MESSAGE_LIMIT = 2000


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ref_of(obj: Json) -> ObjectRef:
    meta = obj["metadata"]
    return ObjectRef(
        api_version=APP_TEMPLATE.api_version,
        kind=APP_TEMPLATE.kind,
        name=meta["name"],
        uid=meta.get("uid"),
    )


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
        at = last + timedelta(seconds=template.spec.sync_frequency)
    return Due(at=at, generation=generation, uid=str(meta.get("uid") or ""))


def awaiting_retry(obj: Json) -> bool:
    """True while the current spec's last try met an unreachable repository.

    Whoever met it is retrying (the consumer with backoff, then a fallback timer; a claim of
    the partition issues a fresh command), so an event such as that very status write need
    not start a second round of retries.
    """
    generation = int(obj["metadata"].get("generation") or 0)
    conditions = AppTemplateStatus.model_validate(obj.get("status") or {}).conditions
    synced = next((c for c in conditions if c.type == SYNCED), None)
    return (
        synced is not None
        and synced.reason == UNREACHABLE
        and synced.observed_generation == generation
    )


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


def known_versions(status: AppTemplateStatus) -> dict[str, AppTemplateVersion]:
    return {v.name: v for v in status.versions}


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
    shown: Json,
    message: str,
    now: datetime,
) -> Json:
    """The status after a successful sync: versions, presentation, times, Synced=True."""
    return {
        **shown,
        "versions": [v.model_dump(mode="json", by_alias=True) for v in versions],
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
