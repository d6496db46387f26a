"""The catalog through its routes and ``Deps``, against the shared fakes (no network).

``FakeKube`` (``tests.fakes``) keeps AppTemplates as the API server does (uid, generation, a
new resourceVersion per change); the writer is played by ``Service.write``, which merges the
status patches the catalog reported into them, uid-guarded, as the writer would;
``FakeCharts`` is a repository whose index and archives the tests change, counting
downloads; ``FakeBus`` drops a repeated message id like JetStream. The timers are the real
``SyncTimers`` on a clock the tests set.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.catalog.app import ROUTES, SyncClaims
from services.catalog.bootstrap import dependencies
from services.catalog.logic import Due
from services.catalog.settings import CatalogSettings, CatalogTuning
from services.catalog.timers import SyncTimers
from shared import subjects
from shared.charts import ChartEntry, ChartSchemas, RepositoryInvalid, RepositoryUnavailable
from shared.claims import ClaimTracker
from shared.consumer import Batch
from shared.errors import BusUnavailable, KubeConflict, KubeNotFound, MessageTooLarge
from shared.messages import Message, ObjectRef, PatchStatus, ResourceChanged, SyncAppTemplate
from shared.metrics import REGISTRY
from shared.models.azimuth import SYNC_FREQUENCY_MAX
from shared.resources import APP_TEMPLATE
from shared.timers import Timers
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
PARTITIONS = 4
REPO = "http://charts.example/"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
DAY = timedelta(seconds=86400)


class FakeCharts:
    """Charts by name; a chart of another repository is that URL's name prefixed to it."""

    def __init__(self) -> None:
        self.entries: dict[str, list[ChartEntry]] = {}
        self.schemas_by_version: dict[tuple[str, str], ChartSchemas] = {}
        self.error: Exception | None = None
        self.index_reads = 0
        self.downloads: list[str] = []

    def add(self, version: str, *, chart: str = "jupyterhub", **extra: Any) -> None:
        entry = ChartEntry(name=chart, version=version, urls=(f"{chart}-{version}.tgz",), **extra)
        self.entries.setdefault(chart, []).append(entry)
        self.schemas_by_version[chart, version] = ChartSchemas(
            values_schema={"title": f"values {chart} {version}"},
            ui_schema={"title": f"ui {version}"},
        )

    @staticmethod
    def key(repo: str, chart: str) -> str:
        return chart if repo == REPO else f"{repo}{chart}"

    async def versions(self, repo: str, chart: str) -> list[ChartEntry] | None:
        self.index_reads += 1
        if self.error:
            raise self.error
        return self.entries.get(self.key(repo, chart))

    async def schemas(self, repo: str, entry: ChartEntry) -> ChartSchemas:
        self.downloads.append(entry.version)
        return self.schemas_by_version[entry.name, entry.version]


