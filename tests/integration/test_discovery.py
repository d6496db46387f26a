"""Zenith service discovery against the real API server, NATS and Redis, as processes.

The test API server plays the tenant cluster too: the ``<cluster>-kubeconfig`` Secret holds
the stack's own kubeconfig, as the CAPI stand-in writes it. The test plays the addon provider
(a chart addon and an app HelmRelease, labelled as the provider and the chart label them) and
the Zenith operator (Reservations in namespaces of their own, Ready by a status write).
Watcher, writer and two discovery replicas run as real processes. The second test spreads
several Clusters over both replicas' partitions and SIGKILLs one replica: every watch it held
must move to the survivor.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shared import subjects
from shared.coordination import placement
from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.resources import CLUSTER, HELM_RELEASE, NAMESPACE, RESERVATION, SECRET
from shared.resp import Redis
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack
from tests.integration.support import ServiceProcess, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
NAME = "demo"
PARTITIONS = 16
SERVICES = "azimuth.stackhpc.com/services"
FAST = {
    "CAPIBUS_AZIMUTH__ZENITH_ENABLED": "true",
    "CAPIBUS_DISCOVERY__QUIET_SECONDS": "0.2",
    "CAPIBUS_DISCOVERY__RETRY_MAX_SECONDS": "2",
}


@pytest.fixture
async def namespaces(kube: KubeClient, namespace: str) -> AsyncIterator[tuple[str, str, str]]:
    """The Cluster's namespace, then two "in the tenant cluster" (the API server is shared)."""
    names = (f"{namespace}-mon", f"{namespace}-apps")
    for name in names:
        await kube.create(NAMESPACE, {"metadata": {"name": name}})
    yield (namespace, *names)
    for name in names:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NAMESPACE, None, name)


def addon_labels(
    release_namespace: str, release_name: str, *, chart: bool, cluster: str = NAME
) -> dict[str, str]:
    labels = {
        "addons.stackhpc.com/cluster": cluster,
        "addons.stackhpc.com/release-namespace": release_namespace,
        "addons.stackhpc.com/release-name": release_name,
    }
    if chart:
        labels |= {
            "capi.stackhpc.com/cluster": cluster,
            "capi.stackhpc.com/component": "monitoring",
        }
    else:
        labels["azimuth.stackhpc.com/app-template"] = "jupyterhub"
    return labels


async def helm_release(kube: KubeClient, ns: str, name: str, labels: dict[str, str]) -> None:
    body = {
        "apiVersion": HELM_RELEASE.api_version,
        "kind": HELM_RELEASE.kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "clusterName": labels["addons.stackhpc.com/cluster"],
            "releaseName": labels["addons.stackhpc.com/release-name"],
        },
    }
    await kube.create(HELM_RELEASE, body)


async def reservation(
    kube: KubeClient, ns: str, name: str, release: str, *, phase: str = "Ready"
) -> None:
    body = {
        "apiVersion": RESERVATION.api_version,
        "kind": RESERVATION.kind,
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {
                "meta.helm.sh/release-namespace": ns,
                "meta.helm.sh/release-name": release,
                "azimuth.stackhpc.com/service-icon-url": "https://icons.test/icon.png",
            },
        },
        "spec": {"credentialSecretName": f"{name}-credential"},
    }
    await kube.create(RESERVATION, body)
    await set_phase(kube, ns, name, phase)


async def set_phase(kube: KubeClient, ns: str, name: str, phase: str) -> None:
    status = {"phase": phase, "subdomain": f"{name}-sd", "fqdn": f"{name}-sd.apps.test"}
    await kube.patch_merge(RESERVATION, ns, name, {"status": status}, subresource="status")


@pytest.fixture
def tenant_kubeconfig(stack: LocalStack) -> str:
    """The stack's own kubeconfig: the test API server plays the tenant cluster."""
    return Path(stack.endpoints.kubeconfig).read_text()


