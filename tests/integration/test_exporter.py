"""The exporter with the real watcher, API server and JetStream, both run as processes.

Objects are created in Kubernetes, the watcher publishes them, the exporter follows the
events: its scrape shows upstream's series. A restarted exporter shows the same series even for
an object whose events have left the stream (it lists each kind once at start), and deletions
after that list remove series.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shared import subjects
from shared.bus import Bus
from shared.errors import BusUnavailable, KubeNotFound
from shared.kube import KubeClient
from shared.messages import ObjectRef, ResourceChanged
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, HELM_RELEASE
from shared.subjects import name_token
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack
from tests.integration.support import ServiceProcess, eventually
from tests.integration.test_metrics_endpoint import OPENMETRICS, Samples, free_port, metrics_env
from tests.integration.test_metrics_endpoint import scrape as scrape_samples

pytestmark = pytest.mark.integration

KINDS = ["clustertemplate", "apptemplate", "cluster", "helmrelease"]
WATCHED = {"CAPIBUS_WATCHER__KINDS": json.dumps(KINDS)}
Series = set[tuple[str, tuple[tuple[str, str], ...], float]]


def template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": CLUSTER_TEMPLATE.api_version,
        "kind": CLUSTER_TEMPLATE.kind,
        "metadata": {"name": name},
        "spec": {
            "label": name,
            "description": "exporter test template",
            "deprecated": True,
            "values": {"kubernetesVersion": "1.31.2", "machineImageId": "image"},
        },
    }


def app(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": HELM_RELEASE.api_version,
        "kind": HELM_RELEASE.kind,
        "metadata": {
            "name": "notebook",
            "namespace": namespace,
            "labels": {"azimuth.stackhpc.com/app-template": "jupyterhub"},
        },
        "spec": {
            "clusterName": "demo",
            "targetNamespace": "notebook",
            "releaseName": "notebook",
            "chart": {"repo": "https://charts.example", "name": "jupyterhub", "version": "4.0.1"},
        },
    }


CLUSTER_STATUS = {
    "kubernetesVersion": "1.31.2",
    "phase": "Ready",
    "networkingPhase": "Provisioned",
    "controlPlanePhase": "Ready",
    "nodeCount": 1,
    "nodes": {"demo-cp-1": {"role": "control-plane", "phase": "Ready", "kubeletVersion": "1.31"}},
    "addonCount": 1,
    "addons": {"kubernetes-dashboard": {"phase": "Deployed"}},
}


def ours(samples: Samples, namespace: str, template_name: str) -> Series:
    """The azimuth_kube_ series of this test's objects, as a comparable set."""
    mine = {namespace, template_name}
    return {
        (name, tuple(sorted(labels.items())), number)
        for name, labels, number in samples
        if name.startswith("azimuth_kube_") and mine & set(labels.values())
    }


def names(series: Series) -> set[str]:
    return {name for name, _, _ in series}


def has(series: Series, name: str, **labels: str) -> bool:
    return any(n == name and labels.items() <= dict(ls).items() for n, ls, _ in series)


async def create_objects(kube: KubeClient, namespace: str, template_name: str) -> None:
    await kube.create(CLUSTER_TEMPLATE, template(template_name))
    await kube.create(CLUSTER, cluster_manifest(namespace, "demo", templateName=template_name))
    await kube.patch_merge(
        CLUSTER, namespace, "demo", {"status": CLUSTER_STATUS}, subresource="status"
    )
    await kube.create(HELM_RELEASE, app(namespace))
    await kube.patch_merge(
        HELM_RELEASE, namespace, "notebook", {"status": {"phase": "Deployed"}}, subresource="status"
    )


def complete(series: Series) -> bool:
    return (
        has(series, "azimuth_kube_cluster_phase", phase="Ready")
        and has(series, "azimuth_kube_app_phase", phase="Deployed")
        and has(series, "azimuth_kube_clustertemplate_deprecated")
    )


