"""What the demo does to the running system, step by step, and how it shows the effect.

Each step acts from outside (the API server, or a publish standing in for the status-producing
services of a later stage) and then waits for the effect to appear on the bus, so the narration
stays in step with the live feed instead of guessing with sleeps.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from demo.feed import Feed, short, within
from demo.style import BOLD, GREEN, note, say
from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient, ResourceKind
from shared.messages import (
    ClusterStatusWritten,
    Message,
    MessageDeadLettered,
    ObjectRef,
    PatchClusterStatus,
    ResourceChanged,
)
from shared.models.azimuth import ClusterStatus
from shared.resources import CLUSTER, KINDS, NAMESPACE

Json = dict[str, Any]
T = TypeVar("T")

MANIFESTS = Path(__file__).with_name("manifests")
FIELD_MANAGER = "capibus-demo"
SOURCE = "demo/status-story"
#: The services' partition count; the demo pins it in their environment so its own status
#: subjects land in the partition the writer consumes.
PARTITIONS = 16
EFFECT_TIMEOUT = 20.0


@dataclass(frozen=True)
class Scene:
    """The clients and the feed every step uses."""

    kube: KubeClient
    bus: Bus
    feed: Feed


# -- CRDs -----------------------------------------------------------------------------------


async def expect(scene: Scene, check: Callable[[list[Message]], T | None], what: str) -> T:
    """Wait for the feed to show an effect of the step that was just taken."""
    async with within(EFFECT_TIMEOUT, what):
        return await scene.feed.wait_until(check)


def _load(path: Path) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


# -- the example objects --------------------------------------------------------------------


async def apply_manifests(scene: Scene) -> ObjectRef:
    """Apply ``demo/manifests`` in file order; returns the Cluster, once the watcher saw all."""
    applied: list[Json] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in _load(path):
            obj = await scene.kube.apply(_kind_of(doc), doc, field_manager=FIELD_MANAGER)
            applied.append(obj)
            meta = obj["metadata"]
            where = f"{meta['namespace']}/" if meta.get("namespace") else ""
            note(f"applied {doc['kind']} {where}{meta['name']}")
    # The watcher does not watch Namespaces, so there is no event to wait for.
    uids = {o["metadata"]["uid"] for o in applied if o["kind"] != "Namespace"}
    await expect(
        scene,
        lambda seen: _added(seen) >= uids or None,
        "the watcher publishing every applied object",
    )
    cluster = next(o for o in applied if o["kind"] == "Cluster")
    return ObjectRef(
        api_version=CLUSTER.api_version,
        kind=CLUSTER.kind,
        namespace=cluster["metadata"]["namespace"],
        name=cluster["metadata"]["name"],
        uid=cluster["metadata"]["uid"],
    )


def _kind_of(doc: Json) -> ResourceKind:
    for kind in (*KINDS.values(), NAMESPACE):
        if (kind.api_version, kind.kind) == (doc["apiVersion"], doc["kind"]):
            return kind
    raise ValueError(f"the demo does not know {doc['apiVersion']} {doc['kind']}")


def _added(seen: list[Message]) -> set[str]:
    return {m.ref.uid or "" for m in seen if isinstance(m, ResourceChanged) and m.event == "ADDED"}


# -- the status story -----------------------------------------------------------------------

CONTROL_PLANE_NODE = "demo-control-plane-7xk2p"
WORKER_NODE = "demo-md-0-b5q9c-x2k4r"


@dataclass(frozen=True)
class Step:
    title: str
    patches: tuple[Json, ...]


STEPS = (
    Step(
        "The cluster is accepted: phase Pending",
        (
            {
                "phase": "Pending",
                "networkingPhase": "Pending",
                "controlPlanePhase": "Pending",
                "nodeCount": 0,
            },
        ),
    ),
    Step(
        "Networking is being provisioned: phase Reconciling",
        ({"phase": "Reconciling", "networkingPhase": "Provisioning"},),
    ),
    Step(
        "Networking is up; the control plane scales up",
        ({"networkingPhase": "Provisioned", "controlPlanePhase": "ScalingUp"},),
    ),
    Step(
        "A burst of 5 updates: nodes appear and the cluster becomes Ready",
        (
            {
                "nodes": {
                    CONTROL_PLANE_NODE: {
                        "role": "control-plane",
                        "phase": "Provisioning",
                        "size": "small",
                    }
                },
                "nodeCount": 1,
            },
            {
                "nodes": {
                    CONTROL_PLANE_NODE: {
                        "phase": "Ready",
                        "ip": "10.0.0.11",
                        "ips": ["10.0.0.11"],
                        "kubeletVersion": "v1.34.2",
                    }
                },
                "controlPlanePhase": "Ready",
            },
            {
                "nodes": {
                    WORKER_NODE: {
                        "role": "worker",
                        "phase": "Provisioning",
                        "size": "small",
                        "nodeGroup": "md-0",
                    }
                },
                "nodeCount": 2,
            },
            {
                "nodes": {
                    WORKER_NODE: {
                        "phase": "Ready",
                        "ip": "10.0.0.12",
                        "ips": ["10.0.0.12"],
                        "kubeletVersion": "v1.34.2",
                    }
                }
            },
            {"phase": "Ready", "kubernetesVersion": "1.34.2"},
        ),
    ),
)


def status_subject(ref: ObjectRef) -> str:
    assert ref.namespace is not None
    partition = subjects.partition_of(ref.key, PARTITIONS)
    return subjects.cluster_status(partition, ref.namespace, ref.name)


async def play_step(scene: Scene, ref: ObjectRef, step: Step) -> None:
    """Publish the step's patches at once; show the writes they became and their result."""
    messages = [
        PatchClusterStatus(source=SOURCE, correlation_id=f"cluster:{ref.key}", ref=ref, patch=patch)
        for patch in step.patches
    ]
    # Pipelined: all patches are in the stream within milliseconds, which is what gives the
    # writer a chance to coalesce them.
    await scene.bus.publish_many([(status_subject(ref), m, None) for m in messages])
    ids = {m.id for m in messages}
    writes = await expect(
        scene,
        lambda seen: _writes_covering(seen, ids),
        f"the writer writing {len(ids)} update(s)",
    )
    latest = writes[-1].resource_version
    if latest is not None:
        await _watcher_saw(scene, ref, latest)
    await show_status(scene.kube, ref)
    if len(messages) > 1:
        applied = [w for w in writes if not w.skipped]
        say(f"   ⇒ {len(messages)} updates became {len(applied)} status write(s)", BOLD, GREEN)


