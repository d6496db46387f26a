"""The catalog through its composition root, against in-memory fakes (no network).

``FakeKube`` applies status merge patches as the API server does (uid precondition, a new
resourceVersion per change); ``FakeCharts`` is a repository whose index and archives the
tests change, counting downloads; ``FakeBus`` drops a repeated message id like JetStream.
The timers are the real ``SyncTimers`` on a clock the tests set.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.catalog.bootstrap import build
from services.catalog.logic import Due
from services.catalog.settings import CatalogSettings
from services.catalog.timers import SyncTimers
from shared import subjects
from shared.bus import Published
from shared.charts import ChartEntry, ChartSchemas, RepositoryInvalid, RepositoryUnavailable
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeNotFound
from shared.kube import ResourceKind
from shared.mergepatch import apply
from shared.messages import Message, ObjectRef, ResourceChanged, SyncAppTemplate
from shared.resources import APP_TEMPLATE

Json = dict[str, Any]
PARTITIONS = 4
REPO = "http://charts.example/"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
DAY = timedelta(seconds=86400)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, Json] = {}
        self.status_patches: list[Json] = []
        self.version = 100

    def put(self, obj: Json) -> Json:
        obj = copy.deepcopy(obj)
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    def spec(self, name: str, **spec: Any) -> None:
        obj = self.objects[name]
        obj["spec"].update(spec)
        obj["metadata"]["generation"] += 1
        self.put(obj)

    def status(self, name: str) -> Json:
        return dict(self.objects[name].get("status") or {})

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        assert kind == APP_TEMPLATE
        assert namespace is None
        if name not in self.objects:
            raise KubeNotFound(f"apptemplates {name}")
        return copy.deepcopy(self.objects[name])

    async def list(
        self, kind: ResourceKind, *, namespace: str | None = None
    ) -> tuple[list[Json], str]:
        return [copy.deepcopy(o) for o in self.objects.values()], str(self.version)

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        assert subresource == "status"
        assert set(patch) == {"metadata", "status"}
        current = await self.get(kind, namespace, name)
        if patch["metadata"]["uid"] != current["metadata"]["uid"]:
            raise KubeConflict("409 precondition failed: uid")
        self.status_patches.append(patch["status"])
        current["status"] = apply(current.get("status") or {}, patch["status"])
        return copy.deepcopy(self.put(current))


class FakeCharts:
    def __init__(self) -> None:
        self.entries: dict[str, list[ChartEntry]] = {}
        self.schemas_by_version: dict[str, ChartSchemas] = {}
        self.error: Exception | None = None
        self.index_reads = 0
        self.downloads: list[str] = []

    def add(self, version: str, **extra: Any) -> None:
        entry = ChartEntry(name="jupyterhub", version=version, urls=(f"jh-{version}.tgz",), **extra)
        self.entries.setdefault("jupyterhub", []).append(entry)
        self.schemas_by_version[version] = ChartSchemas(
            values_schema={"title": f"values {version}"}, ui_schema={"title": f"ui {version}"}
        )

    async def versions(self, repo: str, chart: str) -> list[ChartEntry] | None:
        assert repo == REPO
        self.index_reads += 1
        if self.error:
            raise self.error
        return self.entries.get(chart)

    async def schemas(self, repo: str, entry: ChartEntry) -> ChartSchemas:
        self.downloads.append(entry.version)
        return self.schemas_by_version[entry.version]


class FakeBus:
    def __init__(self) -> None:
        self.stored: list[tuple[str, Message]] = []
        self._ids: set[str] = set()

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        msg_id = msg_id or message.id
        if msg_id in self._ids:
            return Published(sequence=len(self.stored), duplicate=True)
        self._ids.add(msg_id)
        self.stored.append((subject, message))
        return Published(sequence=len(self.stored), duplicate=False)

    def commands(self) -> list[tuple[str, SyncAppTemplate]]:
        return [(s, m) for s, m in self.stored if isinstance(m, SyncAppTemplate)]


class Service:
    def __init__(self) -> None:
        self.now = NOW
        self.kube, self.charts, self.bus = FakeKube(), FakeCharts(), FakeBus()
        settings = CatalogSettings(replica="r1", partitions=PARTITIONS)
        self.timers = SyncTimers(publish=self.bus.publish, source="catalog/r1", clock=self.clock)
        self.consumer = build(
            settings,
            bus=self.bus,  # type: ignore[arg-type]
            leases=None,  # type: ignore[arg-type]
            kube=self.kube,
            charts=self.charts,
            timers=self.timers,
            clock=self.clock,
        )
        self.subscriptions = {s.name: s for s in self.consumer.subscriptions}

    def clock(self) -> datetime:
        return self.now

    def create(self, name: str = "jupyterhub", **spec: Any) -> Json:
        return self.kube.put(
            {
                "apiVersion": APP_TEMPLATE.api_version,
                "kind": APP_TEMPLATE.kind,
                "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1},
                "spec": {"chart": {"repo": REPO, "name": "jupyterhub"}, **spec},
            }
        )

    async def event(self, name: str = "jupyterhub", event: str = "MODIFIED") -> None:
        obj = self.kube.objects.get(name) or {"metadata": {"name": name, "uid": f"uid-{name}"}}
        message = ResourceChanged(
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
            object=obj,
        )
        await self.deliver("apptemplate", message)

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

    def synced(self, name: str = "jupyterhub") -> Json:
        conditions = self.kube.status(name).get("conditions") or []
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

    status = svc.kube.status("jupyterhub")
    assert [v["name"] for v in status["versions"]] == ["1.0.0", "0.2.0"]
    assert status["versions"][0]["valuesSchema"] == {"title": "values 1.0.0"}
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
    reads, writes = svc.charts.index_reads, len(svc.kube.status_patches)

    await svc.event()

    assert (svc.charts.index_reads, len(svc.kube.status_patches)) == (reads, writes)
    assert svc.timers.due_times() == {"/jupyterhub": NOW + DAY}


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

    status = svc.kube.status("jupyterhub")
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

    assert svc.kube.status("jupyterhub")["lastAttempt"] == "2026-03-02T11:59:59Z"


async def test_a_spec_change_syncs_at_once_without_downloads(svc: Service) -> None:
    svc.create(keepVersions=3)
    await svc.event(event="ADDED")
    svc.now += timedelta(minutes=5)
    svc.kube.spec("jupyterhub", keepVersions=1, label="Jupyter")

    await svc.event()

    status = svc.kube.status("jupyterhub")
    assert [v["name"] for v in status["versions"]] == ["1.0.0"]
    assert status["label"] == "Jupyter"
    assert status["observedGeneration"] == 2
    assert svc.charts.downloads == ["1.0.0", "0.2.0", "0.1.0"]
    assert svc.timers.due_times() == {"/jupyterhub": NOW + timedelta(minutes=5) + DAY}


async def test_prereleases_only_when_the_range_admits_them(svc: Service) -> None:
    svc.create(versionRange=">=0.0.0-0")
    await svc.event(event="ADDED")
    assert svc.kube.status("jupyterhub")["versions"][0]["name"] == "1.1.0-rc.1"


async def test_no_versions_in_range_is_reported_not_retried(svc: Service) -> None:
    svc.create(keepVersions=1)
    await svc.event(event="ADDED")
    svc.now += timedelta(minutes=1)
    svc.kube.spec("jupyterhub", versionRange=">=5.0.0")

    await svc.event()

    status = svc.kube.status("jupyterhub")
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

    status = svc.kube.status("jupyterhub")
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


async def test_an_unreachable_repository_is_retried(svc: Service) -> None:
    svc.create(keepVersions=1)
    await svc.event(event="ADDED")
    before = svc.kube.status("jupyterhub")
    svc.charts.error = RepositoryUnavailable("GET http://charts.example/index.yaml: refused")
    svc.now += DAY

    with pytest.raises(RepositoryUnavailable):
        await svc.command(due=svc.now)

    status = svc.kube.status("jupyterhub")
    synced = svc.synced()
    assert (synced["status"], synced["reason"]) == ("False", "RepositoryUnreachable")
    assert synced["message"].endswith("refused; retrying")
    for key in ("versions", "lastSync", "lastAttempt", "observedGeneration", "label"):
        assert status[key] == before[key]
    # The consumer retries the message; should it give up, the fallback timer tries later.
    assert svc.timers.due_times() == {"/jupyterhub": svc.now + timedelta(seconds=600)}
    # The event of that very status write does not start a second round of retries...
    reads = svc.charts.index_reads
    await svc.event()
    assert svc.charts.index_reads == reads
    # ...while the command carrying the retries tries again, and succeeds once it can.
    with pytest.raises(RepositoryUnavailable):
        await svc.command(due=svc.now)
    svc.charts.error = None
    await svc.command(due=svc.now)
    assert svc.synced()["status"] == "True"
    assert svc.timers.due_times() == {"/jupyterhub": svc.now + DAY}


async def test_a_spec_change_while_unreachable_is_tried_at_once(svc: Service) -> None:
    svc.charts.error = RepositoryUnavailable("refused")
    svc.create()
    with pytest.raises(RepositoryUnavailable):
        await svc.event(event="ADDED")
    svc.charts.error = None
    svc.kube.spec("jupyterhub", keepVersions=1)

    await svc.event()

    assert svc.synced()["status"] == "True"
    assert [v["name"] for v in svc.kube.status("jupyterhub")["versions"]] == ["1.0.0"]


async def test_deletion_cancels_the_timer(svc: Service) -> None:
    svc.create()
    await svc.event(event="ADDED")
    del svc.kube.objects["jupyterhub"]

    await svc.event(event="DELETED")

    assert svc.timers.due_times() == {}


async def test_a_command_for_a_replaced_template_does_nothing(svc: Service) -> None:
    svc.create()
    svc.kube.objects["jupyterhub"]["metadata"]["uid"] = "uid-new"
    reads = svc.charts.index_reads

    await svc.command()
    await svc.command("gone")

    assert svc.charts.index_reads == reads
    assert svc.kube.status_patches == []


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
    svc.kube.objects["app-b"]["status"] = synced
    listener = svc.consumer.on_ownership
    assert listener is not None

    await listener(frozenset({2}))
    await _settled()

    assert svc.timers.due_times() == {"/app-b": NOW - timedelta(hours=1) + DAY}
    assert svc.bus.commands() == []

    await listener(frozenset({0, 2}))
    await _settled()
    (subject, command), *_ = svc.bus.commands()
    assert subject == subjects.app_template_sync(0, "app-a")
    assert command.ref.name == "app-a"

    await listener(frozenset())
    assert svc.timers.due_times() == {}


async def test_timers_fire_with_an_id_stable_per_due_time() -> None:
    bus = FakeBus()
    now = datetime.now(UTC)
    replicas = [
        SyncTimers(publish=bus.publish, source=f"catalog/{r}", clock=lambda: now) for r in "ab"
    ]
    due = Due(at=now + timedelta(milliseconds=30), generation=3, uid="u1")
    ref = ObjectRef(api_version=APP_TEMPLATE.api_version, kind=APP_TEMPLATE.kind, name="t")
    for timers in replicas:
        timers.arm(ref, due, partition=1, correlation_id="apptemplate:/t")

    await asyncio.sleep(0.2)

    assert [(s, m.id, m.due) for s, m in bus.commands()] == [
        (subjects.app_template_sync(1, "t"), due.command_id, due.at)
    ]
    assert all(t.due_times() == {} for t in replicas)


async def test_a_failed_publish_is_tried_again() -> None:
    attempts: list[str] = []

    async def flaky(subject: str, message: Message) -> None:
        attempts.append(subject)
        if len(attempts) == 1:
            raise ConnectionError("nats down")

    now = datetime.now(UTC)
    timers = SyncTimers(publish=flaky, source="catalog/a", publish_retry_seconds=0.01)
    ref = ObjectRef(api_version=APP_TEMPLATE.api_version, kind=APP_TEMPLATE.kind, name="t")
    timers.arm(ref, Due(at=now, generation=1, uid="u"), partition=0, correlation_id="c")
    await asyncio.sleep(0.2)

    assert len(attempts) == 2


async def _settled() -> None:
    for _ in range(20):
        await asyncio.sleep(0)