class Service:
    def __init__(self, **tuning: Any) -> None:
        self.now = NOW
        self.kube, self.charts, self.bus = FakeKube(), FakeCharts(), FakeBus()
        #: the writer applies what was reported after each delivery; a test can stop it
        self.writing = True
        self._written = 0
        settings = CatalogSettings(
            replica="r1", partitions=PARTITIONS, catalog=CatalogTuning(**tuning)
        )
        self.deps = dependencies(
            settings, bus=self.bus, kube=self.kube, charts=self.charts, clock=self.clock
        )
        self.timers = self.deps.timers
        self.subscriptions = {s.name: s for s in ROUTES.bind(self.deps)}

    def clock(self) -> datetime:
        return self.now

    def create(self, name: str = "jupyterhub", **spec: Any) -> Json:
        return self.kube.put(
            APP_TEMPLATE,
            {
                "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1},
                "spec": {"chart": {"repo": REPO, "name": "jupyterhub"}, **spec},
            },
        )

    def stored(self, name: str = "jupyterhub") -> Json:
        obj = self.kube.stored(APP_TEMPLATE, None, name)
        assert obj is not None
        return obj

    def spec(self, name: str, **spec: Any) -> None:
        """A spec change, as the API server stores it: a new generation."""
        obj = self.stored(name)
        obj["spec"].update(spec)
        obj["metadata"]["generation"] += 1
        self.kube.put(APP_TEMPLATE, obj)

    def status(self, name: str) -> Json:
        return dict(self.stored(name).get("status") or {})

    def reports(self) -> list[PatchStatus]:
        reports: list[PatchStatus] = self.bus.of(PatchStatus)
        return reports

    def commands(self) -> list[tuple[str, SyncAppTemplate]]:
        return [(s, m) for s, m in self.bus.published if isinstance(m, SyncAppTemplate)]

    async def write(self) -> None:
        """What the writer does with the status patches reported since the last call."""
        for report in self.reports()[self._written :]:
            body = {"metadata": {"uid": report.ref.uid}, "status": report.patch}
            with contextlib.suppress(KubeNotFound, KubeConflict):
                await self.kube.patch_merge(
                    APP_TEMPLATE, None, report.ref.name, body, subresource="status"
                )
        self._written = len(self.reports())

    async def event(self, name: str = "jupyterhub", event: str = "MODIFIED") -> None:
        await self.deliver("apptemplate", self.change(name, event))

    def change(self, name: str = "jupyterhub", event: str = "MODIFIED") -> ResourceChanged:
        """The event the watcher would publish for the template as it is now."""
        obj = self.kube.stored(APP_TEMPLATE, None, name) or {
            "metadata": {"name": name, "uid": f"uid-{name}"}
        }
        return ResourceChanged(
            source="watcher/t",
            correlation_id=f"apptemplate:/{name}",
            event=event,
            ref=ObjectRef(
                api_version=APP_TEMPLATE.api_version,
                kind=APP_TEMPLATE.kind,
                name=name,
                uid=obj["metadata"]["uid"],
            ),
            resource_version=obj["metadata"].get("resourceVersion", "1"),
            object=copy.deepcopy(obj),
        )

    async def command(self, name: str = "jupyterhub", due: datetime | None = None) -> None:
        message = SyncAppTemplate(
            source="catalog/t",
            correlation_id=f"apptemplate:/{name}",
            ref=ObjectRef(
                api_version=APP_TEMPLATE.api_version,
                kind=APP_TEMPLATE.kind,
                name=name,
                uid=f"uid-{name}",
            ),
            due=due or self.now,
        )
        await self.deliver("sync", message)

    async def deliver(self, subscription: str, message: Message) -> None:
        batch = Batch(key="/x", partition=0, messages=(message,))
        await self.subscriptions[subscription].handle(batch)
        if self.writing:
            await self.write()

    def synced(self, name: str = "jupyterhub") -> Json:
        conditions = self.status(name).get("conditions") or []
        return next(c for c in conditions if c["type"] == "Synced")


@pytest.fixture
async def svc() -> AsyncIterator[Service]:
    service = Service()
    for version in ("0.1.0", "0.2.0", "1.0.0", "1.1.0-rc.1"):
        service.charts.add(
            version,
            icon=f"https://icons/{version}.png",
            description=f"JupyterHub {version}",
            annotations={"azimuth.stackhpc.com/label": f"JupyterHub {version}"},
        )
    yield service
    service.timers.cancel_all()


async def test_a_new_template_is_synced_and_scheduled(svc: Service) -> None:
    svc.create(keepVersions=2)

    await svc.event(event="ADDED")

    status = svc.status("jupyterhub")
    assert [v["name"] for v in status["versions"]] == ["1.0.0", "0.2.0"]
    assert status["versions"][0]["valuesSchema"] == {"title": "values jupyterhub 1.0.0"}
    assert status["versions"][0]["uiSchema"] == {"title": "ui 1.0.0"}
    assert status["label"] == "JupyterHub 1.0.0"
    assert status["logo"] == "https://icons/1.0.0.png"
    assert status["description"] == "JupyterHub 1.0.0"
    assert status["lastSync"] == status["lastAttempt"] == "2026-03-01T12:00:00Z"
    assert status["observedGeneration"] == 1
    assert svc.synced()["status"] == "True"
    assert svc.charts.downloads == ["1.0.0", "0.2.0"]
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