def _writes_covering(seen: list[Message], ids: set[str]) -> list[ClusterStatusWritten] | None:
    writes = [m for m in seen if isinstance(m, ClusterStatusWritten) and ids & set(m.update_ids)]
    carried = {i for w in writes for i in w.update_ids}
    return writes if carried >= ids else None


async def _watcher_saw(scene: Scene, ref: ObjectRef, resource_version: str) -> None:
    """Wait for the watch event of a write, so the feed shows the full loop before the summary."""

    def found(seen: list[Message]) -> bool | None:
        return (
            any(
                isinstance(m, ResourceChanged)
                and m.ref.uid == ref.uid
                and m.resource_version == resource_version
                for m in seen
            )
            or None
        )

    await expect(scene, found, f"the watcher seeing {ref.key} at {resource_version}")


async def show_status(kube: KubeClient, ref: ObjectRef) -> None:
    """The Cluster's status as the API server has it, parsed with the shared model."""
    assert ref.namespace is not None
    obj = await kube.get(CLUSTER, ref.namespace, ref.name)
    raw = obj.get("status")
    version = obj["metadata"]["resourceVersion"]
    if not raw:
        say(f"   ↳ API server: {ref.key} has no status yet (rv={version})", BOLD)
        return
    status = ClusterStatus.model_validate(raw)
    nodes = " ".join(f"{name}:{node.phase}" for name, node in status.nodes.items())
    say(
        f"   ↳ API server: phase={status.phase} networking={status.networking_phase}"
        f" controlPlane={status.control_plane_phase} nodeCount={status.node_count}"
        f"{f' [{nodes}]' if nodes else ''} rv={version}",
        BOLD,
    )


# -- a bad message and the end of the cluster -------------------------------------------------


async def send_bad_message(scene: Scene, ref: ObjectRef) -> MessageDeadLettered:
    """Publish what a buggy producer might: a status patch as a string and no ``ref``."""
    msg_id = f"demo-bad-{uuid.uuid4().hex[:8]}"
    body = {
        "type": "PatchClusterStatus",
        "source": "demo/buggy-producer",
        "correlation_id": f"cluster:{ref.key}",
        "patch": "phase: Ready",
    }
    note(f"publishing {json.dumps(body)}")
    # Straight to JetStream: Bus.publish only accepts valid messages, which is the point.
    await scene.bus.js.publish(
        status_subject(ref), json.dumps(body).encode(), headers={"Nats-Msg-Id": msg_id}
    )

    def dead(seen: list[Message]) -> MessageDeadLettered | None:
        return next(
            (m for m in seen if isinstance(m, MessageDeadLettered) and m.original_id == msg_id),
            None,
        )

    letter = await expect(scene, dead, "the malformed message being dead-lettered")
    say(f"   ↳ dead-lettered by {letter.service}: reason={letter.reason}", BOLD)
    note(f"error: {letter.error}")
    note("the writer terminated it (no redelivery) and keeps consuming the cluster's updates")
    return letter


async def delete_cluster(scene: Scene, ref: ObjectRef) -> None:
    assert ref.namespace is not None
    await scene.kube.delete(CLUSTER, ref.namespace, ref.name)

    def deleted(seen: list[Message]) -> ResourceChanged | None:
        return next(
            (
                m
                for m in seen
                if isinstance(m, ResourceChanged) and m.ref.uid == ref.uid and m.event == "DELETED"
            ),
            None,
        )

    event = await expect(scene, deleted, f"the DELETED event of {ref.key}")
    say(f"   ↳ the watcher published DELETED (id {short(event.id)})", BOLD)
