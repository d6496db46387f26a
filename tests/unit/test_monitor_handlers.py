"""The monitor's handler against fakes of its two Protocols (no network)."""

import logging
from typing import Any

import pytest

from services.monitor.handlers import KindCache, report
from services.monitor.logic import ClusterViews
from shared import subjects
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeNotFound
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import EventType, Message, ObjectRef, PatchStatus, ResourceChanged
from shared.resources import CAPI_CLUSTER, CLUSTER, CONTROL_PLANE, MACHINE, SECRET

Json = dict[str, Any]
PARTITIONS = 16
CLUSTER_LABELS = {"capi.stackhpc.com/cluster": "demo"}


class FakeKube:
    """The Azimuth Cluster ``ns/demo``, infrastructure machines and API discovery."""

    def __init__(self, status: Json | None = None, *, uid: str = "u1") -> None:
        self.clusters: dict[str, Json] = {
            "demo": {"metadata": {"name": "demo", "uid": uid}, "status": status or {}}
        }
        self.infra: dict[str, Json] = {}
        self.groups = {"infrastructure.cluster.x-k8s.io": "v1beta1"}
        self.gets: list[tuple[str, str]] = []
        self.resolved: list[tuple[str, str, str | None]] = []

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self.gets.append((kind.plural, name))
        found = self.clusters.get(name) if kind == CLUSTER else self.infra.get(name)
        if found is None or namespace != "ns":
            raise KubeNotFound(f"{kind.plural} {name}")
        return found

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        self.resolved.append((group, kind, version))
        if group not in self.groups or kind != "OpenStackMachine":
            raise KubeNotFound(f"{kind} of {group} is not served")
        version = version or self.groups[group]
        return ResourceKind(kind.lower(), group, version, kind, "openstackmachines")


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, PatchStatus]] = []

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        assert isinstance(message, PatchStatus)
        self.sent.append((subject, message))
        return Published(sequence=len(self.sent), duplicate=False)

    @property
    def patches(self) -> list[Json]:
        return [m.patch for _, m in self.sent]


class Monitor:
    """One monitor replica's state, and a way to feed it events."""

    def __init__(self, kube: FakeKube, *, ttl: float = 5) -> None:
        self.kube = kube
        self.bus = FakeBus()
        self.views = ClusterViews(size=10, ttl=ttl, replay=30)
        self.kinds = KindCache(miss_seconds=60)
        self.now = 0.0
        self.oidc = False

    async def see(self, kind: ResourceKind, obj: Json, event: EventType = "MODIFIED") -> None:
        await self.batch(self.change(kind, obj, event))

    def change(
        self, kind: ResourceKind, obj: Json, event: EventType = "MODIFIED"
    ) -> ResourceChanged:
        meta = obj["metadata"]
        return ResourceChanged(
            source="watcher/test",
            correlation_id="cluster:ns/demo",
            event=event,
            ref=ObjectRef(
                api_version=kind.api_version, kind=kind.kind, namespace="ns", name=meta["name"]
            ),
            resource_version="1",
            object=obj,
        )

    async def batch(self, *changes: ResourceChanged) -> None:
        await report(
            batch=Batch(key=f"ns/{changes[0].ref.name}", partition=0, messages=changes),
            kube=self.kube,
            bus=self.bus,
            views=self.views,
            locks=KeyedLocks(),
            kinds=self.kinds,
            partitions=PARTITIONS,
            source="monitor/test",
            clock=lambda: self.now,
            oidc_enabled=self.oidc,
        )


def thing(name: str, labels: Json | None = None, **rest: Any) -> Json:
    metadata = {
        "name": name,
        "namespace": "ns",
        "labels": CLUSTER_LABELS if labels is None else labels,
    }
    return {"metadata": metadata, **rest}


def machine(name: str = "demo-md-0-a", *, ref: Json | None = None, **status: Any) -> Json:
    labels = {**CLUSTER_LABELS, "capi.stackhpc.com/component": "worker"}
    default_ref = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "OpenStackMachine",
        "name": f"{name}-os",
    }
    spec = {"version": "v1.31.2", "infrastructureRef": ref or default_ref}
    return thing(name, labels, apiVersion="cluster.x-k8s.io/v1beta1", spec=spec, status=status)


def healthy_kcp(version: str = "v1.31.2") -> Json:
    conditions = [
        {"type": "Ready", "status": "True"},
        {"type": "ControlPlaneComponentsHealthy", "status": "True"},
    ]
    return thing(
        "demo-control-plane",
        spec={"version": version},
        status={"conditions": conditions, "version": version},
    )


async def test_a_change_becomes_a_uid_pinned_patch_in_the_clusters_partition() -> None:
    monitor = Monitor(FakeKube())
    await monitor.see(CAPI_CLUSTER, thing("demo", status={"phase": "Provisioned"}))
    [(subject, message)] = monitor.bus.sent
    assert subject == subjects.cluster_status(
        subjects.partition_of("ns/demo", PARTITIONS), "ns", "demo"
    )
    assert message.patch == {"networkingPhase": "Provisioned"}
    assert (message.ref.kind, message.ref.name, message.ref.uid) == ("Cluster", "demo", "u1")
    assert message.correlation_id == "cluster:ns/demo"
    assert message.causation_id is not None
    assert message.source == "monitor/test"