async def test_our_own_status_write_changes_nothing(svc: Service) -> None:
    svc.create()
    await svc.event(event="ADDED")
    reads, writes = svc.charts.index_reads, len(svc.reports())

    await svc.event()

    assert (svc.charts.index_reads, len(svc.reports())) == (reads, writes)
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


async def test_the_next_sync_is_armed_from_what_was_reported(svc: Service) -> None:
    svc.writing = False
    svc.create()

    await svc.event(event="ADDED")

    # The writer has not written yet: the catalog knows what it asked for.
    assert svc.status("jupyterhub") == {}
    (report,) = svc.reports()
    assert report.ref.uid == "uid-jupyterhub"
    assert report.patch["lastSync"] == "2026-03-01T12:00:00Z"
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}
    # The write's echo changes nothing.
    await svc.write()
    reads = svc.charts.index_reads
    await svc.event()
    assert (svc.charts.index_reads, len(svc.reports())) == (reads, 1)
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


async def test_a_redelivered_event_reports_once(svc: Service) -> None:
    svc.writing = False
    svc.create()
    added = svc.change(event="ADDED")

    await svc.deliver("apptemplate", added)
    await svc.deliver("apptemplate", added)  # before the writer wrote: synced again

    assert svc.charts.index_reads == 2
    assert len(svc.reports()) == 1  # the same cause and outcome: one message
    assert svc.reports()[0].causation_id == added.id


async def test_the_scheduled_sync_reuses_known_versions(svc: Service) -> None:
    svc.create(keepVersions=2)
    await svc.event(event="ADDED")
    svc.charts.add(
        "1.2.0",
        icon="https://icons/new.png",
        annotations={"azimuth.stackhpc.com/label": "Renamed"},
    )
    svc.now += DAY

    await svc.command(due=NOW + DAY)

    status = svc.status("jupyterhub")
    assert [v["name"] for v in status["versions"]] == ["1.2.0", "1.0.0"]
    assert svc.charts.downloads == ["1.0.0", "0.2.0", "1.2.0"]
    # Status values stay once set; only a spec value overrides them.
    assert status["label"] == "JupyterHub 1.0.0"
    assert status["logo"] == "https://icons/1.0.0.png"
    assert status["lastSync"] == "2026-03-02T12:00:00Z"
    assert svc.timers.due_times() == {"/jupyterhub": NOW + 2 * DAY}


async def test_a_command_that_comes_too_early_only_rearms(svc: Service) -> None:
    svc.create()
    await svc.event(event="ADDED")
    reads = svc.charts.index_reads

    await svc.command(due=NOW + timedelta(hours=1))

    assert svc.charts.index_reads == reads
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


async def test_a_timer_that_fires_a_hair_early_still_syncs(svc: Service) -> None:
    svc.create()
    await svc.event(event="ADDED")
    svc.now = NOW + DAY - timedelta(milliseconds=3)

    await svc.command(due=NOW + DAY)

    assert svc.status("jupyterhub")["lastAttempt"] == "2026-03-02T11:59:59Z"


async def test_a_spec_change_syncs_at_once_without_downloads(svc: Service) -> None:
    svc.create(keepVersions=3)
    await svc.event(event="ADDED")
    svc.now += timedelta(minutes=5)
    svc.spec("jupyterhub", keepVersions=1, label="Jupyter")

    await svc.event()

    status = svc.status("jupyterhub")
    assert [v["name"] for v in status["versions"]] == ["1.0.0"]
    assert status["label"] == "Jupyter"
    assert status["observedGeneration"] == 2
    assert svc.charts.downloads == ["1.0.0", "0.2.0", "0.1.0"]
    assert svc.timers.due_times() == {"/jupyterhub": NOW + timedelta(minutes=5) + DAY}


