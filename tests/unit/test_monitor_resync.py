"""Resume pruning: the pure rules and the handler against fakes."""

from collections.abc import Mapping
from typing import Any

import pytest

from services.monitor import resync
from services.monitor.handlers import resync_cluster, resync_partitions
from services.monitor.logic import ClusterViews
from shared import subjects
from shared.bus import Published
from shared.errors import KubeNotFound
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import Message, PatchClusterStatus
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    KUSTOMIZATION,
    MACHINE,
    MANIFESTS,
)

Json = dict[str, Any]
PARTITIONS = 4

FULL_STATUS: Json = {
    "networkingPhase": "Ready",
    "controlPlanePhase": "Ready",
    "kubernetesVersion": "1.31.2",
    "nodes": {"m-1": {"phase": "Ready"}, "m-2": {"phase": "Ready"}},
    "addons": {"cni-calico": {"phase": "Deployed"}, "flux-app": {"phase": "Deployed"}},
}


def labelled(name: str, component: str | None = None) -> Json:
    labels = {"capi.stackhpc.com/cluster": "demo"}
    if component:
        labels["capi.stackhpc.com/component"] = component
    return {"metadata": {"name": name, "labels": labels}}


def everything() -> dict[str, list[Json]]:
    return {
        CAPI_CLUSTER.token: [labelled("demo")],
        CONTROL_PLANE.token: [labelled("demo-control-plane")],
        MACHINE.token: [labelled("m-1"), labelled("m-2")],
        HELM_RELEASE.token: [labelled("demo-cni-calico", "cni-calico")],
        KUSTOMIZATION.token: [labelled("demo-flux-app", "flux-app")],
    }


def test_nothing_to_prune_when_every_entry_is_backed() -> None:
    assert resync.stale(FULL_STATUS, resync.present(everything())) == {}


def test_vanished_machine_and_addon_are_removed() -> None:
    objects = everything()
    objects[MACHINE.token] = [labelled("m-1")]
    objects[HELM_RELEASE.token] = []
    patch = resync.stale(FULL_STATUS, resync.present(objects))
    assert patch == {"nodes": {"m-2": None}, "addons": {"cni-calico": None}}


def test_flux_addons_are_kept_when_their_kustomization_exists() -> None:
    # Upstream's resume pruning listed only HelmReleases and Manifests.
    patch = resync.stale(FULL_STATUS, resync.present(everything()))
    assert "addons" not in patch


def test_manifests_back_addons_too() -> None:
    objects = everything()
    objects[HELM_RELEASE.token] = []
    objects[MANIFESTS.token] = [labelled("demo-cni-calico", "cni-calico")]
    assert resync.stale(FULL_STATUS, resync.present(objects)) == {}


def test_vanished_capi_cluster_and_control_plane_become_unknown() -> None:
    objects = everything()
    del objects[CAPI_CLUSTER.token]
    objects[CONTROL_PLANE.token] = []
    patch = resync.stale(FULL_STATUS, resync.present(objects))
    assert patch == {
        "networkingPhase": "Unknown",
        "controlPlanePhase": "Unknown",
        "kubernetesVersion": None,
    }


def test_already_unknown_phases_are_left_alone() -> None:
    status = {"networkingPhase": "Unknown"}
    assert resync.stale(status, resync.present({})) == {}
    assert resync.stale({}, resync.present({})) == {}


def test_objects_without_component_label_back_nothing() -> None:
    objects = {HELM_RELEASE.token: [labelled("demo-x")]}
    assert resync.present(objects).components == frozenset()


# --- handler ---------------------------------------------------------------------------------


class FakeKube:
    def __init__(self, clusters: list[Json], objects: dict[str, list[Json]]) -> None:
        self.clusters = clusters
        self.objects = objects
        self.calls: list[str] = []

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self.calls.append(f"get {kind.plural}")
        for cluster in self.clusters:
            if cluster["metadata"]["name"] == name:
                return cluster
        raise KubeNotFound(name)

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[Json], str]:
        self.calls.append(f"list {kind.plural}")
        if kind == CLUSTER:
            return self.clusters, "1"
        if kind == KUSTOMIZATION and kind.token not in self.objects:
            raise KubeNotFound("kustomizations are not served")
        return self.objects.get(kind.token, []), "1"

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Json:
        raise AssertionError("no discovery needed")


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        self.sent.append((subject, message))
        return Published(sequence=len(self.sent), duplicate=False)


