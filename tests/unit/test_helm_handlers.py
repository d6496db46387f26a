"""The helm service's handlers through its ``Deps`` and routes, against the shared fakes.

``FakeKube`` (``tests.fakes``) plays the API server; ``Kube`` adds what this service needs of
it beyond the shared fake: ``stringData`` folded into ``data`` on create, as the API server
does, and discovery (``resolve``), recorded. ``FakeBus`` drops a repeated message id like
JetStream and answers ``last_message``, so a prerequisite fact is published where the
identity or lease service would publish it. ``FakeHelm`` and ``FakeRegistrar`` stand in for
the helm binary and the Zenith registrar. Every run is caused by a new nudge, so a message
that is not sent again was held back by the service, not dropped as a duplicate.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.helm import logic
from services.helm.app import ROUTES, DeadlineClaims
from services.helm.bootstrap import dependencies
from services.helm.handlers import on_cluster_message, on_secret_event, on_template_event
from services.helm.ports import Deps
from services.helm.settings import HelmSettings
from shared import subjects
from shared.claims import Claim
from shared.consumer import Batch
from shared.errors import PermanentError
from shared.helm import Completed, Helm, HelmForbidden, HelmUnavailable
from shared.kube import ResourceKind
from shared.messages import (
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
    stable_id,
)
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, SECRET
from shared.zenith import RegistrarConflict
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
FINALIZER = "azimuth.stackhpc.com/finalizer"
LAST_HANDLED = "azimuth.stackhpc.com/last-handled-configuration"


class Kube(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        self.resolved: list[tuple[str, str, str | None]] = []

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        data = {
            k: base64.b64encode(v.encode()).decode() for k, v in obj.get("stringData", {}).items()
        }
        stored = {k: v for k, v in obj.items() if k != "stringData"}
        return await super().create(kind, {**stored, "data": {**obj.get("data", {}), **data}})

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        self.resolved.append((group, kind, version))
        return ResourceKind(kind.lower(), group, version or "v1", kind, f"{kind.lower()}s")

    def deleted(self) -> list[tuple[str, str]]:
        return [(kind, name) for verb, kind, _, name in self.calls if verb == "delete"]


@dataclass
class Outcome:
    revision: int
    action: str


@dataclass
class FakeHelm:
    installs: list[Json] = field(default_factory=list)
    #: what each install was told: no revision stored, helm's own checks skipped
    absent: list[bool] = field(default_factory=list)
    uninstalls: int = 0

    async def ensure_release(
        self, name: str, namespace: str, chart: Any, values: Json, *, absent: bool = False
    ) -> Outcome:
        self.installs.append(values)
        self.absent.append(absent)
        return Outcome(len(self.installs), "installed" if len(self.installs) == 1 else "upgraded")

    async def uninstall(self, name: str, namespace: str) -> bool:
        self.uninstalls += 1
        return True

    async def template(self, chart: Any, release: str, namespace: str, values: Json) -> list[Json]:
        return [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "c"},
                "data": {"a": "x"},
            },
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
        ]


@dataclass
class FakeRegistrar:
    conflict: bool = False
    calls: int = 0

    async def reserve(self, public_key: str, subdomain: str | None = None) -> Any:
        self.calls += 1
        if self.conflict:
            raise RegistrarConflict("key already associated")
        return Outcome(0, "")  # never used: conflict tests only


def cluster(**spec: Any) -> Json:
    return {
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
            **spec,
        },
    }


#: every Deps a test built, so its timers are cancelled when the test ends
BUILT: list[Deps] = []


@pytest.fixture(autouse=True)
async def no_timer_outlives_its_test() -> AsyncIterator[None]:
    yield
    while BUILT:
        BUILT.pop().timers.cancel_all()


def world(
    *, oidc: bool = False, registrar: FakeRegistrar | None = None, **tuning: Any
) -> tuple[Deps, Kube, FakeHelm, FakeBus]:
    kube, helm, bus = Kube(), FakeHelm(), FakeBus()
    env: Json = {
        "azimuth": {"oidc_enabled": oidc, "zenith_enabled": registrar is not None},
        "helm": tuning,
    }
    if registrar:
        env["helm"]["zenith"] = {
            "registrar_admin_url": "http://r",
            "sshd_host": "s",
            "base_domain": "zenith.test",
        }
    settings = HelmSettings.model_validate(env)
    deps = dependencies(settings, kube=kube, helm=helm, bus=bus, registrar=registrar)
    BUILT.append(deps)
    kube.put(
        CLUSTER_TEMPLATE,
        {"metadata": {"name": "t"}, "spec": {"values": {"kubernetesVersion": "1.34.2"}}},
    )
    clouds = "clouds:\n  openstack:\n    auth:\n      project_id: p1\n"
    kube.put(
        SECRET,
        {
            "metadata": {"name": "creds", "namespace": "ns"},
            "data": {"clouds.yaml": base64.b64encode(clouds.encode()).decode()},
        },
    )
    return deps, kube, helm, bus


def ref(name: str = "c", uid: str | None = "u1") -> ObjectRef:
    return ObjectRef(
        api_version="azimuth.stackhpc.com/v1alpha1",
        kind="Cluster",
        namespace="ns",
        name=name,
        uid=uid,
    )


def partition(deps: Deps, key: str = "ns/c") -> int:
    return subjects.partition_of(key, deps.partitions)


async def reconcile(deps: Deps, name: str = "c") -> None:
    """One run for Cluster ``ns/<name>``, caused by a new nudge."""
    nudge = ReconcileCluster(
        source="test", correlation_id=f"cluster:ns/{name}", ref=ref(name, None), reason="test"
    )
    key = f"ns/{name}"
    await on_cluster_message(
        Batch(key=key, partition=partition(deps, key), messages=(nudge,)), deps
    )


async def publish_fact(deps: Deps, bus: FakeBus, fact: PrerequisiteChanged) -> None:
    """Publish ``fact`` where the identity or lease service publishes it."""
    subject = subjects.prerequisite(fact.step, partition(deps), "ns", "c")
    await bus.publish(subject, fact)


def reasons(bus: FakeBus) -> list[str]:
    return [c.reason for m in bus.of(PatchStatus) for c in m.conditions]


async def test_nothing_with_a_lifetime_is_made_before_the_finalizer() -> None:
    deps, kube, helm, bus = world()
    body = cluster()
    body["metadata"]["finalizers"] = []
    kube.put(CLUSTER, body)
    await reconcile(deps)
    (command,) = bus.of(PatchMetadata)
    assert command.add_finalizers == (FINALIZER,)
    assert helm.installs == []
    assert kube.stored(SECRET, "ns", "c-etcd-key") is None


async def test_a_missing_template_is_a_reason_not_a_retry_loop() -> None:
    deps, kube, helm, bus = world()
    kube.put(CLUSTER, cluster(templateName="absent"))
    await reconcile(deps)
    await reconcile(deps)
    assert reasons(bus) == ["TemplateNotFound"]  # the repeated wait is not re-sent
    assert helm.installs == []


async def test_identity_must_answer_for_the_current_generation_before_helm() -> None:
    deps, kube, helm, bus = world(oidc=True)
    kube.put(CLUSTER, cluster())
    await reconcile(deps)
    assert reasons(bus) == ["WaitingForIdentity"]
    await publish_fact(deps, bus, identity_fact(generation=0))
    await reconcile(deps)
    assert helm.installs == []
    await publish_fact(deps, bus, identity_fact(generation=1))
    await reconcile(deps)
    (values,) = helm.installs
    assert values["oidc"]["issuerUrl"] == "https://idp/realms/ns"
    assert "oidc-default-rbac" in values["addons"]["custom"]


async def test_install_once_then_label_and_annotate_only_that_generation() -> None:
    deps, kube, helm, bus = world()
    kube.put(CLUSTER, cluster())
    await reconcile(deps)
    await reconcile(deps)
    assert len(helm.installs) == 1
    (command,) = bus.of(PatchMetadata)
    assert command.if_generation == 1
    assert command.labels == {"azimuth.stackhpc.com/cluster-template": "t"}
    handled = json.loads(
        command.annotations["azimuth.stackhpc.com/last-handled-configuration"] or ""
    )
    assert handled["spec"]["templateName"] == "t"
    assert kube.stored(SECRET, "ns", "c-etcd-key") is not None


async def test_an_annotation_that_names_the_spec_already_is_left_as_it_is() -> None:
    # kopf's diff-base, as the upstream operator left it: the spec and the labels.
    deps, kube, _, bus = world()
    taken_over = cluster()
    essence = {"spec": taken_over["spec"], "metadata": {"labels": {"x": "y"}}}
    last = json.dumps(essence, separators=(",", ":")) + "\n"
    taken_over["metadata"]["annotations"] = {LAST_HANDLED: last}
    kube.put(CLUSTER, taken_over)
    await reconcile(deps)
    (command,) = bus.of(PatchMetadata)
    assert command.annotations == {}
    assert command.labels == {"azimuth.stackhpc.com/cluster-template": "t"}


@pytest.mark.parametrize("last", ["{not json", '{"spec": {"label": "older"}}', "[]"])
async def test_an_annotation_that_names_another_spec_is_written(last: str) -> None:
    deps, kube, _, bus = world()
    changed = cluster()
    changed["metadata"]["annotations"] = {LAST_HANDLED: last}
    kube.put(CLUSTER, changed)
    await reconcile(deps)
    (command,) = bus.of(PatchMetadata)
    assert json.loads(command.annotations[LAST_HANDLED] or "")["spec"] == changed["spec"]


async def test_a_release_with_no_stored_revision_is_installed_without_helms_checks() -> None:
    deps, kube, helm, _ = world()
    kube.put(CLUSTER, cluster())
    await reconcile(deps)
    assert helm.absent == [True]
    lists = [c for c in kube.calls if c[0] == "list" and c[1] == SECRET.kind]
    assert len(lists) == 1


async def test_a_stored_revision_takes_helms_checks() -> None:
    deps, kube, helm, _ = world()
    kube.put(CLUSTER, cluster())
    # What a helm killed mid-install leaves: its storage Secret, pending-install.
    labels = {"owner": "helm", "name": "c", "status": "pending-install", "version": "1"}
    kube.put(SECRET, {"metadata": {"name": "sh.helm.release.v1.c.v1", "namespace": "ns",
                                   "labels": labels}})  # fmt: skip
    await reconcile(deps)
    assert helm.absent == [False]


async def test_a_release_this_replica_installed_is_not_looked_up_again() -> None:
    deps, kube, helm, _ = world()
    kube.put(CLUSTER, cluster())
    await reconcile(deps)
    spec_change = cluster(controlPlaneMachineSize="m1.medium")
    spec_change["metadata"]["generation"] = 2
    kube.put(CLUSTER, spec_change)
    await reconcile(deps)
    assert helm.absent == [True, False]
    lists = [c for c in kube.calls if c[0] == "list" and c[1] == SECRET.kind]
    assert len(lists) == 1


async def test_delete_waits_for_cluster_api_and_the_lease_before_the_finalizer() -> None:
    deps, kube, helm, bus = world()
    body = cluster(leaseName="kube-c")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(CLUSTER, body)
    kube.put(SECRET, {"metadata": {"name": "c-etcd-key", "namespace": "ns"}})
    capi = {
        "metadata": {"name": "c", "namespace": "ns", "finalizers": ["cluster.cluster.x-k8s.io"]},
        "status": {"phase": "Deleting"},
    }
    kube.put(CAPI_CLUSTER, capi)
    await reconcile(deps)
    assert helm.uninstalls == 1
    assert ("Secret", "c-etcd-key") in kube.deleted()
    assert reasons(bus)[-1] == "DeletionStuck"  # its deadline is long past
    await kube.delete(CAPI_CLUSTER, "ns", "c")
    await reconcile(deps)
    assert reasons(bus)[-1] == "WaitingForLeaseRelease"
    assert not bus.of(PatchMetadata)
    released = PrerequisiteChanged(
        source="lease",
        correlation_id="cluster:ns/c",
        ref=ref(),
        step="lease",
        generation=1,
        ready=True,
        reason="Released",
        released=True,
    )
    await publish_fact(deps, bus, released)
    await reconcile(deps)
    (command,) = bus.of(PatchMetadata)
    assert command.remove_finalizers == (FINALIZER,)
    assert helm.uninstalls == 1  # not repeated on every deletion event


async def test_zenith_conflict_on_a_fresh_reservation_leaves_no_secret() -> None:
    registrar = FakeRegistrar(conflict=True)
    deps, kube, helm, bus = world(registrar=registrar)
    kube.put(CLUSTER, cluster())
    await reconcile(deps)
    assert reasons(bus) == ["ZenithReservationConflict"]
    assert kube.stored(SECRET, "ns", "c-zenith-apiserver") is None
    assert helm.installs == []


async def test_zenith_reservation_interrupted_by_a_crash_is_finished_not_repeated() -> None:
    registrar = FakeRegistrar(conflict=True)  # our own earlier reserve, answered 409 now
    deps, kube, helm, _ = world(registrar=registrar)
    kube.put(CLUSTER, cluster())
    pending = {
        "metadata": {
            "name": "c-zenith-apiserver",
            "namespace": "ns",
            "annotations": {"azimuth.stackhpc.com/zenith-subdomain": "abc"},
        },
        "data": {
            "id_ed25519": base64.b64encode(b"private").decode(),
            "id_ed25519.pub": base64.b64encode(b"ssh-ed25519 AAAA").decode(),
        },
    }
    kube.put(SECRET, pending)
    await reconcile(deps)
    secret = kube.stored(SECRET, "ns", "c-zenith-apiserver") or {}
    annotations = secret["metadata"]["annotations"]
    assert annotations["azimuth.stackhpc.com/zenith-fqdn"] == "abc.zenith.test"
    assert registrar.calls == 1
    (values,) = helm.installs
    assert values["controlPlaneEndpoint"] == {"host": "abc.zenith.test", "port": 443}
    # the per-cluster operator's objects are applied where discovery says they are served
    assert kube.resolved == [("", "ConfigMap", "v1"), ("", "Pod", "v1")]


def identity_fact(*, generation: int) -> PrerequisiteChanged:
    return PrerequisiteChanged(
        source="identity",
        correlation_id="cluster:ns/c",
        ref=ref(),
        step="identity",
        generation=generation,
        ready=True,
        reason="Ready",
        outputs={
            "realmName": "ns",
            "issuerUrl": "https://idp/realms/ns",
            "clientId": "kube-c",
            "rootGroup": "/kube-c",
            "platformUsersGroup": "/platform-users",
        },
    )


# --- nudges and routes -----------------------------------------------------------------------


async def test_a_new_template_nudges_only_the_clusters_still_waiting_for_it() -> None:
    deps, kube, _, bus = world()
    kube.put(CLUSTER, cluster())
    done = cluster()
    done["metadata"].update(name="done", uid="u2")
    done["status"] = {"conditions": [{"type": "Reconciled", "status": "True"}]}
    kube.put(CLUSTER, done)
    event = ResourceChanged(
        source="watcher",
        correlation_id="clustertemplate:/t",
        event="MODIFIED",
        ref=ObjectRef(api_version=CLUSTER_TEMPLATE.api_version, kind="ClusterTemplate", name="t"),
        resource_version="2",
        object={"metadata": {"name": "t"}},
    )
    for _ in range(2):  # a redelivered event nudges once
        await on_template_event(Batch(key="/t", partition=0, messages=(event,)), deps)
    ((subject, nudge),) = bus.published
    assert subject == subjects.reconcile(partition(deps), "ns", "c")
    assert isinstance(nudge, ReconcileCluster)
    assert (nudge.ref.uid, nudge.reason, nudge.causation_id) == (
        "u1",
        "ClusterTemplate t changed",
        event.id,
    )


async def test_only_a_secret_that_may_be_credentials_looks_for_waiting_clusters() -> None:
    deps, kube, _, bus = world()
    kube.put(CLUSTER, cluster())

    def added(name: str, **extra: Any) -> Batch[ResourceChanged]:
        secret = {"metadata": {"name": name, "namespace": "ns"}, **extra}
        event = ResourceChanged(
            source="watcher",
            correlation_id=f"secret:ns/{name}",
            event="ADDED",
            ref=ObjectRef(api_version="v1", kind="Secret", namespace="ns", name=name),
            resource_version="1",
            object=secret,
        )
        return Batch(key=f"ns/{name}", partition=0, messages=(event,))

    # Helm's record of a release, written at every install: never cloud credentials.
    await on_secret_event(added("sh.helm.release.v1.c.v1", type="helm.sh/release.v1"), deps)
    # The etcd key the helm service makes says whose it is.
    etcd_key = logic.etcd_key_secret(cluster(), b"k")
    await on_secret_event(added("c-etcd-key", metadata=etcd_key["metadata"]), deps)
    assert [c for c in kube.calls if c[0] == "list"] == []
    await on_secret_event(added("creds", type="Opaque"), deps)
    (nudge,) = bus.of(ReconcileCluster)
    assert nudge.reason == "Secret creds appeared"


def test_the_clusters_own_messages_coalesce_and_the_rest_run_as_they_come() -> None:
    deps, *_ = world()
    coalesced = {s.name: s.coalesce_seconds > 0 for s in ROUTES.bind(deps, coalesce_seconds=0.02)}
    assert coalesced == {
        "clusters": True,
        "capiclusters": False,
        "prerequisites": True,
        "nudges": True,
        "templates": False,
        "secrets": False,
    }


# --- deleting --------------------------------------------------------------------------------


def being_deleted(kube: Kube, name: str = "c", **meta: Any) -> Json:
    """A Cluster being deleted whose CAPI Cluster is already gone."""
    body = cluster()
    body["metadata"].update(name=name, deletionTimestamp="2026-01-01T00:00:00Z", **meta)
    kube.put(CLUSTER, body)
    return body


@dataclass
class FailingUninstall(FakeHelm):
    error: Exception = field(default_factory=lambda: HelmUnavailable("unreachable"))

    async def uninstall(self, name: str, namespace: str) -> bool:
        self.uninstalls += 1
        raise self.error


async def test_a_deletion_says_so_before_helm_runs() -> None:
    deps, kube, helm, bus = world()
    being_deleted(kube)
    seen: list[list[str]] = []
    real_uninstall = helm.uninstall

    async def uninstall(name: str, namespace: str) -> bool:
        seen.append(reasons(bus))
        return await real_uninstall(name, namespace)

    helm.uninstall = uninstall  # type: ignore[method-assign]
    await reconcile(deps)
    assert seen == [["UninstallingRelease"]]
    (command,) = bus.of(PatchMetadata)  # nothing else to wait for
    assert command.remove_finalizers == (FINALIZER,)


async def test_a_temporary_failure_while_deleting_is_reported_and_retried() -> None:
    deps, kube, _, bus = world()
    deps = dataclasses.replace(deps, helm=FailingUninstall())
    being_deleted(kube)
    with pytest.raises(HelmUnavailable):
        await reconcile(deps)
    (*_, failed) = [c for m in bus.of(PatchStatus) for c in m.conditions]
    assert (failed.reason, failed.message) == ("HelmUnavailable", "deleting: unreachable")
    assert not bus.of(PatchMetadata)


async def test_a_permanent_failure_while_deleting_says_so_at_once_and_is_raised() -> None:
    deps, kube, _, bus = world()
    forbidden = HelmForbidden("secrets is forbidden: User x cannot list")
    deps = dataclasses.replace(deps, helm=FailingUninstall(error=forbidden))
    being_deleted(kube)
    with pytest.raises(PermanentError):
        await reconcile(deps)
    assert reasons(bus)[-1] == "HelmForbidden"
    assert "forbidden" in bus.of(PatchStatus)[-1].conditions[0].message


async def test_a_release_helm_cannot_name_counts_as_uninstalled_and_the_delete_completes() -> None:
    deps, kube, _, bus = world()

    async def never(argv: Any, stdin: Any, deadline: float) -> Completed:
        raise AssertionError(f"helm was run: {argv}")

    deps = dataclasses.replace(deps, helm=Helm(executor=never, home="/tmp/capibus-unit-helm"))
    name = "a" * 60
    being_deleted(kube, name=name)
    await reconcile(deps, name)
    (command,) = bus.of(PatchMetadata)
    assert command.remove_finalizers == (FINALIZER,)


async def test_a_deletion_without_our_finalizer_names_what_it_waits_for() -> None:
    deps, kube, helm, bus = world()
    being_deleted(kube, finalizers=["foregroundDeletion"])
    await reconcile(deps)
    (report,) = bus.of(PatchStatus)
    assert report.conditions[0].reason == "WaitingForFinalizers"
    assert "foregroundDeletion" in report.conditions[0].message
    assert helm.uninstalls == 0


# --- the deletion deadline ------------------------------------------------------------------


def deleting_since(kube: Kube, since: datetime, name: str = "c", **meta: Any) -> None:
    """A Cluster being deleted since ``since`` whose CAPI Cluster is still there."""
    body = cluster()
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    body["metadata"].update(name=name, uid=f"uid-{name}", deletionTimestamp=stamp, **meta)
    kube.put(CLUSTER, body)
    kube.put(CAPI_CLUSTER, {"metadata": {"name": name, "namespace": "ns"}})


async def test_a_deletion_waiting_for_cluster_api_arms_its_deadline_once() -> None:
    deps, kube, _, bus = world()
    since = datetime.now(UTC)
    deleting_since(kube, since)
    await reconcile(deps)
    assert reasons(bus)[-1] == "WaitingForClusterAPI"
    armed = deps.timers.pending()["ns/c"]
    await reconcile(deps)
    assert deps.timers.pending()["ns/c"] is armed  # kept, not armed again
    assert armed.message.id == stable_id("uid-c", "delete-deadline")
    assert armed.subject == subjects.reconcile(partition(deps), "ns", "c")
    assert armed.partition == partition(deps)
    deadline = since.replace(microsecond=0) + timedelta(seconds=1800)
    assert armed.at == deadline


def named_in(deps: Deps, wanted: int, prefix: str, count: int, *, inside: bool = True) -> list[str]:
    """``count`` Cluster names whose partition is (or, not ``inside``, is not) ``wanted``."""
    names = (f"{prefix}{i}" for i in range(1000))
    found = (n for n in names if (partition(deps, f"ns/{n}") == wanted) == inside)
    return [next(found) for _ in range(count)]


async def test_a_claim_arms_the_deadlines_of_its_deletions_and_a_loss_drops_them() -> None:
    deps, kube, _, bus = world()
    mine = partition(deps, "ns/overdue")
    (elsewhere,) = named_in(deps, mine, "other", 1, inside=False)
    waiting = named_in(deps, mine, "waiting", 2)
    (not_ours,) = named_in(deps, mine, "not-ours", 1)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    for name in [*waiting, elsewhere]:
        deleting_since(kube, datetime.now(UTC), name=name)
    deleting_since(kube, long_ago, name="overdue")
    deleting_since(kube, long_ago, name=not_ours, finalizers=["foregroundDeletion"])
    claims = DeadlineClaims(deps)
    await claims.claimed(Claim(partition=mine, token=1))
    await asyncio.sleep(0.05)
    assert set(deps.timers.pending()) == {f"ns/{n}" for n in waiting}
    ((subject, nudge),) = bus.published  # the overdue deadline fired at once
    assert subject == subjects.reconcile(mine, "ns", "overdue")
    assert isinstance(nudge, ReconcileCluster)
    assert (nudge.id, nudge.reason) == (
        stable_id("uid-overdue", "delete-deadline"),
        "deletion deadline",
    )
    await claims.lost(frozenset({mine}))
    assert deps.timers.pending() == {}


async def test_a_cluster_gone_takes_its_deadline_with_it() -> None:
    deps, kube, _, _ = world()
    deleting_since(kube, datetime.now(UTC))
    await reconcile(deps)
    assert "ns/c" in deps.timers.pending()
    await kube.delete(CLUSTER, "ns", "c")
    await reconcile(deps)
    assert deps.timers.pending() == {}


# --- memory ----------------------------------------------------------------------------------


async def test_memory_of_clusters_deleted_and_gone_is_forgotten() -> None:
    """Many Clusters installed, deleted and gone leave nothing in the replica's memory."""
    deps, kube, helm, _ = world()
    names = [f"c{i}" for i in range(200)]
    for name in names:
        body = cluster()
        body["metadata"].update(name=name, uid=f"uid-{name}")
        kube.put(CLUSTER, body)
        await reconcile(deps, name)
    assert len(deps.memory) == len(names)
    for name in names:
        being_deleted(kube, name=name, uid=f"uid-{name}")
        await reconcile(deps, name)
        await kube.delete(CLUSTER, "ns", name)
        await reconcile(deps, name)
    assert helm.uninstalls == len(names)
    assert len(deps.memory) == 0


async def test_memory_of_a_lost_partition_is_forgotten() -> None:
    deps, _, _, _ = world()
    memory = deps.memory
    keys = [f"ns/c{i}" for i in range(10_000)]
    for key in keys:
        memory.converged[key] = ("u", 1)
        memory.uninstalled[key] = "u"
    lost = frozenset(range(deps.partitions)) - {0}
    await DeadlineClaims(deps).lost(lost)
    kept = [key for key in keys if partition(deps, key) == 0]
    assert 0 < len(memory) == len(kept) < len(keys)
    await DeadlineClaims(deps).lost(frozenset({0}))
    assert len(memory) == 0
