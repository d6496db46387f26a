"""An object's older state published after its newer one must not win, on the real stack.

The fault soak (``soak/RESULTS.md``) left nodes at ``Provisioning`` and addons at
``Installing`` revision 0 while their Machine and HelmRelease said Ready and Deployed. Its
stream shows why: one watcher replica, re-listing after a publish timed out, published the
object's listed (older) state as ADDED right after the other replica's newer MODIFIED, under
an id new to the stream. Here the watcher publishes the object's history as usual and the test
then publishes what such a lagging replica would (``history`` says how each id is kept new),
after the newer state. The monitor must leave the status at the newer state, also when the
replica that gets the older event never saw the newer one (a restart, a partition handed
over).
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
from shared.messages import EventType, PatchStatus
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


async def in_old_state(kube: KubeClient, ns: str, case: Case) -> Json:
    """Create the object and give it its old state; returns it as stored."""
    meta = {"name": case.name, "namespace": ns, **case.body["metadata"]}
    body = {"apiVersion": case.kind.api_version, "kind": case.kind.kind, **case.body}
    await kube.create(case.kind, {**body, "metadata": meta})
    old = await kube.patch_merge(
        case.kind, ns, case.name, {"status": case.old}, subresource="status"
    )
    return scrub(case.kind, old)


async def to_new_state(kube: KubeClient, ns: str, case: Case) -> None:
    await kube.patch_merge(case.kind, ns, case.name, {"status": case.new}, subresource="status")


async def start_watcher(
    service: Callable[..., ServiceProcess], ns: str, case: Case
) -> ServiceProcess:
    watcher = service("watcher", CAPIBUS_WATCHER__NAMESPACE=ns)
    await eventually(
        lambda: _log(watcher),
        lambda text: f"{case.kind.token}: listed at" in text,
        timeout=60,
        what="the watcher's first list",
    )
    return watcher


async def history(
    kube: KubeClient, ns: str, case: Case, service: Callable[..., ServiceProcess], late: EventType
) -> Json:
    """The object's old then new state, published by the watcher so that the late event's id
    is new to the stream; returns the old state.

    A late ADDED (a replica re-listing without the object in its memory: the soak's stale
    events were such ADDEDs) needs a watcher that saw the object created (its ADDED is of
    the first version). A late MODIFIED needs a version the watcher did not publish as
    MODIFIED: here the old state was listed (published as ADDED) by a watcher started after.
    """
    if late == "ADDED":
        await start_watcher(service, ns, case)
        old = await in_old_state(kube, ns, case)
    else:
        old = await in_old_state(kube, ns, case)
        await start_watcher(service, ns, case)
    await to_new_state(kube, ns, case)
    return old


async def publish_late(bus: Bus, case: Case, old: Json, event: EventType) -> tuple[int, str]:
    """What a lagging watcher replica's re-list publishes: ``old``, now (as ADDED when that
    replica's memory lacked the object: the soak's stale events were such ADDEDs).
    Returns (stream sequence, message id)."""
    version = old["metadata"]["resourceVersion"]
    subject, message, dedupe = to_message(
        case.kind,
        Change(event, old, version),
        partitions=PARTITIONS,
        source="watcher/lagging",
    )
    published = await bus.publish(subject, message, msg_id=dedupe)
    assert not published.duplicate, "the older state must reach the stream, as in the soak"
    return published.sequence, message.id


async def _log(process: ServiceProcess) -> str:
    return process.log()


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
    event: EventType,
    restart_monitor: bool,
) -> list[Json]:
    """Returns the status patches the late event caused, once the monitor handled it."""
    service("writer")
    monitor = service("monitor")
    await kube.create(CLUSTER, cluster_manifest(ns, NAME))
    old = await history(kube, ns, case, service, event)
    await eventually(
        lambda: status_of(kube, ns),
        lambda s: case.shown(s) == case.expected,
        timeout=60,
        what=f"the {case.kind.kind}'s newer state on the Cluster",
    )
    partition = subjects.partition_of(f"{ns}/{NAME}", PARTITIONS)
    if restart_monitor:
        # The replica that gets the late event never saw the object's newer event; it has
        # only its claim's listing (waited for: an event before it would be read back).
        monitor.kill()
        monitor = service("monitor")
        await eventually(
            lambda: _log(monitor),
            lambda text: f"partition {partition}: resync corrected" in text,
            timeout=60,
            what="the new monitor's claim of the partition",
        )
    sequence, late = await publish_late(bus, case, old, event)
    await eventually(
        lambda: handled(bus, partition, sequence),
        bool,
        timeout=60,
        what="the monitor to handle the late event",
    )
    # The monitor publishes a patch before it acknowledges the event that caused it.
    return await caused_by(bus, ns, late)


@pytest.mark.parametrize(
    "late",
    [(MACHINE_CASE, "MODIFIED"), (ADDON_CASE, "ADDED")],
    ids=["machine-modified", "helmrelease-added"],
)
async def test_an_older_state_published_after_the_newer_one_does_not_win(
    kube: KubeClient,
    bus: Bus,
    namespace: str,
    service: Callable[..., ServiceProcess],
    late: tuple[Case, EventType],
) -> None:
    case, event = late
    patches = await publish_late_after_settling(
        kube, bus, namespace, case, service, event=event, restart_monitor=False
    )
    assert patches == []
    assert case.shown(await status_of(kube, namespace)) == case.expected


@pytest.mark.parametrize("event", ["ADDED", "MODIFIED"])
async def test_a_replica_that_never_saw_the_newer_event_does_not_apply_the_older(
    kube: KubeClient,
    bus: Bus,
    namespace: str,
    service: Callable[..., ServiceProcess],
    event: EventType,
) -> None:
    patches = await publish_late_after_settling(
        kube, bus, namespace, MACHINE_CASE, service, event=event, restart_monitor=True
    )
    assert patches == []
    assert MACHINE_CASE.shown(await status_of(kube, namespace)) == MACHINE_CASE.expected
