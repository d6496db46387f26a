"""Messages at and over the bus's size limit, on the real stack.

The API server stores objects of up to about 1.5 MiB, NATS takes messages of up to 1 MiB.
Expected: an object too large for one message blocks no other event and is seen whole by
every consumer; a message too large to store is refused as permanent, never retried as an
outage; and a huge undecodable message still ends in a dead letter.
"""

from __future__ import annotations

import hashlib

import pytest

from shared import subjects
from shared.errors import MessageTooLarge
from shared.messages import MessageDeadLettered, ResourceChanged
from shared.resources import CLUSTER, HELM_RELEASE
from testenv.examples import cluster_manifest
from tests.integration.support import dead_letters, eventually, read_stream
from tests.integration.test_faults import Probe, ref, run_probe
from tests.integration.test_monitor import NAME, component, make, status_of
from tests.integration.test_writer import patch_for

pytestmark = pytest.mark.integration

#: over NATS's 1 MiB, under the API server's limit
BIG = "v" * 1_200_000


async def release_events(bus, namespace: str, name: str) -> list[ResourceChanged]:
    subject = f"capibus.evt.{HELM_RELEASE.token}.*.{namespace}.{name}"
    found = await read_stream(bus, subjects.EVENTS.name, subject)
    return [m for _, m in found if isinstance(m, ResourceChanged)]


async def test_an_object_too_large_for_one_message_blocks_nothing_and_is_seen_whole(
    kube, bus, namespace, service
) -> None:
    watcher = service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    service("monitor")
    # Another tenant's oversized release comes first: it used to hold up every later event.
    await make(
        kube,
        HELM_RELEASE,
        namespace,
        "someone-elses",
        spec={"clusterName": "other", "values": {"blob": BIG}},
        status={},
    )
    await kube.create(CLUSTER, cluster_manifest(namespace, NAME))
    for addon, values in (("cni-calico", {}), ("monitoring", {"blob": BIG})):
        await make(
            kube,
            HELM_RELEASE,
            namespace,
            f"{NAME}-{addon}",
            metadata=component(addon),
            spec={"clusterName": NAME, "values": values},
            status={"phase": "Deployed", "revision": 1},
        )

    status = await eventually(
        lambda: status_of(kube, namespace),
        lambda s: len(s.get("addons") or {}) == 2,
        timeout=60,
        what="both addons on the Cluster",
    )
    assert status["addons"]["monitoring"] == {"phase": "Deployed", "revision": 1}
    (first, *_) = await release_events(bus, namespace, f"{NAME}-monitoring")
    assert first.trimmed is not None
    assert "spec" in first.trimmed.fields
    assert first.trimmed.size > bus.max_payload
    assert "published without spec" in watcher.log()


async def test_a_message_over_the_limit_is_refused_as_permanent(bus, namespace) -> None:
    subject, message = patch_for(ref(namespace), {"blob": BIG})
    with pytest.raises(MessageTooLarge):
        await bus.publish(subject, message)
    # Refused before sending: the connection is as good as before.
    subject, message = patch_for(ref(namespace), {"small": True})
    assert (await bus.publish(subject, message)).sequence > 0


async def test_a_huge_undecodable_message_is_still_dead_lettered(
    bus, redis_client, namespace
) -> None:
    subject = subjects.cluster_status(0, namespace, "p")
    body = b"\x00" + b"x" * (bus.max_payload - 1024)
    ack = await bus.js.publish(subject, body)

    async def dead() -> list[MessageDeadLettered]:
        return await dead_letters(bus, subject)

    await run_probe(bus, redis_client, Probe(), namespace, until=dead)
    (letter,) = await dead()
    assert letter.reason == "BadMessage"
    assert letter.payload_truncated
    assert letter.payload_size == len(body)
    assert letter.payload_sha256 == hashlib.sha256(body).hexdigest()
    assert (letter.stream, letter.stream_sequence) == (subjects.STATUS.name, ack.seq)
