"""The later steps of the story: change the Cluster, feed the writer a bad message, delete it.

Each step acts from outside, as a user or a buggy producer would, and then waits for the
effect to show up on the bus, so the narration stays in step with the live feed. The check
that nothing is left after a deletion (``until_nothing_left``, ``show_leftovers``) serves the
metal-stack scene too.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from demo import cluster, portal
from demo.outcome import OSM_TEMPLATE, show_release
from demo.scene import Scene
from demo.style import BOLD, GREEN, RED, note, say
from demo.system import PARTITIONS
from shared import subjects
from shared.kube import ResourceKind
from shared.messages import Message, MessageDeadLettered, ObjectRef, ResourceChanged
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    LEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    OIDC_CLIENT,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    PLATFORM,
    SECRET,
)

Json = dict[str, Any]

DEPLOYMENT = ResourceKind("deployment", "apps", "v1", "Deployment", "deployments")
#: Everything a Cluster brings into its namespace; after deletion, none may be left.
OWNED_KINDS = (
    CLUSTER,
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    OSM_TEMPLATE,
    HELM_RELEASE,
    MANIFESTS,
    OIDC_CLIENT,
    PLATFORM,
    LEASE,
    DEPLOYMENT,
    SECRET,
)
DELETE_TIMEOUT = 90.0
LEFTOVER_TIMEOUT = 30.0


async def scale(scene: Scene, ref: ObjectRef) -> None:
    """One more worker in md-0: one spec change, so exactly one Helm upgrade."""
    obj = await scene.kube.get(CLUSTER, ref.namespace, ref.name)
    groups = obj["spec"]["nodeGroups"]
    before = groups[0]["count"]
    groups[0]["count"] = before + 1
    nodes = (obj.get("status") or {}).get("nodeCount", 0) + 1
    note(f"merge-patching spec.nodeGroups: {groups[0]['name']} count {before} → {before + 1}")
    await scene.kube.patch_merge(CLUSTER, ref.namespace, ref.name, {"spec": {"nodeGroups": groups}})
    await cluster.until_converged(scene, ref, nodes=nodes)
    await cluster.show(scene, ref)
    revisions = [entry["revision"] for entry in await show_release(scene, ref)]
    if revisions == [1, 2]:
        say("   ⇒ one spec change became exactly one helm upgrade (revision 2)", BOLD, GREEN)
    else:
        say(f"   ⇒ expected revisions [1, 2], found {revisions}", BOLD, RED)


async def send_bad_message(scene: Scene, ref: ObjectRef) -> MessageDeadLettered:
    """Publish what a buggy producer might: a status patch as a string and no ``ref``."""
    msg_id = f"demo-bad-{uuid.uuid4().hex[:8]}"
    body = {
        "type": "PatchStatus",
        "source": "demo/buggy-producer",
        "correlation_id": f"cluster:{ref.key}",
        "patch": "phase: Ready",
    }
    note(f"publishing {json.dumps(body)}")
    assert ref.namespace is not None
    subject = subjects.cluster_status(
        subjects.partition_of(ref.key, PARTITIONS), ref.namespace, ref.name
    )
    # Straight to JetStream: Bus.publish only accepts valid messages, which is the point.
    await scene.bus.js.publish(subject, json.dumps(body).encode(), headers={"Nats-Msg-Id": msg_id})

    def dead(seen: list[Message]) -> MessageDeadLettered | None:
        return next(
            (m for m in seen if isinstance(m, MessageDeadLettered) and m.original_id == msg_id),
            None,
        )

    letter = await scene.expect(dead, "the malformed message being dead-lettered")
    say(f"   ↳ dead-lettered by {letter.service}: reason={letter.reason}", BOLD)
    note(f"error: {letter.error}")
    note("the writer terminated it (no redelivery) and keeps consuming the cluster's updates")
    return letter


async def delete(scene: Scene, ref: ObjectRef) -> None:
    """Delete as the portal does, then check that nothing of the Cluster is left."""
    note('DELETE with {"propagationPolicy": "Foreground"}: dependents go before the Cluster')
    progress = cluster.Progress(ref)
    with scene.feed.observing(progress):
        await portal.delete_cluster(scene.kube, ref)
        await scene.expect(
            lambda seen: _deleted(seen, ref), f"{ref.key} gone", seconds=DELETE_TIMEOUT
        )
    assert ref.namespace is not None
    found = await until_nothing_left(scene, ref.namespace, OWNED_KINDS)
    show_leftovers(found, OWNED_KINDS)
    note("left on purpose: the namespace, its Realm and the ClusterTemplate (the portal's)")


def show_leftovers(found: dict[str, list[str]], kinds: Sequence[ResourceKind]) -> None:
    for kind in kinds:
        names = found.get(kind.plural, [])
        mark = f"{len(names)} left: {', '.join(names)}" if names else "none"
        say(f"   ↳ {kind.kind:<25} [{kind.group or 'core'}] {mark}", BOLD, RED if names else "")


def _deleted(seen: list[Message], ref: ObjectRef) -> bool | None:
    return (
        any(
            isinstance(m, ResourceChanged) and m.ref.uid == ref.uid and m.event == "DELETED"
            for m in seen
        )
        or None
    )


async def until_nothing_left(
    scene: Scene, namespace: str, kinds: Sequence[ResourceKind]
) -> dict[str, list[str]]:
    """Garbage collection finishes after the Cluster is gone; give it a little while."""
    deadline = time.monotonic() + LEFTOVER_TIMEOUT
    while True:
        found = await leftovers(scene, namespace, kinds)
        if not found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def leftovers(
    scene: Scene, namespace: str, kinds: Sequence[ResourceKind]
) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for kind in kinds:
        items, _ = await scene.kube.list(kind, namespace=namespace)
        names = [i["metadata"]["name"] for i in items if _counts(kind, i)]
        if names:
            found[kind.plural] = names
    return found


def _counts(kind: ResourceKind, obj: Json) -> bool:
    # Service-account tokens are the namespace's, not the Cluster's.
    return not (kind is SECRET and obj.get("type") == "kubernetes.io/service-account-token")
