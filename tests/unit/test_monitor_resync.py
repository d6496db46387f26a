"""Resume pruning: the pure rules, the handler against the shared fakes, and the claim
follower as the consumer drives it."""

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest

from services.monitor import resync
from services.monitor.app import Resyncs
from services.monitor.bootstrap import build, dependencies
from services.monitor.handlers import Deps, resync_cluster, resync_partitions
from services.monitor.logic import ClusterViews
from services.monitor.settings import MonitorSettings, MonitorTuning
from shared import subjects
from shared.claims import ClaimTracker
from shared.errors import KubeNotFound
from shared.kube import ResourceKind
from shared.messages import PatchStatus
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
from shared.status import StatusReporter
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
PARTITIONS = 4
BACKING = {kind.token: kind for kind in resync.BACKING}

FULL_STATUS: Json = {
    "networkingPhase": "Ready",
    "controlPlanePhase": "Ready",
    "kubernetesVersion": "1.31.2",
    "nodes": {"m-1": {"phase": "Ready"}, "m-2": {"phase": "Ready"}},
    "addons": {"cni-calico": {"phase": "Deployed"}, "flux-app": {"phase": "Deployed"}},
}


def labelled(
    name: str, component: str | None = None, *, cluster: str = "demo", namespace: str = "ns"
) -> Json:
    labels = {"capi.stackhpc.com/cluster": cluster}
    if component:
        labels["capi.stackhpc.com/component"] = component
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


def everything(cluster: str = "demo", namespace: str = "ns") -> dict[str, list[Json]]:
    """Every object FULL_STATUS names, for ``cluster``."""

    def obj(name: str, component: str | None = None) -> Json:
        return labelled(name, component, cluster=cluster, namespace=namespace)

    return {
        CAPI_CLUSTER.token: [obj(cluster)],
        CONTROL_PLANE.token: [obj(f"{cluster}-control-plane")],
        MACHINE.token: [obj("m-1"), obj("m-2")],
        HELM_RELEASE.token: [obj(f"{cluster}-cni-calico", "cni-calico")],
        KUSTOMIZATION.token: [obj(f"{cluster}-flux-app", "flux-app")],
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


class ResyncKube(FakeKube):
    """``clusters``, the ``objects`` backing them (by kind token) and kubeconfig ``secrets``;
    Flux Kustomizations are not served unless ``objects`` has some. ``requests`` lists what
    was asked, in order (``list <plural> <selector>``, ``get <plural>``)."""

    def __init__(
        self,
        clusters: list[Json],
        objects: dict[str, list[Json]],
        secrets: Iterable[Json] = (),
    ) -> None:
        super().__init__()
        for cluster_ in clusters:
            self.put(CLUSTER, cluster_)
        for token, items in objects.items():
            for obj in items:
                self.put(BACKING[token], obj)
        for secret_ in secrets:
            self.put(SECRET, secret_)
        self.unserved = set() if KUSTOMIZATION.token in objects else {KUSTOMIZATION.token}
        self.requests: list[str] = []
        #: awaited before each list: lets a test hold one midway
        self.gate: Callable[[ResourceKind, str | None], Awaitable[None]] | None = None

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self.requests.append(f"get {kind.plural}")
        return await super().get(kind, namespace, name)

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        **_: Any,
    ) -> tuple[list[Json], str]:
        self.requests.append(f"list {kind.plural} {label_selector or ''}".rstrip())
        if self.gate is not None:
            await self.gate(kind, label_selector)
        if kind.token in self.unserved:
            raise KubeNotFound(f"{kind.plural} are not served")
        return await super().list(kind, namespace=namespace, label_selector=label_selector)

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        raise AssertionError("no discovery needed")


def cluster(name: str, status: Json, *, namespace: str = "ns", **meta: Any) -> Json:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **meta},
        "status": status,
    }


def deps(kube: ResyncKube, bus: FakeBus, *, oidc: bool = False) -> Deps:
    reporter = StatusReporter(bus, partitions=PARTITIONS, source="monitor/test")
    return Deps(kube=kube, reporter=reporter, views=views(), oidc_enabled=oidc)


async def run_cluster(kube: ResyncKube, bus: FakeBus, *, oidc: bool = False) -> int:
    return await resync_cluster("ns", "demo", deps(kube, bus, oidc=oidc))


async def run_partitions(
    kube: ResyncKube, bus: FakeBus, claimed: frozenset[int] = frozenset(range(PARTITIONS))
) -> int:
    return await resync_partitions(claimed, deps(kube, bus))


def views() -> ClusterViews:
    return ClusterViews(size=10, ttl=5, replay=30)


