"""``services.replay``: a service's handlers fed stored messages on recorder ports, and the
comparison of what they decide now with what the streams say they did.

The "streams" are plain ``Stored`` values. What a service did then is made by running the
same handlers for real against the shared fakes (``tests.fakes``), in a world as it was; the
replay then runs in a world as it is now, on recorder ports over another ``FakeKube``, whose
``calls`` show that the replay only read.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.helm.app import ROUTES as HELM_ROUTES
from services.helm.bootstrap import dependencies
from services.helm.settings import HelmSettings
from services.replay import (
    Mark,
    Report,
    Sources,
    Step,
    Stored,
    Unsupported,
    compare,
    gist,
    replay,
    routed,
    target,
)
from services.replay_ports import Call, Recorder, RecordingKube
from shared import subjects
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeNotFound
from shared.helm import Chart, ChartRef, ReleaseOutcome, Revision
from shared.kube import ResourceKind
from shared.messages import (
    Condition,
    Message,
    MessageDeadLettered,
    ObjectRef,
    PatchStatus,
    ReconcileCluster,
    ResourceChanged,
    StatusWritten,
)
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, SECRET
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
FINALIZER = "azimuth.stackhpc.com/finalizer"
SETTINGS = HelmSettings()
T0 = datetime(2026, 11, 28, 6, 0, tzinfo=UTC)


class Kube(FakeKube):
    """The shared fake with discovery, which the helm service's port includes."""

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        return ResourceKind(kind.lower(), group, version or "v1", kind, f"{kind.lower()}s")

    def writes(self) -> list[tuple[str, str, str | None, str]]:
        return [c for c in self.calls if c[0] not in ("get", "list")]


@dataclass
class HelmThen:
    """The helm binary as the service ran it then: every install is revision 1."""

    installs: list[Json] = field(default_factory=list)

    async def ensure_release(
        self, name: str, namespace: str, chart: Any, values: Json, *, absent: bool = False
    ) -> ReleaseOutcome:
        self.installs.append(values)
        return ReleaseOutcome(1, "deployed", "installed")

    async def uninstall(self, name: str, namespace: str) -> bool:
        return True

    async def template(self, chart: Any, release: str, namespace: str, values: Json) -> list[Json]:
        return []


@dataclass
class HelmNow:
    """Helm's read commands now: ``release`` is what ``helm get metadata`` says (None: none)."""

    release: Revision | None = None
    deployed_values: Json = field(default_factory=dict)

    async def status(self, name: str, namespace: str) -> Revision | None:
        return self.release

    async def show_chart(self, chart: ChartRef) -> Chart:
        return Chart("openstack-cluster", "0.27.0")

    async def values(self, name: str, namespace: str, revision: int) -> Json:
        return self.deployed_values

    async def template(
        self, chart: ChartRef, release: str, namespace: str, values: Json
    ) -> list[Json]:
        return []


def world(*, template: bool = True) -> Kube:
    """A Cluster with our finalizer, its credentials and (unless not) its template."""
    kube = Kube()
    kube.put(
        CLUSTER,
        {
            "metadata": {
                "name": "c",
                "namespace": "ns",
                "uid": "u1",
                "generation": 1,
                "finalizers": [FINALIZER],
            },
            "spec": {
                "label": "c",
                "templateName": "t",
                "cloudCredentialsSecretName": "creds",
                "controlPlaneMachineSize": "m1.small",
                "nodeGroups": [{"name": "md-0", "machineSize": "m1.small", "count": 1}],
            },
        },
    )
    clouds = base64.b64encode(b"clouds:\n  openstack:\n    auth:\n      project_id: p1\n").decode()
    kube.put(
        SECRET, {"metadata": {"name": "creds", "namespace": "ns"}, "data": {"clouds.yaml": clouds}}
    )
    kube.put(SECRET, {"metadata": {"name": "c-etcd-key", "namespace": "ns"}, "data": {}})
    if template:
        kube.put(
            CLUSTER_TEMPLATE,
            {"metadata": {"name": "t"}, "spec": {"values": {"kubernetesVersion": "1.34.2"}}},
        )
    return kube


