"""``capibus status`` against the session's stack: two real writer replicas share the
partitions (their leases in the real Redis), a status patch waits on a real durable consumer
once they are gone, and an unreachable Redis is one line and exit code 2.

The command runs in-process (``main`` in a thread: it runs its own event loop). Other modules'
services leave their consumers and dead letters on the session's NATS, so the checks look at
this test's replicas and at the partition its Cluster hashes to only.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from cli.main import main
from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient
from shared.messages import ObjectRef, PatchStatus
from shared.resources import CLUSTER
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack
from tests.integration.support import ServiceProcess, eventually

pytestmark = pytest.mark.integration
PARTITIONS = 16


class Status:
    """``capibus status`` in-process against the stack: exit code, stdout, stderr."""

    def __init__(self, stack: LocalStack, capsys: pytest.CaptureFixture[str]) -> None:
        self.urls = ["--nats-url", stack.endpoints.nats_url]
        self.redis = ["--redis-url", stack.endpoints.redis_url]
        self.capsys = capsys

    async def run(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, [*self.urls, "status", *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    async def json(self) -> dict[str, Any]:
        args = [*self.redis, "--partitions", str(PARTITIONS), "--lease-ttl", "2", "--json"]
        code, out, err = await self.run(*args)
        assert code == 0, err
        doc: dict[str, Any] = json.loads(out)
        return doc


@pytest.fixture
def status(stack: LocalStack, capsys: pytest.CaptureFixture[str]) -> Status:
    return Status(stack, capsys)


def writer_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The writer's part of the status (empty before any writer registered)."""
    found = [s for s in doc["services"] if s["service"] == "writer"]
    return found[0] if found else {"replicas": [], "subscriptions": [], "unheld_partitions": None}


def held(doc: dict[str, Any], replicas: list[str]) -> dict[str, set[int]]:
    """The partitions each of ``replicas`` holds, live ones only."""
    found = {r["name"]: r for r in writer_of(doc)["replicas"] if r["live"]}
    return {name: set(found[name]["partitions"]) if name in found else set() for name in replicas}


NO_CONSUMER = {"holder": None, "pending": -1, "ack_pending": -1}


def lag(doc: dict[str, Any], partition: int) -> dict[str, Any]:
    """The lag of the writer's status consumer of ``partition`` (a holder creates it once its
    lease is usable; until then ``NO_CONSUMER``)."""
    for sub in writer_of(doc)["subscriptions"]:
        for one in sub["partitions"] if sub["subscription"] == "status" else []:
            if one["partition"] == partition:
                return dict(one)
    return NO_CONSUMER


async def test_status_shows_replicas_their_partitions_and_what_waits(
    status: Status,
    service: Callable[..., ServiceProcess],
    kube: KubeClient,
    bus: Bus,
    namespace: str,
) -> None:
    tag = uuid.uuid4().hex[:6]
    names = [f"st-{tag}-a", f"st-{tag}-b"]
    replicas = [service("writer", name) for name in names]

    def shared_out(doc: dict[str, Any]) -> bool:
        shares = held(doc, names)
        a, b = shares.values()
        return bool(a and b) and not a & b and writer_of(doc)["unheld_partitions"] == []

    doc = await eventually(status.json, shared_out, timeout=60, what="both replicas hold a share")
    replica = {r["name"]: r for r in writer_of(doc)["replicas"]}
    assert all(replica[n]["heartbeat_age_seconds"] < 5 for n in names)

    await kube.create(CLUSTER, cluster_manifest(namespace, "st"))
    cluster = await kube.get(CLUSTER, namespace, "st")
    ref = ObjectRef(
        api_version=CLUSTER.api_version,
        kind="Cluster",
        namespace=namespace,
        name="st",
        uid=cluster["metadata"]["uid"],
    )
    partition = subjects.partition_of(ref.key, PARTITIONS)
    await publish(bus, ref, {"probe": 1})
    doc = await eventually(
        status.json,
        lambda d: lag(d, partition)["pending"] + lag(d, partition)["ack_pending"] == 0,
        what="the patch consumed",
    )
    holders = {r["name"]: r["partitions"] for r in writer_of(doc)["replicas"] if r["live"]}
    assert partition in holders[lag(doc, partition)["holder"]]

    for proc in replicas:
        proc.stop()
    await publish(bus, ref, {"probe": 2})
    doc = await eventually(status.json, lambda d: lag(d, partition)["pending"] == 1, what="lag")
    waiting = lag(doc, partition)
    assert waiting["holder"] is None
    assert waiting["oldest_unacked_age_seconds"] is not None
    assert waiting["oldest_unacked_age_seconds"] < 60
    assert held(doc, names) == {name: set() for name in names}
    texts = [w["text"] for w in doc["warnings"] if w["service"] == "writer"]
    assert f"status p{partition}: 1 message(s) waiting and no replica holds the partition" in texts

    code, out, _ = await status.run(*status.redis)
    assert code == 0
    assert f"warning: writer: status p{partition}: 1 message(s) waiting" in out
    assert "\033[" not in out


async def publish(bus: Bus, ref: ObjectRef, patch: dict[str, Any]) -> None:
    assert ref.namespace
    subject = subjects.cluster_status(
        subjects.partition_of(ref.key, PARTITIONS), ref.namespace, ref.name
    )
    message = PatchStatus(source="tests", correlation_id=f"cluster:{ref.key}", ref=ref, patch=patch)
    await bus.publish(subject, message)


async def test_unreachable_redis_is_one_line_and_exit_2(status: Status) -> None:
    code, out, err = await status.run("--redis-url", "redis://127.0.0.1:1/0")
    assert (code, out) == (2, "")
    (line,) = err.splitlines()
    assert line.startswith("capibus: cannot reach Redis at redis://127.0.0.1:1/0: ")
