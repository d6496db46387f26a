"""The Cluster API stand-in against the real API server.

The objects a ``helm install`` of the openstack-cluster chart would create are created here
directly, shaped as in ``docs/upstream.md`` §3; the stand-in's controllers run in
this process, confined to the test's namespace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    NAMESPACE,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    RESERVATION,
    SECRET,
)
from standins.base import run_all
from standins.capi import CapiKnobs, controllers
from standins.capi_shapes import OPENSTACK_MACHINE_TEMPLATE
from testenv.harness import LocalStack
from tests.integration.support import eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
P = "capi.stackhpc.com"
VERSION = "v1.31.2"
Start = Callable[..., Awaitable[None]]
Record = Callable[[ResourceKind], Awaitable[dict[str, list[str]]]]


# --- what the chart would create -----------------------------------------------------------


def _labels(cluster: str, **extra: str) -> dict[str, str]:
    return {
        f"{P}/managed-by": "Helm",
        f"{P}/infrastructure-provider": "openstack",
        f"{P}/cluster": cluster,
        **{f"{P}/{k.replace('_', '-')}": v for k, v in extra.items()},
    }


def _obj(kind: ResourceKind, ns: str, name: str, labels: dict[str, str], spec: Json) -> Json:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": spec,
    }


def _template_ref(name: str) -> Json:
    return {
        "apiVersion": OPENSTACK_MACHINE_TEMPLATE.api_version,
        "kind": OPENSTACK_MACHINE_TEMPLATE.kind,
        "name": name,
    }


def machine_template(ns: str, name: str, cluster: str, flavor: str) -> Json:
    spec = {"template": {"spec": {"flavor": flavor, "image": {"id": "img-1"}}}}
    return _obj(OPENSTACK_MACHINE_TEMPLATE, ns, name, _labels(cluster), spec)


def capi_cluster(ns: str, name: str) -> Json:
    spec = {
        "controlPlaneRef": {
            "apiVersion": CONTROL_PLANE.api_version,
            "kind": CONTROL_PLANE.kind,
            "name": f"{name}-control-plane",
        },
        "infrastructureRef": {
            "apiVersion": OPENSTACK_CLUSTER.api_version,
            "kind": OPENSTACK_CLUSTER.kind,
            "name": name,
        },
    }
    return _obj(CAPI_CLUSTER, ns, name, _labels(name), spec)


def openstack_cluster(ns: str, name: str) -> Json:
    identity = {"name": f"{name}-cloud-credentials", "cloudName": "openstack"}
    return _obj(OPENSTACK_CLUSTER, ns, name, _labels(name), {"identityRef": identity})


def control_plane(ns: str, name: str, replicas: int) -> Json:
    labels = _labels(name, component="control-plane")
    spec = {
        "version": VERSION,
        "replicas": replicas,
        "machineTemplate": {
            "metadata": {"labels": labels},
            "infrastructureRef": _template_ref(f"{name}-control-plane-aa"),
        },
    }
    return _obj(CONTROL_PLANE, ns, f"{name}-control-plane", labels, spec)


def machine_deployment(ns: str, name: str, group: str, replicas: int) -> Json:
    labels = _labels(name, component="worker", node_group=group)
    template_spec = {
        "clusterName": name,
        "version": VERSION,
        "infrastructureRef": _template_ref(f"{name}-{group}-aa"),
    }
    spec = {
        "clusterName": name,
        "replicas": replicas,
        "template": {"metadata": {"labels": labels}, "spec": template_spec},
    }
    return _obj(MACHINE_DEPLOYMENT, ns, f"{name}-{group}", labels, spec)


def addon(ns: str, name: str, component: str, kind: ResourceKind, target: str) -> Json:
    spec = {
        "clusterName": name,
        "bootstrap": True,
        "targetNamespace": target,
        "releaseName": component,
    }
    return _obj(kind, ns, f"{name}-{component}", _labels(name, component=component), spec)


def chart_objects(
    ns: str,
    name: str,
    *,
    workers: dict[str, int],
    addons: dict[str, tuple[ResourceKind, str]],
    cp_replicas: int = 1,
) -> list[tuple[ResourceKind, Json]]:
    """What the chart renders for release ``name`` (``docs/upstream.md`` §3), in a plausible
    install order."""
    out = [
        (
            OPENSTACK_MACHINE_TEMPLATE,
            machine_template(ns, f"{name}-control-plane-aa", name, "m1.cp"),
        ),
        (OPENSTACK_CLUSTER, openstack_cluster(ns, name)),
        (CONTROL_PLANE, control_plane(ns, name, cp_replicas)),
        (CAPI_CLUSTER, capi_cluster(ns, name)),
    ]
    for group, replicas in workers.items():
        template = machine_template(ns, f"{name}-{group}-aa", name, f"m1.{group}")
        out.append((OPENSTACK_MACHINE_TEMPLATE, template))
        out.append((MACHINE_DEPLOYMENT, machine_deployment(ns, name, group, replicas)))
    for component, (kind, target) in addons.items():
        out.append((kind, addon(ns, name, component, kind, target)))
    return out


# --- fixtures and probes -------------------------------------------------------------------


@pytest.fixture
async def start(kube: KubeClient, namespace: str, stack: LocalStack) -> AsyncIterator[Start]:
    """Start the stand-in (once per test) with the given knobs; cleaned up afterwards."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def go(**knobs: Any) -> None:
        path = str(stack.endpoints.kubeconfig)
        settings = CapiKnobs(step_delay=0.01, kubeconfig_path=path, **knobs)
        tasks.append(
            asyncio.create_task(
                run_all(controllers(kube, namespace=namespace, knobs=settings), stop)
            )
        )

    yield go
    if tasks:  # let the stand-in release its finalizers before the namespace goes
        for kind in (CAPI_CLUSTER, HELM_RELEASE, MANIFESTS, MACHINE_DEPLOYMENT):
            for item in await names(kube, kind, namespace):
                with contextlib.suppress(KubeNotFound):
                    await kube.delete(kind, namespace, item)
        with contextlib.suppress(AssertionError):
            await eventually(lambda: names(kube, MACHINE, namespace), lambda n: not n, timeout=20)
    stop.set()
    await asyncio.gather(*tasks)


