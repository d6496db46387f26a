"""Discovery's recompute, event dispatch and watch lifecycle against fakes (no network)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.discovery import handlers, logic
from services.discovery.settings import DiscoveryTuning
from services.discovery.tenant import TenantDeps, TenantWatch
from services.discovery.watches import Watches
from shared import subjects
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeForbidden, KubeInvalid, KubeNotFound, KubeUnavailable
from shared.kube import ResourceKind, WatchEvent, WatchExpired
from shared.mergepatch import apply
from shared.messages import EventType, Message, ObjectRef, PatchStatus, ResourceChanged
from shared.metrics import REGISTRY
from shared.resources import CLUSTER, HELM_RELEASE, MANIFESTS, SECRET

Json = dict[str, Any]
PARTITIONS = 4
ALL = frozenset(range(PARTITIONS))
TUNING = DiscoveryTuning(quiet_seconds=0.01, max_delay_seconds=0.2, retry_max_seconds=0.05)
KPS = ("monitoring-system", "demo-monitoring")


class FakeKube:
    """The management cluster: objects by (plural, namespace, name)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Json] = {}
        self.patched: list[tuple[str, Json]] = []
        self.lists = 0
        self.version = 0
        self.refuse: dict[str, Exception] = {}  # a patch of the object by this name raises
        self.fail_cluster_lists: list[Exception] = []  # the next lists of Clusters raise

    def put(self, kind: ResourceKind, obj: Json) -> Json:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[(kind.plural, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return obj

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        try:
            return self.objects[(kind.plural, namespace or "", name)]
        except KeyError:
            raise KubeNotFound(f"{kind.plural} {name}") from None

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Json], str]:
        self.lists += 1
        if kind == CLUSTER and self.fail_cluster_lists:
            raise self.fail_cluster_lists.pop(0)
        wanted = dict(p.split("=", 1) for p in label_selector.split(",")) if label_selector else {}
        found = [
            obj
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == kind.plural
            and namespace in (None, ns)
            and wanted.items() <= (obj["metadata"].get("labels") or {}).items()
        ]
        return found, str(self.version)

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        current = await self.get(kind, namespace, name)
        if name in self.refuse:
            raise self.refuse[name]
        self.patched.append((name, patch))
        return self.put(kind, apply(current, patch))


class FakeBus:
    def __init__(self, kube: FakeKube | None = None) -> None:
        self.sent: list[tuple[str, PatchStatus]] = []
        self.kube = kube  # when given, plays the writer: patches land at once

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        assert isinstance(message, PatchStatus)
        self.sent.append((subject, message))
        if self.kube is not None:
            ref = message.ref
            cluster = await self.kube.get(CLUSTER, ref.namespace, ref.name)
            self.kube.put(CLUSTER, apply(cluster, {"status": message.patch}))
        return Published(sequence=len(self.sent), duplicate=False)

    @property
    def patches(self) -> list[Json]:
        return [m.patch for _, m in self.sent]