async def test_resync_publishes_one_patch_for_what_vanished() -> None:
    objects = everything()
    objects[MACHINE.token] = [labelled("m-1")]
    kube, bus = ResyncKube([cluster("demo", FULL_STATUS)], objects), FakeBus()
    assert await run_cluster(kube, bus) == 1
    [(subject, message)] = bus.published
    assert isinstance(message, PatchStatus)
    assert message.patch == {"nodes": {"m-2": None}}
    assert message.ref.uid == "uid-demo"
    assert subject == subjects.cluster_status(
        subjects.partition_of("ns/demo", PARTITIONS), "ns", "demo"
    )
    # The objects are listed before the status is read (see resync_cluster).
    assert kube.requests.index("get clusters") > max(
        i for i, c in enumerate(kube.requests) if c.startswith("list")
    )


async def test_resync_publishes_nothing_when_all_is_backed() -> None:
    kube, bus = ResyncKube([cluster("demo", FULL_STATUS)], everything()), FakeBus()
    assert await run_cluster(kube, bus) == 0
    assert bus.published == []


async def test_an_unserved_kind_backs_nothing() -> None:
    objects = everything()
    del objects[KUSTOMIZATION.token]
    kube, bus = ResyncKube([cluster("demo", FULL_STATUS)], objects), FakeBus()
    await run_cluster(kube, bus)
    [(_, message)] = bus.published
    assert isinstance(message, PatchStatus)
    assert message.patch == {"addons": {"flux-app": None}}


async def test_same_prune_twice_is_the_same_message() -> None:
    objects = everything()
    objects[MACHINE.token] = []
    buses = [FakeBus(), FakeBus()]
    for bus in buses:
        await run_cluster(ResyncKube([cluster("demo", FULL_STATUS)], objects), bus)
    assert buses[0].published[0][1].id == buses[1].published[0][1].id


@pytest.mark.parametrize("owned", [True, False])
async def test_partitions_select_their_clusters(owned: bool) -> None:
    partition = subjects.partition_of("ns/demo", PARTITIONS)
    claimed = frozenset({partition} if owned else set(range(PARTITIONS)) - {partition})
    objects = everything()
    objects[MACHINE.token] = []
    kube, bus = ResyncKube([cluster("demo", FULL_STATUS)], objects), FakeBus()
    patched = await run_partitions(kube, bus, claimed)
    assert patched == (1 if owned else 0)


async def test_deleting_clusters_are_skipped() -> None:
    objects = everything()
    objects[MACHINE.token] = []
    doomed = cluster("demo", FULL_STATUS, deletionTimestamp="2026-01-01T00:00:00Z")
    kube, bus = ResyncKube([doomed], objects), FakeBus()
    patched = await run_partitions(kube, bus)
    assert patched == 0


# --- the kubeconfig the status names ----------------------------------------------------------


def secret(name: str, cluster: str = "demo", namespace: str = "ns") -> Json:
    labels = {"cluster.x-k8s.io/cluster-name": cluster}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


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
    kube = ResyncKube([cluster("demo", status)], everything(), [secret(n) for n in existing])
    bus = FakeBus()
    await run_cluster(kube, bus, oidc=oidc)
    patches = [m.patch for _, m in bus.published if isinstance(m, PatchStatus)]
    assert patches == ([{"kubeconfigSecretName": expected}] if expected else [])


async def test_a_kubeconfig_of_another_cluster_is_not_named() -> None:
    status = {**FULL_STATUS, "kubeconfigSecretName": "demo-kubeconfig-user"}
    kube = ResyncKube([cluster("demo", status)], everything(), [secret("demo-kubeconfig", "x")])
    bus = FakeBus()
    assert await run_cluster(kube, bus) == 0


async def test_pruning_and_naming_are_one_patch() -> None:
    objects = everything()
    objects[MACHINE.token] = [labelled("m-1")]
    status = {**FULL_STATUS, "kubeconfigSecretName": "demo-kubeconfig-user"}
    kube = ResyncKube([cluster("demo", status)], objects, [secret("demo-kubeconfig")])
    bus = FakeBus()
    await run_cluster(kube, bus)
    [(_, message)] = bus.published
    assert isinstance(message, PatchStatus)
    assert message.patch == {"nodes": {"m-2": None}, "kubeconfigSecretName": "demo-kubeconfig"}
    # The Secret, like the objects, is looked at before the status is read.
    assert kube.requests.index("get clusters") > kube.requests.index("get secrets")


# --- what a claim costs ----------------------------------------------------------------------

FLEET = 20
SNAPSHOT = ["list clusters"] + [
    f"list {k.plural} capi.stackhpc.com/cluster" for k in resync.BACKING
]