async def test_prereleases_only_when_the_range_admits_them(svc: Service) -> None:
    svc.create(versionRange=">=0.0.0-0")
    await svc.event(event="ADDED")
    assert svc.status("jupyterhub")["versions"][0]["name"] == "1.1.0-rc.1"


async def test_no_versions_in_range_is_reported_not_retried(svc: Service) -> None:
    svc.create(keepVersions=1)
    await svc.event(event="ADDED")
    svc.now += timedelta(minutes=1)
    svc.spec("jupyterhub", versionRange=">=5.0.0")

    await svc.event()

    status = svc.status("jupyterhub")
    synced = svc.synced()
    assert (synced["status"], synced["reason"]) == ("False", "NoVersions")
    assert "'>=5.0.0'" in synced["message"]
    assert "keeping the 1 known version" in synced["message"]
    assert [v["name"] for v in status["versions"]] == ["1.0.0"]
    assert status["lastSync"] == "2026-03-01T12:00:00Z"
    assert status["lastAttempt"] == "2026-03-01T12:01:00Z"
    assert status["observedGeneration"] == 2
    reads = svc.charts.index_reads
    await svc.event()
    assert svc.charts.index_reads == reads
    assert svc.timers.due_times() == {"/jupyterhub": NOW + timedelta(minutes=1) + DAY}


async def test_a_chart_the_repository_does_not_list(svc: Service) -> None:
    svc.charts.entries = {}
    svc.create()

    await svc.event(event="ADDED")

    assert svc.synced()["reason"] == "ChartNotFound"
    assert "no chart named 'jupyterhub'" in svc.synced()["message"]


async def test_a_malformed_repository_waits_for_the_next_sync(svc: Service) -> None:
    svc.charts.error = RepositoryInvalid(f"{REPO}index.yaml is not valid YAML: oops")
    svc.create(syncFrequency=3600)

    await svc.event(event="ADDED")

    status = svc.status("jupyterhub")
    assert (svc.synced()["status"], svc.synced()["reason"]) == ("False", "RepositoryInvalid")
    assert "not valid YAML" in svc.synced()["message"]
    assert "lastSync" not in status
    assert status["observedGeneration"] == 1
    reads = svc.charts.index_reads
    await svc.event()
    assert svc.charts.index_reads == reads
    assert svc.timers.due_times() == {"/jupyterhub": NOW + timedelta(hours=1)}

    svc.charts.error = None
    svc.now += timedelta(hours=1)
    await svc.command(due=svc.now)
    assert svc.synced()["status"] == "True"


async def test_an_unreachable_repository_is_retried_with_backoff(svc: Service) -> None:
    svc.create(keepVersions=1)
    await svc.event(event="ADDED")
    before = svc.status("jupyterhub")
    svc.charts.error = RepositoryUnavailable("GET http://charts.example/index.yaml: refused")
    svc.now += DAY

    await svc.command(due=svc.now)

    status = svc.status("jupyterhub")
    synced = svc.synced()
    assert (synced["status"], synced["reason"]) == ("False", "RepositoryUnreachable")
    assert synced["message"].endswith("refused; retrying")
    for key in ("versions", "lastSync", "lastAttempt", "observedGeneration", "label"):
        assert status[key] == before[key]
    # The template's timer carries the retry: 2 s, then doubling.
    first_try = svc.now
    assert svc.timers.due_times() == {"/jupyterhub": first_try + timedelta(seconds=2)}
    # The event of that very status write does not start a second round of retries...
    reads = svc.charts.index_reads
    await svc.event()
    assert svc.charts.index_reads == reads
    assert svc.timers.due_times() == {"/jupyterhub": first_try + timedelta(seconds=2)}
    # ...while each retry tries again, waits longer after each failure...
    svc.now += timedelta(seconds=2)
    await svc.command(due=svc.now)
    assert svc.charts.index_reads == reads + 1
    assert svc.timers.due_times() == {"/jupyterhub": svc.now + timedelta(seconds=4)}
    # ...and succeeds once it can, which resets the backoff and the schedule.
    svc.charts.error = None
    svc.now += timedelta(seconds=4)
    await svc.command(due=svc.now)
    assert svc.synced()["status"] == "True"
    assert svc.timers.due_times() == {"/jupyterhub": svc.now + DAY}
    svc.charts.error = RepositoryUnavailable("refused again")
    svc.now += DAY
    await svc.command(due=svc.now)
    assert svc.timers.due_times() == {"/jupyterhub": svc.now + timedelta(seconds=2)}


