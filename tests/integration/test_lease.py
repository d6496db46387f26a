"""The lease service against the real API server, NATS and Redis, run as real processes.

The watcher, the writer and the lease service run as they do in production; the test plays
the Azimuth portal (it creates the Cluster and its owner-referenced Lease), the schedule
operator (it writes the Lease status) and Cluster API (it owns the CAPI Cluster's deletion).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from shared import subjects
from shared.bus import Bus
from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.messages import PrerequisiteChanged, ResourceChanged
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE
from testenv.examples import cluster_manifest
from tests.integration.support import ServiceProcess, dead_letters, eventually, read_stream

pytestmark = pytest.mark.integration

Json = dict[str, Any]
FINALIZER = "azimuth.stackhpc.com"
JSON_PATCH = "application/json-patch+json"
#: generous: other stacks may share the machine, and each wait may include a service start
WAIT = 60


def start_services(service: Callable[..., ServiceProcess], namespace: str) -> ServiceProcess:
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    return service("lease")


async def portal_creates(kube: KubeClient, namespace: str, name: str) -> Json:
    """A Cluster with ``kube-<name>`` as its Lease, and the Lease owned by it, as Azimuth does."""
    cluster = await kube.create(
        CLUSTER, cluster_manifest(namespace, name, leaseName=f"kube-{name}")
    )
    owner = {
        "apiVersion": CLUSTER.api_version,
        "kind": "Cluster",
        "name": name,
        "uid": cluster["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }
    await kube.create(
        LEASE,
        {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {
                "name": f"kube-{name}",
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "azimuth"},
                "ownerReferences": [owner],
            },
            "spec": {
                "cloudCredentialsSecretName": f"{name}-cloud-credentials",
                "endsAt": None,
                "resources": {"machines": [{"sizeId": "flavor-1", "count": 2}]},
            },
        },
    )
    return cluster


async def schedule_operator_says(
    kube: KubeClient, namespace: str, lease: str, **status: Any
) -> None:
    await kube.patch_merge(LEASE, namespace, lease, {"status": status}, subresource="status")


async def get_or_none(kube: KubeClient, kind: Any, namespace: str, name: str) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


def held(lease: Json | None, cluster_uid: str) -> bool:
    if lease is None:
        return False
    meta = lease["metadata"]
    owners = [o for o in meta.get("ownerReferences") or [] if o["uid"] == cluster_uid]
    return (meta.get("finalizers") or []).count(FINALIZER) == 1 and len(owners) == 1


def condition(cluster: Json, type_: str = "LeaseReady") -> Json:
    found = [c for c in (cluster.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return found[0] if found else {}


async def prerequisites(bus: Bus, namespace: str, name: str) -> list[PrerequisiteChanged]:
    subject = f"capibus.lifecycle.prep.lease.*.{namespace}.{name}"
    found = await read_stream(bus, subjects.LIFECYCLE.name, subject)
    return [m for _, m in found if isinstance(m, PrerequisiteChanged)]


def last(messages: list[PrerequisiteChanged]) -> PrerequisiteChanged | None:
    return messages[-1] if messages else None


def facts(messages: list[PrerequisiteChanged]) -> list[tuple[Any, ...]]:
    return [
        (m.ref.uid, m.generation, m.ready, m.reason, m.detail, json.dumps(m.outputs), m.released)
        for m in messages
    ]


async def no_dead_letters(bus: Bus, namespace: str) -> None:
    for kind in ("cluster", "lease", "capicluster"):
        assert await dead_letters(bus, f"capibus.evt.{kind}.*.{namespace}.*") == []


async def test_lease_is_held_and_its_phase_reaches_the_cluster(
    kube, bus, namespace, service
) -> None:
    start_services(service, namespace)
    cluster = await portal_creates(kube, namespace, "alpha")
    uid = cluster["metadata"]["uid"]
    lease = await eventually(
        lambda: get_or_none(kube, LEASE, namespace, "kube-alpha"),
        lambda lease: held(lease, uid),
        what="the lease held with our finalizer and ownerReference",
        timeout=WAIT,
    )
    assert lease["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True

    sizes = {"small": "reservation-small"}
    await schedule_operator_says(kube, namespace, "kube-alpha", phase="Active", sizeNameMap=sizes)
    ready = await eventually(
        lambda: prerequisites(bus, namespace, "alpha"),
        lambda found: bool(found) and found[-1].ready,
        what="the lease prerequisite ready",
        timeout=WAIT,
    )
    assert ready[-1].outputs == {"sizeNameMap": sizes}
    assert (ready[-1].reason, ready[-1].ref.uid) == ("Active", uid)
    assert ready[-1].generation == cluster["metadata"]["generation"]
    shown = await eventually(
        lambda: kube.get(CLUSTER, namespace, "alpha"),
        lambda c: (
            condition(c).get("status") == "True" and c["status"].get("leasePhase") == "Active"
        ),
        what="LeaseReady True and leasePhase Active on the Cluster",
        timeout=WAIT,
    )
    assert condition(shown)["reason"] == "Active"

    await schedule_operator_says(
        kube, namespace, "kube-alpha", phase="Error", errorMessage="Blazar: no hosts left"
    )
    failed = await eventually(
        lambda: kube.get(CLUSTER, namespace, "alpha"),
        lambda c: condition(c).get("reason") == "LeaseError",
        what="LeaseError on the Cluster",
        timeout=WAIT,
    )
    assert condition(failed)["message"] == "Blazar: no hosts left"
    assert failed["status"]["leasePhase"] == "Error"
    error = last(await prerequisites(bus, namespace, "alpha"))
    assert error is not None
    assert (error.ready, error.reason, error.detail) == (
        False,
        "LeaseError",
        "Blazar: no hosts left",
    )
    await no_dead_letters(bus, namespace)


async def test_lease_is_released_only_after_the_capi_cluster_is_gone(
    kube, bus, namespace, service
) -> None:
    start_services(service, namespace)
    cluster = await portal_creates(kube, namespace, "beta")
    uid = cluster["metadata"]["uid"]
    await schedule_operator_says(kube, namespace, "kube-beta", phase="Active")
    await eventually(
        lambda: get_or_none(kube, LEASE, namespace, "kube-beta"),
        lambda lease: held(lease, uid),
        what="the lease held",
        timeout=WAIT,
    )
    capi = {
        "apiVersion": CAPI_CLUSTER.api_version,
        "kind": CAPI_CLUSTER.kind,
        "metadata": {"name": "beta", "namespace": namespace, "finalizers": ["cluster.x-k8s.io"]},
        "spec": {},
    }
    await kube.create(CAPI_CLUSTER, capi)

    await kube.delete(CLUSTER, namespace, "beta")
    await kube.delete(CAPI_CLUSTER, namespace, "beta")  # held by Cluster API's finalizer

    async def cluster_deletion_seen() -> list[Any]:
        found = await read_stream(
            bus, subjects.EVENTS.name, f"capibus.evt.cluster.*.{namespace}.beta"
        )
        return [m for _, m in found if isinstance(m, ResourceChanged) and m.event == "DELETED"]

    await eventually(
        cluster_deletion_seen, bool, what="the Cluster's deletion on the bus", timeout=WAIT
    )
    await asyncio.sleep(3)  # time enough to release wrongly, if it would
    lease = await kube.get(LEASE, namespace, "kube-beta")
    assert FINALIZER in lease["metadata"]["finalizers"]
    assert not any(p.released for p in await prerequisites(bus, namespace, "beta"))

    await kube.patch_merge(CAPI_CLUSTER, namespace, "beta", {"metadata": {"finalizers": None}})
    await eventually(
        lambda: get_or_none(kube, LEASE, namespace, "kube-beta"),
        lambda lease: lease is None or FINALIZER not in (lease["metadata"].get("finalizers") or []),
        what="the lease finalizer removed",
        timeout=WAIT,
    )
    released = await eventually(
        lambda: prerequisites(bus, namespace, "beta"),
        lambda found: bool(found) and found[-1].released,
        what="the released prerequisite",
        timeout=WAIT,
    )
    assert (released[-1].ready, released[-1].reason, released[-1].ref.uid) == (
        True,
        "Released",
        uid,
    )
    assert sum(p.released for p in released) == 1
    await no_dead_letters(bus, namespace)


async def test_a_killed_service_converges_on_restart_and_re_adopts_a_restored_lease(
    kube, bus, namespace, service
) -> None:
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    names = [f"c{i}" for i in range(6)]
    uids = {}
    for name in names:
        uids[name] = (await portal_creates(kube, namespace, name))["metadata"]["uid"]
        await schedule_operator_says(
            kube, namespace, f"kube-{name}", phase="Active", sizeNameMap={"small": name}
        )

    async def leases() -> dict[str, Json | None]:
        return {n: await get_or_none(kube, LEASE, namespace, f"kube-{n}") for n in names}

    first = service("lease")
    await eventually(
        leases,
        lambda found: any(held(found[n], uids[n]) for n in names),
        what="first adoption",
        timeout=WAIT,
    )
    first.kill()  # mid-flow: some Clusters done, some not, messages in flight unacked
    second = service("lease")
    await eventually(
        leases,
        lambda found: all(held(found[n], uids[n]) for n in names),
        timeout=WAIT,
        what="every lease held exactly once",
    )

    async def all_ready() -> dict[str, list[PrerequisiteChanged]]:
        return {n: await prerequisites(bus, namespace, n) for n in names}

    said = await eventually(
        all_ready,
        lambda found: all(found[n] and found[n][-1].ready for n in names),
        timeout=WAIT,
        what="every prerequisite ready",
    )
    for name, messages in said.items():
        assert messages[-1].outputs == {"sizeNameMap": {"small": name}}
        told = facts(messages)
        assert all(a != b for a, b in itertools.pairwise(told)), f"{name}: said twice"

    # A restore brings the Lease back without its ownerReference (upstream H7,
    # docs/upstream.md §1) while no lease service runs; the next one adopts it again.
    second.kill()
    lease = await kube.get(LEASE, namespace, "kube-c0")
    version = lease["metadata"]["resourceVersion"]
    drop = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "remove", "path": "/metadata/ownerReferences"},
    ]
    await kube.request(
        "PATCH",
        LEASE.path(namespace, "kube-c0"),
        body=json.dumps(drop).encode(),
        content_type=JSON_PATCH,
    )
    assert not held(await kube.get(LEASE, namespace, "kube-c0"), uids["c0"])
    service("lease")
    await eventually(
        lambda: get_or_none(kube, LEASE, namespace, "kube-c0"),
        lambda lease: held(lease, uids["c0"]),
        timeout=WAIT,
        what="the restored lease adopted again",
    )
    await no_dead_letters(bus, namespace)