async def test_exporter_follows_events_survives_restart_and_forgets_deleted(
    kube: KubeClient, bus: Bus, namespace: str, service: Callable[..., ServiceProcess]
) -> None:
    template_name = f"exporter-{uuid.uuid4().hex[:6]}"
    service("watcher", **WATCHED)
    port = free_port()
    exporter = service("exporter", **metrics_env(port))
    try:
        await create_objects(kube, namespace, template_name)

        async def probe(at: int = port) -> Series:
            return ours(await scrape_samples(at, OPENMETRICS), namespace, template_name)

        before = await eventually(probe, complete, timeout=60, what="series of every object")
        cl = {"cluster_namespace": namespace, "cluster_name": "demo"}
        assert has(before, "azimuth_kube_cluster_template", **cl, template=template_name)
        assert ("azimuth_kube_cluster_node_count", tuple(sorted(cl.items())), 1.0) in before
        assert has(
            before,
            "azimuth_kube_cluster_node_phase",
            **cl,
            node="demo-cp-1",
            role="control-plane",
            group="",
            phase="Ready",
        )
        dashboard = {"addon": "kubernetes-dashboard", "phase": "Deployed"}
        assert has(before, "azimuth_kube_cluster_addon_phase", **cl, **dashboard)
        assert has(
            before,
            "azimuth_kube_app_info",
            app_namespace=namespace,
            app_name="notebook",
            app_template="jupyterhub",
            target_cluster="demo",
            target_namespace="notebook",
            release_name="notebook",
            chart_repo="https://charts.example",
            chart_name="jupyterhub",
            chart_version="4.0.1",
        )
        assert has(
            before,
            "azimuth_kube_clustertemplate_kube_version",
            template_name=template_name,
            kube_version="1.31.2",
        )
        assert (
            "azimuth_kube_clustertemplate_deprecated",
            (("template_name", template_name),),
            1.0,
        ) in before
        assert len(names(before)) == 14  # 2 template + 10 cluster + 2 app families

        # The template has been quiet for longer than the stream keeps events: none is left.
        exporter.stop()
        quiet = f"capibus.evt.{CLUSTER_TEMPLATE.token}.*.*.{name_token(template_name)}"
        await bus.js.purge_stream(subjects.EVENTS.name, subject=quiet)
        port = free_port()
        service("exporter", **metrics_env(port))
        after = await eventually(
            lambda: probe(port), lambda s: s == before, timeout=60, what="the same series"
        )
        assert after == before
        async with httpx.AsyncClient(timeout=5) as client:
            ready = await client.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200
        own = await scrape_samples(port, OPENMETRICS)
        assert ("capibus_exporter_caught_up", {}, 1.0) in own

        await kube.delete(CLUSTER, namespace, "demo")
        await kube.delete(HELM_RELEASE, namespace, "notebook")
        left = await eventually(
            lambda: probe(port),
            lambda s: not names(s) & {"azimuth_kube_cluster_phase", "azimuth_kube_app_phase"},
            timeout=60,
            what="deleted objects' series gone",
        )
        assert names(left) == {
            "azimuth_kube_clustertemplate_kube_version",
            "azimuth_kube_clustertemplate_deprecated",
        }
    finally:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(CLUSTER_TEMPLATE, None, template_name)


# --- Bus.follow, the exporter's read side, across a NATS restart ------------------------------


def change(namespace: str, name: str, version: int) -> tuple[str, ResourceChanged]:
    obj = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}
    message = ResourceChanged(
        source="tests",
        correlation_id=f"cluster:{namespace}/{name}",
        event="MODIFIED",
        ref=ObjectRef(
            api_version=CLUSTER.api_version, kind=CLUSTER.kind, namespace=namespace, name=name
        ),
        resource_version=str(version),
        object=obj,
    )
    return subjects.resource_event(CLUSTER.token, 0, namespace, name), message


async def test_follow_starts_from_the_newest_per_subject_and_survives_a_nats_restart(
    stack: LocalStack, bus: Bus, namespace: str
) -> None:
    for name, version in (("a", 1), ("a", 2), ("b", 1)):
        await bus.publish(*change(namespace, name, version))
    reader = await Bus.connect(stack.endpoints.nats_url, name="tests-follow")
    seen: list[tuple[str, str]] = []
    caught_up = asyncio.Event()

    async def follow() -> None:
        async for message in reader.follow(
            subjects.EVENTS.name,
            [f"capibus.evt.cluster.*.{namespace}.*"],
            ResourceChanged,
            caught_up=caught_up.set,
            idle_seconds=0.5,
        ):
            seen.append((message.ref.name, message.resource_version))

    task = asyncio.create_task(follow())
    try:
        await asyncio.wait_for(caught_up.wait(), 30)
        assert seen == [("a", "2"), ("b", "1")]  # only the newest of each object
        stack.restart("nats")
        for _ in range(100):
            try:
                await bus.publish(*change(namespace, "b", 2))
                break
            except BusUnavailable:
                await asyncio.sleep(0.2)
        await bus.publish(*change(namespace, "c", 1))

        async def observed() -> list[tuple[str, str]]:
            return list(seen)

        await eventually(observed, lambda s: len(s) >= 4, timeout=60, what="events after restart")
        assert seen == [("a", "2"), ("b", "1"), ("b", "2"), ("c", "1")]  # in order, none twice
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await reader.close()
