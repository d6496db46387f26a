"""Discovery's recompute, event dispatch and watch lifecycle against fakes (no network)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.discovery import handlers, logic
from services.discovery.app import ROUTES
from services.discovery.handlers import Deps
from services.discovery.settings import DiscoveryTuning
from services.discovery.tenant import TenantDeps, TenantWatch
from services.discovery.watches import Watches
from shared import subjects
from shared.bus import Published
from shared.claims import Claim, ClaimRound, ClaimTracker
from shared.consumer import Batch
from shared.errors import KubeForbidden, KubeInvalid, KubeUnavailable
from shared.kube import ResourceKind, WatchEvent, WatchExpired
from shared.mergepatch import apply
from shared.messages import EventType, Message, ObjectRef, PatchStatus, ResourceChanged
from shared.metrics import REGISTRY
from shared.resources import CLUSTER, HELM_RELEASE, MANIFESTS, SECRET
from shared.status import StatusReporter
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
PARTITIONS = 4
ALL = frozenset(range(PARTITIONS))
TUNING = DiscoveryTuning(quiet_seconds=0.01, max_delay_seconds=0.2, retry_max_seconds=0.05)
KPS = ("monitoring-system", "demo-monitoring")


class Kube(FakeKube):
    """The management cluster; a patch of an object named in ``refuse`` raises its error."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: dict[str, Exception] = {}

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        if name in self.refuse:
            raise self.refuse[name]
        return await super().patch_merge(kind, namespace, name, patch, subresource=subresource)

    @property
    def patched(self) -> list[str]:
        return [name for verb, _, _, name in self.calls if verb == "patch"]

    @property
    def lists(self) -> int:
        return sum(verb == "list" for verb, *_ in self.calls)

    def cluster(self) -> Json:
        found = self.stored(CLUSTER, "ns", "demo")
        assert found is not None
        return found


class Writer(FakeBus):
    """Plays the writer too: a status patch lands on the Cluster at once."""

    def __init__(self, kube: Kube) -> None:
        super().__init__()
        self.kube = kube

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        published = await super().publish(subject, message, msg_id=msg_id)
        if isinstance(message, PatchStatus) and not published.duplicate:
            cluster = self.kube.cluster()
            self.kube.put(CLUSTER, apply(cluster, {"status": message.patch}))
        return published

    @property
    def patches(self) -> list[Json]:
        return [m.patch for m in self.of(PatchStatus)]


def reporter(bus: FakeBus) -> StatusReporter:
    return StatusReporter(bus, partitions=PARTITIONS, source="discovery/test")


class FakeTenant:
    """A tenant API server: Reservations, a scripted watch, failures on demand."""

    def __init__(self, *reservations: Json) -> None:
        self.items = {_key(r): r for r in reservations}
        self.events: asyncio.Queue[WatchEvent | Exception | None] = asyncio.Queue()
        self.fail_lists: list[Exception] = []
        self.lists = 0
        #: the resourceVersion each watch started from
        self.watched: list[str] = []
        self.closed = False
        self._revisions = itertools.count(1)

    def emit(self, kind: str, obj: Json) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._revisions))
        if kind == "DELETED":
            self.items.pop(_key(obj), None)
        else:
            self.items[_key(obj)] = obj
        self.events.put_nowait(WatchEvent(type=kind, object=obj))  # type: ignore[arg-type]

    async def list(self, kind: ResourceKind, **_: Any) -> tuple[list[Json], str]:
        self.lists += 1
        if self.fail_lists:
            raise self.fail_lists.pop(0)
        return list(self.items.values()), str(next(self._revisions))

    async def watch(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        self.watched.append(resource_version)
        while True:
            item = await self.events.get()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    async def aclose(self) -> None:
        self.closed = True


def _key(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def reservation(name: str, namespace: str = "monitoring-system", *, phase: str = "Ready") -> Json:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {
                "meta.helm.sh/release-namespace": KPS[0],
                "meta.helm.sh/release-name": KPS[1],
            },
        },
        "status": {"phase": phase, "subdomain": name, "fqdn": f"{name}.apps.test"},
    }


