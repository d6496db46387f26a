"""The watcher against the real API server and JetStream, run as real processes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import pytest

from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient, WatchExpired
from shared.messages import ResourceChanged
from shared.resources import CLUSTER, SECRET
from testenv.examples import cluster_manifest as cluster_body
from tests.integration.support import ServiceProcess, eventually, read_stream

pytestmark = pytest.mark.integration
WATCH_CLUSTERS = {"CAPIBUS_WATCHER__KINDS": '["cluster"]'}


async def events(bus: Bus, namespace: str) -> list[ResourceChanged]:
    found = await read_stream(bus, subjects.EVENTS.name, f"capibus.evt.cluster.*.{namespace}.*")
    return [m for _, m in found if isinstance(m, ResourceChanged)]


def facts(found: list[ResourceChanged]) -> Counter[tuple[str, str, str]]:
    return Counter(
        (m.ref.uid or "", m.event, "" if m.event == "DELETED" else m.resource_version)
        for m in found
    )


async def final_states(kube: KubeClient, namespace: str) -> dict[str, str]:
    items, _ = await kube.list(CLUSTER, namespace=namespace)
    return {i["metadata"]["uid"]: i["metadata"]["resourceVersion"] for i in items}


def covers(found: list[ResourceChanged], live: dict[str, str], deleted: set[str]) -> bool:
    """Every live object's current resourceVersion, and every deletion, is on the stream."""
    seen = facts(found)
    present = all(
        seen[(uid, "ADDED", rv)] or seen[(uid, "MODIFIED", rv)] for uid, rv in live.items()
    )
    return present and all(seen[(uid, "DELETED", "")] for uid in deleted)


async def started(*watchers: ServiceProcess) -> None:
    """Wait until each watcher finished its first list (and so is watching)."""
    for watcher in watchers:

        async def log(w: ServiceProcess = watcher) -> str:
            return w.log()

        await eventually(log, lambda text: "listed at" in text, what="watcher's first list")


async def churn(kube: KubeClient, namespace: str, names: list[str], rounds: int) -> set[str]:
    """Create, relabel and delete Clusters; returns the uids deleted."""
    deleted: set[str] = set()
    uids = {}
    for name in names:
        uids[name] = (await kube.create(CLUSTER, cluster_body(namespace, name)))["metadata"]["uid"]
    for r in range(rounds):
        for name in names:
            await kube.patch_merge(CLUSTER, namespace, name, {"spec": {"label": f"{name}-{r}"}})
    for name in names[::3]:
        await kube.delete(CLUSTER, namespace, name)
        deleted.add(uids[name])
    return deleted


async def test_created_changed_deleted_cluster_appears_on_the_stream(
    kube, bus, namespace, service
) -> None:
    await started(service("watcher", **WATCH_CLUSTERS))
    created = await kube.create(CLUSTER, cluster_body(namespace, "demo"))
    changed = await kube.patch_merge(CLUSTER, namespace, "demo", {"spec": {"paused": True}})
    await kube.delete(CLUSTER, namespace, "demo")
    found = await eventually(
        lambda: events(bus, namespace), lambda e: len(e) >= 3, what="three events"
    )
    assert [m.event for m in found] == ["ADDED", "MODIFIED", "DELETED"]
    assert found[0].resource_version == created["metadata"]["resourceVersion"]
    assert found[1].resource_version == changed["metadata"]["resourceVersion"]
    assert found[1].object["spec"]["paused"] is True
    assert all(m.correlation_id == f"cluster:{namespace}/demo" for m in found)
    assert "managedFields" not in found[0].object["metadata"]


async def test_sigkill_mid_stream_loses_nothing(kube, bus, namespace, service) -> None:
    watcher = service("watcher", **WATCH_CLUSTERS)
    await started(watcher)
    names = [f"c{i}" for i in range(15)]
    work = asyncio.create_task(churn(kube, namespace, names, rounds=6))
    await eventually(lambda: events(bus, namespace), lambda e: len(e) >= 10, what="first events")
    watcher.kill()
    deleted = await work
    watcher.start()
    live = await final_states(kube, namespace)
    found = await eventually(
        lambda: events(bus, namespace),
        lambda e: covers(e, live, deleted),
        timeout=60,
        what="every final state on the stream",
    )
    duplicates = [fact for fact, n in facts(found).items() if n > 1]
    assert duplicates == []


