"""The writer writes the OpenShift Assisted providers' status: a provider's report, addressed
by ``shared.status.StatusReporter``, goes through the writer's composition root (its routes,
rules and handlers) to a uid-guarded merge patch of the ``status`` subresource, and what it
writes parses with the kind's model; metadata commands add the providers' finalizers."""

from __future__ import annotations

import fnmatch
from typing import Any, cast

import pytest

from services.writer.bootstrap import build
from services.writer.settings import WriterSettings
from shared import consumer as consuming
from shared import models, subjects
from shared.consumer import Batch, Consumer, Subscription
from shared.kube import ResourceKind
from shared.messages import Condition, ObjectRef
from shared.models.assisted import ConfigConditionType, ConfigReason
from shared.resources import OPENSHIFT_ASSISTED_CONFIG, OPENSHIFT_ASSISTED_CONTROL_PLANE
from shared.status import WRITTEN, StatusReporter
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
PARTITIONS = 4


class Kube(FakeKube):
    """Records which subresource every PATCH went to."""

    def __init__(self) -> None:
        super().__init__()
        self.patched: list[tuple[str, str | None]] = []

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        self.patched.append((kind.kind, subresource))
        return await super().patch_merge(kind, namespace, name, patch, subresource=subresource)


class Leases:
    ttl = 10.0


OAC: Json = {
    "metadata": {"name": "demo-control-plane-abcde", "namespace": "t"},
    "spec": {"pullSecretRef": {"name": "pull-secret"}},
}
ACP: Json = {
    "metadata": {"name": "demo-control-plane", "namespace": "t"},
    "spec": {
        "config": {"baseDomain": "example.com", "releaseImage": "quay.io/ocp:4.16.0"},
        "machineTemplate": {"infrastructureRef": {"kind": "Metal3MachineTemplate", "name": "m"}},
        "replicas": 3,
        "version": "4.16.0",
    },
}


def writer(kube: Kube) -> Consumer:
    settings = WriterSettings(replica="w1", partitions=PARTITIONS)
    # The fakes play the bus and the leases; nothing here pulls or claims.
    bus = cast(consuming.ConsumerBus, FakeBus())
    return build(settings, bus=bus, leases=cast(consuming.Leases, Leases()), kube=kube)


def subscription(consumer: Consumer, name: str, subject: str, partition: int) -> Subscription[Any]:
    """The writer's subscription ``name``, checked to receive ``subject``."""
    sub = next(s for s in consumer.subscriptions if s.name == name)
    # NATS's "*" is one token; fnmatch's is any run, so compare token counts too.
    assert any(
        fnmatch.fnmatchcase(subject, f) and subject.count(".") == f.count(".")
        for f in sub.filters(partition)
    )
    return sub


def stored_ref(kube: Kube, kind: ResourceKind, obj: Json) -> ObjectRef:
    stored = kube.put(kind, obj)
    return ObjectRef(
        api_version=kind.api_version,
        kind=kind.kind,
        namespace=stored["metadata"]["namespace"],
        name=stored["metadata"]["name"],
        uid=stored["metadata"]["uid"],
    )


async def deliver(consumer: Consumer, name: str, published: tuple[str, Any]) -> None:
    subject, message = published
    partition = subjects.partition_of(message.ref.key, PARTITIONS)
    sub = subscription(consumer, name, subject, partition)
    await sub.handle(
        Batch(key=message.ref.key, partition=partition, messages=(message,), lease_token=1)
    )


def test_the_providers_kinds_are_written_through_the_status_subresource() -> None:
    assert OPENSHIFT_ASSISTED_CONFIG in WRITTEN
    assert OPENSHIFT_ASSISTED_CONTROL_PLANE in WRITTEN
    assert OPENSHIFT_ASSISTED_CONFIG.status_subresource
    assert OPENSHIFT_ASSISTED_CONTROL_PLANE.status_subresource