def cluster(uid: str = "u1", **status: Any) -> Json:
    meta = {"name": "demo", "namespace": "ns", "uid": uid}
    return {"metadata": meta, "status": status}


def kubeconfig_secret(text: str = "kubeconfig-1") -> Json:
    return {
        "metadata": {
            "name": "demo-kubeconfig",
            "namespace": "ns",
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        },
        "data": {"value": base64.b64encode(text.encode()).decode()},
    }


def chart_addon(name: str = "demo-monitoring", *, chart: bool = True) -> Json:
    labels = {
        "addons.stackhpc.com/cluster": "demo",
        "addons.stackhpc.com/release-namespace": KPS[0],
        "addons.stackhpc.com/release-name": KPS[1],
    }
    if chart:
        labels["capi.stackhpc.com/cluster"] = "demo"
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}}


def management(**status: Any) -> Kube:
    kube = Kube()
    kube.put(CLUSTER, cluster(**status))
    kube.put(SECRET, kubeconfig_secret())
    kube.put(HELM_RELEASE, chart_addon())
    return kube


def target(uid: str = "u1") -> logic.Target:
    partition = subjects.partition_of("ns/demo", PARTITIONS)
    return logic.Target("ns", "demo", uid, partition, "1")


def announced(kube: Kube, kind: ResourceKind = HELM_RELEASE, name: str = "demo-monitoring") -> Json:
    notes = kube.objects[(kind.token, "ns", name)]["metadata"].get("annotations") or {}
    return dict(json.loads(notes.get(logic.SERVICES_ANNOTATION, "{}")))


async def until(check: Callable[[], bool], *, timeout: float = 3.0, what: str = "it") -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# --- one recompute -------------------------------------------------------------------------


async def run_sync(
    kube: Kube,
    bus: FakeBus,
    reservations: list[Json],
    belief: logic.Belief,
    *,
    uid: str = "u1",
    version: str = "1",
) -> None:
    await handlers.sync(
        target=target(uid),
        reservations=reservations,
        tenant_version=version,
        belief=belief,
        reread=belief.services is None,
        kube=kube,
        reporter=reporter(bus),
        now=0.0,
    )


async def test_sync_publishes_the_status_difference_and_annotates_the_addon() -> None:
    kube = management(services={"stale": {"subdomain": "s", "fqdn": "s", "label": "S"}})
    bus = FakeBus()
    belief = logic.Belief(replay=30)
    await run_sync(
        kube, bus, [reservation("kps-client"), reservation("x", phase="Pending")], belief
    )

    [(subject, message)] = bus.published
    assert isinstance(message, PatchStatus)
    assert subject == subjects.cluster_status(target().partition, "ns", "demo")
    assert message.ref.uid == "u1"
    assert message.patch == {
        "services": {
            "stale": None,
            "monitoring-system-kps-client": {
                "subdomain": "kps-client",
                "fqdn": "kps-client.apps.test",
                "label": "Kps Client",
            },
        }
    }
    assert set(announced(kube)) == {"monitoring-system-kps-client"}

    # Nothing changed: nothing is published and no addon is patched again.
    patched = len(kube.patched)
    await run_sync(kube, bus, [reservation("kps-client")], belief)
    assert len(bus.published) == 1
    assert len(kube.patched) == patched