@pytest.fixture
async def phases(kube: KubeClient, namespace: str) -> AsyncIterator[Record]:
    """``await phases(kind)``: every phase each object of ``kind`` shows from then on."""
    tasks: list[asyncio.Task[None]] = []

    async def watch(kind: ResourceKind) -> dict[str, list[str]]:
        seen: dict[str, list[str]] = {}
        _, version = await kube.list(kind, namespace=namespace)

        async def record() -> None:
            async for event in kube.watch(kind, resource_version=version, namespace=namespace):
                phase = (event.object.get("status") or {}).get("phase")
                trail = seen.setdefault(event.object["metadata"]["name"], [])
                if phase and trail[-1:] != [phase]:
                    trail.append(phase)

        tasks.append(asyncio.create_task(record()))
        return seen

    yield watch
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def names(kube: KubeClient, kind: ResourceKind, ns: str) -> list[str]:
    items, _ = await kube.list(kind, namespace=ns)
    return sorted(i["metadata"]["name"] for i in items)


async def items(kube: KubeClient, kind: ResourceKind, ns: str) -> list[Json]:
    found, _ = await kube.list(kind, namespace=ns)
    return found


async def create_all(kube: KubeClient, objects: list[tuple[ResourceKind, Json]]) -> None:
    for kind, obj in objects:
        await kube.create(kind, obj)


