"""Resume pruning: the pure rules, the handler against fakes, and the ownership listener
through the composition root."""

import asyncio
from collections.abc import Awaitable, Callable
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
from shared.messages import Message, PatchStatus
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


def labelled(name: str, component: str | None = None, *, cluster: str = "demo") -> Json:
    labels = {"capi.stackhpc.com/cluster": cluster}
    if component:
        labels["capi.stackhpc.com/component"] = component
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}}


def everything(cluster: str = "demo") -> dict[str, list[Json]]:
    """Every object FULL_STATUS names, for ``cluster``."""
    return {
        CAPI_CLUSTER.token: [labelled(cluster, cluster=cluster)],
        CONTROL_PLANE.token: [labelled(f"{cluster}-control-plane", cluster=cluster)],
        MACHINE.token: [labelled("m-1", cluster=cluster), labelled("m-2", cluster=cluster)],
        HELM_RELEASE.token: [labelled(f"{cluster}-cni-calico", "cni-calico", cluster=cluster)],
        KUSTOMIZATION.token: [labelled(f"{cluster}-flux-app", "flux-app", cluster=cluster)],
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


# --- the pre-filter --------------------------------------------------------------------------


def test_objects_are_grouped_by_namespace_and_cluster_label() -> None:
    elsewhere = {"metadata": {**labelled("m-1")["metadata"], "namespace": "other"}}
    unlabelled = {"metadata": {"name": "m-9", "namespace": "ns"}}
    listed = {
        MACHINE.token: [labelled("m-1"), labelled("m-2", cluster="x"), elsewhere, unlabelled],
        HELM_RELEASE.token: [labelled("demo-cni", "cni")],
    }
    assert resync.group(listed) == {
        ("ns", "demo"): {
            MACHINE.token: [labelled("m-1")],
            HELM_RELEASE.token: [listed[HELM_RELEASE.token][0]],
        },
        ("ns", "x"): {MACHINE.token: [labelled("m-2", cluster="x")]},
        ("other", "demo"): {MACHINE.token: [elsewhere]},
    }


@pytest.mark.parametrize(
    ("oidc", "named", "drop_machine", "expected"),
    [
        (False, "demo-kubeconfig", False, False),
        (True, "demo-kubeconfig-user", False, False),
        (False, "demo-kubeconfig", True, True),  # a node nothing backs
        (False, "demo-kubeconfig-user", False, True),  # OIDC switched off
        (True, "demo-kubeconfig", False, True),  # OIDC switched on
        (False, None, False, True),  # not named yet: only the exact path can look
    ],
)
def test_a_cluster_is_suspect_when_the_exact_path_could_correct_it(
    oidc: bool, named: str | None, drop_machine: bool, expected: bool
) -> None:
    objects = everything()
    if drop_machine:
        objects[MACHINE.token] = [labelled("m-1")]
    status = {**FULL_STATUS, **({"kubeconfigSecretName": named} if named else {})}
    grouped = resync.group(objects)
    assert resync.suspect(cluster("demo", status), grouped, oidc=oidc) is expected


def test_a_cluster_with_nothing_listed_is_suspect_if_its_status_names_anything() -> None:
    named = {"kubeconfigSecretName": "demo-kubeconfig"}
    assert resync.suspect(cluster("demo", {**FULL_STATUS, **named}), {}, oidc=False)
    assert not resync.suspect(cluster("demo", named), {}, oidc=False)


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
        self.calls.append(f"list {kind.plural} {label_selector or ''}".rstrip())
        if self.gate is not None:
            await self.gate(kind, label_selector)
        if kind == CLUSTER:
            return self.clusters, "1"
        if kind == KUSTOMIZATION and kind.token not in self.objects:
            raise KubeNotFound("kustomizations are not served")
        return [
            o for o in self.objects.get(kind.token, []) if selects(o, namespace, label_selector)
        ], "1"

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        raise AssertionError("no discovery needed")


def selects(obj: Json, namespace: str | None, label_selector: str | None) -> bool:
    """The API server's namespace and label selection (``key`` or ``key=value``)."""
    meta = obj["metadata"]
    labels = meta.get("labels") or {}
    key, _, value = (label_selector or "").partition("=")
    return (namespace is None or meta.get("namespace") == namespace) and (
        not key or (key in labels and (not value or labels[key] == value))
    )


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


async def run_partitions(
    kube: FakeKube, bus: FakeBus, claimed: frozenset[int] = frozenset(range(PARTITIONS))
) -> int:
    return await resync_partitions(
        claimed=claimed,
        kube=kube,
        bus=bus,
        views=views(),
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
    assert isinstance(message, PatchStatus)
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
    assert isinstance(message, PatchStatus)
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
    patched = await run_partitions(kube, bus, claimed)
    assert patched == (1 if owned else 0)


async def test_deleting_clusters_are_skipped() -> None:
    objects = everything()
    objects[MACHINE.token] = []
    doomed = cluster("demo", FULL_STATUS, deletionTimestamp="2026-01-01T00:00:00Z")
    kube, bus = FakeKube([doomed], objects), FakeBus()
    patched = await run_partitions(kube, bus)
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
    patches = [m.patch for _, m in bus.sent if isinstance(m, PatchStatus)]
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
    assert isinstance(message, PatchStatus)
    assert message.patch == {"nodes": {"m-2": None}, "kubeconfigSecretName": "demo-kubeconfig"}
    # The Secret, like the objects, is looked at before the status is read.
    assert kube.calls.index("get clusters") > kube.calls.index("get secrets")


# --- what a claim costs ----------------------------------------------------------------------

FLEET = 20
SNAPSHOT = ["list clusters"] + [
    f"list {k.plural} capi.stackhpc.com/cluster" for k in resync.BACKING
]


def fleet(size: int = FLEET) -> tuple[list[Json], dict[str, list[Json]], list[Json]]:
    """``size`` Clusters, every status entry backed and the kubeconfig named."""
    clusters: list[Json] = []
    objects: dict[str, list[Json]] = {}
    secrets: list[Json] = []
    for name in (f"c{i}" for i in range(size)):
        named = {"kubeconfigSecretName": f"{name}-kubeconfig"}
        clusters.append(cluster(name, {**FULL_STATUS, **named}))
        for token, items in everything(name).items():
            objects.setdefault(token, []).extend(items)
        secrets.append(secret(f"{name}-kubeconfig", name))
    return clusters, objects, secrets


def exact(name: str) -> list[str]:
    """The requests of ``resync_cluster`` for one Cluster."""
    lists = [f"list {k.plural} capi.stackhpc.com/cluster={name}" for k in resync.BACKING]
    return [*lists, "get secrets", "get clusters"]


async def test_a_claim_with_nothing_stale_costs_one_list_per_kind() -> None:
    kube, bus = FakeKube(*fleet()), FakeBus()
    assert await run_partitions(kube, bus) == 0
    # Formerly 1 + 8 per Cluster (161 here); now 7 whatever the number of Clusters.
    assert kube.calls == SNAPSHOT
    assert bus.sent == []


async def test_only_a_stale_cluster_takes_the_exact_path() -> None:
    clusters, objects, secrets = fleet()
    objects[MACHINE.token].remove(labelled("m-2", cluster="c3"))
    kube, bus = FakeKube(clusters, objects, secrets), FakeBus()
    assert await run_partitions(kube, bus) == 1
    assert kube.calls == SNAPSHOT + exact("c3")
    [(_, message)] = bus.sent
    assert isinstance(message, PatchStatus)
    assert (message.ref.name, message.patch) == ("c3", {"nodes": {"m-2": None}})


async def test_a_wrong_kubeconfig_name_takes_the_exact_path() -> None:
    clusters, objects, secrets = fleet()
    clusters[5]["status"]["kubeconfigSecretName"] = "c5-kubeconfig-user"
    kube, bus = FakeKube(clusters, objects, secrets), FakeBus()
    assert await run_partitions(kube, bus) == 1
    assert kube.calls == SNAPSHOT + exact("c5")
    [(_, message)] = bus.sent
    assert isinstance(message, PatchStatus)
    assert (message.ref.name, message.patch) == ("c5", {"kubeconfigSecretName": "c5-kubeconfig"})


async def test_an_unserved_kind_in_the_snapshot_backs_nothing() -> None:
    clusters, objects, secrets = fleet()
    del objects[KUSTOMIZATION.token]
    for c in clusters[1:]:
        c["status"]["addons"] = {"cni-calico": {"phase": "Deployed"}}
    kube, bus = FakeKube(clusters, objects, secrets), FakeBus()
    assert await run_partitions(kube, bus) == 1  # c0 still names its Flux addon
    assert kube.calls == SNAPSHOT + exact("c0")


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
    cluster_lists = bulk_lists = 0

    async def gate(kind: ResourceKind, label_selector: str | None) -> None:
        nonlocal cluster_lists, bulk_lists
        cluster_lists += kind == CLUSTER
        bulk_lists += label_selector == "capi.stackhpc.com/cluster"
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
    assert [m.ref.name for _, m in bus.sent if isinstance(m, PatchStatus)] == [other]
    # One snapshot serves the whole claim.
    assert (cluster_lists, bulk_lists) == (1, len(resync.BACKING))