REF = ObjectRef(api_version=CLUSTER.api_version, kind="Cluster", namespace="ns", name="c", uid="u1")


def event(at: int = 0) -> Stored:
    """The watcher's event for the Cluster, as stored."""
    message = ResourceChanged(
        source="watcher/w1",
        correlation_id="cluster:ns/c",
        time=T0 + timedelta(seconds=at),
        event="MODIFIED",
        ref=REF,
        resource_version=str(at + 1),
        object={},
    )
    subject = subjects.resource_event("cluster", subjects.partition_of("ns/c", 16), "ns", "c")
    return Stored(subjects.EVENTS.name, at + 1, subject, message, message.id)


async def then(kube: Kube, *inputs: Stored) -> list[Stored]:
    """What the helm service published for ``inputs``, run for real on the fakes."""
    bus = FakeBus()
    deps = dependencies(SETTINGS, kube=kube, helm=HelmThen(), bus=bus)
    try:
        for item in inputs:
            batch = Batch(key="ns/c", partition=0, messages=(item.message,))
            for route, _ in routed(HELM_ROUTES, [item]):
                await route.handle(batch, deps)
    finally:
        deps.timers.cancel_all()
    return [
        Stored(subjects.STATUS.name, 100 + n, subject, message, message.id)
        for n, (subject, message) in enumerate(bus.published)
    ]


async def now(kube: Kube, helm: HelmNow, inputs: list[Stored]) -> list[Step]:
    built, record = target("helm", Sources(kube=kube, bus=FakeBus(), helm=helm), SETTINGS)
    return await replay(built, record, inputs)


def marks(report: Report) -> list[tuple[str, str, str]]:
    return [(str(d.mark), d.port, d.verb) for s in report.steps for d in s.decisions]


# --- the two cases the command is for ------------------------------------------------------------


async def test_a_decision_equal_to_the_journal_shows_no_difference() -> None:
    inputs = [event()]
    history = [*inputs, *await then(world(), *inputs)]

    kube = world()
    steps = await now(kube, HelmNow(), inputs)
    report = compare("helm", steps, history)

    assert marks(report) == [
        ("·", "helm", "install"),
        ("=", "bus", "publish"),  # the cluster-template label and the annotation
        ("=", "bus", "publish"),  # Reconciled=True(Deployed): revision 1
    ]
    assert report.differences == 0
    (install, *_) = report.steps[0].decisions
    assert install.target == "release ns/c"
    assert "would install revision 1" in install.text
    assert kube.writes() == []  # read only: nothing reached the API server


async def test_a_changed_decision_is_shown_as_a_difference() -> None:
    inputs = [event()]
    history = [*inputs, *await then(world(template=False), *inputs)]  # it was missing then

    release = Revision(1, "deployed", "openstack-cluster", "0.27.0")
    kube = world()
    stored = {
        "name": "sh.helm.release.v1.c.v1",
        "namespace": "ns",
        "labels": {"owner": "helm", "name": "c"},
    }
    kube.put(SECRET, {"metadata": stored})  # Helm's record of revision 1
    steps = await now(kube, HelmNow(release, deployed_values={"stale": True}), inputs)
    report = compare("helm", steps, history)

    (step,) = report.steps
    by_mark = {(str(d.mark), d.text.split(":")[0]) for d in step.decisions}
    assert ("-", "status Reconciled=False(TemplateNotFound)") in by_mark
    assert ("+", "status Reconciled=True(Deployed)") in by_mark
    upgrade = next(d for d in step.decisions if d.port == "helm")
    assert "would upgrade revision 1 (deployed) to 2" in upgrade.text
    assert report.differences == 3  # the status now and then, the label only now
    assert kube.writes() == []