async def test_expired_watch_relists_and_loses_nothing(kube, bus, namespace, service) -> None:
    # Short server-side watches: the one open when we freeze the watcher ends meanwhile.
    watcher = service("watcher", **WATCH_CLUSTERS, CAPIBUS_WATCHER__WATCH_TIMEOUT_SECONDS="3")
    await started(watcher)
    await kube.create(CLUSTER, cluster_body(namespace, "seed"))
    await eventually(lambda: events(bus, namespace), lambda e: len(e) >= 1, what="seed event")
    assert watcher.proc is not None
    os.kill(watcher.proc.pid, signal.SIGSTOP)
    try:
        # Changes, and time for etcd compaction (5s in the test stack) to pass the frozen
        # watcher's last resourceVersion.
        deleted = await churn(kube, namespace, [f"x{i}" for i in range(10)], rounds=5)
        await asyncio.sleep(13)
    finally:
        os.kill(watcher.proc.pid, signal.SIGCONT)
    live = await final_states(kube, namespace)
    await eventually(
        lambda: events(bus, namespace),
        lambda e: covers(e, live, deleted),
        timeout=90,
        what="every final state after the 410",
    )
    assert "watch expired" in watcher.log()


async def test_a_stale_resource_version_raises_watch_expired(kube, namespace) -> None:
    """The adapter half of the 410 story, directly against the real API server."""
    first = await kube.create(CLUSTER, cluster_body(namespace, "old"))
    for i in range(30):
        await kube.patch_merge(CLUSTER, namespace, "old", {"spec": {"label": str(i)}})
    await asyncio.sleep(12)
    await kube.patch_merge(CLUSTER, namespace, "old", {"spec": {"label": "last"}})
    with pytest.raises(WatchExpired):
        async for _ in kube.watch(
            CLUSTER,
            namespace=namespace,
            resource_version=first["metadata"]["resourceVersion"],
            timeout_seconds=5,
        ):
            pass


async def test_two_watchers_store_each_change_once(kube, bus, namespace, service) -> None:
    await started(
        service("watcher", "wa", **WATCH_CLUSTERS), service("watcher", "wb", **WATCH_CLUSTERS)
    )
    deleted = await churn(kube, namespace, [f"d{i}" for i in range(9)], rounds=4)
    live = await final_states(kube, namespace)
    found = await eventually(
        lambda: events(bus, namespace), lambda e: covers(e, live, deleted), what="all changes"
    )
    await asyncio.sleep(1)
    found = await events(bus, namespace)
    counts = facts(found)
    assert max(counts.values()) == 1, [f for f, n in counts.items() if n > 1]
    # 9 created, 4 rounds of changes, 3 deleted: every one stored, none twice.
    assert len(found) == 9 + 9 * 4 + 3


async def test_secret_data_never_reaches_the_stream(kube, bus, namespace, service) -> None:
    await started(service("watcher", CAPIBUS_WATCHER__KINDS='["secret"]'))
    await kube.create(
        SECRET,
        {
            "metadata": {
                "name": "demo-kubeconfig",
                "namespace": namespace,
                "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
            },
            "stringData": {"value": "super-secret-token"},
        },
    )
    found = await eventually(
        lambda: read_stream(bus, subjects.EVENTS.name, f"capibus.evt.secret.*.{namespace}.*"),
        lambda e: len(e) >= 1,
        what="secret event",
    )
    ((_, message),) = found
    assert isinstance(message, ResourceChanged)
    assert message.correlation_id == f"cluster:{namespace}/demo"
    raw = message.model_dump_json()
    assert "super-secret-token" not in raw
    assert "c3VwZXItc2VjcmV0LXRva2Vu" not in raw


async def test_watcher_stops_promptly_on_sigterm_even_while_its_watch_is_silent(service) -> None:
    watcher = service("watcher", **WATCH_CLUSTERS)
    await started(watcher)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert watcher.stop(timeout=10) == 0
    assert loop.time() - began < 5