def fleet(size: int = FLEET) -> tuple[list[Json], dict[str, list[Json]], list[Json]]:
    """``size`` Clusters, each in a namespace of its own (their Machines share names), every
    status entry backed and the kubeconfig named."""
    clusters: list[Json] = []
    objects: dict[str, list[Json]] = {}
    secrets: list[Json] = []
    for name in (f"c{i}" for i in range(size)):
        namespace = f"ns-{name}"
        named = {"kubeconfigSecretName": f"{name}-kubeconfig"}
        clusters.append(cluster(name, {**FULL_STATUS, **named}, namespace=namespace))
        for token, items in everything(name, namespace).items():
            objects.setdefault(token, []).extend(items)
        secrets.append(secret(f"{name}-kubeconfig", name, namespace))
    return clusters, objects, secrets


def exact(name: str) -> list[str]:
    """The requests of ``resync_cluster`` for one Cluster."""
    lists = [f"list {k.plural} capi.stackhpc.com/cluster={name}" for k in resync.BACKING]
    return [*lists, "get secrets", "get clusters"]


async def test_a_claim_with_nothing_stale_costs_one_list_per_kind() -> None:
    kube, bus = ResyncKube(*fleet()), FakeBus()
    assert await run_partitions(kube, bus) == 0
    # Formerly 1 + 8 per Cluster (161 here); now 7 whatever the number of Clusters.
    assert kube.requests == SNAPSHOT
    assert bus.published == []


async def test_only_a_stale_cluster_takes_the_exact_path() -> None:
    clusters, objects, secrets = fleet()
    objects[MACHINE.token].remove(labelled("m-2", cluster="c3", namespace="ns-c3"))
    kube, bus = ResyncKube(clusters, objects, secrets), FakeBus()
    assert await run_partitions(kube, bus) == 1
    assert kube.requests == SNAPSHOT + exact("c3")
    [(_, message)] = bus.published
    assert isinstance(message, PatchStatus)
    assert (message.ref.name, message.patch) == ("c3", {"nodes": {"m-2": None}})


async def test_a_wrong_kubeconfig_name_takes_the_exact_path() -> None:
    clusters, objects, secrets = fleet()
    clusters[5]["status"]["kubeconfigSecretName"] = "c5-kubeconfig-user"
    kube, bus = ResyncKube(clusters, objects, secrets), FakeBus()
    assert await run_partitions(kube, bus) == 1
    assert kube.requests == SNAPSHOT + exact("c5")
    [(_, message)] = bus.published
    assert isinstance(message, PatchStatus)
    assert (message.ref.name, message.patch) == ("c5", {"kubeconfigSecretName": "c5-kubeconfig"})


async def test_an_unserved_kind_in_the_snapshot_backs_nothing() -> None:
    clusters, objects, secrets = fleet()
    del objects[KUSTOMIZATION.token]
    for c in clusters[1:]:
        c["status"]["addons"] = {"cni-calico": {"phase": "Deployed"}}
    kube, bus = ResyncKube(clusters, objects, secrets), FakeBus()
    assert await run_partitions(kube, bus) == 1  # c0 still names its Flux addon
    assert kube.requests == SNAPSHOT + exact("c0")


# --- claims, as the consumer drives them ------------------------------------------------------


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
    kube = ResyncKube([cluster("demo", FULL_STATUS), cluster(other, FULL_STATUS)], objects)
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
    claims = ClaimTracker(
        Resyncs(deps(kube, bus)), service="monitor", retry_base=0.01, retry_max=0.05
    )
    await claims.follow({demo: 1, kept: 1})
    await asyncio.wait_for(entered.wait(), timeout=5)
    # The new owner of demo's partition may report a node from now on: the consumer cancels
    # the partition's claim work first, then lets it go.
    await claims.cancel(demo)
    await claims.follow({kept: 1})
    release.set()
    for _ in range(100):
        if bus.published:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert [m.ref.name for _, m in bus.published if isinstance(m, PatchStatus)] == [other]
    # One snapshot serves the whole claim.
    assert (cluster_lists, bulk_lists) == (1, len(resync.BACKING))
    await claims.close()


def test_the_resync_can_be_switched_off() -> None:
    bus, kube = FakeBus(), ResyncKube([], {})
    on = MonitorSettings(replica="r1", partitions=PARTITIONS)
    off = on.model_copy(update={"monitor": MonitorTuning(resync=False)})
    for settings, follows in ((on, True), (off, False)):
        consumer = build(settings, dependencies(settings, bus=bus, kube=kube), bus=bus, leases=None)
        assert (consumer.claims is not None) is follows