# --- comparing ---------------------------------------------------------------------------------


def nudge(reason: str, cause: Message | None = None, source: str = "helm/h1") -> ReconcileCluster:
    caused = cause.caused() if cause else {"correlation_id": "cluster:ns/c"}
    return ReconcileCluster(source=source, ref=REF, reason=reason, **caused)


def published(message: Message) -> Call:
    return Call("bus", "publish", "s", message=message, published=True)


def test_a_decision_the_consumer_made_for_a_batch_matches_under_an_earlier_message() -> None:
    first, second = event(0), event(1)
    steps = [
        Step(first, "clusters", (published(nudge("wake")),)),
        Step(second, "clusters", ()),
    ]
    history = [first, second, Stored("CAPIBUS_LIFECYCLE", 9, "s", nudge("wake", second.message))]
    report = compare("helm", steps, history)
    assert marks(report) == [("=", "bus", "publish")]
    assert report.steps[0].decisions[0].stored == history[-1]


def test_only_the_services_own_messages_caused_by_a_replayed_one_count() -> None:
    first = event(0)
    history = [
        first,
        Stored("CAPIBUS_LIFECYCLE", 7, "s", nudge("other service", first.message, "lease/l1")),
        Stored("CAPIBUS_LIFECYCLE", 8, "s", nudge("another cause")),
        Stored("CAPIBUS_LIFECYCLE", 9, "s", nudge("gone", first.message)),
    ]
    report = compare("helm", [Step(first, "clusters", ())], history)
    (decision,) = report.steps[0].decisions
    assert (decision.mark, decision.text) == (Mark.THEN_ONLY, "nudge gone")


def test_a_permanent_failure_is_compared_with_the_dead_letter() -> None:
    first = event(0)
    letter = MessageDeadLettered(
        source="helm",
        correlation_id="deadletter:s",
        causation_id=first.msg_id,
        service="helm",
        original_subject=first.subject,
        original_id=first.msg_id,
        error="HelmRejected: no",
        reason="ChartRenderFailed",
        deliveries=1,
        payload="{}",
        payload_size=2,
    )
    failed = Call("consumer", "dead letter", "ChartRenderFailed", "HelmRejected: no")
    retried = Call("consumer", "retry", "HelmUnavailable", "down")
    history = [first, Stored("CAPIBUS_DEADLETTER", 3, "s", letter)]
    report = compare("helm", [Step(first, "clusters", (retried, failed))], history)
    assert marks(report) == [("·", "consumer", "retry"), ("=", "consumer", "dead letter")]


def test_a_gist_keeps_the_decision_and_drops_what_differs_between_runs() -> None:
    def deployed(at: datetime, message: str = "revision 1") -> PatchStatus:
        condition = Condition(type="Reconciled", status="True", reason="Deployed", message=message)
        return PatchStatus(
            source="helm/a",
            correlation_id="c",
            ref=REF,
            conditions=(condition,),
            patch={"lastUpdated": at.strftime("%Y-%m-%dT%H:%M:%SZ")},
        )

    assert gist(deployed(T0)) == gist(deployed(T0 + timedelta(hours=1)))
    assert gist(deployed(T0)) != gist(deployed(T0, "revision 2"))
    written = StatusWritten(
        source="writer/x",
        correlation_id="c",
        ref=REF,
        update_ids=["a"],
        resource_version="5",
        writer="x",
        started=T0,
        finished=T0,
    )
    assert gist(written) == "journal status written"


# --- feeding and recording ---------------------------------------------------------------------


def test_each_message_goes_to_every_route_that_consumes_it() -> None:
    cluster, message = event(0), nudge("wake")
    lifecycle = Stored(
        subjects.LIFECYCLE.name, 2, subjects.reconcile(3, "ns", "c"), message, message.id
    )
    elsewhere = Stored(subjects.STATUS.name, 3, cluster.subject, cluster.message)
    got = [
        (route.name, item.sequence)
        for route, item in routed(HELM_ROUTES, [cluster, lifecycle, elsewhere])
    ]
    assert got == [("clusters", 1), ("nudges", 2)]