async def kubeconfig_secret(kube: KubeClient, ns: str, value: str, cluster: str = NAME) -> None:
    await kube.create(
        SECRET,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "cluster.x-k8s.io/secret",
            "metadata": {
                "name": f"{cluster}-kubeconfig",
                "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster},
            },
            "data": {"value": base64.b64encode(value.encode()).decode()},
        },
    )


async def services_of(kube: KubeClient, ns: str, name: str = NAME) -> Json:
    cluster = await kube.get(CLUSTER, ns, name)
    return dict((cluster.get("status") or {}).get("services") or {})


async def announced(kube: KubeClient, ns: str, name: str) -> Json:
    addon = await kube.get(HELM_RELEASE, ns, name)
    notes = addon["metadata"].get("annotations") or {}
    return dict(json.loads(notes.get(SERVICES, "{}")))


async def partition_owner(redis_client: Redis, ns: str, name: str = NAME) -> str:
    return await owner_of(redis_client, subjects.partition_of(f"{ns}/{name}", PARTITIONS))


async def owner_of(redis_client: Redis, partition: int) -> str:
    value = await redis_client.execute("GET", f"capibus:discovery:partition:{partition}")
    return value.decode().rsplit(":", 1)[0] if isinstance(value, bytes) else ""


def start_services(
    service: Callable[..., ServiceProcess], namespace: str, replicas: tuple[str, ...]
) -> dict[str, ServiceProcess]:
    """Watcher, writer and the discovery ``replicas``, by replica name."""
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    return {r: service("discovery", r, **FAST) for r in replicas}


async def test_reservations_become_services_and_follow_a_replica_crash(
    kube, redis_client, tenant_kubeconfig, namespaces, service
) -> None:
    namespace, mon, apps = namespaces
    replicas = start_services(service, namespace, ("d1", "d2"))

    await kube.create(CLUSTER, cluster_manifest(namespace, NAME))
    await helm_release(kube, namespace, f"{NAME}-monitoring", addon_labels(mon, "kps", chart=True))
    await helm_release(kube, namespace, "jupyter", addon_labels(apps, "jupyter", chart=False))
    await reservation(kube, mon, "kps-client", "kps")
    await reservation(kube, apps, "hub", "jupyter")
    await reservation(kube, mon, "not-yet", "kps", phase="Pending")
    await kubeconfig_secret(kube, namespace, tenant_kubeconfig)

    kps, hub = f"{mon}-kps-client", f"{apps}-hub"
    services = await eventually(
        lambda: services_of(kube, namespace), lambda s: kps in s, timeout=60, what="kps service"
    )
    assert services == {
        kps: {
            "subdomain": "kps-client-sd",
            "fqdn": "kps-client-sd.apps.test",
            "label": "Kps Client",
            "iconUrl": "https://icons.test/icon.png",
        }
    }
    assert set(await announced(kube, namespace, f"{NAME}-monitoring")) == {kps}
    app = await eventually(
        lambda: announced(kube, namespace, "jupyter"), lambda a: hub in a, what="app service"
    )
    assert app[hub]["label"] == "Hub"

    # Leaving Ready removes the entry (upstream kept it), in status and annotation alike.
    await set_phase(kube, mon, "kps-client", "Pending")
    await eventually(
        lambda: services_of(kube, namespace), lambda s: s == {}, what="kps entry to go"
    )
    assert await announced(kube, namespace, f"{NAME}-monitoring") == {}
    await set_phase(kube, mon, "kps-client", "Ready")
    await eventually(lambda: services_of(kube, namespace), lambda s: kps in s, what="kps back")
    await kube.delete(RESERVATION, apps, "hub")
    await eventually(
        lambda: announced(kube, namespace, "jupyter"), lambda a: a == {}, what="hub to go"
    )

    # The replica watching this Cluster dies; the other one takes its partition and watch.
    owner = await partition_owner(redis_client, namespace)
    assert owner in replicas, owner
    replicas[owner].kill()
    await reservation(kube, mon, "grafana", "kps")
    services = await eventually(
        lambda: services_of(kube, namespace),
        lambda s: f"{mon}-grafana" in s,
        timeout=60,
        what="the survivor to report a new service",
    )
    assert set(services) == {kps, f"{mon}-grafana"}

    await kube.delete(RESERVATION, mon, "kps-client")
    await eventually(
        lambda: services_of(kube, namespace),
        lambda s: set(s) == {f"{mon}-grafana"},
        what="the deleted reservation's service to go",
    )