def cond(obj: Json, kind: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"])
    return None


def running(machines: list[Json]) -> int:
    return sum((m.get("status") or {}).get("phase") == "Running" for m in machines)


def deployed(addons: list[Json], revision: int = 1) -> bool:
    return bool(addons) and all(
        (a.get("status") or {}).get("phase") == "Deployed"
        and a["status"].get("revision") == revision
        for a in addons
    )


async def bring_up(kube: KubeClient, ns: str, name: str = "r", **kw: Any) -> None:
    """Create R and wait until it is fully provisioned (``docs/upstream.md`` §5)."""
    workers = kw.setdefault("workers", {"md-0": 2})
    kw.setdefault(
        "addons",
        {
            "cni-calico": (HELM_RELEASE, "tigera-operator"),
            "metrics-server": (HELM_RELEASE, "kube-system"),
        },
    )
    await create_all(kube, chart_objects(ns, name, **kw))
    total = kw.get("cp_replicas", 1) + sum(workers.values())
    await eventually(
        lambda: items(kube, MACHINE, ns),
        lambda ms: running(ms) == total == len(ms),
        what="all machines running",
        timeout=60,
    )
    await eventually(
        lambda: kube.get(CONTROL_PLANE, ns, f"{name}-control-plane"),
        lambda k: cond(k, "Ready") == "True",
        what="control plane ready",
    )


# --- tests ---------------------------------------------------------------------------------


async def test_cluster_comes_up_as_the_capi_operator_expects(kube, namespace, start, stack):
    await start()
    monitoring = f"mon-{namespace}"
    await bring_up(
        kube,
        namespace,
        addons={
            "cni-calico": (HELM_RELEASE, "tigera-operator"),
            "kube-prometheus-stack-client": (MANIFESTS, monitoring),
        },
    )

    cluster = await eventually(
        lambda: kube.get(CAPI_CLUSTER, namespace, "r"),
        lambda c: cond(c, "Ready") == "True",
        what="cluster Ready",
    )
    assert cluster["status"]["phase"] == "Provisioned"
    assert cluster["status"]["infrastructureReady"] is True
    assert cond(cluster, "ControlPlaneInitialized") == "True"
    assert "cluster.cluster.x-k8s.io" in cluster["metadata"]["finalizers"]
    endpoint = cluster["spec"]["controlPlaneEndpoint"]
    assert endpoint["port"] == 6443
    infra = await kube.get(OPENSTACK_CLUSTER, namespace, "r")
    assert infra["spec"]["controlPlaneEndpoint"] == endpoint

    kcp = await kube.get(CONTROL_PLANE, namespace, "r-control-plane")
    assert cond(kcp, "ControlPlaneComponentsHealthy") == "True"
    expected = {
        "version": VERSION,
        "replicas": 1,
        "readyReplicas": 1,
        "initialized": True,
        "ready": True,
    }
    assert {k: kcp["status"].get(k) for k in expected} == expected

    machines = await items(kube, MACHINE, namespace)
    flavors = {}
    for m in machines:
        labels = m["metadata"]["labels"]
        assert labels["cluster.x-k8s.io/cluster-name"] == "r"
        assert labels[f"{P}/cluster"] == "r"
        assert m["status"]["addresses"][0]["type"] == "InternalIP"
        assert cond(m, "NodeHealthy") == "True"
        assert m["metadata"]["ownerReferences"][0]["controller"] is True
        osm = await kube.get(OPENSTACK_MACHINE, namespace, m["spec"]["infrastructureRef"]["name"])
        flavors[m["metadata"]["name"]] = osm["spec"]["flavor"]
        if labels[f"{P}/component"] == "worker":
            assert labels[f"{P}/node-group"] == "md-0"
            assert labels["cluster.x-k8s.io/deployment-name"] == "r-md-0"
        else:
            assert m["metadata"]["name"].startswith("r-control-plane-")
            assert "cluster.x-k8s.io/control-plane" in labels
    assert sorted(flavors.values()) == ["m1.cp", "m1.md-0", "m1.md-0"]

    secret = await kube.get(SECRET, namespace, "r-kubeconfig")
    assert secret["type"] == "cluster.x-k8s.io/secret"
    assert secret["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] == "r"
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "KubeadmControlPlane"
    value = base64.b64decode(secret["data"]["value"]).decode()
    assert value == stack.endpoints.kubeconfig.read_text()

    addons = await eventually(lambda: _addons(kube, namespace), deployed, what="addons deployed")
    for addon in addons:
        labels = addon["metadata"]["labels"]
        assert labels["addons.stackhpc.com/cluster"] == "r"
        assert labels["addons.stackhpc.com/release-name"] == addon["spec"]["releaseName"]
        assert addon["metadata"]["ownerReferences"][0]["uid"] == cluster["metadata"]["uid"]
        assert "addons.stackhpc.com/finalizer" in addon["metadata"]["finalizers"]

    reservation = await kube.get(RESERVATION, monitoring, "kube-prometheus-stack-client")
    annotations = reservation["metadata"]["annotations"]
    assert annotations["meta.helm.sh/release-name"] == "kube-prometheus-stack-client"
    assert annotations["meta.helm.sh/release-namespace"] == monitoring
    assert annotations["azimuth.stackhpc.com/service-label"] == "Monitoring"

    # Uninstalling the monitoring addon (cluster alive) takes its Reservation along.
    await kube.delete(MANIFESTS, namespace, "r-kube-prometheus-stack-client")
    await eventually(lambda: names(kube, MANIFESTS, namespace), lambda n: not n, what="gone")
    assert not await names(kube, RESERVATION, monitoring)
    await kube.delete(NAMESPACE, None, monitoring)


async def _addons(kube: KubeClient, ns: str) -> list[Json]:
    return await items(kube, HELM_RELEASE, ns) + await items(kube, MANIFESTS, ns)


async def test_machine_deployment_scales_up_and_down(kube, namespace, start):
    await start()
    await bring_up(kube, namespace)

    async def workers() -> list[Json]:
        found = await items(kube, MACHINE, namespace)
        return [m for m in found if "cluster.x-k8s.io/deployment-name" in m["metadata"]["labels"]]

    await kube.patch_merge(MACHINE_DEPLOYMENT, namespace, "r-md-0", {"spec": {"replicas": 4}})
    await eventually(workers, lambda ms: running(ms) == 4 == len(ms), what="4 workers")
    await kube.patch_merge(MACHINE_DEPLOYMENT, namespace, "r-md-0", {"spec": {"replicas": 1}})
    left = await eventually(workers, lambda ms: len(ms) == 1, what="1 worker")
    assert running(left) == 1
    osms = await names(kube, OPENSTACK_MACHINE, namespace)
    assert len(osms) == 2  # each deleted Machine took its OpenStackMachine along
    md = await eventually(
        lambda: kube.get(MACHINE_DEPLOYMENT, namespace, "r-md-0"),
        lambda d: (d.get("status") or {}).get("readyReplicas") == 1,
        what="md status",
    )
    assert md["status"]["phase"] == "Running"


async def test_addon_spec_change_is_an_upgrade(kube, namespace, start, phases):
    await start()
    await bring_up(kube, namespace)
    await eventually(lambda: _addons(kube, namespace), deployed, what="addons deployed")
    releases = await phases(HELM_RELEASE)

    patch = {"spec": {"releaseTimeout": "10m"}}
    await kube.patch_merge(HELM_RELEASE, namespace, "r-metrics-server", patch)
    addon = await eventually(
        lambda: kube.get(HELM_RELEASE, namespace, "r-metrics-server"),
        lambda a: deployed([a], revision=2),
        what="revision 2",
    )
    assert releases["r-metrics-server"] == ["Deployed", "Upgrading", "Deployed"]
    other = await kube.get(HELM_RELEASE, namespace, "r-cni-calico")
    assert other["status"]["revision"] == 1
    assert addon["status"].get("failureMessage") is None

    await kube.delete(HELM_RELEASE, namespace, "r-cni-calico")
    await eventually(
        lambda: names(kube, HELM_RELEASE, namespace),
        lambda n: n == ["r-metrics-server"],
        what="addon uninstalled",
    )
    assert releases["r-cni-calico"] == ["Deployed", "Uninstalling"]


async def test_control_plane_upgrade_rolls_machines(kube, namespace, start):
    await start()
    await bring_up(kube, namespace, workers={})
    before = await names(kube, MACHINE, namespace)
    reasons: list[str] = []

    async def kcp() -> Json:
        found = await kube.get(CONTROL_PLANE, namespace, "r-control-plane")
        for c in found["status"]["conditions"]:
            if c["type"] == "Ready" and c.get("reason") and c["reason"] not in reasons[-1:]:
                reasons.append(c["reason"])
        return found

    await kube.patch_merge(
        CONTROL_PLANE, namespace, "r-control-plane", {"spec": {"version": "v1.32.0"}}
    )
    done = await eventually(
        kcp,
        lambda k: k["status"]["version"] == "v1.32.0" and cond(k, "Ready") == "True",
        interval=0.02,
        what="upgraded",
    )
    assert done["status"]["updatedReplicas"] == 1
    after = await items(kube, MACHINE, namespace)
    assert [m["spec"]["version"] for m in after] == ["v1.32.0"]
    assert after[0]["metadata"]["name"] not in before
    assert "RollingUpdateInProgress" in reasons


async def test_deleting_the_cluster_removes_everything(kube, namespace, start, phases):
    await start()
    await bring_up(kube, namespace)
    await eventually(lambda: _addons(kube, namespace), deployed, what="addons deployed")
    cluster_phases = await phases(CAPI_CLUSTER)
    machine_phases = await phases(MACHINE)
    addon_phases = await phases(HELM_RELEASE)

    # What `helm uninstall` does: the KCP and OpenStackCluster carry resource-policy keep.
    for kind in (CAPI_CLUSTER, HELM_RELEASE, MACHINE_DEPLOYMENT):
        for name in await names(kube, kind, namespace):
            await kube.delete(kind, namespace, name)

    for kind in (
        CAPI_CLUSTER,
        CONTROL_PLANE,
        OPENSTACK_CLUSTER,
        MACHINE,
        OPENSTACK_MACHINE,
        MACHINE_DEPLOYMENT,
        HELM_RELEASE,
    ):
        await eventually(
            lambda k=kind: names(kube, k, namespace),
            lambda n: not n,
            what=f"{kind.plural} gone",
            timeout=40,
        )
    secrets = await names(kube, SECRET, namespace)
    assert "r-kubeconfig" not in secrets
    assert cluster_phases["r"] == ["Provisioned", "Deleting"]
    assert len(machine_phases) == 3
    assert all(trail == ["Running", "Deleting"] for trail in machine_phases.values())
    # The Cluster was going: the addons were not uninstalled one by one.
    assert all("Uninstalling" not in trail for trail in addon_phases.values())


async def test_knobs_fail_addons_unhealthy_workers_and_stuck_clusters(kube, namespace, start):
    await start(
        fail_addons={"metrics-server"}, unhealthy_machines="1", stuck={f"{namespace}/stuck"}
    )
    await create_all(kube, chart_objects(namespace, "stuck", workers={"md-0": 1}, addons={}))
    await bring_up(kube, namespace)

    failed = await eventually(
        lambda: kube.get(HELM_RELEASE, namespace, "r-metrics-server"),
        lambda a: (a.get("status") or {}).get("phase") == "Failed",
        what="failed addon",
    )
    assert failed["status"]["failureMessage"]
    ok = await kube.get(HELM_RELEASE, namespace, "r-cni-calico")
    assert ok["status"]["phase"] == "Deployed"

    workers = [
        m
        for m in await items(kube, MACHINE, namespace)
        if m["metadata"]["labels"].get(f"{P}/component") == "worker"
    ]
    assert sorted(cond(m, "NodeHealthy") or "" for m in workers) == ["False", "True"]

    stuck = await kube.get(CAPI_CLUSTER, namespace, "stuck")
    assert stuck["status"]["phase"] == "Provisioning"
    assert not [
        m for m in await items(kube, MACHINE, namespace) if m["spec"]["clusterName"] == "stuck"
    ]