async def test_a_retried_recompute_reports_once_and_a_service_that_returns_again() -> None:
    kube = management()
    bus = FakeBus()
    belief = logic.Belief(replay=30)
    await run_sync(kube, bus, [reservation("a")], belief, version="5")
    # The same state again (a retry after its report was stored but not acknowledged): the
    # same message, stored once.
    await run_sync(kube, bus, [reservation("a")], logic.Belief(replay=30), version="5")
    assert len(bus.published) == 1
    # Gone and back: new states, so the second report of the same patch is not a duplicate.
    await run_sync(kube, bus, [], belief, version="6")
    await run_sync(kube, bus, [reservation("a")], belief, version="7")
    service = bus.of(PatchStatus)[0].patch["services"]["monitoring-system-a"]
    assert [m.patch for m in bus.of(PatchStatus)] == [
        {"services": {"monitoring-system-a": service}},
        {"services": {"monitoring-system-a": None}},
        {"services": {"monitoring-system-a": service}},
    ]
    assert len({m.id for m in bus.of(PatchStatus)}) == 3


async def test_app_services_stay_in_their_helm_release_only() -> None:
    kube = Kube()
    kube.put(CLUSTER, cluster())
    kube.put(HELM_RELEASE, chart_addon("jupyter", chart=False))
    kube.put(MANIFESTS, chart_addon("demo-monitoring"))  # same release: the HelmRelease wins
    bus = FakeBus()
    await run_sync(kube, bus, [reservation("kps-client")], logic.Belief(replay=30))
    assert bus.published == []
    assert set(announced(kube, HELM_RELEASE, "jupyter")) == {"monitoring-system-kps-client"}
    assert announced(kube, MANIFESTS, "demo-monitoring") == {}


def released_by(reservation_: Json, release: str) -> Json:
    reservation_["metadata"]["annotations"]["meta.helm.sh/release-name"] = release
    return reservation_


def refusals(error: str) -> float:
    labels = {"kind": "HelmRelease", "error": error}
    return REGISTRY.get_sample_value("capibus_discovery_annotation_failures_total", labels) or 0