async def test_a_bootstrap_report_becomes_the_configs_status() -> None:
    kube, bus = Kube(), FakeBus()
    consumer = writer(kube)
    ref = stored_ref(kube, OPENSHIFT_ASSISTED_CONFIG, OAC)
    reporter = StatusReporter(bus, partitions=PARTITIONS, source="assistedbootstrap/r1")
    waiting = Condition(
        type=ConfigConditionType.DATA_SECRET_AVAILABLE,
        status="False",
        reason=ConfigReason.WAITING_FOR_LIVE_ISO_URL,
        message="waiting for the InfraEnv's ISO",
    )
    infra_env = {"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "InfraEnv"}
    patch = {"infraEnvRef": {**infra_env, "name": "demo-control-plane", "namespace": "t"}}
    await reporter.report(ref, patch=patch, conditions=[waiting])

    (published,) = bus.published
    assert published[0].startswith("capibus.status.patch.openshiftassistedconfig.")
    await deliver(consumer, "status", published)

    assert kube.patched == [("OpenshiftAssistedConfig", "status")]
    stored = kube.stored(OPENSHIFT_ASSISTED_CONFIG, "t", OAC["metadata"]["name"])
    assert stored is not None
    parsed = models.OpenshiftAssistedConfig.model_validate(stored)
    assert parsed.status.infra_env_ref is not None
    assert parsed.status.infra_env_ref.name == "demo-control-plane"
    (condition,) = parsed.status.conditions
    assert (condition.type, condition.reason) == ("DataSecretAvailable", "WaitingForLiveISOURL")


async def test_a_control_plane_report_becomes_its_status() -> None:
    kube, bus = Kube(), FakeBus()
    consumer = writer(kube)
    ref = stored_ref(kube, OPENSHIFT_ASSISTED_CONTROL_PLANE, ACP)
    reporter = StatusReporter(bus, partitions=PARTITIONS, source="assistedcontrolplane/r1")
    patch = {
        "replicas": 3,
        "selector": "cluster.x-k8s.io/cluster-name=demo,cluster.x-k8s.io/control-plane",
        "initialized": True,
    }
    created = Condition(type="MachinesCreated", status="True", reason="MachinesCreated")
    await reporter.report(ref, patch=patch, conditions=[created])

    await deliver(consumer, "status", bus.published[0])

    assert kube.patched == [("OpenshiftAssistedControlPlane", "status")]
    stored = kube.stored(OPENSHIFT_ASSISTED_CONTROL_PLANE, "t", ACP["metadata"]["name"])
    assert stored is not None
    parsed = models.OpenshiftAssistedControlPlane.model_validate(stored)
    assert (parsed.status.replicas, parsed.status.initialized) == (3, True)
    assert parsed.status.ready is False
    assert [c.type for c in parsed.status.conditions] == ["MachinesCreated"]


@pytest.mark.parametrize(
    ("kind", "obj", "finalizer"),
    [
        (OPENSHIFT_ASSISTED_CONFIG, OAC, models.OPENSHIFT_ASSISTED_CONFIG_FINALIZER),
        (
            OPENSHIFT_ASSISTED_CONTROL_PLANE,
            ACP,
            models.OPENSHIFT_ASSISTED_CONTROL_PLANE_FINALIZER,
        ),
    ],
    ids=["config", "control-plane"],
)
async def test_metadata_commands_add_the_providers_finalizers(
    kind: ResourceKind, obj: Json, finalizer: str
) -> None:
    kube, bus = Kube(), FakeBus()
    consumer = writer(kube)
    ref = stored_ref(kube, kind, obj)
    reporter = StatusReporter(bus, partitions=PARTITIONS, source="assisted/r1")
    await reporter.change_metadata(ref, add_finalizers=[finalizer], if_generation=1)

    await deliver(consumer, "meta", bus.published[0])

    assert kube.patched == [(kind.kind, None)]
    stored = kube.stored(kind, "t", obj["metadata"]["name"])
    assert stored is not None
    assert stored["metadata"]["finalizers"] == [finalizer]