async def test_retry_after_is_honoured(svc: Service) -> None:
    svc.charts.error = RepositoryUnavailable("GET index.yaml: HTTP 429", delay=120)
    svc.create()

    await svc.event(event="ADDED")

    assert svc.synced()["reason"] == "RepositoryUnreachable"
    assert svc.timers.due_times() == {"/jupyterhub": NOW + timedelta(seconds=120)}


async def test_the_backoff_stops_at_its_cap_and_at_the_sync_frequency() -> None:
    svc = Service(retry_unreachable_first_seconds=10, retry_unreachable_seconds=30)
    svc.charts.error = RepositoryUnavailable("refused")
    svc.create("slow")
    svc.create("fast", syncFrequency=15)
    try:
        waits: dict[str, list[float]] = {"slow": [], "fast": []}
        for _ in range(3):
            for name, seen in waits.items():
                await svc.command(name, due=svc.now)
                seen.append((svc.timers.due_times()[f"/{name}"] - svc.now).total_seconds())
        assert waits == {"slow": [10, 20, 30], "fast": [10, 15, 15]}
    finally:
        svc.timers.cancel_all()


async def test_a_redelivered_event_after_an_unreachable_repository_reads_the_index_again(
    svc: Service,
) -> None:
    svc.charts.error = RepositoryUnavailable("refused")
    svc.create()
    added = svc.change(event="ADDED")  # the watcher's copy, from before any status
    await svc.deliver("apptemplate", added)
    assert svc.synced()["reason"] == "RepositoryUnreachable"
    assert svc.charts.index_reads == 1

    # JetStream hands the same event back (an ack lost, the replica restarted): it is not
    # an echo of the try, so it tries again, and the repository has come back meanwhile.
    svc.charts.error = None
    await svc.deliver("apptemplate", added)

    assert svc.charts.index_reads == 2
    assert svc.synced()["status"] == "True"
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


async def test_a_spec_change_while_unreachable_is_tried_at_once(svc: Service) -> None:
    svc.charts.error = RepositoryUnavailable("refused")
    svc.create()
    await svc.event(event="ADDED")
    svc.charts.error = None
    svc.spec("jupyterhub", keepVersions=1)

    await svc.event()

    assert svc.synced()["status"] == "True"
    assert [v["name"] for v in svc.status("jupyterhub")["versions"]] == ["1.0.0"]


async def test_schemas_too_large_for_a_status_are_reported_not_retried() -> None:
    svc = Service(max_status_schema_bytes=120)
    for version in ("1.0.0", "2.0.0", "3.0.0"):
        svc.charts.add(version)  # 55 bytes of schemas each
    svc.create(keepVersions=2)
    await svc.event(event="ADDED")
    assert [v["name"] for v in svc.status("jupyterhub")["versions"]] == ["3.0.0", "2.0.0"]

    svc.now += timedelta(minutes=1)
    svc.spec("jupyterhub", keepVersions=3)
    await svc.event()

    status = svc.status("jupyterhub")
    synced = svc.synced()
    assert (synced["status"], synced["reason"]) == ("False", "StatusTooLarge")
    assert "exceed 120 bytes" in synced["message"]
    assert "keepVersions" in synced["message"]
    assert [v["name"] for v in status["versions"]] == ["3.0.0", "2.0.0"]
    assert status["observedGeneration"] == 2
    assert svc.timers.due_times() == {"/jupyterhub": svc.now + DAY}
    # Concluded: the echo of the write downloads nothing more.
    downloads = list(svc.charts.downloads)
    await svc.event()
    assert svc.charts.downloads == downloads == ["3.0.0", "2.0.0", "1.0.0"]
    svc.timers.cancel_all()