def cluster(name: str, status: Json, **meta: Any) -> Json:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **meta},
        "status": status,
    }


async def run_cluster(kube: FakeKube, bus: FakeBus, views: ClusterViews) -> int:
    return await resync_cluster(
        namespace="ns",
        name="demo",
        kube=kube,
        bus=bus,
        views=views,
        locks=KeyedLocks(),
        partitions=PARTITIONS,
        source="monitor/test",
    )


def views() -> ClusterViews:
    return ClusterViews(size=10, ttl=5, replay=30)


async def test_resync_publishes_one_patch_for_what_vanished() -> None:
    objects = everything()
    objects[MACHINE.token] = [labelled("m-1")]
    kube, bus = FakeKube([cluster("demo", FULL_STATUS)], objects), FakeBus()
    assert await run_cluster(kube, bus, views()) == 1
    [(subject, message)] = bus.sent
    assert isinstance(message, PatchClusterStatus)
    assert message.patch == {"nodes": {"m-2": None}}
    assert message.ref.uid == "uid-demo"
    assert subject == subjects.cluster_status(
        subjects.partition_of("ns/demo", PARTITIONS), "ns", "demo"
    )
    # The objects are listed before the status is read (see resync_cluster).
    assert kube.calls.index("get clusters") > max(
        i for i, c in enumerate(kube.calls) if c.startswith("list")
    )


async def test_resync_publishes_nothing_when_all_is_backed() -> None:
    kube, bus = FakeKube([cluster("demo", FULL_STATUS)], everything()), FakeBus()
    assert await run_cluster(kube, bus, views()) == 0
    assert bus.sent == []


async def test_an_unserved_kind_backs_nothing() -> None:
    objects = everything()
    del objects[KUSTOMIZATION.token]
    kube, bus = FakeKube([cluster("demo", FULL_STATUS)], objects), FakeBus()
    await run_cluster(kube, bus, views())
    [(_, message)] = bus.sent
    assert isinstance(message, PatchClusterStatus)
    assert message.patch == {"addons": {"flux-app": None}}


async def test_same_prune_twice_is_the_same_message() -> None:
    objects = everything()
    objects[MACHINE.token] = []
    bus = FakeBus()
    for _ in range(2):
        await run_cluster(FakeKube([cluster("demo", FULL_STATUS)], objects), bus, views())
    assert bus.sent[0][1].id == bus.sent[1][1].id


@pytest.mark.parametrize("owned", [True, False])
async def test_partitions_select_their_clusters(owned: bool) -> None:
    partition = subjects.partition_of("ns/demo", PARTITIONS)
    claimed = frozenset({partition} if owned else set(range(PARTITIONS)) - {partition})
    objects = everything()
    objects[MACHINE.token] = []
    kube, bus = FakeKube([cluster("demo", FULL_STATUS)], objects), FakeBus()
    patched = await resync_partitions(
        claimed=claimed,
        kube=kube,
        bus=bus,
        views=views(),
        locks=KeyedLocks(),
        partitions=PARTITIONS,
        source="monitor/test",
    )
    assert patched == (1 if owned else 0)


async def test_deleting_clusters_are_skipped() -> None:
    objects = everything()
    objects[MACHINE.token] = []
    doomed = cluster("demo", FULL_STATUS, deletionTimestamp="2026-01-01T00:00:00Z")
    kube, bus = FakeKube([doomed], objects), FakeBus()
    patched = await resync_partitions(
        claimed=frozenset(range(PARTITIONS)),
        kube=kube,
        bus=bus,
        views=views(),
        locks=KeyedLocks(),
        partitions=PARTITIONS,
        source="monitor/test",
    )
    assert patched == 0
