"""The writer against the real API server, NATS and Redis, run as real processes."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.writer.logic import compose_all
from shared import subjects
from shared.bus import Bus
from shared.coordination import share
from shared.kube import KubeClient
from shared.messages import ObjectRef, PatchStatus, StatusWritten
from shared.resources import CLUSTER
from testenv.examples import cluster_manifest as cluster_body
from tests.integration.support import ServiceProcess, dead_letters, eventually, read_stream

pytestmark = pytest.mark.integration
PARTITIONS = 16


async def make_cluster(kube: KubeClient, namespace: str, name: str) -> ObjectRef:
    created = await kube.create(CLUSTER, cluster_body(namespace, name))
    return ObjectRef(
        api_version=CLUSTER.api_version,
        kind="Cluster",
        namespace=namespace,
        name=name,
        uid=created["metadata"]["uid"],
    )


def patch_for(ref: ObjectRef, patch: dict[str, Any]) -> tuple[str, PatchStatus]:
    assert ref.namespace
    subject = subjects.cluster_status(
        subjects.partition_of(ref.key, PARTITIONS), ref.namespace, ref.name
    )
    return subject, PatchStatus(
        source="tests", correlation_id=f"cluster:{ref.key}", ref=ref, patch=patch
    )


async def journal(bus: Bus, namespace: str) -> list[StatusWritten]:
    entries = await read_stream(
        bus, subjects.JOURNAL.name, f"capibus.journal.statuswritten.cluster.{namespace}.*"
    )
    return [m for _, m in entries if isinstance(m, StatusWritten)]


def carried(entries: list[StatusWritten]) -> set[str]:
    return {i for e in entries for i in e.update_ids}


async def test_status_update_becomes_visible_on_the_cluster(kube, bus, namespace, service) -> None:
    service("writer")
    ref = await make_cluster(kube, namespace, "one")
    await bus.publish(*patch_for(ref, {"networkingPhase": "Provisioning", "probe": 0}))
    cluster = await eventually(
        lambda: kube.get(CLUSTER, namespace, "one"),
        lambda c: c.get("status", {}).get("networkingPhase") == "Provisioning",
        what="status written",
    )
    assert cluster["status"]["probe"] == 0


async def test_close_updates_coalesce_into_fewer_writes_with_the_merged_result(
    kube, bus, namespace, service
) -> None:
    ref = await make_cluster(kube, namespace, "burst")
    patches = [{"nodes": {f"n{i}": {"phase": "Ready"}}, "probe": i + 1} for i in range(50)]
    patches.append({"nodes": {"n0": None}, "networkingPhase": "Provisioned"})
    messages = [patch_for(ref, p) for p in patches]
    await bus.publish_many([(s, m, None) for s, m in messages])
    service("writer")
    ids = {m.id for _, m in messages}
    entries = await eventually(
        lambda: journal(bus, namespace), lambda e: carried(e) >= ids, what="all updates written"
    )
    writes = [e for e in entries if not e.skipped]
    assert len(writes) < len(patches) / 5
    status = (await kube.get(CLUSTER, namespace, "burst"))["status"]
    expected = compose_all(patches)
    assert status["nodes"] == {k: v for k, v in expected["nodes"].items() if v is not None}
    assert status["networkingPhase"] == "Provisioned"
    assert status["probe"] == 50
    assert status["nodeCount"] == 49  # derived by the writer from nodes


async def test_two_writers_lose_nothing_and_never_write_one_cluster_at_once(
    kube, bus, namespace, service
) -> None:
    refs = [await make_cluster(kube, namespace, f"c{i}") for i in range(12)]
    # Leases long enough that a busy two-CPU machine does not let one lapse (which moves a
    # partition, legitimately), and both replicas settled before the first update: a replica
    # that starts late finds its share already taken and writes nothing.
    shares = {w: share(w, PARTITIONS, ["w-a", "w-b"]) for w in ("w-a", "w-b")}
    first = service("writer", "w-a", CAPIBUS_LEASE_TTL="10")
    await eventually(lambda: _owned(first), lambda n: n == PARTITIONS, timeout=60, what="all")
    second = service("writer", "w-b", CAPIBUS_LEASE_TTL="10")
    await eventually(
        lambda: _owned(second), lambda n: n == len(shares["w-b"]), timeout=60, what="its share"
    )
    await asyncio.sleep(1)  # w-a's release of them
    sent: list[PatchStatus] = []
    for round_ in range(8):
        batch = [patch_for(ref, {"probe": round_, f"k{round_}": ref.name}) for ref in refs]
        await bus.publish_many([(s, m, None) for s, m in batch])
        sent += [m for _, m in batch]
        await asyncio.sleep(0.05)
    entries = await eventually(
        lambda: journal(bus, namespace),
        lambda e: carried(e) >= {m.id for m in sent},
        timeout=60,
        what="every update written",
    )
    by_cluster: dict[str, list[StatusWritten]] = defaultdict(list)
    for entry in entries:
        by_cluster[entry.ref.key].append(entry)
    for writes in by_cluster.values():
        writes.sort(key=lambda e: e.started)
        for earlier, later in itertools.pairwise(writes):
            assert earlier.finished <= later.started, f"overlapping writes: {earlier} / {later}"
    owners = {w for w, share in shares.items() for ref in refs if _partition(ref) in share}
    assert {e.writer for e in entries} == owners
    for ref in refs:
        status = (await kube.get(CLUSTER, namespace, ref.name))["status"]
        assert status["probe"] == 7
        assert all(status[f"k{r}"] == ref.name for r in range(8))


def _partition(ref: ObjectRef) -> int:
    return subjects.partition_of(ref.key, PARTITIONS)


async def _owned(replica: ServiceProcess) -> int:
    """How many partitions ``replica`` claimed so far, from its log."""
    return replica.log().count("owns partition")


async def test_a_partition_handed_back_never_turns_a_real_change_into_a_skip(
    kube, bus, namespace, service
) -> None:
    """w-a writes, the partition goes to w-b (which writes), then back to w-a.

    w-a's memory of the Cluster is from before w-b's write: the change back to the value w-a
    last wrote must still be written, not skipped as a no-op against that memory.
    """
    ref = await make_cluster(kube, namespace, "handed")
    partition = subjects.partition_of(ref.key, PARTITIONS)
    other = next(
        f"w-b{i}"
        for i in itertools.count()
        if partition in share(f"w-b{i}", PARTITIONS, ["w-a", f"w-b{i}"])
    )

    async def write(patch: dict[str, Any], by: str | None = None) -> StatusWritten:
        subject, message = patch_for(ref, patch)
        await bus.publish(subject, message)
        entries = await eventually(
            lambda: journal(bus, namespace),
            lambda e: message.id in carried(e),
            timeout=30,
            what=f"{patch} written",
        )
        return next(e for e in entries if message.id in e.update_ids)

    def node(phase: str) -> dict[str, Any]:
        return {"nodes": {"n1": {"phase": phase}}}

    service("writer", "w-a")
    await write(node("Ready"))
    b = service("writer", other)
    for probe in itertools.count():
        if (await write({"probe": probe})).writer == other:
            break
    assert (await write(node("Unhealthy"))).writer == other
    b.stop()
    entry = await write(node("Ready"))
    assert entry.writer == "w-a"
    assert not entry.skipped
    status = (await kube.get(CLUSTER, namespace, ref.name))["status"]
    assert status["nodes"]["n1"]["phase"] == "Ready"


async def test_malformed_message_is_dead_lettered_and_the_consumer_goes_on(
    kube, bus, namespace, service
) -> None:
    service("writer")
    ref = await make_cluster(kube, namespace, "poison")
    subject, good = patch_for(ref, {"networkingPhase": "Provisioned"})
    await bus.js.publish(subject, b"{this is not json")
    await bus.js.publish(subject, b'{"type": "PatchStatus", "source": "x"}')
    await bus.publish(subject, good)
    await eventually(
        lambda: kube.get(CLUSTER, namespace, "poison"),
        lambda c: c.get("status", {}).get("networkingPhase") == "Provisioned",
        what="the good patch after the poison",
    )
    reasons = await eventually(
        lambda: dead_letters(bus, subject), lambda e: len(e) >= 2, what="dead letters"
    )
    assert {r.reason for r in reasons} == {"BadMessage"}
    assert any("Invalid JSON" in r.error for r in reasons)
    assert any("correlation_id" in r.error for r in reasons)
    assert reasons[0].payload.startswith("{this is not json")


async def test_invalid_status_is_dead_lettered_with_the_api_servers_message(
    kube, bus, namespace, service
) -> None:
    service("writer")
    ref = await make_cluster(kube, namespace, "badstatus")
    subject, bad = patch_for(ref, {"networkingPhase": "NotAPhase"})
    await bus.publish(subject, bad)
    letter, *_ = await eventually(
        lambda: dead_letters(bus, subject), lambda e: len(e) >= 1, what="dead letter"
    )
    assert letter.service == "writer"
    assert letter.reason == "InvalidStatus"
    assert "NotAPhase" in letter.error


async def test_update_for_a_deleted_cluster_is_dropped_not_retried(
    kube, bus, namespace, service
) -> None:
    writer = service("writer")
    ref = await make_cluster(kube, namespace, "gone")
    await kube.delete(CLUSTER, namespace, "gone")
    await bus.publish(*patch_for(ref, {"networkingPhase": "Provisioned"}))
    recreated = await make_cluster(kube, namespace, "gone")
    await bus.publish(*patch_for(recreated, {"networkingPhase": "Pending"}))
    await eventually(
        lambda: kube.get(CLUSTER, namespace, "gone"),
        lambda c: c.get("status", {}).get("networkingPhase") == "Pending",
        what="the new incarnation's status",
    )
    assert "dropped 1 status update" in writer.log()


async def test_a_stuck_cluster_shows_unhealthy_at_its_deadline_not_before(
    kube, bus, namespace, service
) -> None:
    service("writer", CAPIBUS_WRITER__CLUSTER_TIMEOUT_SECONDS="4")
    ref = await make_cluster(kube, namespace, "stuck")
    await bus.publish(*patch_for(ref, {"networkingPhase": "Provisioning"}))
    reconciling = await eventually(
        lambda: kube.get(CLUSTER, namespace, "stuck"),
        lambda c: c.get("status", {}).get("phase") == "Reconciling",
        what="Reconciling with a start time",
    )
    assert reconciling["status"]["lastUpdated"]
    unhealthy = await eventually(
        lambda: kube.get(CLUSTER, namespace, "stuck"),
        lambda c: c.get("status", {}).get("phase") == "Unhealthy",
        timeout=15,
        what="Unhealthy at the deadline",
    )
    started = datetime.fromisoformat(unhealthy["status"]["lastUpdated"].replace("Z", "+00:00"))
    assert datetime.now(UTC) - started >= timedelta(seconds=4)
    assert unhealthy["status"]["lastUpdated"] == reconciling["status"]["lastUpdated"]