async def test_a_status_larger_than_one_message_is_reported_too_large(svc: Service) -> None:
    svc.create(keepVersions=2)
    svc.bus.fail(MessageTooLarge("publish x: 1100000 bytes exceed the maximum payload"))

    await svc.event(event="ADDED")

    status, synced = svc.status("jupyterhub"), svc.synced()
    assert (synced["status"], synced["reason"]) == ("False", "StatusTooLarge")
    assert "2 version(s) of jupyterhub" in synced["message"]
    assert "exceed the maximum payload" in synced["message"]
    assert "keepVersions" in synced["message"]
    assert "versions" not in status
    assert status["observedGeneration"] == 1
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


async def test_a_changed_chart_starts_from_nothing(svc: Service) -> None:
    svc.charts.add("1.0.0", chart="daskhub", description="Dask")
    svc.create(keepVersions=1)
    await svc.event(event="ADDED")
    assert svc.status("jupyterhub")["logo"] == "https://icons/1.0.0.png"

    svc.spec("jupyterhub", chart={"repo": REPO, "name": "daskhub"})
    await svc.event()

    status = svc.status("jupyterhub")
    (version,) = status["versions"]
    # Same version string, other chart: downloaded again, not reused.
    assert version["valuesSchema"] == {"title": "values daskhub 1.0.0"}
    assert svc.charts.downloads == ["1.0.0", "1.0.0"]
    assert status["chart"] == {"repo": REPO, "name": "daskhub"}
    # The old chart's presentation goes; the new chart has no icon.
    assert (status["label"], status["description"]) == ("daskhub", "Dask")
    assert "logo" not in status

    # Another repository with the same chart name is another chart too.
    other = "http://mirror.example/"
    svc.charts.entries[f"{other}daskhub"] = svc.charts.entries["daskhub"]
    svc.spec("jupyterhub", chart={"repo": other, "name": "daskhub"})
    await svc.event()
    assert svc.charts.downloads == ["1.0.0", "1.0.0", "1.0.0"]
    assert svc.status("jupyterhub")["chart"]["repo"] == other


async def test_a_status_without_its_chart_is_read_again(svc: Service) -> None:
    # Written by upstream: versions and a label, but not which chart they came from.
    obj = svc.create(keepVersions=1)
    obj["status"] = {
        "label": "Upstream label",
        "versions": [{"name": "1.0.0", "valuesSchema": {"title": "stale"}}],
        "lastSync": "2026-03-01T11:00:00Z",
    }
    svc.kube.put(APP_TEMPLATE, obj)

    await svc.event(event="ADDED")

    status = svc.status("jupyterhub")
    assert status["versions"][0]["valuesSchema"] == {"title": "values jupyterhub 1.0.0"}
    assert status["label"] == "JupyterHub 1.0.0"
    assert status["chart"] == {"repo": REPO, "name": "jupyterhub"}


async def test_a_huge_sync_frequency_is_clamped(svc: Service) -> None:
    svc.create(syncFrequency=10**30)  # stored before the CRD had a maximum

    await svc.event(event="ADDED")

    assert svc.synced()["status"] == "True"
    assert svc.timers.due_times() == {"/jupyterhub": NOW + timedelta(seconds=SYNC_FREQUENCY_MAX)}


async def test_status_writes_are_counted(svc: Service) -> None:
    def writes(outcome: str) -> float:
        sample = "capibus_catalog_status_writes_total"
        return REGISTRY.get_sample_value(sample, {"outcome": outcome}) or 0.0

    written, skipped = writes("written"), writes("skipped")
    svc.create()
    await svc.event(event="ADDED")
    assert writes("written") == written + 1

    svc.now += DAY
    svc.charts.error = RepositoryUnavailable("refused")
    await svc.command(due=svc.now)
    await svc.command(due=svc.now + timedelta(seconds=2))
    assert writes("written") == written + 2  # the condition, once
    assert writes("skipped") == skipped + 1  # the same condition again