async def test_only_the_keys_that_differ_are_published() -> None:
    monitor = Monitor(FakeKube({"controlPlanePhase": "Ready", "kubernetesVersion": "1.30.1"}))
    await monitor.see(CONTROL_PLANE, healthy_kcp("v1.31.2"))
    assert monitor.bus.patches == [{"kubernetesVersion": "1.31.2"}]


async def test_nothing_is_published_when_the_cluster_already_says_it() -> None:
    status = {"controlPlanePhase": "Ready", "kubernetesVersion": "1.31.2"}
    monitor = Monitor(FakeKube(status))
    await monitor.see(CONTROL_PLANE, healthy_kcp())
    await monitor.see(CAPI_CLUSTER, thing("demo", status={}))
    assert monitor.bus.sent == []


async def test_a_repeated_event_is_published_once() -> None:
    monitor = Monitor(FakeKube())
    for _ in range(3):
        await monitor.see(CONTROL_PLANE, healthy_kcp())
    assert len(monitor.bus.sent) == 1


async def test_a_burst_of_events_for_one_cluster_reads_it_once() -> None:
    monitor = Monitor(FakeKube())
    for i in range(5):
        await monitor.see(MACHINE, machine(f"m{i}", phase="Pending"))
    assert [g for g in monitor.kube.gets if g[0] == "clusters"] == [("clusters", "demo")]
    assert len(monitor.bus.sent) == 5


async def test_unrelated_secrets_cost_nothing() -> None:
    monitor = Monitor(FakeKube())
    capi = {"cluster.x-k8s.io/cluster-name": "demo"}
    for name in ("demo-ca", "demo-etcd", "demo-sa", "demo-proxy"):
        await monitor.see(SECRET, thing(name, capi, type="cluster.x-k8s.io/secret"))
    await monitor.see(SECRET, thing("other-kubeconfig", {}))
    assert monitor.bus.sent == []
    assert monitor.kube.gets == []


async def test_only_the_clusters_own_kubeconfig_counts() -> None:
    monitor = Monitor(FakeKube())
    capi = {"cluster.x-k8s.io/cluster-name": "demo"}
    for name in ("demo-proxy-kubeconfig", "old-demo-kubeconfig", "demo-kubeconfig-user"):
        await monitor.see(SECRET, thing(name, capi))
    assert monitor.bus.sent == []
    monitor.oidc = True
    await monitor.see(SECRET, thing("demo-kubeconfig", capi))
    await monitor.see(SECRET, thing("x-demo-kubeconfig-user", capi))
    assert monitor.bus.sent == []
    await monitor.see(SECRET, thing("demo-kubeconfig-user", capi))
    assert monitor.bus.patches == [{"kubeconfigSecretName": "demo-kubeconfig-user"}]


async def test_the_kubeconfig_secret_names_itself() -> None:
    monitor = Monitor(FakeKube())
    secret = thing("demo-kubeconfig", {"cluster.x-k8s.io/cluster-name": "demo"})
    await monitor.see(SECRET, secret, "ADDED")
    await monitor.see(SECRET, secret, "DELETED")
    assert monitor.bus.patches == [{"kubeconfigSecretName": "demo-kubeconfig"}]


async def test_objects_of_a_missing_cluster_publish_nothing() -> None:
    monitor = Monitor(FakeKube())
    other = {"capi.stackhpc.com/cluster": "gone"}
    await monitor.see(CAPI_CLUSTER, thing("gone", other, status={"phase": "Provisioned"}))
    await monitor.see(CAPI_CLUSTER, thing("x", {}, status={"phase": "Provisioned"}))
    assert monitor.bus.sent == []


async def test_a_node_gets_its_size_from_the_infrastructure_machine() -> None:
    kube = FakeKube()
    kube.infra["m-os"] = {"spec": {"flavor": "m1.small"}}
    monitor = Monitor(kube)
    await monitor.see(MACHINE, machine("m", phase="Running"))
    [patch] = monitor.bus.patches
    assert patch["nodes"]["m"]["size"] == "m1.small"
    assert patch["nodes"]["m"]["phase"] == "Unhealthy"
    assert ("openstackmachines", "m-os") in kube.gets


async def test_a_v1beta2_reference_asks_discovery_for_the_preferred_version() -> None:
    kube = FakeKube()
    kube.infra["m-os"] = {"spec": {"flavor": "m1.large"}}
    monitor = Monitor(kube)
    ref = {
        "apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "OpenStackMachine",
        "name": "m-os",
    }
    await monitor.see(MACHINE, machine("m", ref=ref, phase="Provisioning"))
    await monitor.see(MACHINE, machine("m", ref=ref, phase="Provisioned"))
    assert monitor.bus.patches[0]["nodes"]["m"]["size"] == "m1.large"
    assert kube.resolved[0] == ("infrastructure.cluster.x-k8s.io", "OpenStackMachine", None)


