"""The lease service through its routes and ``Deps``, against the shared fakes (no network).

``LeaseKube`` is ``tests.fakes.FakeKube`` with what the Lease's lists need: JSON patches that
append (``-``) and remove entries by index, a deleting object that goes when its last
finalizer does, every patch recorded, and a hook for a concurrent writer. ``FakeBus`` drops a
repeated message id like JetStream's duplicate window; ``CountingBus`` also counts what the
service even tried to send.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from services.lease.app import ROUTES
from services.lease.bootstrap import dependencies
from services.lease.settings import LeaseSettings
from shared import subjects
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeInvalid
from shared.kube import ResourceKind
from shared.messages import (
    Message,
    ObjectRef,
    PatchStatus,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
)
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
FINALIZER = "azimuth.stackhpc.com"
PARTITIONS = 16
PARTITION = subjects.partition_of("ns/c", PARTITIONS)
PREREQUISITE = subjects.prerequisite("lease", PARTITION, "ns", "c")
STATUS = subjects.cluster_status(PARTITION, "ns", "c")


class LeaseKube(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.patches: list[list[Json]] = []
        #: runs just before a PATCH is applied: a concurrent writer
        self.meanwhile: Callable[[], None] | None = None

    def obj(self, kind: ResourceKind, name: str) -> Json:
        found = self.stored(kind, "ns", name)
        assert found is not None, name
        return found

    async def patch_json(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        ops: Iterable[Json],
        *,
        subresource: str | None = None,
    ) -> Json:
        if self.meanwhile:
            self.meanwhile()
            self.meanwhile = None
        ops = list(ops)
        self.patches.append(ops)
        return await super().patch_json(kind, namespace, name, ops, subresource=subresource)


class CountingBus(FakeBus):
    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        self.attempts += 1
        return await super().publish(subject, message, msg_id=msg_id)

    def prerequisites(self) -> list[PrerequisiteChanged]:
        return [m for m in self.on(PREREQUISITE) if isinstance(m, PrerequisiteChanged)]

    def statuses(self) -> list[PatchStatus]:
        return [m for m in self.on(STATUS) if isinstance(m, PatchStatus)]


class Service:
    """The service's routes bound to its ``Deps``, plus a stand-in for the writer."""

    def __init__(self) -> None:
        self.kube, self.bus = LeaseKube(), CountingBus()
        settings = LeaseSettings(replica="r1", partitions=PARTITIONS)
        deps = dependencies(settings, bus=self.bus, kube=self.kube)
        self.subscriptions = {s.name: s for s in ROUTES.bind(deps)}

    async def deliver(self, subscription: str, message: Message) -> None:
        batch = Batch(key="ns/x", partition=PARTITION, messages=(message,))
        await self.subscriptions[subscription].handle(batch)

    async def event(self, kind: ResourceKind, name: str, event: str = "MODIFIED") -> None:
        await self.deliver(kind.token, self.changed(kind, name, event))

    def changed(self, kind: ResourceKind, name: str, event: str = "MODIFIED") -> ResourceChanged:
        obj = self.kube.stored(kind, "ns", name) or {"metadata": {"namespace": "ns", "name": name}}
        return changed(kind, obj, event)

    def write_status(self) -> None:
        """What the writer would do with the status patches published so far."""
        cluster = self.kube.obj(CLUSTER, "c")
        status = cluster.setdefault("status", {})
        for message in self.bus.statuses():
            status.update(message.patch)
            kept = [
                c
                for c in status.get("conditions", [])
                if c["type"] not in {m.type for m in message.conditions}
            ]
            status["conditions"] = kept + [c.model_dump() for c in message.conditions]


def changed(kind: ResourceKind, obj: Json, event: str = "MODIFIED") -> ResourceChanged:
    meta = obj["metadata"]
    return ResourceChanged(
        source="watcher/t",
        correlation_id="cluster:ns/c",
        event=event,  # type: ignore[arg-type]
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid"),
        ),
        resource_version=meta.get("resourceVersion", "1"),
        object=obj,
    )


def cluster(**spec: Any) -> Json:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "cluster-uid", "generation": 2},
        "spec": {"leaseName": "kube-c", **spec},
    }