class FakeTenant:
    """A tenant API server: Reservations, a scripted watch, failures on demand."""

    def __init__(self, *reservations: Json) -> None:
        self.items = {_key(r): r for r in reservations}
        self.events: asyncio.Queue[WatchEvent | Exception | None] = asyncio.Queue()
        self.fail_lists: list[Exception] = []
        self.lists = 0
        self.closed = False

    def emit(self, kind: str, obj: Json) -> None:
        if kind == "DELETED":
            self.items.pop(_key(obj), None)
        else:
            self.items[_key(obj)] = obj
        self.events.put_nowait(WatchEvent(type=kind, object=obj))  # type: ignore[arg-type]

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Json], str]:
        self.lists += 1
        if self.fail_lists:
            raise self.fail_lists.pop(0)
        return list(self.items.values()), str(self.lists)

    async def watch(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
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


def management(**status: Any) -> FakeKube:
    kube = FakeKube()
    kube.put(CLUSTER, cluster(**status))
    kube.put(SECRET, kubeconfig_secret())
    kube.put(HELM_RELEASE, chart_addon())
    return kube


def target(uid: str = "u1") -> logic.Target:
    partition = subjects.partition_of("ns/demo", PARTITIONS)
    return logic.Target("ns", "demo", uid, partition, "1")


def announced(
    kube: FakeKube, kind: ResourceKind = HELM_RELEASE, name: str = "demo-monitoring"
) -> Json:
    notes = kube.objects[(kind.plural, "ns", name)]["metadata"].get("annotations") or {}
    return dict(json.loads(notes.get(logic.SERVICES_ANNOTATION, "{}")))


async def until(check: Callable[[], bool], *, timeout: float = 3.0, what: str = "it") -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# --- one recompute -------------------------------------------------------------------------


async def run_sync(
    kube: FakeKube, bus: FakeBus, reservations: list[Json], belief: logic.Belief, *, uid: str = "u1"
) -> None:
    await handlers.sync(
        target=target(uid),
        reservations=reservations,
        belief=belief,
        reread=belief.services is None,
        kube=kube,
        bus=bus,
        partitions=PARTITIONS,
        source="discovery/test",
        now=0.0,
    )


async def test_sync_publishes_the_status_difference_and_annotates_the_addon() -> None:
    kube = management(services={"stale": {"subdomain": "s", "fqdn": "s", "label": "S"}})
    bus = FakeBus()
    belief = logic.Belief(replay=30)
    await run_sync(
        kube, bus, [reservation("kps-client"), reservation("x", phase="Pending")], belief
    )

    [(subject, message)] = bus.sent
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
    assert len(bus.sent) == 1
    assert len(kube.patched) == patched


async def test_app_services_stay_in_their_helm_release_only() -> None:
    kube = FakeKube()
    kube.put(CLUSTER, cluster())
    kube.put(HELM_RELEASE, chart_addon("jupyter", chart=False))
    kube.put(MANIFESTS, chart_addon("demo-monitoring"))  # same release: the HelmRelease wins
    bus = FakeBus()
    await run_sync(kube, bus, [reservation("kps-client")], logic.Belief(replay=30))
    assert bus.sent == []
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
    broken = chart_addon("demo-aaa")  # listed (and patched) before demo-monitoring
    broken["metadata"]["labels"]["addons.stackhpc.com/release-name"] = "other"
    kube.put(HELM_RELEASE, broken)
    kube.refuse["demo-aaa"] = refusal
    counted = refusals(type(refusal).__name__)
    bus = FakeBus()
    found = [reservation("kps-client"), released_by(reservation("other-ui"), "other")]
    with caplog.at_level(logging.ERROR):
        await run_sync(kube, bus, found, logic.Belief(replay=30))

    [(_, message)] = bus.sent
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
    assert bus.sent == []


async def test_a_replaced_or_missing_cluster_gets_nothing() -> None:
    kube = management()
    bus = FakeBus()
    await run_sync(kube, bus, [reservation("kps-client")], logic.Belief(replay=30), uid="old")
    assert bus.sent == []
    assert kube.patched == []


# --- the watch lifecycle -------------------------------------------------------------------


class World:
    """A discovery replica's tracker with real ``TenantWatch``es over fake tenants."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.bus = FakeBus(kube)
        self.tenants: list[tuple[str, FakeTenant]] = []
        self.next_tenant: FakeTenant = FakeTenant()
        deps = TenantDeps(
            kube=kube,
            bus=self.bus,
            connect=self.connect,
            tuning=TUNING,
            partitions=PARTITIONS,
            source="discovery/test",
        )
        self.watches = Watches(
            kube=kube,
            spawn=lambda t, text: TenantWatch(t, text, deps).start(),
            partitions=PARTITIONS,
            retry_max_seconds=0.05,
        )

    def connect(self, kubeconfig: str) -> handlers.TenantApi:
        tenant, self.next_tenant = self.next_tenant, FakeTenant()
        self.tenants.append((kubeconfig, tenant))
        return tenant

    @property
    def tenant(self) -> FakeTenant:
        return self.tenants[-1][1]

    def services(self) -> Json:
        return dict(self.kube.objects[("clusters", "ns", "demo")]["status"].get("services") or {})


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
    batch = Batch(key="ns/demo", partition=0, messages=changes)
    await handlers.on_changes(batch=batch, tracker=world.watches)


async def test_a_cluster_event_starts_one_watch_whose_initial_list_is_one_publish() -> None:
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"), reservation("b"), reservation("c"))
    await world.watches.follow_ownership(ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.services()) == 3, what="three services")
    await asyncio.sleep(0.05)
    assert len(world.bus.sent) == 1
    assert world.tenants[0][0] == "kubeconfig-1"

    # Later Cluster events (its own status writes) cost nothing: same watch, no API call.
    lists = world.kube.lists
    await deliver(world, event(CLUSTER, "MODIFIED", world.kube.objects[("clusters", "ns", "demo")]))
    assert len(world.tenants) == 1
    await world.watches.close()
    assert world.tenant.closed
    assert world.kube.lists == lists


async def test_leaving_ready_or_being_deleted_removes_the_service_everywhere() -> None:
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"), reservation("b"))
    await world.watches.follow_ownership(ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.services()) == 2)

    world.tenant.emit("MODIFIED", reservation("a", phase="Failed"))
    await until(lambda: set(world.services()) == {"monitoring-system-b"})
    assert world.bus.patches[-1] == {"services": {"monitoring-system-a": None}}
    assert set(announced(world.kube)) == {"monitoring-system-b"}

    world.tenant.emit("DELETED", reservation("b"))
    await until(lambda: world.services() == {})
    assert announced(world.kube) == {}
    await world.watches.close()


async def test_expired_and_broken_watches_reconnect_with_a_full_relist() -> None:
    world = World(management())
    world.next_tenant = FakeTenant(reservation("a"))
    await world.watches.follow_ownership(ALL)
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
    # The server ending a watch normally is a reconnect too.
    tenant.events.put_nowait(None)
    await until(lambda: tenant.lists == 5)
    await world.watches.close()


async def test_a_rotated_kubeconfig_restarts_the_watch_and_deletion_stops_it() -> None:
    world = World(management())
    await world.watches.follow_ownership(ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: len(world.tenants) == 1)
    first = world.tenant

    # The same Secret version again: nothing happens.
    secret = world.kube.objects[("secrets", "ns", "demo-kubeconfig")]
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
    secret = kube.objects.pop(("secrets", "ns", "demo-kubeconfig"))
    world = World(kube)
    await world.watches.follow_ownership(ALL)
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
    await world.watches.follow_ownership(ALL - {mine})
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    assert world.tenants == []  # not ours

    await world.watches.follow_ownership(ALL)  # claimed: its Clusters are found and watched
    await until(lambda: len(world.tenants) == 1, what="adoption")
    await world.watches.follow_ownership(ALL - {mine})
    assert world.tenant.closed
    assert world.watches.running == {}
    await world.watches.follow_ownership(frozenset())


async def test_addon_events_nudge_a_recompute() -> None:
    kube = management()
    kube.objects.pop(("helmreleases", "ns", "demo-monitoring"))
    world = World(kube)
    world.next_tenant = FakeTenant(reservation("a"))
    await world.watches.follow_ownership(ALL)
    await deliver(world, event(CLUSTER, "ADDED", cluster()))
    await until(lambda: bool(world.tenants) and world.tenant.lists == 1)
    await asyncio.sleep(0.05)
    assert world.services() == {}  # no addon yet: the service belongs to nobody

    addon = kube.put(HELM_RELEASE, chart_addon())
    await deliver(world, event(HELM_RELEASE, "ADDED", addon))
    await until(lambda: set(world.services()) == {"monitoring-system-a"}, what="the nudge")
    await world.watches.close()


@pytest.mark.parametrize(
    "failure",
    [KubeUnavailable("connection refused"), KubeForbidden("RBAC"), RuntimeError("a bug")],
)
async def test_adoption_retries_whatever_the_list_raises(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(management())
    world.kube.fail_cluster_lists = [failure, failure]
    with caplog.at_level(logging.WARNING):
        await world.watches.follow_ownership(ALL)
        await until(lambda: len(world.tenants) == 1, what="adoption after two failures")
    assert world.kube.fail_cluster_lists == []
    assert caplog.text.count("cannot adopt partitions") == 2
    assert world.watches._adoptions == set()
    await world.watches.close()


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
    await world.watches.follow_ownership(ALL)
    await until(lambda: "ns/demo" in world.watches.running, what="the healthy Cluster's watch")
    assert "ns/a-broken" not in world.watches.running
    await world.watches.close()


async def test_an_adoption_task_that_fails_unexpectedly_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(management())

    async def broken(partitions: frozenset[int]) -> None:
        raise RuntimeError("escaped")

    monkeypatch.setattr(world.watches, "_adopt", broken)
    with caplog.at_level(logging.ERROR):
        await world.watches.follow_ownership(ALL)
        await until(lambda: not world.watches._adoptions, what="the task to end")
    assert "ended unexpectedly" in caplog.text
    assert "escaped" in caplog.text