@pytest.mark.parametrize("refusal", [KubeForbidden("forbidden"), KubeInvalid("invalid")])
async def test_an_addon_refusing_its_annotation_holds_up_neither_the_others_nor_the_status(
    refusal: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    kube = management()
    monitoring = kube.objects.pop((HELM_RELEASE.token, "ns", "demo-monitoring"))
    broken = chart_addon("demo-aaa")  # listed (and patched) before demo-monitoring
    broken["metadata"]["labels"]["addons.stackhpc.com/release-name"] = "other"
    kube.put(HELM_RELEASE, broken)
    kube.put(HELM_RELEASE, monitoring)
    kube.refuse["demo-aaa"] = refusal
    counted = refusals(type(refusal).__name__)
    bus = FakeBus()
    found = [reservation("kps-client"), released_by(reservation("other-ui"), "other")]
    with caplog.at_level(logging.ERROR):
        await run_sync(kube, bus, found, logic.Belief(replay=30))

    [message] = bus.of(PatchStatus)
    assert set(message.patch["services"]) == {
        "monitoring-system-kps-client",
        "monitoring-system-other-ui",
    }
    assert set(announced(kube)) == {"monitoring-system-kps-client"}
    assert refusals(type(refusal).__name__) == counted + 1
    assert "cannot write the services of HelmRelease demo-aaa" in caplog.text


async def test_a_temporary_failure_of_an_annotation_retries_the_whole_recompute() -> None:
    kube = management()
    kube.refuse["demo-monitoring"] = KubeUnavailable("503")
    bus = FakeBus()
    with pytest.raises(KubeUnavailable):
        await run_sync(kube, bus, [reservation("kps-client")], logic.Belief(replay=30))
    assert bus.published == []


async def test_a_replaced_or_missing_cluster_gets_nothing() -> None:
    kube = management()
    bus = FakeBus()
    await run_sync(kube, bus, [reservation("kps-client")], logic.Belief(replay=30), uid="old")
    assert bus.published == []
    assert kube.patched == []


# --- the watch lifecycle -------------------------------------------------------------------


class World:
    """A discovery replica's tracker with real ``TenantWatch``es over fake tenants."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.bus = Writer(kube)
        self.tenants: list[tuple[str, FakeTenant]] = []
        self.next_tenant: FakeTenant = FakeTenant()
        deps = TenantDeps(
            kube=kube, reporter=reporter(self.bus), connect=self.connect, tuning=TUNING
        )
        self.watches = Watches(
            kube=kube,
            spawn=lambda t, text: TenantWatch(t, text, deps).start(),
            partitions=PARTITIONS,
        )
        [self.changes] = ROUTES.bind(Deps(tracker=self.watches))

    async def claim(self, *partitions: int) -> None:
        """What the consumer does on a rebalance that claims ``partitions`` (one round)."""
        together = ClaimRound()
        for partition in partitions:
            await self.watches.claimed(Claim(partition, token=1, round=together))

    async def lose(self, *partitions: int) -> None:
        await self.watches.lost(frozenset(partitions))

    def connect(self, kubeconfig: str) -> handlers.TenantApi:
        tenant, self.next_tenant = self.next_tenant, FakeTenant()
        self.tenants.append((kubeconfig, tenant))
        return tenant

    @property
    def tenant(self) -> FakeTenant:
        return self.tenants[-1][1]

    def services(self) -> Json:
        return dict(self.kube.cluster()["status"].get("services") or {})


def event(kind: ResourceKind, type_: EventType, obj: Json) -> ResourceChanged:
    meta = obj["metadata"]
    return ResourceChanged(
        source="watcher/test",
        correlation_id="cluster:ns/demo",
        event=type_,
        ref=ObjectRef(
            api_version=kind.api_version, kind=kind.kind, namespace="ns", name=meta["name"]
        ),
        resource_version=str(meta.get("resourceVersion", "1")),
        object={k: v for k, v in obj.items() if k != "data"},
    )


async def deliver(world: World, *changes: ResourceChanged) -> None:
    await world.changes.handle(Batch(key="ns/demo", partition=0, messages=changes))


async def test_a_cluster_event_starts_one_watch_whose_initial_list_is_one_publish() -> None:
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"), reservation("b"), reservation("c"))
    await world.claim(*ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.services()) == 3, what="three services")
    await asyncio.sleep(0.05)
    assert len(world.bus.published) == 1
    assert world.tenants[0][0] == "kubeconfig-1"

    # Later Cluster events (its own status writes) cost nothing: same watch, no API call.
    lists = world.kube.lists
    await deliver(world, event(CLUSTER, "MODIFIED", world.kube.cluster()))
    assert len(world.tenants) == 1
    await world.lose(*ALL)
    assert world.tenant.closed
    assert world.kube.lists == lists


async def test_leaving_ready_or_being_deleted_removes_the_service_everywhere() -> None:
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"), reservation("b"))
    await world.claim(*ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.services()) == 2)

    world.tenant.emit("MODIFIED", reservation("a", phase="Failed"))
    await until(lambda: set(world.services()) == {"monitoring-system-b"})
    assert world.bus.patches[-1] == {"services": {"monitoring-system-a": None}}
    assert set(announced(world.kube)) == {"monitoring-system-b"}

    world.tenant.emit("DELETED", reservation("b"))
    await until(lambda: world.services() == {})
    assert announced(world.kube) == {}
    await world.lose(*ALL)


async def test_expired_and_broken_watches_reconnect_with_a_full_relist_ended_ones_resume() -> None:
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"))
    await world.claim(*ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.services()) == 1)
    tenant = world.tenant

    # A change missed while the watch was down is found by the re-list.
    tenant.items.clear()
    tenant.events.put_nowait(WatchExpired("too old"))
    await until(lambda: world.services() == {}, what="the re-list after 410")
    assert tenant.lists == 2

    tenant.items[("monitoring-system", "b")] = reservation("b")
    tenant.fail_lists.append(KubeUnavailable("connection refused"))
    tenant.events.put_nowait(KubeUnavailable("connection reset"))
    await until(lambda: set(world.services()) == {"monitoring-system-b"}, what="reconnect")
    assert tenant.lists == 4
    # The server ending a healthy watch: the next one starts from the newest version seen
    # (a bookmark's too), without a re-list.
    bookmark = {"kind": "Reservation", "metadata": {"resourceVersion": "99"}}
    tenant.events.put_nowait(WatchEvent(type="BOOKMARK", object=bookmark))
    tenant.events.put_nowait(None)
    await until(lambda: tenant.watched[-1:] == ["99"], what="the resumed watch")
    assert tenant.lists == 4
    tenant.emit("DELETED", reservation("b"))
    await until(lambda: world.services() == {}, what="an event on the resumed watch")
    await world.lose(*ALL)


async def test_a_rotated_kubeconfig_restarts_the_watch_and_deletion_stops_it() -> None:
    world = World(management())
    await world.claim(*ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.tenants) == 1)
    first = world.tenant

    # The same Secret version again: nothing happens.
    secret = world.kube.objects[(SECRET.token, "ns", "demo-kubeconfig")]
    await deliver(world, event(SECRET, "MODIFIED", secret))
    assert len(world.tenants) == 1

    rotated = world.kube.put(SECRET, kubeconfig_secret("kubeconfig-2"))
    await deliver(world, event(SECRET, "MODIFIED", rotated))
    await until(lambda: len(world.tenants) == 2, what="the new watch")
    assert [text for text, _ in world.tenants] == ["kubeconfig-1", "kubeconfig-2"]
    assert first.closed

    deleting = {**cluster(), "metadata": {**cluster()["metadata"], "deletionTimestamp": "now"}}
    await deliver(world, event(CLUSTER, "MODIFIED", deleting))
    assert world.tenant.closed
    assert world.watches.running == {}


async def test_no_kubeconfig_no_watch_until_its_secret_appears() -> None:
    kube = management()
    secret = kube.objects.pop((SECRET.token, "ns", "demo-kubeconfig"))
    world = World(kube)
    await world.claim(*ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    assert world.tenants == []
    kube.put(SECRET, secret)
    await deliver(world, event(SECRET, "ADDED", secret))
    await until(lambda: len(world.tenants) == 1, what="the watch")
    await deliver(world, event(SECRET, "DELETED", secret))
    assert world.tenant.closed
    assert world.watches.running == {}


async def test_watches_follow_partition_ownership() -> None:
    world = World(management())
    mine = target().partition
    await world.claim(*(ALL - {mine}))
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    assert world.tenants == []  # not ours

    await world.claim(mine)  # claimed: its Clusters are found and watched
    await until(lambda: len(world.tenants) == 1, what="adoption")
    await world.lose(mine)
    assert world.tenant.closed
    assert world.watches.running == {}
    await world.lose(*(ALL - {mine}))


async def test_addon_events_nudge_a_recompute() -> None:
    kube = management()
    kube.objects.pop((HELM_RELEASE.token, "ns", "demo-monitoring"))
    world = World(kube)
    world.next_tenant = FakeTenant(reservation("a"))
    await world.claim(*ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: bool(world.tenants) and world.tenant.lists == 1)
    await asyncio.sleep(0.05)
    assert world.services() == {}  # no addon yet: the service belongs to nobody

    addon = kube.put(HELM_RELEASE, chart_addon())
    await deliver(world, event(HELM_RELEASE, "ADDED", addon))
    await until(lambda: set(world.services()) == {"monitoring-system-a"}, what="the nudge")
    await world.lose(*ALL)


def claim_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("claim:discovery:")]


@pytest.mark.parametrize(
    "failure",
    [KubeUnavailable("connection refused"), KubeForbidden("RBAC"), RuntimeError("a bug")],
)
async def test_adoption_retries_whatever_the_list_raises(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(management())
    world.kube.fail("list", failure, failure)
    claims = ClaimTracker(world.watches, service="discovery", retry_base=0.01, retry_max=0.05)
    with caplog.at_level(logging.WARNING):
        await claims.follow(dict.fromkeys(ALL, 1))  # as the consumer drives it
        await until(lambda: len(world.tenants) == 1, what="adoption after two failures")
    assert world.kube.lists >= 3  # two failed, then one for every claim of the round
    assert caplog.text.count("cannot list Clusters") == 2
    await until(lambda: not claim_tasks(), what="the claim work to end")
    await claims.close()
    assert world.watches.running == {}


async def test_adoption_skips_a_cluster_that_cannot_be_watched_for_good() -> None:
    kube = management()
    other = kube.put(CLUSTER, {"metadata": {"name": "a-broken", "namespace": "ns", "uid": "u2"}})
    secret = kubeconfig_secret()
    secret["metadata"]["name"] = "a-broken-kubeconfig"
    kube.put(SECRET, secret)
    world = World(kube)
    spawn = world.watches.spawn

    def refuse_broken(target_: logic.Target, text: str) -> Any:
        if target_.name == other["metadata"]["name"]:
            raise KubeForbidden("cannot read")
        return spawn(target_, text)

    world.watches.spawn = refuse_broken
    await world.claim(*ALL)
    await until(lambda: "ns/demo" in world.watches.running, what="the healthy Cluster's watch")
    assert "ns/a-broken" not in world.watches.running
    await world.lose(*ALL)


async def test_claim_work_that_fails_unexpectedly_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(management())

    def broken(cluster: Json) -> int:
        raise RuntimeError("escaped")

    monkeypatch.setattr(world.watches, "_partition", broken)
    claims = ClaimTracker(world.watches, service="discovery", retry_base=0.01, retry_max=0.05)
    with caplog.at_level(logging.ERROR):
        await claims.follow(dict.fromkeys(ALL, 1))
        await until(lambda: not claim_tasks(), what="the claim work to end")
    assert "work for claimed partition" in caplog.text
    assert "escaped" in caplog.text
    await claims.close()


# --- a Cluster's events out of resourceVersion order (``shared.freshness``) ----------------


def versioned(type_: EventType, obj: Json, version: int) -> ResourceChanged:
    """The Cluster's event at ``version`` as the watcher publishes it (with its uid)."""
    meta = {**obj["metadata"], "resourceVersion": str(version)}
    change = event(CLUSTER, type_, {**obj, "metadata": meta})
    return change.model_copy(update={"ref": change.ref.model_copy(update={"uid": meta["uid"]})})


def deleting() -> Json:
    return {**cluster(), "metadata": {**cluster()["metadata"], "deletionTimestamp": "now"}}


async def test_a_clusters_older_event_after_its_deletion_starts_no_watch() -> None:
    """A lagging watcher replica's copy from before the deletion, published after it."""
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"))
    await world.claim(*ALL)
    await deliver(world, versioned("ADDED", cluster(), 5))
    await until(lambda: len(world.tenants) == 1, what="the watch")
    await deliver(world, versioned("DELETED", deleting(), 9))
    assert world.tenant.closed
    await deliver(world, versioned("MODIFIED", cluster(), 7))
    await asyncio.sleep(0.05)
    assert len(world.tenants) == 1
    # A new Cluster of the same name is another object: it is watched.
    await deliver(world, versioned("ADDED", cluster(uid="u2"), 12))
    await until(lambda: len(world.tenants) == 2, what="the new incarnation's watch")
    await world.lose(*ALL)


async def test_a_batch_steers_by_the_clusters_newest_version_not_stream_order() -> None:
    world = World(management())
    await world.claim(*ALL)
    await deliver(world, versioned("MODIFIED", deleting(), 9), versioned("MODIFIED", cluster(), 7))
    await asyncio.sleep(0.05)
    assert world.tenants == []
    await world.lose(*ALL)