PORTAL_OWNER = {
    "apiVersion": "azimuth.stackhpc.com/v1alpha1",
    "kind": "Cluster",
    "name": "c",
    "uid": "cluster-uid",
    "blockOwnerDeletion": True,
}


def lease(phase: str | None = None, *, owners: list[Json] | None = None, **extra: Any) -> Json:
    meta: Json = {"namespace": "ns", "name": "kube-c", "uid": "lease-uid"}
    meta["ownerReferences"] = [PORTAL_OWNER] if owners is None else owners
    meta.update(extra.pop("meta", {}))
    return {"metadata": meta, "status": {**({"phase": phase} if phase else {}), **extra}}


def deleting(obj: Json, *finalizers: str) -> Json:
    meta = obj["metadata"]
    meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizers:
        meta["finalizers"] = list(finalizers)
    return obj


@pytest.fixture
def svc() -> Service:
    return Service()


# --- holding -------------------------------------------------------------------------------


async def test_lease_is_adopted_and_its_activity_reported(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active", owners=[], sizeNameMap={"small": "res-small"}))
    await svc.event(CLUSTER, "c")
    [ops] = svc.kube.patches
    assert ops[0]["op"] == "test"
    assert ops[0]["path"] == "/metadata/resourceVersion"
    held = svc.kube.obj(LEASE, "kube-c")["metadata"]
    assert held["finalizers"] == [FINALIZER]
    assert held["ownerReferences"] == [PORTAL_OWNER]
    [status] = svc.bus.statuses()
    assert status.patch == {"leasePhase": "Active"}
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [
        ("LeaseReady", "True", "Active")
    ]
    [ready] = svc.bus.prerequisites()
    assert (ready.ready, ready.reason, ready.generation) == (True, "Active", 2)
    assert ready.outputs == {"sizeNameMap": {"small": "res-small"}}
    assert ready.ref.uid == "cluster-uid"


async def test_an_adopted_lease_is_not_patched_again(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active", meta={"finalizers": ["other", FINALIZER]}))
    await svc.event(CLUSTER, "c")
    await svc.event(LEASE, "kube-c")
    assert svc.kube.patches == []


async def test_the_portal_owner_reference_is_kept_and_ours_not_duplicated(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Pending"))
    await svc.event(LEASE, "kube-c")
    await svc.event(LEASE, "kube-c")
    [ops] = svc.kube.patches
    assert [op["path"] for op in ops] == ["/metadata/resourceVersion", "/metadata/finalizers"]
    assert svc.kube.obj(LEASE, "kube-c")["metadata"]["ownerReferences"] == [PORTAL_OWNER]


async def test_redelivery_stores_nothing_twice(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active"))
    cluster_event, lease_event = svc.changed(CLUSTER, "c"), svc.changed(LEASE, "kube-c")
    for _ in range(3):
        await svc.deliver("cluster", cluster_event)
    assert len(svc.bus.prerequisites()) == 1
    assert len(svc.bus.statuses()) == 1
    for _ in range(3):
        await svc.deliver("lease", lease_event)
    assert len(svc.bus.prerequisites()) == 1
    # The writer has not caught up, so the Lease event says it again: once, as its own cause.
    assert [s.causation_id for s in svc.bus.statuses()] == [cluster_event.id, lease_event.id]


async def test_a_status_report_is_the_clusters_story_caused_by_the_event(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active"))
    event = svc.changed(CLUSTER, "c")
    await svc.deliver("cluster", event)
    [status] = svc.bus.statuses()
    assert (status.ref.uid, status.correlation_id, status.causation_id) == (
        "cluster-uid",
        "cluster:ns/c",
        event.id,
    )
    assert status.source == "lease/r1"


async def test_once_the_writer_caught_up_nothing_is_even_sent(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active"))
    await svc.event(CLUSTER, "c")
    svc.write_status()
    sent = svc.bus.attempts
    await svc.event(CLUSTER, "c")
    await svc.event(LEASE, "kube-c")
    assert svc.bus.attempts == sent


async def test_a_change_of_phase_is_reported_and_a_return_is_not_swallowed(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    for phase in ("Active", "Error", "Active"):
        svc.kube.put(LEASE, lease(phase, meta={"finalizers": [FINALIZER]}))
        await svc.event(LEASE, "kube-c")
        svc.write_status()
    assert [p.reason for p in svc.bus.prerequisites()] == ["Active", "LeaseError", "Active"]
    assert [s.patch.get("leasePhase") for s in svc.bus.statuses()] == ["Active", "Error", "Active"]
    assert svc.kube.obj(CLUSTER, "c")["status"]["leasePhase"] == "Active"


async def test_a_new_generation_gets_a_new_answer(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active", meta={"finalizers": [FINALIZER]}))
    await svc.event(CLUSTER, "c")
    svc.kube.obj(CLUSTER, "c")["metadata"]["generation"] = 3
    await svc.event(CLUSTER, "c")
    assert [p.generation for p in svc.bus.prerequisites()] == [2, 3]


async def test_lease_error_surfaces_the_schedule_operators_message(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Error", errorMessage="Blazar: not enough hosts"))
    await svc.event(LEASE, "kube-c")
    [condition] = svc.bus.statuses()[0].conditions
    assert (condition.status, condition.reason) == ("False", "LeaseError")
    assert condition.message == "Blazar: not enough hosts"
    [prerequisite] = svc.bus.prerequisites()
    assert (prerequisite.ready, prerequisite.detail) == (False, "Blazar: not enough hosts")


async def test_an_unknown_phase_is_reported_as_unknown_with_a_warning(
    svc: Service, caplog: pytest.LogCaptureFixture
) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Exploding"))
    with caplog.at_level(logging.WARNING):
        await svc.event(LEASE, "kube-c")
    assert "Exploding" in caplog.text
    assert svc.bus.statuses()[0].patch == {"leasePhase": "Unknown"}
    assert svc.bus.prerequisites()[0].detail == "lease is Unknown"


async def test_a_missing_lease_is_reported_not_found(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    await svc.event(CLUSTER, "c")
    [status] = svc.bus.statuses()
    assert status.patch == {"leasePhase": "Unknown"}
    assert status.conditions[0].reason == "LeaseNotFound"
    assert svc.bus.prerequisites()[0].reason == "LeaseNotFound"


async def test_a_concurrent_change_is_a_conflict_and_the_retry_keeps_both(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active", owners=[]))

    def schedule_operator_adds_its_finalizer() -> None:
        changed = copy.deepcopy(svc.kube.obj(LEASE, "kube-c"))
        changed["metadata"]["finalizers"] = ["scheduling.azimuth.stackhpc.com"]
        svc.kube.put(LEASE, changed)  # a new resourceVersion

    svc.kube.meanwhile = schedule_operator_adds_its_finalizer
    with pytest.raises(KubeConflict):
        await svc.event(CLUSTER, "c")
    await svc.event(CLUSTER, "c")  # the consumer's retry
    meta = svc.kube.obj(LEASE, "kube-c")["metadata"]
    assert meta["finalizers"] == ["scheduling.azimuth.stackhpc.com", FINALIZER]


async def test_a_real_rejection_is_reported_then_dead_lettered(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, lease("Active", owners=[]))

    svc.kube.fail("patch", KubeInvalid("422 metadata.ownerReferences: Invalid value"))
    with pytest.raises(KubeInvalid):
        await svc.event(CLUSTER, "c")
    [status] = svc.bus.statuses()
    assert status.patch == {}
    assert status.conditions[0].reason == "LeasePatchRejected"
    assert "ownerReferences: Invalid value" in status.conditions[0].message
    [prerequisite] = svc.bus.prerequisites()
    assert (prerequisite.ready, prerequisite.reason) == (False, "LeasePatchRejected")


async def test_a_paused_cluster_mirrors_its_lease_phase_but_does_not_adopt_it(
    svc: Service,
) -> None:
    svc.kube.put(CLUSTER, cluster(paused=True))
    svc.kube.put(LEASE, lease("Active", owners=[]))
    await svc.event(CLUSTER, "c")
    svc.write_status()
    svc.kube.put(LEASE, lease("Error", owners=[], errorMessage="no hosts"))
    await svc.event(LEASE, "kube-c")  # ownerless: a nudge into the Cluster's partition
    [nudge] = svc.bus.of(ReconcileCluster)
    await svc.deliver("reconcile", nudge)
    assert svc.kube.patches == []
    assert svc.bus.prerequisites() == []
    statuses = svc.bus.statuses()
    assert [s.patch for s in statuses] == [{"leasePhase": "Active"}, {"leasePhase": "Error"}]
    assert [(c.reason, c.message) for s in statuses for c in s.conditions] == [
        ("Active", ""),
        ("LeaseError", "no hosts"),
    ]


async def test_unpausing_adopts_the_lease(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster(paused=True))
    svc.kube.put(LEASE, lease("Active", owners=[]))
    await svc.event(CLUSTER, "c")
    svc.write_status()
    svc.kube.put(CLUSTER, {**cluster(), "status": svc.kube.obj(CLUSTER, "c")["status"]})
    await svc.event(CLUSTER, "c")
    assert svc.kube.obj(LEASE, "kube-c")["metadata"]["finalizers"] == [FINALIZER]
    [ready] = svc.bus.prerequisites()
    assert ready.ready
    assert len(svc.bus.statuses()) == 1  # the phase was already there


async def test_a_cluster_without_lease_is_none_of_our_business(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster(leaseName=None))
    await svc.event(CLUSTER, "c")
    await svc.event(CLUSTER, "c", "DELETED")
    assert svc.bus.published == []
    assert svc.kube.reads == 0  # its events say so: a switched-off prerequisite costs nothing


async def test_a_nudge_for_a_cluster_without_lease_reads_it(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster(leaseName=None))
    nudge = ReconcileCluster(
        source="t", correlation_id="cluster:ns/c", ref=svc.changed(CLUSTER, "c").ref, reason="t"
    )
    await svc.deliver("reconcile", nudge)
    assert svc.kube.reads == 1  # a nudge carries no object: the Cluster is read
    assert svc.bus.published == []


async def test_a_deleting_lease_gets_no_new_finalizer(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(LEASE, deleting(lease("Terminating"), "scheduling.azimuth.stackhpc.com"))
    await svc.event(LEASE, "kube-c")
    assert svc.kube.patches == []
    assert svc.bus.prerequisites()[0].detail == "lease is Terminating"


# --- ownerless Leases ----------------------------------------------------------------------


async def test_an_ownerless_lease_nudges_the_clusters_that_name_it(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(CLUSTER, {**cluster(), "metadata": {"namespace": "ns", "name": "other"}})
    svc.kube.obj(CLUSTER, "other")["spec"]["leaseName"] = "kube-other"
    ownerless = svc.kube.put(LEASE, lease("Active", owners=[], meta={"finalizers": [FINALIZER]}))
    event = changed(LEASE, ownerless)
    await svc.deliver("lease", event)
    await svc.deliver("lease", event)  # redelivered
    nudges = svc.bus.of(ReconcileCluster)
    assert [(n.ref.name, n.ref.uid) for n in nudges] == [("c", "cluster-uid")]
    [(subject, _)] = [(s, m) for s, m in svc.bus.published if isinstance(m, ReconcileCluster)]
    assert subject == subjects.reconcile(PARTITION, "ns", "c")
    assert nudges[0].causation_id == event.id
    assert svc.kube.patches == []
    await svc.deliver("reconcile", nudges[0])
    assert svc.kube.obj(LEASE, "kube-c")["metadata"]["ownerReferences"] == [PORTAL_OWNER]


# --- releasing -----------------------------------------------------------------------------


async def test_release_waits_for_the_cluster_api_cluster(svc: Service) -> None:
    svc.kube.put(CLUSTER, deleting(cluster(paused=True), "capibus/helm"))
    held = lease("Active", meta={"finalizers": ["scheduling.azimuth.stackhpc.com", FINALIZER]})
    svc.kube.put(LEASE, held)
    svc.kube.put(CAPI_CLUSTER, {"metadata": {"namespace": "ns", "name": "c"}})
    await svc.event(CLUSTER, "c")
    svc.write_status()
    await svc.event(CLUSTER, "c")
    await svc.event(LEASE, "kube-c")
    assert svc.kube.patches == []
    [waiting] = svc.bus.statuses()
    assert waiting.patch == {}
    assert waiting.conditions[0].reason == "WaitingForClusterAPI"
    assert svc.bus.prerequisites() == []

    del svc.kube.objects[(CAPI_CLUSTER.token, "ns", "c")]
    await svc.event(CAPI_CLUSTER, "c", "DELETED")
    meta = svc.kube.obj(LEASE, "kube-c")["metadata"]
    assert meta["finalizers"] == ["scheduling.azimuth.stackhpc.com"]
    [released] = svc.bus.prerequisites()
    assert (released.ready, released.reason, released.released) == (True, "Released", True)
    await svc.event(CAPI_CLUSTER, "c", "DELETED")
    await svc.event(LEASE, "kube-c")
    assert len(svc.bus.prerequisites()) == 1
    assert len(svc.kube.patches) == 1


async def test_other_cluster_api_events_cost_nothing(svc: Service) -> None:
    svc.kube.put(CLUSTER, cluster())
    svc.kube.put(CAPI_CLUSTER, {"metadata": {"namespace": "ns", "name": "c"}})
    await svc.event(CAPI_CLUSTER, "c", "MODIFIED")
    assert svc.kube.reads == 0


async def test_a_gone_cluster_is_known_from_its_last_event(svc: Service) -> None:
    last = changed(CLUSTER, cluster(), "DELETED")
    subject = subjects.resource_event("cluster", PARTITION, "ns", "c")
    await svc.bus.publish(subject, last)
    svc.kube.put(LEASE, deleting(lease("Active"), FINALIZER))
    await svc.event(CAPI_CLUSTER, "c", "DELETED")
    assert (LEASE.token, "ns", "kube-c") not in svc.kube.objects  # our finalizer was the last
    [released] = svc.bus.prerequisites()
    assert released.released
    assert released.ref.uid == "cluster-uid"
    assert svc.bus.statuses() == []  # no Cluster left to write to


async def test_without_history_the_lease_owner_names_the_cluster(svc: Service) -> None:
    svc.kube.put(LEASE, lease("Active", meta={"finalizers": [FINALIZER, "other"]}))
    await svc.event(LEASE, "kube-c")
    assert svc.kube.obj(LEASE, "kube-c")["metadata"]["finalizers"] == ["other"]
    [released] = svc.bus.prerequisites()
    assert (released.ref.name, released.ref.uid, released.released) == ("c", "cluster-uid", True)


async def test_a_lease_already_gone_is_released_without_a_patch(svc: Service) -> None:
    svc.kube.put(CLUSTER, deleting(cluster(), "capibus/helm"))
    await svc.event(CLUSTER, "c")
    assert svc.kube.patches == []
    assert svc.bus.prerequisites()[0].released


# --- settings ------------------------------------------------------------------------------


def test_the_lease_section_does_not_collide_with_the_partition_lease_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CAPIBUS_LEASE_TTL", "3")
    monkeypatch.setenv("CAPIBUS_LEASE__FINALIZER", "example.org/hold")
    monkeypatch.setenv("CAPIBUS_LEASE__COALESCE_SECONDS", "0.5")
    settings = LeaseSettings()
    assert settings.lease_ttl == 3
    assert (settings.lease.finalizer, settings.lease.coalesce_seconds) == ("example.org/hold", 0.5)
    monkeypatch.delenv("CAPIBUS_LEASE__FINALIZER")
    assert LeaseSettings().lease.finalizer == FINALIZER


def test_only_a_cluster_api_clusters_deletion_is_not_held_back() -> None:
    deps = dependencies(LeaseSettings(), kube=FakeKube(), bus=FakeBus())
    coalesced = {s.name: s.coalesce_seconds > 0 for s in ROUTES.bind(deps, coalesce_seconds=0.05)}
    # Its other events cost nothing, so a window would only delay the release.
    assert coalesced == {"cluster": True, "lease": True, "capicluster": False, "reconcile": True}