def watching(log: str, namespace: str, name: str) -> int:
    """How often a replica's log says it started watching ``namespace/name``."""
    return log.count(f"{namespace}/{name}: watching tenant reservations")


def spread(namespace: str, owners: dict[int, str], per_replica: int) -> dict[str, str]:
    """Cluster names (each in a partition of its own) with their owner, ``per_replica`` each."""
    chosen: dict[str, str] = {}
    taken: set[int] = set()
    for i in range(1000):
        name = f"c{i}"
        partition = subjects.partition_of(f"{namespace}/{name}", PARTITIONS)
        owner = owners[partition]
        if partition not in taken and list(chosen.values()).count(owner) < per_replica:
            chosen[name] = owner
            taken.add(partition)
    assert len(chosen) == per_replica * len(set(owners.values())), chosen
    return chosen


async def test_watches_are_spread_over_replicas_and_all_move_to_the_survivor_of_a_crash(
    kube, redis_client, tenant_kubeconfig, namespaces, service
) -> None:
    namespace, mon, _ = namespaces
    suffix = uuid.uuid4().hex[:4]  # other tests' crashed replicas may linger as members
    replicas = start_services(service, namespace, (f"a-{suffix}", f"b-{suffix}"))

    # Settled: every partition held by the replica the placement gives it to.
    wanted = placement(PARTITIONS, replicas)
    owners = await eventually(
        lambda: asyncio.gather(*(owner_of(redis_client, p) for p in range(PARTITIONS))),
        lambda found: dict(enumerate(found)) == wanted,
        timeout=60,
        what="both replicas to hold their partitions",
    )
    clusters = spread(namespace, dict(enumerate(owners)), per_replica=3)

    for name in clusters:
        await kube.create(CLUSTER, cluster_manifest(namespace, name))
        labels = addon_labels(mon, f"kps-{name}", chart=True, cluster=name)
        await helm_release(kube, namespace, f"{name}-monitoring", labels)
        await reservation(kube, mon, f"{name}-ui", f"kps-{name}")
        await kubeconfig_secret(kube, namespace, tenant_kubeconfig, name)

    async def all_services() -> dict[str, set[str]]:
        found = [await services_of(kube, namespace, name) for name in clusters]
        return {name: set(s) for name, s in zip(clusters, found, strict=True)}

    await eventually(
        all_services,
        lambda found: all(found[c] == {f"{mon}-{c}-ui"} for c in clusters),
        timeout=60,
        what="every Cluster's service",
    )
    for name, owner in clusters.items():
        for replica, proc in replicas.items():
            expected = 1 if replica == owner else 0
            assert watching(proc.log(), namespace, name) == expected, (name, replica)

    victim, survivor = replicas.values()
    orphans = [name for name, owner in clusters.items() if owner == victim.replica]
    victim.kill()
    for name in clusters:
        await reservation(kube, mon, f"{name}-grafana", f"kps-{name}")
    await eventually(
        all_services,
        lambda found: all(found[c] == {f"{mon}-{c}-ui", f"{mon}-{c}-grafana"} for c in clusters),
        timeout=60,
        what="every Cluster's new service, the crashed replica's through the survivor",
    )
    log = survivor.log()
    assert all(watching(log, namespace, name) == 1 for name in orphans), log[-3000:]