async def test_deletion_cancels_the_timer(svc: Service) -> None:
    svc.create()
    await svc.event(event="ADDED")
    await svc.kube.delete(APP_TEMPLATE, None, "jupyterhub")

    await svc.event(event="DELETED")

    assert svc.timers.due_times() == {}


async def test_a_command_for_a_replaced_template_does_nothing(svc: Service) -> None:
    svc.create()
    svc.stored()["metadata"]["uid"] = "uid-new"
    reads = svc.charts.index_reads

    await svc.command()
    await svc.command("gone")

    assert svc.charts.index_reads == reads
    assert svc.reports() == []


async def test_ownership_arms_the_owned_templates_only(svc: Service) -> None:
    # app-a hashes to partition 0 and app-b to partition 2 (of 4).
    assert subjects.partition_of("/app-a", PARTITIONS) == 0
    assert subjects.partition_of("/app-b", PARTITIONS) == 2
    svc.create("app-a")
    svc.create("app-b")
    synced = {
        "lastSync": "2026-03-01T11:00:00Z",
        "lastAttempt": "2026-03-01T11:00:00Z",
        "observedGeneration": 1,
    }
    svc.stored("app-b")["status"] = synced
    claims = ClaimTracker(SyncClaims(svc.deps), service="catalog", retry_base=0.01, retry_max=0.05)

    await claims.follow({2: 1})
    await _settled()

    assert svc.timers.due_times() == {"/app-b": NOW - timedelta(hours=1) + DAY}
    assert svc.commands() == []

    await claims.follow({0: 1, 2: 1})
    await _settled()
    (subject, command), *_ = svc.commands()
    assert subject == subjects.app_template_sync(0, "app-a")
    assert command.ref.name == "app-a"

    await claims.close()
    assert svc.timers.due_times() == {}


async def test_the_claims_of_one_rebalance_share_one_list(svc: Service) -> None:
    svc.create("app-a")
    svc.create("app-b")
    claims = ClaimTracker(SyncClaims(svc.deps), service="catalog", retry_base=0.01, retry_max=0.05)

    await claims.follow({0: 1, 2: 1})
    await _settled()

    assert [call[0] for call in svc.kube.calls] == ["list"]
    assert sorted(m.ref.name for _, m in svc.commands()) == ["app-a", "app-b"]
    await claims.close()


async def test_timers_fire_with_an_id_stable_per_due_time() -> None:
    bus = FakeBus()
    now = datetime.now(UTC)
    replicas = [SyncTimers(Timers(bus), source=f"catalog/{r}") for r in "ab"]
    due = Due(at=now + timedelta(milliseconds=30), generation=3, uid="u1")
    ref = ObjectRef(api_version=APP_TEMPLATE.api_version, kind=APP_TEMPLATE.kind, name="t")
    for timers in replicas:
        timers.arm(ref, due, partition=1)

    await asyncio.sleep(0.2)

    assert [(s, m.id, m.due) for s, m in bus.published if isinstance(m, SyncAppTemplate)] == [
        (subjects.app_template_sync(1, "t"), due.command_id, due.at)
    ]
    assert all(t.due_times() == {} for t in replicas)


async def test_a_failed_publish_is_tried_again() -> None:
    bus = FakeBus()
    bus.fail(BusUnavailable("nats down"))
    now = datetime.now(UTC)
    timers = SyncTimers(Timers(bus, retry_base=0.01), source="catalog/a")
    ref = ObjectRef(api_version=APP_TEMPLATE.api_version, kind=APP_TEMPLATE.kind, name="t")
    timers.arm(ref, Due(at=now, generation=1, uid="u"), partition=0)
    await asyncio.sleep(0.2)

    # the first attempt failed, the second was stored
    assert len(bus.published) == 1


async def _settled() -> None:
    for _ in range(20):
        await asyncio.sleep(0)
