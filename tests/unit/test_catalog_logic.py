"""The catalog's pure rules: due times, version selection, presentation, status patches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from services.catalog import logic
from services.catalog.versions import Range
from shared import subjects
from shared.charts import ChartEntry
from shared.models import AppTemplate, AppTemplateVersion
from shared.models.azimuth import SYNC_FREQUENCY_MAX

Json = dict[str, Any]
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def template(status: Json | None = None, generation: int = 1, **spec: Any) -> Json:
    return {
        "apiVersion": "azimuth.stackhpc.com/v1alpha1",
        "kind": "AppTemplate",
        "metadata": {"name": "jupyterhub", "uid": "u1", "generation": generation},
        "spec": {"chart": {"repo": "http://charts.example", "name": "jupyterhub"}, **spec},
        "status": status or {},
    }


def entry(version: str, **extra: Any) -> ChartEntry:
    return ChartEntry(name="jupyterhub", version=version, urls=(f"jh-{version}.tgz",), **extra)


# --- due -----------------------------------------------------------------------------------


def test_a_new_template_is_due_at_once() -> None:
    due = logic.due(template())
    assert due.at == logic.IMMEDIATELY
    assert due.reached(NOW)


def test_a_changed_spec_is_due_at_once() -> None:
    status = {"lastSync": "2026-03-01T11:00:00Z", "observedGeneration": 1}
    assert logic.due(template(status, generation=2)).reached(NOW)


def test_an_upstream_status_without_observed_generation_is_synced_once() -> None:
    assert logic.due(template({"lastSync": "2026-03-01T11:59:00Z"})).reached(NOW)


def test_the_next_sync_follows_the_last_concluded_attempt() -> None:
    status = {
        "lastSync": "2026-03-01T10:00:00Z",
        "lastAttempt": "2026-03-01T11:00:00Z",
        "observedGeneration": 1,
    }
    due = logic.due(template(status, syncFrequency=3600))

    assert due.at == datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    assert due.reached(NOW)
    assert not due.reached(NOW - timedelta(seconds=1))


def test_a_sync_frequency_beyond_the_crd_maximum_is_clamped() -> None:
    status = {"lastAttempt": "2026-03-01T11:00:00Z", "observedGeneration": 1}
    due = logic.due(template(status, syncFrequency=10**30))
    assert due.at == datetime(2026, 3, 1, 11, 0, 0, tzinfo=UTC) + timedelta(
        seconds=SYNC_FREQUENCY_MAX
    )


def _unreachable(generation: int, condition_generation: int) -> Json:
    condition = {
        "type": "Synced",
        "status": "False",
        "reason": "RepositoryUnreachable",
        "message": "refused",
        "lastTransitionTime": "2026-03-01T11:00:00Z",
        "observedGeneration": condition_generation,
    }
    return template({"conditions": [condition]}, generation=generation)


def test_a_copy_after_an_unreachable_try_of_this_generation_is_left_to_the_retry() -> None:
    assert logic.tried_unreachable(_unreachable(2, 2), 2)
    # A try of an older spec, a copy from before any try, another reason: sync.
    assert not logic.tried_unreachable(_unreachable(2, 1), 2)
    assert not logic.tried_unreachable(_unreachable(2, 2), 3)
    assert not logic.tried_unreachable(template(generation=2), 2)
    other = _unreachable(2, 2)
    other["status"]["conditions"][0]["reason"] = "NoVersions"
    assert not logic.tried_unreachable(other, 2)


def test_retry_delays_double_up_to_the_cap_and_honour_retry_after() -> None:
    delays = [logic.retry_delay(n, retry_after=None, first=2, cap=60) for n in range(1, 8)]
    assert delays == [2, 4, 8, 16, 32, 60, 60]
    assert logic.retry_delay(10**6, retry_after=None, first=2, cap=60) == 60
    assert logic.retry_delay(1, retry_after=300, first=2, cap=60) == 300
    assert logic.retry_delay(1, retry_after=0, first=2, cap=60) == 2
    assert logic.retry_delay(1, retry_after=1e300, first=2, cap=60) == logic.RETRY_AFTER_MAX


def test_command_ids_are_stable_per_uid_generation_and_due_time() -> None:
    status = {"lastAttempt": "2026-03-01T11:00:00Z", "observedGeneration": 1}
    first, again = logic.due(template(status)), logic.due(template(status))
    later = logic.due(template({**status, "lastAttempt": "2026-03-01T11:00:01Z"}))

    assert first.command_id == again.command_id
    assert first.command_id != later.command_id


def test_partition_follows_the_watcher() -> None:
    assert logic.partition_of(template(), 16) == subjects.partition_of("/jupyterhub", 16)


# --- selection -----------------------------------------------------------------------------


def test_select_is_newest_first_in_range_and_truncated() -> None:
    entries = [entry(v) for v in ("0.1.0", "1.0.0", "0.2.0", "1.1.0-rc.1", "0.10.0", "bad")]

    chosen = logic.select(entries, Range.parse(">=0.0.0"), keep=3)

    assert [e.version for e in chosen] == ["1.0.0", "0.10.0", "0.2.0"]


def test_select_admits_prereleases_when_the_lower_bound_does() -> None:
    entries = [entry(v) for v in ("0.1.0", "1.0.0", "1.1.0-rc.1")]
    chosen = logic.select(entries, Range.parse(">=0.0.0-0,<2.0.0"), keep=5)
    assert [e.version for e in chosen] == ["1.1.0-rc.1", "1.0.0", "0.1.0"]


def test_select_keeps_one_entry_per_version() -> None:
    entries = [entry("1.0.0", icon="first"), entry("1.0.0+rebuilt", icon="second")]
    chosen = logic.select(entries, Range.parse(">=0.0.0"), keep=5)
    assert [e.icon for e in chosen] == ["first"]


def test_select_nothing() -> None:
    assert logic.select([entry("0.1.0")], Range.parse(">=1.0.0"), keep=5) == []


# --- presentation --------------------------------------------------------------------------


def _parsed(obj: Json) -> AppTemplate:
    return AppTemplate.model_validate(obj)


def test_presentation_comes_from_the_chart_when_nothing_else_says() -> None:
    source = entry(
        "1.0.0",
        icon="https://x/icon.png",
        description="Notebooks",
        annotations={"azimuth.stackhpc.com/label": "JupyterHub"},
    )
    t = _parsed(template())

    shown = logic.presentation(t.spec, t.status, source)

    assert shown == {
        "label": "JupyterHub",
        "logo": "https://x/icon.png",
        "description": "Notebooks",
    }


def test_presentation_keeps_status_values_and_spec_values_win() -> None:
    t = _parsed(template({"label": "Old label", "logo": "old.png"}, label="Spec label"))
    source = entry("2.0.0", icon="new.png", description="New")

    shown = logic.presentation(t.spec, t.status, source)

    assert shown == {"label": "Spec label", "logo": "old.png", "description": "New"}


def test_presentation_without_a_source_leaves_out_empty_values() -> None:
    t = _parsed(template())
    assert logic.presentation(t.spec, t.status, None) == {}
    assert logic.presentation(t.spec, t.status, entry("1.0.0")) == {"label": "jupyterhub"}


def test_versions_are_known_only_for_the_chart_that_gave_them() -> None:
    recorded = {"chart": {"repo": "http://charts.example", "name": "jupyterhub"}}
    same = _parsed(template(recorded))
    assert logic.same_chart(same.spec, same.status)
    renamed = _parsed(template(recorded, chart={"repo": "http://charts.example", "name": "dask"}))
    assert not logic.same_chart(renamed.spec, renamed.status)
    moved = _parsed(
        template(recorded, chart={"repo": "http://other.example", "name": "jupyterhub"})
    )
    assert not logic.same_chart(moved.spec, moved.status)
    unrecorded = _parsed(template({"versions": [{"name": "1.0.0"}]}))
    assert not logic.same_chart(unrecorded.spec, unrecorded.status)


def test_a_replacing_presentation_removes_what_it_leaves_out() -> None:
    assert logic.replacing({"label": "L"}) == {"label": "L", "logo": None, "description": None}


def test_schema_bytes_count_compact_json() -> None:
    version = AppTemplateVersion(name="1.0.0", values_schema={"a": 1}, ui_schema={})
    assert logic.schema_bytes(version) == len('{"a":1}') + len("{}")


def test_source_is_the_newest_version_not_known_before() -> None:
    selected = [entry("3.0.0"), entry("2.0.0"), entry("1.0.0")]
    assert logic.source_entry(selected, {"3.0.0", "1.0.0"}) == selected[1]
    assert logic.source_entry(selected, {"3.0.0", "2.0.0", "1.0.0"}) == selected[0]
    assert logic.source_entry([], set()) is None


# --- status --------------------------------------------------------------------------------


def test_synced_patch() -> None:
    obj = template(generation=4)
    versions = [AppTemplateVersion(name="1.0.0", values_schema={"type": "object"})]

    chart = _parsed(obj).spec.chart

    patch = logic.synced_patch(
        obj, versions=versions, chart=chart, shown={"label": "L"}, message="m", now=NOW
    )

    assert patch == {
        "label": "L",
        "versions": [{"name": "1.0.0", "valuesSchema": {"type": "object"}, "uiSchema": {}}],
        "chart": {"repo": "http://charts.example/", "name": "jupyterhub"},
        "lastSync": "2026-03-01T12:00:00Z",
        "lastAttempt": "2026-03-01T12:00:00Z",
        "observedGeneration": 4,
        "conditions": [
            {
                "type": "Synced",
                "status": "True",
                "reason": "Synced",
                "message": "m",
                "lastTransitionTime": "2026-03-01T12:00:00Z",
                "observedGeneration": 4,
            }
        ],
    }


def test_condition_transition_time_moves_only_when_the_status_flips() -> None:
    earlier = "2026-02-01T00:00:00Z"
    failing = {
        "type": "Synced",
        "status": "False",
        "reason": "RepositoryUnreachable",
        "message": "old",
        "lastTransitionTime": earlier,
    }
    other = {"type": "Other", "status": "True", "reason": "R", "lastTransitionTime": earlier}
    obj = template({"conditions": [other, failing]})

    still = logic.unconcluded(obj, reason="RepositoryInvalid", message="new", now=NOW)
    flipped = logic.concluded(obj, status="True", reason="Synced", message="ok", now=NOW)

    assert still["conditions"][0]["type"] == "Other"
    assert still["conditions"][1]["lastTransitionTime"] == earlier
    assert still["conditions"][1]["message"] == "new"
    assert flipped["conditions"][1]["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    assert set(still) == {"conditions"}


def test_changes_nothing() -> None:
    obj = template({"label": "L", "versions": []})
    assert logic.changes_nothing(obj, {"label": "L"})
    assert not logic.changes_nothing(obj, {"label": "M"})


def test_long_messages_are_cut() -> None:
    patch = logic.unconcluded(template(), reason="R", message="x" * 10_000, now=NOW)
    assert len(patch["conditions"][0]["message"]) == logic.MESSAGE_LIMIT


def test_the_status_once_written_is_the_merge_of_what_was_reported() -> None:
    obj = template({"label": "old", "lastSync": "2026-03-01T11:00:00Z"})
    after = logic.with_status(obj, {"label": None, "lastAttempt": "2026-03-01T12:00:00Z"})
    assert after["status"] == {
        "lastSync": "2026-03-01T11:00:00Z",
        "lastAttempt": "2026-03-01T12:00:00Z",
    }
    assert obj["status"]["label"] == "old"
