"""The helm service's handlers against fakes, through its composition root (no network)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.helm.bootstrap import context
from services.helm.handlers import Context, reconcile
from services.helm.settings import HelmSettings
from shared.bus import Published
from shared.errors import KubeConflict, KubeNotFound, PermanentError
from shared.helm import Completed, Helm, HelmForbidden, HelmUnavailable
from shared.kube import ResourceKind
from shared.messages import (
    Message,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    PrerequisiteChanged,
    ReconcileCluster,
    encode,
)
from shared.zenith import RegistrarConflict

Json = dict[str, Any]
FINALIZER = "azimuth.stackhpc.com/finalizer"


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Json] = {}
        self.deleted: list[tuple[str, str]] = []
        self.resolved: list[tuple[str, str, str | None]] = []

    def put(self, kind: str, namespace: str | None, obj: Json) -> None:
        self.objects[(kind, namespace, obj["metadata"]["name"])] = obj

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        try:
            return self.objects[(kind.kind, namespace, name)]
        except KeyError:
            raise KubeNotFound(f"{kind.kind} {name}") from None

    async def list(self, kind: ResourceKind, **_: Any) -> tuple[list[Json], str]:
        return [o for (k, _, _), o in self.objects.items() if k == kind.kind], "1"

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        key = (kind.kind, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in self.objects:
            raise KubeConflict("exists")
        data = {
            k: base64.b64encode(v.encode()).decode() for k, v in obj.get("stringData", {}).items()
        }
        stored = {**obj, "data": {**obj.get("data", {}), **data}}
        stored["metadata"] = {**obj["metadata"], "resourceVersion": "1"}
        self.objects[key] = stored
        return stored

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self.deleted.append((kind.kind, name))
        try:
            return self.objects.pop((kind.kind, namespace, name))
        except KeyError:
            raise KubeNotFound(f"{kind.kind} {name}") from None

    async def apply(self, kind: ResourceKind, obj: Json, **_: Any) -> Json:
        return obj

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        self.resolved.append((group, kind, version))
        return ResourceKind(kind.lower(), group, version or "v1", kind, f"{kind.lower()}s")

    async def patch_merge(
        self, kind: ResourceKind, namespace: str | None, name: str, patch: Json, **_: Any
    ) -> Json:
        obj = self.objects[(kind.kind, namespace, name)]
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations.update(patch["metadata"].get("annotations", {}))
        return obj


@dataclass
class Outcome:
    revision: int
    action: str


@dataclass
class FakeHelm:
    installs: list[Json] = field(default_factory=list)
    uninstalls: int = 0

    async def ensure_release(self, name: str, namespace: str, chart: Any, values: Json) -> Outcome:
        self.installs.append(values)
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


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.last: dict[str, bytes] = {}

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        self.sent.append((subject, message))
        return Published(sequence=len(self.sent), duplicate=False)

    async def last_message(self, stream: str, subject: str) -> bytes | None:
        for key, body in self.last.items():
            if subject.startswith(key):
                return body
        return None

    def of(self, kind: type[Message]) -> list[Any]:
        return [m for _, m in self.sent if isinstance(m, kind)]


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


def world(
    *, oidc: bool = False, registrar: FakeRegistrar | None = None
) -> tuple[Context, FakeKube, FakeHelm, FakeBus]:
    kube, helm, bus = FakeKube(), FakeHelm(), FakeBus()
    env: Json = {"azimuth": {"oidc_enabled": oidc, "zenith_enabled": registrar is not None}}
    if registrar:
        env["helm"] = {
            "zenith": {
                "registrar_admin_url": "http://r",
                "sshd_host": "s",
                "base_domain": "zenith.test",
            }
        }
    settings = HelmSettings.model_validate(env)
    ctx = context(settings, kube=kube, helm=helm, bus=bus, registrar=registrar)
    kube.put(
        "ClusterTemplate",
        None,
        {"metadata": {"name": "t"}, "spec": {"values": {"kubernetesVersion": "1.34.2"}}},
    )
    clouds = "clouds:\n  openstack:\n    auth:\n      project_id: p1\n"
    kube.put(
        "Secret",
        "ns",
        {
            "metadata": {"name": "creds"},
            "data": {"clouds.yaml": base64.b64encode(clouds.encode()).decode()},
        },
    )
    return ctx, kube, helm, bus


CAUSE = ReconcileCluster(
    source="test",
    correlation_id="cluster:ns/c",
    ref=ObjectRef(
        api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="ns", name="c"
    ),
    reason="test",
)


def reasons(bus: FakeBus) -> list[str]:
    return [c.reason for m in bus.of(PatchStatus) for c in m.conditions]


async def test_nothing_with_a_lifetime_is_made_before_the_finalizer() -> None:
    ctx, kube, helm, bus = world()
    body = cluster()
    body["metadata"]["finalizers"] = []
    kube.put("Cluster", "ns", body)
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    (command,) = bus.of(PatchMetadata)
    assert command.add_finalizers == (FINALIZER,)
    assert helm.installs == []
    assert ("Secret", "ns", "c-etcd-key") not in kube.objects


async def test_a_missing_template_is_a_reason_not_a_retry_loop() -> None:
    ctx, kube, helm, bus = world()
    kube.put("Cluster", "ns", cluster(templateName="absent"))
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert reasons(bus) == ["TemplateNotFound"]  # the repeated wait is not re-sent
    assert helm.installs == []


async def test_identity_must_answer_for_the_current_generation_before_helm() -> None:
    ctx, kube, helm, bus = world(oidc=True)
    kube.put("Cluster", "ns", cluster())
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert reasons(bus) == ["WaitingForIdentity"]
    stale = identity_fact(generation=0)
    bus.last["capibus.lifecycle.prep.identity"] = encode(stale)
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert helm.installs == []
    bus.last["capibus.lifecycle.prep.identity"] = encode(identity_fact(generation=1))
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    (values,) = helm.installs
    assert values["oidc"]["issuerUrl"] == "https://idp/realms/ns"
    assert "oidc-default-rbac" in values["addons"]["custom"]


async def test_install_once_then_label_and_annotate_only_that_generation() -> None:
    ctx, kube, helm, bus = world()
    kube.put("Cluster", "ns", cluster())
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert len(helm.installs) == 1
    (command,) = bus.of(PatchMetadata)
    assert command.if_generation == 1
    assert command.labels == {"azimuth.stackhpc.com/cluster-template": "t"}
    handled = json.loads(
        command.annotations["azimuth.stackhpc.com/last-handled-configuration"] or ""
    )
    assert handled["spec"]["templateName"] == "t"
    assert "Secret" in {k for k, _, _ in kube.objects}
    assert ("Secret", "ns", "c-etcd-key") in kube.objects


async def test_delete_waits_for_cluster_api_and_the_lease_before_the_finalizer() -> None:
    ctx, kube, helm, bus = world()
    body = cluster(leaseName="kube-c")
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put("Cluster", "ns", body)
    kube.put("Cluster.capi", "ns", {"metadata": {"name": "c"}})
    kube.put("Secret", "ns", {"metadata": {"name": "c-etcd-key"}})
    capi = {
        "metadata": {"name": "c", "finalizers": ["cluster.cluster.x-k8s.io"]},
        "status": {"phase": "Deleting"},
    }
    kube.objects[("Cluster", "ns", "c")] = body
    kube.objects[("Cluster", "ns", "c-capi")] = capi
    kube.objects.pop(("Cluster.capi", "ns", "c"))
    # The CAPI Cluster shares kind "Cluster" with the Azimuth one in this fake; route by group.
    original_get = kube.get

    async def get(kind: ResourceKind, namespace: str | None, name: str) -> Json:
        if kind.group == "cluster.x-k8s.io":
            return await original_get(kind, namespace, f"{name}-capi")
        return await original_get(kind, namespace, name)

    kube.get = get  # type: ignore[method-assign]
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert helm.uninstalls == 1
    assert ("Secret", "c-etcd-key") in kube.deleted
    assert reasons(bus)[-1] == "DeletionStuck"  # its deadline is long past
    kube.objects.pop(("Cluster", "ns", "c-capi"))
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
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
    bus.last["capibus.lifecycle.prep.lease"] = encode(released)
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    (command,) = bus.of(PatchMetadata)
    assert command.remove_finalizers == (FINALIZER,)
    assert helm.uninstalls == 1  # not repeated on every deletion event


async def test_zenith_conflict_on_a_fresh_reservation_leaves_no_secret() -> None:
    registrar = FakeRegistrar(conflict=True)
    ctx, kube, helm, bus = world(registrar=registrar)
    kube.put("Cluster", "ns", cluster())
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert reasons(bus) == ["ZenithReservationConflict"]
    assert ("Secret", "ns", "c-zenith-apiserver") not in kube.objects
    assert helm.installs == []


async def test_zenith_reservation_interrupted_by_a_crash_is_finished_not_repeated() -> None:
    registrar = FakeRegistrar(conflict=True)  # our own earlier reserve, answered 409 now
    ctx, kube, helm, _ = world(registrar=registrar)
    kube.put("Cluster", "ns", cluster())
    pending = {
        "metadata": {
            "name": "c-zenith-apiserver",
            "annotations": {"azimuth.stackhpc.com/zenith-subdomain": "abc"},
            "resourceVersion": "7",
        },
        "data": {
            "id_ed25519": base64.b64encode(b"private").decode(),
            "id_ed25519.pub": base64.b64encode(b"ssh-ed25519 AAAA").decode(),
        },
    }
    kube.put("Secret", "ns", pending)
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    annotations = kube.objects[("Secret", "ns", "c-zenith-apiserver")]["metadata"]["annotations"]
    assert annotations["azimuth.stackhpc.com/zenith-fqdn"] == "abc.zenith.test"
    assert registrar.calls == 1
    (values,) = helm.installs
    assert values["controlPlaneEndpoint"] == {"host": "abc.zenith.test", "port": 443}
    # the per-cluster operator's objects are applied where discovery says they are served
    assert kube.resolved == [("", "ConfigMap", "v1"), ("", "Pod", "v1")]


def ref() -> ObjectRef:
    return ObjectRef(
        api_version="azimuth.stackhpc.com/v1alpha1",
        kind="Cluster",
        namespace="ns",
        name="c",
        uid="u1",
    )


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


# --- deleting --------------------------------------------------------------------------------


def being_deleted(kube: FakeKube, name: str = "c", **meta: Any) -> Json:
    """A Cluster being deleted whose CAPI Cluster is already gone (this fake keys objects by
    kind, which the two Cluster kinds share)."""
    body = cluster()
    body["metadata"].update(name=name, deletionTimestamp="2026-01-01T00:00:00Z", **meta)
    kube.put("Cluster", "ns", body)
    azimuth_only = kube.get

    async def get(kind: ResourceKind, namespace: str | None, name: str) -> Json:
        if kind.group == "cluster.x-k8s.io":
            raise KubeNotFound(name)
        return await azimuth_only(kind, namespace, name)

    kube.get = get  # type: ignore[method-assign]
    return body


@dataclass
class FailingUninstall(FakeHelm):
    error: Exception = field(default_factory=lambda: HelmUnavailable("unreachable"))

    async def uninstall(self, name: str, namespace: str) -> bool:
        self.uninstalls += 1
        raise self.error


async def test_a_deletion_says_so_before_helm_runs() -> None:
    ctx, kube, helm, bus = world()
    being_deleted(kube)
    seen: list[list[str]] = []
    real_uninstall = helm.uninstall

    async def uninstall(name: str, namespace: str) -> bool:
        seen.append(reasons(bus))
        return await real_uninstall(name, namespace)

    helm.uninstall = uninstall  # type: ignore[method-assign]
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert seen == [["UninstallingRelease"]]
    (command,) = bus.of(PatchMetadata)  # nothing else to wait for
    assert command.remove_finalizers == (FINALIZER,)


async def test_a_temporary_failure_while_deleting_is_reported_and_retried() -> None:
    ctx, kube, _, bus = world()
    ctx.helm = FailingUninstall()
    being_deleted(kube)
    with pytest.raises(HelmUnavailable):
        await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    (*_, failed) = [c for m in bus.of(PatchStatus) for c in m.conditions]
    assert (failed.reason, failed.message) == ("HelmUnavailable", "deleting: unreachable")
    assert not bus.of(PatchMetadata)


async def test_a_permanent_failure_while_deleting_says_so_at_once_and_is_raised() -> None:
    ctx, kube, _, bus = world()
    ctx.helm = FailingUninstall(error=HelmForbidden("secrets is forbidden: User x cannot list"))
    being_deleted(kube)
    with pytest.raises(PermanentError):
        await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    assert reasons(bus)[-1] == "HelmForbidden"
    assert "forbidden" in bus.of(PatchStatus)[-1].conditions[0].message


async def test_a_release_helm_cannot_name_counts_as_uninstalled_and_the_delete_completes() -> None:
    ctx, kube, _, bus = world()

    async def never(argv: Any, stdin: Any, deadline: float) -> Completed:
        raise AssertionError(f"helm was run: {argv}")

    ctx.helm = Helm(executor=never, home="/tmp/capibus-unit-helm")
    name = "a" * 60
    being_deleted(kube, name=name)
    await reconcile(key=f"ns/{name}", cause=CAUSE, ctx=ctx)
    (command,) = bus.of(PatchMetadata)
    assert command.remove_finalizers == (FINALIZER,)


async def test_a_deletion_without_our_finalizer_names_what_it_waits_for() -> None:
    ctx, kube, helm, bus = world()
    being_deleted(kube, finalizers=["foregroundDeletion"])
    await reconcile(key="ns/c", cause=CAUSE, ctx=ctx)
    (report,) = bus.of(PatchStatus)
    assert report.conditions[0].reason == "WaitingForFinalizers"
    assert "foregroundDeletion" in report.conditions[0].message
    assert helm.uninstalls == 0