def test_a_service_replay_has_no_recorders_for_is_refused() -> None:
    with pytest.raises(Unsupported, match="replay not supported for catalog yet"):
        target("catalog", Sources(kube=Kube(), bus=FakeBus()))


async def test_writes_land_in_the_overlay_only_and_fail_as_the_server_would() -> None:
    source, record = world(), Recorder()
    kube = RecordingKube(source, record)
    made = await kube.create(
        SECRET, {"metadata": {"name": "new", "namespace": "ns"}, "stringData": {"k": "v"}}
    )
    assert (await kube.get(SECRET, "ns", "new"))["metadata"]["uid"] == made["metadata"]["uid"]
    with pytest.raises(KubeConflict):
        await kube.create(SECRET, {"metadata": {"name": "new", "namespace": "ns"}})
    names = {s["metadata"]["name"] for s in (await kube.list(SECRET, namespace="ns"))[0]}
    assert names == {"creds", "c-etcd-key", "new"}

    cluster = await kube.get(CLUSTER, "ns", "c")
    stale = {"metadata": {"resourceVersion": "0"}, "status": {"phase": "Ready"}}
    with pytest.raises(KubeConflict):
        await kube.patch_merge(CLUSTER, "ns", "c", stale, subresource="status")
    fresh = {
        "metadata": {"resourceVersion": cluster["metadata"]["resourceVersion"]},
        "status": {"phase": "Ready"},
    }
    await kube.patch_merge(CLUSTER, "ns", "c", fresh, subresource="status")
    assert (await kube.get(CLUSTER, "ns", "c"))["status"] == {"phase": "Ready"}

    await kube.delete(SECRET, "ns", "creds")
    with pytest.raises(KubeNotFound):
        await kube.get(SECRET, "ns", "creds")
    calls = record.take()
    assert "v" not in calls[0].text  # what a Secret sets is named, never its data
    assert [(c.verb, c.target) for c in calls] == [
        ("create", "Secret ns/new"),
        ("create", "Secret ns/new"),
        ("patch", "Cluster ns/c /status"),
        ("patch", "Cluster ns/c /status"),
        ("delete", "Secret ns/creds"),
    ]
    assert source.writes() == []
    assert "status" not in (source.stored(CLUSTER, "ns", "c") or {})
    assert source.stored(SECRET, "ns", "creds") is not None


async def test_the_writers_status_write_is_recorded_never_sent_and_journaled_as_then() -> None:
    kube = world()
    patch = PatchStatus(
        source="helm/h1", correlation_id="cluster:ns/c", ref=REF, patch={"probe": "now"}
    )
    item = Stored(subjects.STATUS.name, 1, subjects.cluster_status(3, "ns", "c"), patch, patch.id)
    written = StatusWritten(
        source="writer/w1",
        **patch.caused(),
        ref=REF,
        update_ids=[patch.id],
        resource_version="9",
        writer="w1",
        started=T0,
        finished=T0,
    )
    built, record = target("writer", Sources(kube=kube, bus=FakeBus()))
    steps = await replay(built, record, [item])
    report = compare("writer", steps, [item, Stored(subjects.JOURNAL.name, 2, "j", written)])

    decisions = report.steps[0].decisions
    (write,) = [d for d in decisions if d.port == "kube"]
    assert (write.mark, write.verb, write.target) == (
        Mark.UNRECORDED,
        "patch",
        "Cluster ns/c /status",
    )
    assert '"probe":"now"' in write.text
    (journal,) = [d for d in decisions if d.port == "bus"]
    assert (journal.mark, journal.text) == (Mark.SAME, "journal status written")
    assert report.differences == 0
    assert kube.writes() == []
