"""Resume pruning: the pure rules, the handler against fakes, and the ownership listener
through the composition root."""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from services.monitor import resync
from services.monitor.bootstrap import build
from services.monitor.handlers import resync_cluster, resync_partitions
from services.monitor.logic import ClusterViews
from services.monitor.settings import MonitorSettings
from shared import subjects
from shared.bus import Published
from shared.consumer import Ownership
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
    SECRET,
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
    def __init__(
        self, clusters: list[Json], objects: dict[str, list[Json]], secrets: list[Json] = ()
    ) -> None:
        self.clusters = clusters
        self.objects = objects
        self.secrets = list(secrets)
        self.calls: list[str] = []
        #: awaited before each list: lets a test hold one midway
        self.gate: Callable[[ResourceKind, str | None], Awaitable[None]] | None = None

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self.calls.append(f"get {kind.plural}")
        for obj in self.secrets if kind == SECRET else self.clusters:
            if obj["metadata"]["name"] == name:
                return obj
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
        if self.gate is not None:
            await self.gate(kind, label_selector)
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


async def run_cluster(
    kube: FakeKube, bus: FakeBus, views: ClusterViews, *, oidc: bool = False
) -> int:
    return await resync_cluster(
        namespace="ns",
        name="demo",
        kube=kube,
        bus=bus,
        views=views,
        locks=KeyedLocks(),
        partitions=PARTITIONS,
        source="monitor/test",
        oidc_enabled=oidc,
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


# --- the kubeconfig the status names ----------------------------------------------------------


def secret(name: str, cluster: str = "demo") -> Json:
    labels = {"cluster.x-k8s.io/cluster-name": cluster}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}}


@pytest.mark.parametrize(
    ("oidc", "named", "existing", "expected"),
    [
        # OIDC switched off: the user kubeconfig is no longer written, the admin one counts.
        (
            False,
            "demo-kubeconfig-user",
            ["demo-kubeconfig", "demo-kubeconfig-user"],
            "demo-kubeconfig",
        ),
        # Switched on again: the identity service's Secret, once it exists.
        (
            True,
            "demo-kubeconfig",
            ["demo-kubeconfig", "demo-kubeconfig-user"],
            "demo-kubeconfig-user",
        ),
        (True, "demo-kubeconfig", ["demo-kubeconfig"], None),
        (False, None, ["demo-kubeconfig"], "demo-kubeconfig"),
        (False, "demo-kubeconfig", ["demo-kubeconfig"], None),
        (False, "demo-kubeconfig-user", [], None),
    ],
)
async def test_resync_names_the_kubeconfig_this_deployment_hands_out(
    oidc: bool, named: str | None, existing: list[str], expected: str | None
) -> None:
    status = {**FULL_STATUS, **({"kubeconfigSecretName": named} if named else {})}
    kube = FakeKube([cluster("demo", status)], everything(), [secret(n) for n in existing])
    bus = FakeBus()
    await run_cluster(kube, bus, views(), oidc=oidc)
    patches = [m.patch for _, m in bus.sent if isinstance(m, PatchClusterStatus)]
    assert patches == ([{"kubeconfigSecretName": expected}] if expected else [])


async def test_a_kubeconfig_of_another_cluster_is_not_named() -> None:
    status = {**FULL_STATUS, "kubeconfigSecretName": "demo-kubeconfig-user"}
    kube = FakeKube([cluster("demo", status)], everything(), [secret("demo-kubeconfig", "x")])
    bus = FakeBus()
    assert await run_cluster(kube, bus, views()) == 0


async def test_pruning_and_naming_are_one_patch() -> None:
    objects = everything()
    objects[MACHINE.token] = [labelled("m-1")]
    status = {**FULL_STATUS, "kubeconfigSecretName": "demo-kubeconfig-user"}
    kube = FakeKube([cluster("demo", status)], objects, [secret("demo-kubeconfig")])
    bus = FakeBus()
    await run_cluster(kube, bus, views())
    [(_, message)] = bus.sent
    assert isinstance(message, PatchClusterStatus)
    assert message.patch == {"nodes": {"m-2": None}, "kubeconfigSecretName": "demo-kubeconfig"}
    # The Secret, like the objects, is looked at before the status is read.
    assert kube.calls.index("get clusters") > kube.calls.index("get secrets")


# --- ownership, through the composition root --------------------------------------------------


async def test_losing_one_partition_cancels_its_resync_and_no_other() -> None:
    demo = subjects.partition_of("ns/demo", PARTITIONS)
    other = next(
        n
        for n in (f"c{i}" for i in range(100))
        if subjects.partition_of(f"ns/{n}", PARTITIONS) != demo
    )
    kept = subjects.partition_of(f"ns/{other}", PARTITIONS)
    objects = everything()
    objects[MACHINE.token] = []  # both Clusters name nodes that are gone
    kube = FakeKube([cluster("demo", FULL_STATUS), cluster(other, FULL_STATUS)], objects)
    entered, release = asyncio.Event(), asyncio.Event()
    cluster_lists = 0

    async def gate(kind: ResourceKind, label_selector: str | None) -> None:
        nonlocal cluster_lists
        cluster_lists += kind == CLUSTER
        if kind == MACHINE and label_selector == "capi.stackhpc.com/cluster=demo":
            entered.set()
            await release.wait()

    kube.gate = gate
    bus = FakeBus()
    settings = MonitorSettings(replica="r1", partitions=PARTITIONS)
    consumer = build(settings, bus=bus, leases=None, kube=kube)  # type: ignore[arg-type]
    listener = consumer.on_ownership
    assert listener is not None
    await listener(Ownership({demo: 1, kept: 1}))
    await asyncio.wait_for(entered.wait(), timeout=5)
    # The new owner of demo's partition may report a node from now on.
    await listener(Ownership({kept: 1}))
    release.set()
    for _ in range(100):
        if bus.sent:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert [m.ref.name for _, m in bus.sent if isinstance(m, PatchClusterStatus)] == [other]
    assert cluster_lists == 1  # one list serves the whole claim
