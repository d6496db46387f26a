"""An object's older state published after its newer one must not win, on the real stack.

The fault soak (``soak/RESULTS.md``) left nodes at ``Provisioning`` and addons at
``Installing`` revision 0 while their Machine and HelmRelease said Ready and Deployed: two
watcher replicas had stored one object's events out of resourceVersion order. Here the watcher
publishes the object's history as usual and the test then publishes what a lagging second
replica's re-list would: the object at its older version, under the id the watcher derives
(``<uid>:<resourceVersion>:MODIFIED``, new to the stream, so not deduplicated), after the
newer one. The monitor must leave the status at the newer state, also when the replica that
gets the older event has no memory of the object (a restart, or a partition handed over).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from services.watcher.logic import Change, to_message
from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient, ResourceKind
from shared.messages import PatchStatus
from shared.resources import CLUSTER, HELM_RELEASE, MACHINE, scrub
from testenv.examples import cluster_manifest
from tests.integration.support import ServiceProcess, eventually, read_stream

pytestmark = pytest.mark.integration

Json = dict[str, Any]
NAME = "demo"
PARTITIONS = 16
LABELS = {"capi.stackhpc.com/cluster": NAME}


@dataclass(frozen=True)
class Case:
    """One kind whose older state the soak saw win: its object, two states, and where the
    Cluster's status shows them."""

    kind: ResourceKind
    name: str
    body: Json
    old: Json
    new: Json
    #: status -> what it says of this object
    shown: Callable[[Json], Any]
    #: what ``shown`` says for ``new``
    expected: Any


MACHINE_CASE = Case(
    kind=MACHINE,
    name=f"{NAME}-control-plane-x",
    body={
        "metadata": {"labels": {**LABELS, "capi.stackhpc.com/component": "control-plane"}},
        "spec": {
            "clusterName": NAME,
            "version": "v1.31.2",
            "infrastructureRef": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "OpenStackMachine",
                "name": f"{NAME}-control-plane-x-os",
            },
        },
    },
    old={"phase": "Provisioned"},
    new={
        "phase": "Running",
        "conditions": [
            {
                "type": "NodeHealthy",
                "status": "True",
                "reason": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        ],
        "addresses": [{"type": "InternalIP", "address": "10.0.47.105"}],
    },
    shown=lambda s: {
        k: ((s.get("nodes") or {}).get(f"{NAME}-control-plane-x") or {}).get(k)
        for k in ("phase", "ip")
    },
    expected={"phase": "Ready", "ip": "10.0.47.105"},
)
ADDON_CASE = Case(
    kind=HELM_RELEASE,
    name=f"{NAME}-metrics-server",
    body={
        "metadata": {"labels": {**LABELS, "capi.stackhpc.com/component": "metrics-server"}},
        "spec": {"clusterName": NAME, "targetNamespace": "kube-system"},
    },
    old={"phase": "Installing"},
    new={"phase": "Deployed", "revision": 1},
    shown=lambda s: (s.get("addons") or {}).get("metrics-server"),
    expected={"phase": "Deployed", "revision": 1},
)


async def status_of(kube: KubeClient, ns: str) -> Json:
    return dict((await kube.get(CLUSTER, ns, NAME)).get("status") or {})


async def older_then_newer(kube: KubeClient, ns: str, case: Case) -> tuple[Json, Json]:
    """Create the object in its old state, then move it to its new one: both as stored."""
    meta = {"name": case.name, "namespace": ns, **case.body["metadata"]}
    body = {"apiVersion": case.kind.api_version, "kind": case.kind.kind, **case.body}
    await kube.create(case.kind, {**body, "metadata": meta})
    old = await kube.patch_merge(
        case.kind, ns, case.name, {"status": case.old}, subresource="status"
    )
    new = await kube.patch_merge(
        case.kind, ns, case.name, {"status": case.new}, subresource="status"
    )
    return scrub(case.kind, old), scrub(case.kind, new)


async def publish_late(bus: Bus, case: Case, old: Json) -> tuple[int, int, str]:
    """What a lagging watcher replica's re-list publishes: ``old`` as MODIFIED, now.
    Returns (partition, stream sequence, message id)."""
    version = old["metadata"]["resourceVersion"]
    subject, message, dedupe = to_message(
        case.kind,
        Change("MODIFIED", old, version),
        partitions=PARTITIONS,
        source="watcher/lagging",
    )
    published = await bus.publish(subject, message, msg_id=dedupe)
    assert not published.duplicate, "the older state must reach the stream, as in the soak"
    partition = subjects.partition_of(f"{old['metadata']['namespace']}/{NAME}", PARTITIONS)
    return partition, published.sequence, message.id


async def handled(bus: Bus, partition: int, sequence: int) -> bool:
    """Whether the monitor acknowledged everything of ``partition`` up to ``sequence``."""
    info = await bus.js.consumer_info(subjects.EVENTS.name, f"monitor-changes-p{partition}")
    return (info.ack_floor.stream_seq or 0) >= sequence


async def caused_by(bus: Bus, ns: str, message_id: str) -> list[Json]:
    """The status patches published because of the message ``message_id``."""
    found = await read_stream(
        bus, subjects.STATUS.name, f"capibus.status.patch.cluster.*.{ns}.{NAME}"
    )
    return [
        m.patch for _, m in found if isinstance(m, PatchStatus) and m.causation_id == message_id
    ]


async def publish_late_after_settling(
    kube: KubeClient,
    bus: Bus,
    ns: str,
    case: Case,
    service: Callable[..., ServiceProcess],
    *,
    restart_monitor: bool,
) -> list[Json]:
    """Returns the status patches the late event caused, once the monitor handled it."""
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=ns)
    service("writer")
    monitor = service("monitor")
    await kube.create(CLUSTER, cluster_manifest(ns, NAME))
    old, _ = await older_then_newer(kube, ns, case)
    await eventually(
        lambda: status_of(kube, ns),
        lambda s: case.shown(s) == case.expected,
        timeout=60,
        what=f"the {case.kind.kind}'s newer state on the Cluster",
    )
    if restart_monitor:
        # The replica that gets the late event never saw the object's newer event.
        monitor.kill()
        service("monitor")
    partition, sequence, late = await publish_late(bus, case, old)
    await eventually(
        lambda: handled(bus, partition, sequence),
        bool,
        timeout=60,
        what="the monitor to handle the late event",
    )
    # The monitor publishes a patch before it acknowledges the event that caused it.
    return await caused_by(bus, ns, late)


@pytest.mark.parametrize("case", [MACHINE_CASE, ADDON_CASE], ids=["machine", "helmrelease"])
async def test_an_older_state_published_after_the_newer_one_does_not_win(
    kube: KubeClient, bus: Bus, namespace: str, service: Callable[..., ServiceProcess], case: Case
) -> None:
    patches = await publish_late_after_settling(
        kube, bus, namespace, case, service, restart_monitor=False
    )
    assert patches == []
    assert case.shown(await status_of(kube, namespace)) == case.expected


async def test_a_replica_without_memory_of_the_object_reads_it_back(
    kube: KubeClient, bus: Bus, namespace: str, service: Callable[..., ServiceProcess]
) -> None:
    patches = await publish_late_after_settling(
        kube, bus, namespace, MACHINE_CASE, service, restart_monitor=True
    )
    assert patches == []
    assert MACHINE_CASE.shown(await status_of(kube, namespace)) == MACHINE_CASE.expected