async def test_a_missing_infrastructure_machine_leaves_the_size_unset() -> None:
    monitor = Monitor(FakeKube())
    await monitor.see(MACHINE, machine("m", phase="Provisioning"))
    unknown_group = {"apiGroup": "metal.example", "kind": "MetalMachine", "name": "x"}
    await monitor.see(MACHINE, machine("n", ref=unknown_group, phase="Pending"))
    nodes = [p["nodes"] for p in monitor.bus.patches]
    assert nodes == [
        {"m": {"role": "worker", "phase": "Provisioning", "ips": [], "kubeletVersion": "1.31.2"}},
        {"n": {"role": "worker", "phase": "Pending", "ips": [], "kubeletVersion": "1.31.2"}},
    ]


async def test_a_kind_the_server_does_not_serve_is_logged_once_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    monitor = Monitor(kube)
    unserved = {"apiGroup": "metal.example", "kind": "MetalMachine", "name": "x"}
    wrong_kind = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "NoSuchMachine",
        "name": "y",
    }
    caplog.set_level(logging.INFO, logger="services.monitor.handlers")
    for phase in ("Pending", "Provisioning", "Provisioned"):
        await monitor.see(MACHINE, machine("n", ref=unserved, phase=phase))
        await monitor.see(MACHINE, machine("o", ref=wrong_kind, phase=phase))
    monitor.now = 61
    await monitor.see(MACHINE, machine("n", ref=unserved, phase="Running"))
    said = [r.getMessage() for r in caplog.records if "get no size" in r.getMessage()]
    assert [m.split(":")[0] for m in said] == [
        "MetalMachine of metal.example",
        "NoSuchMachine of infrastructure.cluster.x-k8s.io",
        "MetalMachine of metal.example",
    ]
    assert all("size" not in node for p in monitor.bus.patches for node in p["nodes"].values())


async def test_a_deleted_machine_removes_its_node_once() -> None:
    status = {"nodes": {"m": {"role": "worker", "phase": "Ready"}}}
    monitor = Monitor(FakeKube(status))
    await monitor.see(MACHINE, machine("m"), "DELETED")
    await monitor.see(MACHINE, machine("m"), "DELETED")
    await monitor.see(MACHINE, machine("never-reported"), "DELETED")
    assert monitor.bus.patches == [{"nodes": {"m": None}}]


async def test_a_replaced_cluster_is_addressed_by_its_new_uid_after_the_view_expires() -> None:
    kube = FakeKube()
    monitor = Monitor(kube, ttl=5)
    await monitor.see(CAPI_CLUSTER, thing("demo", status={"phase": "Pending"}))
    kube.clusters["demo"] = {"metadata": {"name": "demo", "uid": "u2"}, "status": {}}
    monitor.now = 6
    await monitor.see(CAPI_CLUSTER, thing("demo", status={"phase": "Provisioning"}))
    assert [m.ref.uid for _, m in monitor.bus.sent] == ["u1", "u2"]


async def test_a_patch_still_in_flight_is_not_mistaken_for_the_clusters_state() -> None:
    """The Cluster read after the TTL does not show our last patch yet; we must not conclude
    that the object's reverted state is already what the Cluster says."""
    monitor = Monitor(FakeKube({"networkingPhase": "Pending"}), ttl=1)
    await monitor.see(CAPI_CLUSTER, thing("demo", status={"phase": "Provisioning"}))
    monitor.now = 2
    await monitor.see(CAPI_CLUSTER, thing("demo", status={"phase": "Pending"}))
    assert monitor.bus.patches == [
        {"networkingPhase": "Provisioning"},
        {"networkingPhase": "Pending"},
    ]


async def test_a_batch_reports_the_latest_event_of_each_kind() -> None:
    """A CAPI Cluster and a Secret may share a name, and so a queue and a batch."""
    monitor = Monitor(FakeKube())
    kubeconfig_labels = {"cluster.x-k8s.io/cluster-name": "demo"}
    await monitor.batch(
        monitor.change(CAPI_CLUSTER, thing("demo-kubeconfig", status={"phase": "Pending"})),
        monitor.change(SECRET, thing("demo-kubeconfig", kubeconfig_labels)),
        monitor.change(CAPI_CLUSTER, thing("demo-kubeconfig", status={"phase": "Provisioning"})),
    )
    assert monitor.bus.patches == [
        {"networkingPhase": "Provisioning"},
        {"kubeconfigSecretName": "demo-kubeconfig"},
    ]


async def test_a_new_object_reads_the_cluster_afresh() -> None:
    kube = FakeKube()
    monitor = Monitor(kube, ttl=60)
    await monitor.see(CAPI_CLUSTER, thing("demo", status={"phase": "Deleting"}))
    kube.clusters["demo"] = {"metadata": {"name": "demo", "uid": "u2"}, "status": {}}
    await monitor.see(MACHINE, machine("m", phase="Pending"), "ADDED")
    assert [m.ref.uid for _, m in monitor.bus.sent] == ["u1", "u2"]
