"""The monitor against the real API server, NATS and Redis, with watcher and writer, as processes.

The test plays Cluster API, the addon provider and Flux itself: it creates their objects with
the labels the openstack-cluster chart gives them (``docs/upstream.md`` §3) and writes their
statuses, then watches the Azimuth Cluster's status follow.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient, ResourceKind
from shared.messages import PatchStatus
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    KUSTOMIZATION,
    MACHINE,
    OPENSTACK_MACHINE,
    SECRET,
)
from testenv.examples import cluster_manifest
from tests.integration.support import eventually, read_stream

pytestmark = pytest.mark.integration

Json = dict[str, Any]
NAME = "demo"
CLUSTER_LABELS = {"capi.stackhpc.com/cluster": NAME}
MONITOR_KEYS = {
    "networkingPhase",
    "controlPlanePhase",
    "kubernetesVersion",
    "nodes",
    "addons",
    "kubeconfigSecretName",
}


async def make(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str, *, status: Json, **body: Any
) -> None:
    """Create an object as its controller would, then give it a status."""
    metadata = {"name": name, "namespace": namespace, **body.pop("metadata", {})}
    await kube.create(
        kind, {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata, **body}
    )
    if status:
        await set_status(kube, kind, namespace, name, status)


async def set_status(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str, status: Json
) -> None:
    await kube.patch_merge(kind, namespace, name, {"status": status}, subresource="status")


def component(name: str, **labels: str) -> Json:
    return {"labels": {**CLUSTER_LABELS, "capi.stackhpc.com/component": name, **labels}}


def true(kind: str) -> Json:
    return {
        "type": kind,
        "status": "True",
        "reason": "",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }


async def play_capi(kube: KubeClient, ns: str) -> None:
    await make(
        kube,
        CAPI_CLUSTER,
        ns,
        NAME,
        metadata={"labels": CLUSTER_LABELS},
        spec={},
        status={"phase": "Provisioned"},
    )
    await make(
        kube,
        CONTROL_PLANE,
        ns,
        f"{NAME}-control-plane",
        metadata=component("control-plane"),
        spec={"version": "v1.31.2", "replicas": 1},
        status={
            "version": "v1.31.2",
            "conditions": [true("Ready"), true("ControlPlaneComponentsHealthy")],
        },
    )
    await make(kube, OPENSTACK_MACHINE, ns, "cp-os", spec={"flavor": "m1.medium"}, status={})
    await make(kube, OPENSTACK_MACHINE, ns, "w-os", spec={"flavor": "m1.small"}, status={})
    running = {
        "phase": "Running",
        "conditions": [true("NodeHealthy")],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
    }
    await make(
        kube,
        MACHINE,
        ns,
        f"{NAME}-control-plane-x",
        metadata=component("control-plane"),
        # v1beta2's reference shape: group only, the version found by discovery.
        spec={
            "clusterName": NAME,
            "version": "v1.31.2",
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "OpenStackMachine",
                "name": "cp-os",
            },
        },
        status=running,
    )
    await make(
        kube,
        MACHINE,
        ns,
        f"{NAME}-md-0-y",
        metadata=component("worker", **{"capi.stackhpc.com/node-group": "md-0"}),
        spec={
            "clusterName": NAME,
            "version": "v1.31.2",
            "infrastructureRef": {
                "apiVersion": OPENSTACK_MACHINE.api_version,
                "kind": "OpenStackMachine",
                "name": "w-os",
            },
        },
        status={"phase": "Provisioned"},
    )


async def play_addons(kube: KubeClient, ns: str) -> None:
    await make(
        kube,
        HELM_RELEASE,
        ns,
        f"{NAME}-cni-calico",
        metadata=component("cni-calico"),
        spec={"clusterName": NAME, "targetNamespace": "tigera-operator"},
        status={"phase": "Deployed", "revision": 2},
    )
    await make(
        kube,
        KUSTOMIZATION,
        ns,
        f"{NAME}-flux-thing",
        metadata=component("flux-thing"),
        spec={"path": "./"},
        status={"conditions": [{**true("Ready"), "observedGeneration": 3}]},
    )
    capi_secret = {"labels": {"cluster.x-k8s.io/cluster-name": NAME}}
    for name in (f"{NAME}-ca", f"{NAME}-kubeconfig"):
        await make(
            kube,
            SECRET,
            ns,
            name,
            metadata=capi_secret,
            type="cluster.x-k8s.io/secret",
            stringData={"value": "not-a-real-kubeconfig"},
            status={},
        )


async def status_of(kube: KubeClient, ns: str) -> Json:
    return dict((await kube.get(CLUSTER, ns, NAME)).get("status") or {})


def settled(status: Json) -> bool:
    nodes = status.get("nodes") or {}
    return (
        status.get("networkingPhase") == "Provisioned"
        and status.get("controlPlanePhase") == "Ready"
        and len(nodes) == 2
        and all(n.get("size") for n in nodes.values())
        and len(status.get("addons") or {}) == 2
        and status.get("kubeconfigSecretName") == f"{NAME}-kubeconfig"
    )


async def monitor_patches(bus: Bus, ns: str) -> list[PatchStatus]:
    found = await read_stream(
        bus, subjects.STATUS.name, f"capibus.status.patch.cluster.*.{ns}.{NAME}"
    )
    return [m for _, m in found if isinstance(m, PatchStatus) and m.source.startswith("monitor/")]


async def test_capi_and_addon_objects_become_the_clusters_status(
    kube, bus, namespace, service
) -> None:
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    service("monitor")
    created = await kube.create(CLUSTER, cluster_manifest(namespace, NAME))
    await play_capi(kube, namespace)
    await play_addons(kube, namespace)

    status = await eventually(
        lambda: status_of(kube, namespace), settled, timeout=60, what="status from CAPI objects"
    )
    assert status["kubernetesVersion"] == "1.31.2"
    assert status["nodes"][f"{NAME}-control-plane-x"] == {
        "role": "control-plane",
        "phase": "Ready",
        "size": "m1.medium",
        "ip": "10.0.0.7",
        "ips": ["10.0.0.7"],
        "kubeletVersion": "1.31.2",
        "created": status["nodes"][f"{NAME}-control-plane-x"]["created"],
    }
    worker = status["nodes"][f"{NAME}-md-0-y"]
    assert (worker["phase"], worker["size"], worker["nodeGroup"]) == (
        "Provisioning",
        "m1.small",
        "md-0",
    )
    assert status["addons"] == {
        "cni-calico": {"phase": "Deployed", "revision": 2},
        "flux-thing": {"phase": "Deployed", "revision": 3},
    }
    patches = await monitor_patches(bus, namespace)
    assert {m.ref.uid for m in patches} == {created["metadata"]["uid"]}
    assert set().union(*(m.patch for m in patches)) <= MONITOR_KEYS

    # A change that changes nothing the Cluster shows publishes nothing; the real change
    # after it, on the same object and so handled after it, publishes exactly itself.
    before = len(patches)
    kcp = f"{NAME}-control-plane"
    await kube.patch_merge(CONTROL_PLANE, namespace, kcp, {"metadata": {"annotations": {"x": "y"}}})
    await kube.patch_merge(
        SECRET, namespace, f"{NAME}-ca", {"metadata": {"annotations": {"x": "y"}}}
    )
    await set_status(kube, CONTROL_PLANE, namespace, kcp, {"version": "v1.31.3"})
    await eventually(
        lambda: status_of(kube, namespace),
        lambda s: s.get("kubernetesVersion") == "1.31.3",
        what="the version change",
    )
    patches = await monitor_patches(bus, namespace)
    assert [m.patch for m in patches[before:]] == [{"kubernetesVersion": "1.31.3"}]

    await kube.delete(MACHINE, namespace, f"{NAME}-md-0-y")
    await eventually(
        lambda: status_of(kube, namespace),
        lambda s: set(s.get("nodes") or {}) == {f"{NAME}-control-plane-x"},
        what="the deleted machine's node to go",
    )
    await kube.delete(HELM_RELEASE, namespace, f"{NAME}-cni-calico")
    await kube.delete(CAPI_CLUSTER, namespace, NAME)
    status = await eventually(
        lambda: status_of(kube, namespace),
        lambda s: (
            set(s.get("addons") or {}) == {"flux-thing"} and s.get("networkingPhase") == "Unknown"
        ),
        what="the deleted addon and CAPI cluster",
    )


async def test_entries_nothing_backs_are_pruned_when_the_monitor_starts(
    kube, namespace, service
) -> None:
    """A status inherited from the previous operator names objects no event will ever
    mention again: a resync on claiming the partition removes them, Flux addons kept."""
    await kube.create(CLUSTER, cluster_manifest(namespace, NAME))
    await play_capi(kube, namespace)
    await play_addons(kube, namespace)
    inherited = {
        "networkingPhase": "Provisioned",
        "nodes": {
            "machine-gone": {"role": "worker", "phase": "Ready", "ips": []},
            f"{NAME}-md-0-y": {"role": "worker", "phase": "Provisioning", "ips": []},
        },
        "addons": {
            "addon-gone": {"phase": "Deployed", "revision": 1},
            "flux-thing": {"phase": "Deployed", "revision": 3},
        },
    }
    await set_status(kube, CLUSTER, namespace, NAME, inherited)
    # Only the monitor's own resync can act: the watcher is confined to another namespace,
    # so no event about these objects reaches it.
    service("watcher", CAPIBUS_WATCHER__NAMESPACE="elsewhere")
    service("writer")
    service("monitor")

    status = await eventually(
        lambda: status_of(kube, namespace),
        lambda s: (
            "machine-gone" not in (s.get("nodes") or {})
            and "addon-gone" not in (s.get("addons") or {})
        ),
        timeout=60,
        what="the inherited entries to be pruned",
    )
    assert set(status["nodes"]) == {f"{NAME}-md-0-y"}
    assert set(status["addons"]) == {"flux-thing"}
    assert status["networkingPhase"] == "Provisioned"


async def test_objects_deleted_while_capibus_was_down_leave_the_status(
    kube, namespace, service
) -> None:
    watcher = service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    monitor = service("monitor")
    await kube.create(CLUSTER, cluster_manifest(namespace, NAME))
    await play_capi(kube, namespace)
    await play_addons(kube, namespace)
    await eventually(lambda: status_of(kube, namespace), settled, timeout=60, what="settled")

    watcher.kill()
    monitor.kill()
    await kube.delete(MACHINE, namespace, f"{NAME}-md-0-y")
    await kube.delete(KUSTOMIZATION, namespace, f"{NAME}-flux-thing")
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("monitor")

    status = await eventually(
        lambda: status_of(kube, namespace),
        lambda s: (
            set(s.get("nodes") or {}) == {f"{NAME}-control-plane-x"}
            and set(s.get("addons") or {}) == {"cni-calico"}
        ),
        timeout=60,
        what="the entries of the objects deleted meanwhile to go",
    )
    assert status["controlPlanePhase"] == "Ready"
