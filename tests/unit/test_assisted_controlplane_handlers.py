"""The OpenShift Assisted control-plane provider's handlers, through its composition root.

Kubernetes and the bus are fakes (``tests/fakes.py``); a small "writer" merges the published
status patches into the fake ACP, so each step sees what the previous one reported. The
events go through ``handlers.on_changes`` (the mappers included) wherever the test is about
what wakes what; elsewhere a target is reconciled directly. Replica names are drawn from a
counter so the tests can name them.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.baremetal.assisted_controlplane import handlers, logic
from services.baremetal.assisted_controlplane.bootstrap import build, dependencies
from services.baremetal.assisted_controlplane.ports import Deps
from services.baremetal.assisted_controlplane.settings import AssistedControlPlaneSettings
from shared.consumer import Batch
from shared.errors import KubeInvalid, KubeUnavailable, PermanentError, TemporaryError
from shared.kube import ResourceKind
from shared.mergepatch import apply as merge
from shared.messages import ObjectRef, PatchStatus, RecheckObject, ResourceChanged
from shared.reconcile import Target
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    CLUSTER_IMAGE_SET,
    CONFIG_MAP,
    MACHINE,
    MACHINE_DEPLOYMENT,
    METAL3_MACHINE,
    METAL3_MACHINE_TEMPLATE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
    scrub,
)
from shared.seen import Forgetting, key_of
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
ACP = OPENSHIFT_ASSISTED_CONTROL_PLANE
NS = "ns"
CLUSTER = "c1"
NAME = "c1-control-plane"
HIVE_FINALIZER = "clusterdeployments.agent-install.openshift.io/ai-deprovision"
CAUSE = RecheckObject(
    source="test",
    correlation_id="t",
    ref=ObjectRef(api_version="v1", kind="Test", name="x"),
    reason="test",
)
WRITES = ("create", "apply", "patch", "delete")


class Crash(Exception):
    """The process died mid-run (SIGKILL): nothing after it ran, nothing was rolled back."""


class FinalizingKube(FakeKube):
    """Deletes as the API server does: an object with finalizers only gets a deletionTimestamp;
    a create may be made to store the object and then fail (a timeout after the write)."""

    def __init__(self) -> None:
        super().__init__()
        self.stored_then_failed: dict[str, Exception] = {}

    def bump(self, stored: Json) -> None:
        """A change made in place gets a new resourceVersion, as every write does."""
        stored["metadata"]["resourceVersion"] = str(next(self._versions))

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        stored = self.stored(kind, namespace, name)
        if stored is not None and stored["metadata"].get("finalizers"):
            self._called("delete", kind, namespace, name)
            stored["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            self.bump(stored)
            return copy.deepcopy(stored)
        return await super().delete(kind, namespace, name)

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        made = await super().create(kind, obj)
        error = self.stored_then_failed.pop(kind.kind, None)
        if error is not None:
            raise error
        return made


@dataclass
class Rig:
    deps: Deps
    kube: FinalizingKube
    bus: FakeBus
    drawn: list[str] = field(default_factory=list)
    applied: int = 0

    def obj(self, kind: ResourceKind, name: str, namespace: str | None = NS) -> Json:
        found = self.kube.stored(kind, namespace, name)
        assert found is not None, name
        return found

    def acp(self) -> Json:
        return self.obj(ACP, NAME)

    def status(self) -> Json:
        return dict(self.acp().get("status") or {})

    def conditions(self) -> dict[str, Json]:
        return {c["type"]: c for c in self.status().get("conditions") or []}

    def machines(self) -> list[str]:
        return sorted(m["metadata"]["name"] for m in self.kube.of_kind(MACHINE))

    async def reconcile(self, kind: ResourceKind = ACP, name: str = NAME) -> None:
        """Run now, on a world the test changed in place, without the events that would have
        told the replica: it forgets what it remembers, as when partitions move."""
        self.deps.seen.clear()
        try:
            await handlers.run({Target(kind, NS, name): CAUSE}, self.deps)
        finally:
            self.write_status()

    async def event(self, kind: ResourceKind, obj: Json, event: str = "MODIFIED") -> None:
        try:
            await handlers.on_changes(batch(changed(kind, obj, event)), self.deps)
        finally:
            self.write_status()

    async def touched(self, kind: ResourceKind, name: str) -> None:
        """The watcher's event of the object as it is stored (changed in place by the test,
        so at a new resourceVersion)."""
        self.kube.bump(self.obj(kind, name))
        await self.event(kind, self.obj(kind, name))

    def write_status(self) -> None:
        """The writer's part: merge every new status patch into its ACP."""
        patches = self.bus.of(PatchStatus)
        for message in patches[self.applied :]:
            assert message.ref.kind == ACP.kind
            stored = self.kube.stored(ACP, NS, message.ref.name)
            if stored is None:
                continue
            status = merge(stored.get("status") or {}, dict(message.patch))
            merged = {c["type"]: c for c in status.get("conditions") or []}
            merged |= {c.type: c.model_dump() for c in message.conditions}
            if merged:
                status["conditions"] = list(merged.values())
            stored["status"] = status
            self.kube.bump(stored)
        self.applied = len(patches)

    def writes(self) -> list[tuple[str, str, str | None, str]]:
        return [call for call in self.kube.calls if call[0] in WRITES]


def changed(kind: ResourceKind, obj: Json, event: str = "MODIFIED") -> ResourceChanged:
    meta = obj["metadata"]
    return ResourceChanged(
        source="t",
        correlation_id="t",
        event=event,
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=meta.get("namespace", NS),
            name=meta["name"],
            uid=meta.get("uid", "u"),
        ),
        resource_version="1",
        object=scrub(kind, obj),
    )


def batch(*messages: ResourceChanged) -> Batch[ResourceChanged]:
    return Batch(key="k", partition=0, messages=messages)


@pytest.fixture
def rig() -> Rig:
    kube, bus = FinalizingKube(), FakeBus()
    drawn: list[str] = []
    counter = itertools.count()

    def names(acp: Json) -> str:
        name = f"{acp['metadata']['name']}-r{next(counter)}"
        drawn.append(name)
        return name

    deps = dependencies(AssistedControlPlaneSettings(), bus=bus, kube=kube, names=names)
    return Rig(deps, kube, bus, drawn)


# --- the world Cluster API and the user make ---------------------------------------------------


def capi_cluster(rig: Rig, *, ready: bool = True, port: int = 6443, **spec: Any) -> Json:
    return rig.kube.put(
        CAPI_CLUSTER,
        {
            "metadata": {"name": CLUSTER, "namespace": NS},
            "spec": {
                "clusterNetwork": {
                    "pods": {"cidrBlocks": ["10.128.0.0/14"]},
                    "services": {"cidrBlocks": ["172.30.0.0/16"]},
                },
                "controlPlaneEndpoint": {"host": "192.168.10.5", "port": port},
                "controlPlaneRef": {
                    "apiVersion": ACP.api_version,
                    "kind": ACP.kind,
                    "name": NAME,
                },
                "infrastructureRef": {"kind": "Metal3Cluster", "name": CLUSTER},
                **spec,
            },
            "status": {"infrastructureReady": ready},
        },
    )


def control_plane(
    rig: Rig, *, owned: bool = True, version: str = "4.16.0", replicas: int = 3, **config: Any
) -> Json:
    owners = [
        {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": CLUSTER, "uid": "cu"}
    ]
    return rig.kube.put(
        ACP,
        {
            "metadata": {
                "name": NAME,
                "namespace": NS,
                "labels": {logic.CLUSTER_NAME_LABEL: CLUSTER},
                "ownerReferences": owners if owned else [],
            },
            "spec": {
                "version": version,
                "replicas": replicas,
                "config": {"baseDomain": "example.com", **config},
                "machineTemplate": {
                    "metadata": {"labels": {"tier": "cp"}, "annotations": {"note": "x"}},
                    "infrastructureRef": {
                        "apiVersion": METAL3_MACHINE_TEMPLATE.api_version,
                        "kind": METAL3_MACHINE_TEMPLATE.kind,
                        "name": NAME,
                    },
                    "nodeDrainTimeout": "5m",
                },
                "openshiftAssistedConfigSpec": {
                    "sshAuthorizedKey": "ssh-ed25519 AAAA",
                    "cpuArchitecture": "x86_64",
                },
            },
        },
    )


def templates(rig: Rig) -> None:
    rig.kube.put(
        METAL3_MACHINE_TEMPLATE,
        {
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {
                "template": {
                    "metadata": {"labels": {"from": "template"}},
                    "spec": {"dataTemplate": {"name": "dt"}, "image": {"url": "", "format": ""}},
                }
            },
        },
    )
    rig.kube.put(
        MACHINE_DEPLOYMENT,
        {
            "metadata": {
                "name": "c1-md-0",
                "namespace": NS,
                "labels": {logic.CLUSTER_NAME_LABEL: CLUSTER},
            },
            "spec": {"replicas": 2},
        },
    )


def world(rig: Rig, **acp: Any) -> None:
    capi_cluster(rig)
    templates(rig)
    control_plane(rig, **acp)


async def converged(rig: Rig, **acp: Any) -> None:
    """The ACP reconciled with its ClusterDeployment's ACI made (the CD's own event)."""
    world(rig, **acp)
    await rig.reconcile()
    await rig.touched(CLUSTER_DEPLOYMENT, NAME)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def set_aci_state(rig: Rig, state: str, info: str = "") -> Json:
    aci = rig.obj(AGENT_CLUSTER_INSTALL, NAME)
    aci["status"] = {"debugInfo": {"state": state, "stateInfo": info}}
    return aci


def start_install(rig: Rig, kubeconfig: str = "apiVersion: v1\nkind: Config\n") -> None:
    """What assisted-service does at ``installing``: the admin kubeconfig and its reference."""
    rig.kube.put(
        SECRET,
        {
            "metadata": {
                "name": f"{NAME}-admin-kubeconfig",
                "namespace": NS,
                "labels": {logic.CD_NAME_LABEL: NAME, logic.SECRET_TYPE_LABEL: "kubeconfig"},
            },
            "data": {"kubeconfig": b64(kubeconfig)},
        },
    )
    aci = set_aci_state(rig, "installing")
    aci["spec"]["clusterMetadata"] = {
        "clusterID": "id",
        "adminKubeconfigSecretRef": {"name": f"{NAME}-admin-kubeconfig"},
    }


# --- 11: the gates ---------------------------------------------------------------------------


async def test_a_version_below_4_14_is_refused_with_upstreams_condition_and_nothing_is_made(
    rig: Rig,
) -> None:
    world(rig, version="4.13.9")
    await rig.touched(ACP, NAME)

    created = rig.conditions()[logic.MACHINES_CREATED]
    assert (created["status"], created["reason"]) == ("False", "MachineGenerationFailed")
    assert created["message"] == (
        "version 4.13.9 is not supported, the minimum supported version is 4.14.0"
    )
    assert logic.ACP_FINALIZER in rig.acp()["metadata"]["finalizers"]
    assert rig.kube.of_kind(CLUSTER_DEPLOYMENT) == []
    assert rig.machines() == []
    assert rig.kube.stored(SECRET, NS, logic.PLACEHOLDER_PULL_SECRET) is None


async def test_a_version_that_is_not_semver_is_a_permanent_error_with_a_condition(
    rig: Rig,
) -> None:
    world(rig, version="latest")
    with pytest.raises(PermanentError) as refused:
        await rig.touched(ACP, NAME)

    assert refused.value.reason == "InvalidVersion"
    created = rig.conditions()[logic.MACHINES_CREATED]
    assert (created["status"], created["reason"]) == ("False", "InvalidVersion")
    assert "'latest' is not a semantic version" in created["message"]
    assert rig.kube.of_kind(CLUSTER_DEPLOYMENT) == []


async def test_the_acp_waits_for_its_owner_infrastructure_and_endpoint_then_carries_on(
    rig: Rig,
) -> None:
    templates(rig)
    control_plane(rig, owned=False)
    await rig.touched(ACP, NAME)
    assert rig.kube.of_kind(CLUSTER_DEPLOYMENT) == []
    assert rig.writes() == []  # not even the finalizer: Cluster API is about to write the ACP

    control_plane(rig)
    capi_cluster(rig, ready=False)
    await rig.touched(ACP, NAME)
    capi_cluster(rig, port=0)
    await rig.touched(CAPI_CLUSTER, CLUSTER)
    assert rig.kube.of_kind(CLUSTER_DEPLOYMENT) == []
    assert rig.machines() == []
    assert rig.bus.of(PatchStatus) == []

    capi_cluster(rig)
    await rig.touched(CAPI_CLUSTER, CLUSTER)
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)
    assert len(rig.machines()) == 3


async def test_a_paused_cluster_holds_the_acp(rig: Rig) -> None:
    capi_cluster(rig, paused=True)
    templates(rig)
    control_plane(rig)
    await rig.reconcile()
    assert rig.kube.of_kind(CLUSTER_DEPLOYMENT) == []
    assert rig.machines() == []


# --- 12: the placeholder pull secret ---------------------------------------------------------


async def test_without_a_pull_secret_the_placeholder_is_made_and_named_in_the_spec(
    rig: Rig,
) -> None:
    world(rig)
    await rig.reconcile()

    secret = rig.obj(SECRET, logic.PLACEHOLDER_PULL_SECRET)
    content = base64.b64decode(secret["data"][".dockerconfigjson"]).decode()
    assert content == '{"auths":{"fake-pull-secret":{"auth":"cGxhY2Vob2xkZXI6c2VjcmV0Cg=="}}}'
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner.get("controller")) == (ACP.kind, NAME, None)
    acp = rig.acp()
    assert acp["spec"]["config"]["pullSecretRef"] == {"name": logic.PLACEHOLDER_PULL_SECRET}
    assert acp["spec"]["config"]["baseDomain"] == "example.com"
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["spec"]["pullSecretRef"] == {
        "name": logic.PLACEHOLDER_PULL_SECRET
    }


async def test_an_existing_placeholder_is_used_and_kept_alive_for_this_acp_too(rig: Rig) -> None:
    world(rig)
    other = {"apiVersion": ACP.api_version, "kind": ACP.kind, "name": "other", "uid": "o"}
    rig.kube.put(
        SECRET,
        {
            "metadata": {
                "name": logic.PLACEHOLDER_PULL_SECRET,
                "namespace": NS,
                "ownerReferences": [other],
            },
            "data": {".dockerconfigjson": b64(logic.PLACEHOLDER_DOCKERCONFIG)},
        },
    )
    await rig.reconcile()

    owners = rig.obj(SECRET, logic.PLACEHOLDER_PULL_SECRET)["metadata"]["ownerReferences"]
    assert [o["name"] for o in owners] == ["other", NAME]
    assert rig.acp()["spec"]["config"]["pullSecretRef"] == {"name": logic.PLACEHOLDER_PULL_SECRET}


class YieldingKube(FinalizingKube):
    """Every read lets other tasks run while its answer travels, as a real API server's does."""

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        try:
            return await super().get(kind, namespace, name)
        finally:
            await asyncio.sleep(0)


async def test_the_acps_of_a_namespace_running_at_once_make_the_placeholder_once() -> None:
    kube, bus = YieldingKube(), FakeBus()
    deps = dependencies(AssistedControlPlaneSettings(), bus=bus, kube=kube)
    rig = Rig(deps, kube, bus)
    names = [f"c{i}-control-plane" for i in range(3)]
    for index, name in enumerate(names):
        cluster = copy.deepcopy(capi_cluster(rig))
        cluster["metadata"] = {"name": f"c{index}", "namespace": NS}
        cluster["spec"]["controlPlaneRef"]["name"] = name
        made = kube.put(CAPI_CLUSTER, cluster)
        acp = copy.deepcopy(control_plane(rig, replicas=0))
        owner = acp["metadata"]["ownerReferences"][0]
        owner |= {"name": f"c{index}", "uid": made["metadata"]["uid"]}
        acp["metadata"] |= {"name": name, "uid": f"acp-{index}"}
        kube.put(ACP, acp)
    await asyncio.gather(*(handlers.run({Target(ACP, NS, n): CAUSE}, deps) for n in names))

    placeholder = [c for c in rig.writes() if c[1] == "Secret"]
    assert placeholder == [
        ("create", "Secret", NS, logic.PLACEHOLDER_PULL_SECRET),
        ("patch", "Secret", NS, logic.PLACEHOLDER_PULL_SECRET),
        ("patch", "Secret", NS, logic.PLACEHOLDER_PULL_SECRET),
    ]
    owners = rig.obj(SECRET, logic.PLACEHOLDER_PULL_SECRET)["metadata"]["ownerReferences"]
    assert sorted(o["name"] for o in owners) == names


async def test_a_configured_pull_secret_is_left_alone(rig: Rig) -> None:
    world(rig, pullSecretRef={"name": "mine"})
    await rig.reconcile()
    assert rig.kube.stored(SECRET, NS, logic.PLACEHOLDER_PULL_SECRET) is None
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["spec"]["pullSecretRef"] == {"name": "mine"}


# --- 13: the ClusterDeployment ---------------------------------------------------------------


async def test_the_cluster_deployment_has_upstreams_shape_and_is_recorded(rig: Rig) -> None:
    world(rig)
    await rig.reconcile()

    cd = rig.obj(CLUSTER_DEPLOYMENT, NAME)
    assert cd["metadata"]["labels"] == {
        "tier": "cp",
        logic.CLUSTER_NAME_LABEL: CLUSTER,
        logic.CONTROL_PLANE_LABEL: "",
        logic.CONTROL_PLANE_NAME_LABEL: NAME,
    }
    (owner,) = cd["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], "controller" in owner) == (ACP.kind, NAME, False)
    assert cd["spec"] == {
        "clusterName": CLUSTER,
        "baseDomain": "example.com",
        "platform": {"agentBareMetal": {"agentSelector": {}}},
        "pullSecretRef": {"name": logic.PLACEHOLDER_PULL_SECRET},
    }
    assert ("apply", CLUSTER_DEPLOYMENT.kind, NS, NAME) in rig.kube.calls
    assert rig.status()["clusterDeploymentRef"] == {
        "apiVersion": "hive.openshift.io/v1",
        "kind": "ClusterDeployment",
        "name": NAME,
        "namespace": NS,
    }


async def test_a_configured_cluster_name_is_used(rig: Rig) -> None:
    world(rig, clusterName="ocp")
    await rig.reconcile()
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["spec"]["clusterName"] == "ocp"


async def test_a_deleted_cluster_deployment_is_made_again_when_its_deletion_event_arrives(
    rig: Rig,
) -> None:
    world(rig)
    await rig.reconcile()
    cd = rig.obj(CLUSTER_DEPLOYMENT, NAME)
    cd["metadata"]["finalizers"] = [HIVE_FINALIZER]
    await rig.kube.delete(CLUSTER_DEPLOYMENT, NS, NAME)
    await rig.touched(ACP, NAME)
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["metadata"]["deletionTimestamp"]  # waited for

    gone = rig.kube.objects.pop((CLUSTER_DEPLOYMENT.token, NS, NAME))
    await rig.event(CLUSTER_DEPLOYMENT, gone, "DELETED")

    again = rig.obj(CLUSTER_DEPLOYMENT, NAME)
    assert "deletionTimestamp" not in again["metadata"]
    assert again["metadata"]["uid"] != gone["metadata"]["uid"]


# --- 14: the ClusterDeployment's ImageSet and ACI ----------------------------------------------


async def test_the_cluster_deployment_gets_its_image_set_and_aci_with_upstreams_shape(
    rig: Rig,
) -> None:
    await converged(rig, releaseImage="quay.io/example/release:4.16.0", mastersSchedulable=True)

    image_set = rig.obj(CLUSTER_IMAGE_SET, NAME, None)
    assert image_set["spec"] == {"releaseImage": "quay.io/example/release:4.16.0"}
    aci = rig.obj(AGENT_CLUSTER_INSTALL, NAME)
    assert aci["spec"] == {
        "clusterDeploymentRef": {"name": NAME},
        "platformType": "None",
        "provisionRequirements": {"controlPlaneAgents": 3, "workerAgents": 2},
        "imageSetRef": {"name": NAME},
        "mastersSchedulable": True,
        "networking": {
            "clusterNetwork": [{"cidr": "10.128.0.0/14", "hostPrefix": 23}],
            "serviceNetwork": ["172.30.0.0/16"],
        },
    }
    assert "annotations" not in aci["metadata"]
    assert aci["metadata"]["labels"][logic.CONTROL_PLANE_NAME_LABEL] == NAME
    (owner,) = aci["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (ACP.kind, NAME, True)
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["spec"]["clusterInstallRef"] == {
        "group": "extensions.hive.openshift.io",
        "version": "v1beta1",
        "kind": "AgentClusterInstall",
        "name": NAME,
    }


async def test_with_both_vip_lists_the_aci_is_bare_metal_with_the_capabilities_override(
    rig: Rig,
) -> None:
    await converged(
        rig, apiVIPs=["192.168.10.5"], ingressVIPs=["192.168.10.6"], sshAuthorizedKey="ssh-rsa K"
    )
    aci = rig.obj(AGENT_CLUSTER_INSTALL, NAME)
    assert aci["spec"]["platformType"] == "BareMetal"
    assert (aci["spec"]["apiVIPs"], aci["spec"]["ingressVIPs"]) == (
        ["192.168.10.5"],
        ["192.168.10.6"],
    )
    assert aci["spec"]["sshPublicKey"] == "ssh-rsa K"
    overrides = json.loads(aci["metadata"]["annotations"][logic.INSTALL_CONFIG_OVERRIDES])
    assert overrides == {
        "capabilities": {
            "baselineCapabilitySet": "None",
            "additionalEnabledCapabilities": [
                "baremetal",
                "Console",
                "Insights",
                "OperatorLifecycleManager",
                "Ingress",
            ],
        }
    }


async def test_one_vip_list_alone_keeps_platform_none(rig: Rig) -> None:
    await converged(rig, apiVIPs=["192.168.10.5"])
    aci = rig.obj(AGENT_CLUSTER_INSTALL, NAME)
    assert aci["spec"]["platformType"] == "None"
    assert "apiVIPs" not in aci["spec"]


async def test_without_a_release_image_the_public_release_of_the_version_is_used(
    rig: Rig,
) -> None:
    await converged(rig)
    assert rig.obj(CLUSTER_IMAGE_SET, NAME, None)["spec"]["releaseImage"] == (
        "quay.io/openshift-release-dev/ocp-release:4.16.0-x86_64"
    )


async def test_the_aci_is_made_once_and_never_updated(rig: Rig) -> None:
    await converged(rig)
    aci = rig.obj(AGENT_CLUSTER_INSTALL, NAME)
    md = rig.obj(MACHINE_DEPLOYMENT, "c1-md-0")
    md["spec"]["replicas"] = 5
    before = len(rig.writes())

    await rig.touched(CLUSTER_DEPLOYMENT, NAME)
    await rig.reconcile(CLUSTER_DEPLOYMENT, NAME)

    assert rig.writes()[before:] == []
    assert rig.obj(AGENT_CLUSTER_INSTALL, NAME) == aci
    assert aci["spec"]["provisionRequirements"]["workerAgents"] == 2


async def test_an_aci_made_by_a_run_that_died_before_the_reference_is_referred_to(
    rig: Rig,
) -> None:
    await converged(rig)
    cd = rig.obj(CLUSTER_DEPLOYMENT, NAME)
    del cd["spec"]["clusterInstallRef"]
    cd["metadata"]["generation"] += 1  # a spec change
    await rig.touched(CLUSTER_DEPLOYMENT, NAME)
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["spec"]["clusterInstallRef"]["name"] == NAME
    assert [c for c in rig.writes() if c[0] == "create" and c[1] == "AgentClusterInstall"] == [
        ("create", "AgentClusterInstall", NS, NAME)
    ]


async def test_a_deleted_aci_is_made_again_through_its_cluster_deployment(rig: Rig) -> None:
    await converged(rig)
    gone = rig.kube.objects.pop((AGENT_CLUSTER_INSTALL.token, NS, NAME))
    await rig.event(AGENT_CLUSTER_INSTALL, gone, "DELETED")
    assert rig.obj(AGENT_CLUSTER_INSTALL, NAME)["metadata"]["uid"] != gone["metadata"]["uid"]


async def test_a_cluster_deployment_no_acp_owns_is_none_of_ours(rig: Rig) -> None:
    rig.kube.put(CLUSTER_DEPLOYMENT, {"metadata": {"name": "x", "namespace": NS}, "spec": {}})
    await rig.touched(CLUSTER_DEPLOYMENT, "x")
    assert rig.writes() == []


async def test_the_image_registry_becomes_the_additional_registry_config(rig: Rig) -> None:
    conf = (
        '[[registry]]\nlocation = "quay.io"\n'
        '[[registry.mirror]]\nlocation = "mirror.local/quay"\ninsecure = true\n'
        '[[registry.mirror]]\nlocation = "tags.local/quay"\npull-from-mirror = "tag-only"\n'
    )
    rig.kube.put(
        CONFIG_MAP,
        {
            "metadata": {"name": "registry", "namespace": NS},
            "data": {"registries.conf": conf, "ca-bundle.crt": "PEM"},
        },
    )
    await converged(
        rig, imageRegistryRef={"name": "registry"}, manifestsConfigMapRefs=[{"name": "m"}]
    )

    data = rig.obj(CONFIG_MAP, logic.REGISTRY_CONFIG_MAP)["data"]
    digest = json.loads(data["image-digest-mirror-set.json"])
    assert digest["kind"] == "ImageDigestMirrorSet"
    assert digest["spec"]["imageDigestMirrors"] == [
        {"source": "quay.io", "mirrors": ["mirror.local/quay"]}
    ]
    tags = json.loads(data["image-tag-mirror-set.json"])
    assert tags["spec"]["imageTagMirrors"] == [
        {"source": "quay.io", "mirrors": ["tags.local/quay"]}
    ]
    cert = json.loads(data["additional-registry-certificate.json"])
    assert (cert["metadata"]["namespace"], cert["data"]) == (
        "openshift-config",
        {"ca-bundle.crt": "PEM"},
    )
    image = json.loads(data["image-config.json"])
    assert image["spec"] == {
        "additionalTrustedCA": {"name": "additional-registry-certificate"},
        "registrySources": {"insecureRegistries": ["mirror.local/quay"]},
    }
    aci = rig.obj(AGENT_CLUSTER_INSTALL, NAME)
    assert aci["spec"]["manifestsConfigMapRefs"] == [
        {"name": "m"},
        {"name": "additional-registry-config"},
    ]


async def test_a_malformed_or_missing_registry_config_map_is_shown_on_the_acp(rig: Rig) -> None:
    world(rig, imageRegistryRef={"name": "registry"})
    await rig.reconcile()
    with pytest.raises(TemporaryError):
        await rig.touched(CLUSTER_DEPLOYMENT, NAME)
    assert rig.conditions()["ImageRegistryConfigured"]["status"] == "False"

    rig.kube.put(
        CONFIG_MAP, {"metadata": {"name": "registry", "namespace": NS}, "data": {"x": "y"}}
    )
    with pytest.raises(PermanentError) as refused:
        await rig.touched(CLUSTER_DEPLOYMENT, NAME)
    assert refused.value.reason == "InvalidImageRegistry"
    assert "registries.conf" in rig.conditions()["ImageRegistryConfigured"]["message"]
    assert rig.kube.stored(AGENT_CLUSTER_INSTALL, NS, NAME) is None


# --- 15, 16: the replicas --------------------------------------------------------------------


async def test_each_replica_is_a_clone_an_oac_and_a_machine_under_one_name(rig: Rig) -> None:
    world(rig)
    await rig.reconcile()

    assert rig.machines() == [f"{NAME}-r0", f"{NAME}-r1", f"{NAME}-r2"]
    name = f"{NAME}-r0"
    machine = rig.obj(MACHINE, name)
    labels = {
        "tier": "cp",
        logic.CLUSTER_NAME_LABEL: CLUSTER,
        logic.CONTROL_PLANE_LABEL: "",
        logic.CONTROL_PLANE_NAME_LABEL: NAME,
    }
    assert machine["metadata"]["labels"] == labels
    assert machine["metadata"]["annotations"] == {"note": "x", logic.ROLE_ANNOTATION: "master"}
    (owner,) = machine["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (ACP.kind, NAME, True)
    assert machine["spec"] == {
        "clusterName": CLUSTER,
        "version": "4.16.0",
        "bootstrap": {
            "configRef": {
                "apiVersion": OPENSHIFT_ASSISTED_CONFIG.api_version,
                "kind": "OpenshiftAssistedConfig",
                "name": name,
                "namespace": NS,
            }
        },
        "infrastructureRef": {
            "apiVersion": METAL3_MACHINE.api_version,
            "kind": "Metal3Machine",
            "name": name,
            "namespace": NS,
        },
        "nodeDrainTimeout": "5m",
    }
    oac = rig.obj(OPENSHIFT_ASSISTED_CONFIG, name)
    assert oac["spec"] == {"sshAuthorizedKey": "ssh-ed25519 AAAA", "cpuArchitecture": "x86_64"}
    assert oac["metadata"]["labels"] == labels
    assert "controller" not in oac["metadata"]["ownerReferences"][0]
    clone = rig.obj(METAL3_MACHINE, name)
    assert clone["spec"] == {"dataTemplate": {"name": "dt"}, "image": {"url": "", "format": ""}}
    assert clone["metadata"]["labels"] == {"from": "template", **labels}
    assert clone["metadata"]["annotations"] == {
        "note": "x",
        logic.CLONED_FROM_NAME: NAME,
        logic.CLONED_FROM_GROUPKIND: "Metal3MachineTemplate.infrastructure.cluster.x-k8s.io",
    }
    assert "controller" not in clone["metadata"]["ownerReferences"][0]


async def test_the_status_counts_the_replicas_and_their_readiness(rig: Rig) -> None:
    world(rig)
    await rig.reconcile()
    status = rig.status()
    assert {k: status[k] for k in ("replicas", "updatedReplicas", "readyReplicas")} == {
        "replicas": 3,
        "updatedReplicas": 3,
        "readyReplicas": 0,
    }
    assert status["unavailableReplicas"] == 3
    assert status["selector"] == f"{logic.CLUSTER_NAME_LABEL}={CLUSTER},{logic.CONTROL_PLANE_LABEL}"
    assert (status["version"], status["observedGeneration"]) == ("4.16.0", 1)
    assert (status["initialized"], status["ready"]) == (False, False)
    assert rig.conditions()[logic.MACHINES_CREATED]["status"] == "True"
    assert rig.conditions()[logic.KUBECONFIG_AVAILABLE]["reason"] == "KubeconfigUnavailable"

    for name in rig.machines()[:2]:
        rig.obj(MACHINE, name)["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
        await rig.touched(MACHINE, name)
    status = rig.status()
    assert (status["readyReplicas"], status["unavailableReplicas"]) == (2, 1)


async def test_replicas_are_maintained_when_a_machine_goes(rig: Rig) -> None:
    world(rig)
    await rig.reconcile()
    name = f"{NAME}-r1"
    adopted = {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "name": name,
        "uid": "m",
    }
    for kind in (OPENSHIFT_ASSISTED_CONFIG, METAL3_MACHINE):
        rig.obj(kind, name)["metadata"]["ownerReferences"].append(adopted)
    gone = rig.kube.objects.pop((MACHINE.token, NS, name))

    await rig.event(MACHINE, gone, "DELETED")

    assert rig.machines() == [f"{NAME}-r0", f"{NAME}-r2", f"{NAME}-r3"]
    # the gone Machine's OAC and clone are not reused for the new one
    assert rig.kube.stored(OPENSHIFT_ASSISTED_CONFIG, NS, name) is None
    assert rig.kube.stored(METAL3_MACHINE, NS, name) is None


async def test_scaling_up_adds_machines_and_a_second_run_writes_nothing(rig: Rig) -> None:
    world(rig, replicas=1)
    await rig.reconcile()
    assert len(rig.machines()) == 1
    rig.acp()["spec"]["replicas"] = 3
    rig.acp()["metadata"]["generation"] += 1  # a spec change
    await rig.touched(ACP, NAME)
    assert len(rig.machines()) == 3
    assert rig.status()["replicas"] == 3


async def test_a_failed_machine_rolls_back_its_oac_and_clone(rig: Rig) -> None:
    world(rig, replicas=1)
    original = rig.kube.create

    async def failing_machine(kind: ResourceKind, obj: Json) -> Json:
        if kind == MACHINE:
            raise KubeInvalid("Machine.cluster.x-k8s.io is invalid")
        return await original(kind, obj)

    rig.kube.create = failing_machine  # type: ignore[method-assign]
    with pytest.raises(KubeInvalid):
        await rig.reconcile()

    assert rig.machines() == []
    assert rig.kube.of_kind(OPENSHIFT_ASSISTED_CONFIG) == []
    assert rig.kube.of_kind(METAL3_MACHINE) == []
    created = rig.conditions()[logic.MACHINES_CREATED]
    assert (created["status"], created["reason"]) == ("False", "MachineGenerationFailed")
    assert f"error creating machine {NAME}-r0" in created["message"]

    rig.kube.create = original  # type: ignore[method-assign]
    await rig.reconcile()
    assert rig.machines() == [f"{NAME}-r1"]
    assert rig.conditions()[logic.MACHINES_CREATED]["status"] == "True"


async def test_a_temporary_machine_failure_rolls_back_and_is_retried(rig: Rig) -> None:
    world(rig, replicas=1)
    original = rig.kube.create
    failures = iter([KubeUnavailable("503")])

    async def flaky(kind: ResourceKind, obj: Json) -> Json:
        if kind == MACHINE:
            error = next(failures, None)
            if error is not None:
                raise error
        return await original(kind, obj)

    rig.kube.create = flaky  # type: ignore[method-assign]
    with pytest.raises(TemporaryError):
        await rig.reconcile()
    assert rig.kube.of_kind(OPENSHIFT_ASSISTED_CONFIG) == []
    await rig.reconcile()
    assert len(rig.machines()) == 1
    assert len(rig.kube.of_kind(OPENSHIFT_ASSISTED_CONFIG)) == 1


async def test_a_machine_made_despite_a_timeout_is_kept_not_rolled_back(rig: Rig) -> None:
    world(rig, replicas=1)
    rig.kube.stored_then_failed["Machine"] = KubeUnavailable("timeout")
    await rig.reconcile()
    assert rig.machines() == [f"{NAME}-r0"]
    assert rig.obj(OPENSHIFT_ASSISTED_CONFIG, f"{NAME}-r0")
    assert rig.obj(METAL3_MACHINE, f"{NAME}-r0")


@pytest.mark.parametrize("dies_at", ["Metal3Machine", "OpenshiftAssistedConfig", "Machine"])
async def test_a_run_killed_mid_replica_is_completed_by_the_next_never_more_machines(
    rig: Rig, dies_at: str
) -> None:
    """A SIGKILL after a part of a replica was written: the next run completes that name."""
    world(rig, replicas=2)
    original = rig.kube.create
    made: list[str] = []

    async def dying(kind: ResourceKind, obj: Json) -> Json:
        made.append(kind.kind)
        if kind.kind == dies_at and made.count(dies_at) == 2:
            await original(kind, obj)  # written, then the process dies before the answer
            raise Crash
        return await original(kind, obj)

    rig.kube.create = dying  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await rig.reconcile()
    rig.kube.create = original  # type: ignore[method-assign]

    await rig.reconcile()
    await rig.reconcile()

    assert rig.machines() == [f"{NAME}-r0", f"{NAME}-r1"]
    assert rig.drawn == [f"{NAME}-r0", f"{NAME}-r1"]
    assert sorted(o["metadata"]["name"] for o in rig.kube.of_kind(OPENSHIFT_ASSISTED_CONFIG)) == (
        rig.machines()
    )
    assert sorted(o["metadata"]["name"] for o in rig.kube.of_kind(METAL3_MACHINE)) == (
        rig.machines()
    )


async def test_a_killed_run_with_only_a_clone_left_resumes_that_name(rig: Rig) -> None:
    world(rig, replicas=1)
    original = rig.kube.create

    async def dying(kind: ResourceKind, obj: Json) -> Json:
        if kind == OPENSHIFT_ASSISTED_CONFIG:
            raise Crash
        return await original(kind, obj)

    rig.kube.create = dying  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await rig.reconcile()
    rig.kube.create = original  # type: ignore[method-assign]
    await rig.reconcile()

    assert rig.machines() == [f"{NAME}-r0"]
    assert rig.drawn == [f"{NAME}-r0"]
    assert [c for c in rig.kube.calls if c[:2] == ("create", "Metal3Machine")] == [
        ("create", "Metal3Machine", NS, f"{NAME}-r0")
    ]


async def test_a_missing_infrastructure_template_is_shown_and_retried(rig: Rig) -> None:
    capi_cluster(rig)
    control_plane(rig, replicas=1)
    with pytest.raises(TemporaryError):
        await rig.reconcile()
    created = rig.conditions()[logic.MACHINES_CREATED]
    assert created["reason"] == "InfrastructureTemplateCloningFailed"
    templates(rig)
    await rig.reconcile()
    assert len(rig.machines()) == 1


async def test_a_malformed_infrastructure_reference_is_a_permanent_error(rig: Rig) -> None:
    world(rig)
    rig.acp()["spec"]["machineTemplate"]["infrastructureRef"] = {"kind": "Metal3Machine"}
    with pytest.raises(PermanentError) as refused:
        await rig.touched(ACP, NAME)
    assert refused.value.reason == "InfrastructureTemplateCloningFailed"
    assert rig.conditions()[logic.MACHINES_CREATED]["reason"] == (
        "InfrastructureTemplateCloningFailed"
    )
    assert rig.machines() == []


async def test_a_failed_oac_is_shown_as_bootstrap_cloning_failed(rig: Rig) -> None:
    world(rig, replicas=1)
    original = rig.kube.create

    async def refusing(kind: ResourceKind, obj: Json) -> Json:
        if kind == OPENSHIFT_ASSISTED_CONFIG:
            raise KubeInvalid("spec.cpuArchitecture: unsupported")
        return await original(kind, obj)

    rig.kube.create = refusing  # type: ignore[method-assign]
    with pytest.raises(KubeInvalid):
        await rig.reconcile()
    assert rig.conditions()[logic.MACHINES_CREATED]["reason"] == "BootstrapTemplateCloningFailed"
    assert rig.machines() == []


# --- 17, 18: the installation ----------------------------------------------------------------


async def test_the_admin_kubeconfig_becomes_the_cluster_kubeconfig_and_the_acp_initialized(
    rig: Rig,
) -> None:
    await converged(rig)
    start_install(rig)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)

    admin = rig.obj(SECRET, f"{NAME}-admin-kubeconfig")
    assert admin["metadata"]["labels"][logic.CLUSTER_NAME_LABEL] == CLUSTER
    kubeconfig = rig.obj(SECRET, f"{CLUSTER}-kubeconfig")
    assert kubeconfig["type"] == "cluster.x-k8s.io/secret"
    assert kubeconfig["metadata"]["labels"] == {logic.CLUSTER_NAME_LABEL: CLUSTER}
    assert base64.b64decode(kubeconfig["data"]["value"]).decode().startswith("apiVersion: v1")
    (owner,) = kubeconfig["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (ACP.kind, NAME, True)
    status = rig.status()
    assert (status["initialized"], status["ready"]) == (True, False)
    assert rig.conditions()[logic.KUBECONFIG_AVAILABLE]["status"] == "True"
    ready = rig.conditions()[logic.CONTROL_PLANE_READY]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ControlPlaneInstalling",
        "Controlplane installing, status: installing",
    )


async def test_a_changed_admin_kubeconfig_is_published_again(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    rig.obj(SECRET, f"{NAME}-admin-kubeconfig")["data"]["kubeconfig"] = b64("rotated")

    await rig.touched(SECRET, f"{NAME}-admin-kubeconfig")

    value = rig.obj(SECRET, f"{CLUSTER}-kubeconfig")["data"]["value"]
    assert base64.b64decode(value).decode() == "rotated"


async def test_a_deleted_cluster_kubeconfig_is_published_again(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    gone = rig.kube.objects.pop((SECRET.token, NS, f"{CLUSTER}-kubeconfig"))
    await rig.event(SECRET, gone, "DELETED")
    assert rig.obj(SECRET, f"{CLUSTER}-kubeconfig")["data"] == gone["data"]


async def test_adding_hosts_makes_the_acp_ready(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    set_aci_state(rig, "adding-hosts")
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)

    assert (rig.status()["initialized"], rig.status()["ready"]) == (True, True)
    ready = rig.conditions()[logic.CONTROL_PLANE_READY]
    assert (ready["status"], ready["reason"]) == ("True", "ControlPlaneReady")


async def test_an_install_error_is_shown_with_its_state_info(rig: Rig) -> None:
    await converged(rig)
    set_aci_state(rig, "error", "Host master-0: failed to write image to disk")
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    ready = rig.conditions()[logic.CONTROL_PLANE_READY]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "InstallationFailed",
        "Host master-0: failed to write image to disk",
    )
    assert rig.status()["ready"] is False


async def test_an_aci_no_acp_controls_is_ignored_quietly(rig: Rig) -> None:
    rig.kube.put(
        AGENT_CLUSTER_INSTALL,
        {
            "metadata": {"name": "other", "namespace": NS},
            "spec": {"clusterMetadata": {"adminKubeconfigSecretRef": {"name": "x"}}},
        },
    )
    await rig.touched(AGENT_CLUSTER_INSTALL, "other")
    assert rig.writes() == []
    assert rig.bus.published == []


async def test_an_admin_kubeconfig_without_its_key_is_a_permanent_error(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    del rig.obj(SECRET, f"{NAME}-admin-kubeconfig")["data"]["kubeconfig"]
    with pytest.raises(PermanentError) as refused:
        await rig.touched(AGENT_CLUSTER_INSTALL, NAME)  # naming its admin kubeconfig
    assert refused.value.reason == "SecretKeyMissing"
    assert rig.conditions()[logic.KUBECONFIG_AVAILABLE]["status"] == "False"
    assert rig.kube.stored(SECRET, NS, f"{CLUSTER}-kubeconfig") is None


# --- 19: deletion ----------------------------------------------------------------------------


async def test_deletion_deletes_the_cluster_deployment_and_lets_go_once_it_is_gone(
    rig: Rig,
) -> None:
    await converged(rig)
    rig.obj(CLUSTER_DEPLOYMENT, NAME)["metadata"]["finalizers"] = [HIVE_FINALIZER]
    await rig.kube.delete(ACP, NS, NAME)
    await rig.touched(ACP, NAME)

    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)["metadata"]["deletionTimestamp"]
    assert logic.ACP_FINALIZER in rig.acp()["metadata"]["finalizers"]
    assert rig.conditions()["Deleting"]["reason"] == "WaitingForClusterDeployment"

    gone = rig.kube.objects.pop((CLUSTER_DEPLOYMENT.token, NS, NAME))  # hive let go
    await rig.event(CLUSTER_DEPLOYMENT, gone, "DELETED")

    assert rig.kube.stored(ACP, NS, NAME) is None
    assert rig.kube.stored(CLUSTER_DEPLOYMENT, NS, NAME) is None


async def test_deletion_without_a_cluster_deployment_lets_go_at_once(rig: Rig) -> None:
    world(rig, version="4.12.0")
    await rig.reconcile()
    await rig.kube.delete(ACP, NS, NAME)
    await rig.touched(ACP, NAME)
    assert rig.kube.stored(ACP, NS, NAME) is None


# --- idempotence and events ------------------------------------------------------------------


async def test_a_converged_control_plane_writes_nothing_more(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    set_aci_state(rig, "adding-hosts")
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    writes, reports = len(rig.writes()), len(rig.bus.of(PatchStatus))
    del rig.acp()["status"]["observedGeneration"]  # a CRD without the field prunes it

    for kind in (ACP, CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL):
        await rig.touched(kind, NAME)
    await rig.touched(CAPI_CLUSTER, CLUSTER)
    await rig.touched(MACHINE, f"{NAME}-r0")
    await rig.touched(SECRET, f"{NAME}-admin-kubeconfig")

    assert rig.writes()[writes:] == []
    assert len(rig.bus.of(PatchStatus)) == reports


async def test_the_writers_write_of_a_decision_brings_nothing_new(rig: Rig) -> None:
    await converged(rig)
    await rig.touched(ACP, NAME)  # the writer's write of what the last run reported
    reads = rig.kube.reads
    await rig.touched(ACP, NAME)
    assert rig.kube.reads == reads

    rig.acp()["metadata"]["annotations"] = {"note": "changed"}
    await rig.touched(ACP, NAME)  # more than the reported status: decided again
    assert rig.kube.reads > reads


async def test_changes_the_acp_does_not_look_at_wake_nobody_and_cost_no_read(rig: Rig) -> None:
    await converged(rig)
    machine = f"{NAME}-r0"
    for kind, name in ((CAPI_CLUSTER, CLUSTER), (MACHINE, machine), (AGENT_CLUSTER_INSTALL, NAME)):
        await rig.touched(kind, name)  # the first event of each maps
    reads, reports = rig.kube.reads, len(rig.bus.of(PatchStatus))

    rig.obj(CAPI_CLUSTER, CLUSTER)["status"]["phase"] = "Provisioned"
    await rig.touched(CAPI_CLUSTER, CLUSTER)
    rig.obj(MACHINE, machine)["status"] = {"phase": "Provisioning"}
    await rig.touched(MACHINE, machine)
    rig.obj(AGENT_CLUSTER_INSTALL, NAME)["status"] = {"conditions": [{"type": "Validated"}]}
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    assert (rig.kube.reads, len(rig.bus.of(PatchStatus))) == (reads, reports)

    rig.obj(MACHINE, machine)["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    calls = len(rig.kube.calls)
    await rig.touched(MACHINE, machine)
    assert rig.status()["readyReplicas"] == 1
    # the ACP, its Cluster, ClusterDeployment and ACI as their events left them: only the
    # Machines are listed (they decide what is made)
    assert [c for c in rig.kube.calls[calls:] if c[0] in ("get", "list")] == [
        ("list", MACHINE.kind, NS, "")
    ]


async def test_an_acis_install_states_wake_its_acp_not_the_aci(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)  # publishes the kubeconfig
    set_aci_state(rig, "finalizing")
    calls = len(rig.kube.calls)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    read = [c for c in rig.kube.calls[calls:] if c[0] == "get"]
    assert ("get", AGENT_CLUSTER_INSTALL.kind, NS, NAME) not in read  # the ACP took the event's
    assert ("get", SECRET.kind, NS, f"{NAME}-admin-kubeconfig") not in read  # the ACI slept
    message = rig.conditions()[logic.CONTROL_PLANE_READY]["message"]
    assert message == "Controlplane installing, status: finalizing"


async def test_a_failed_run_leaves_its_acp_to_be_read_and_decided_again(rig: Rig) -> None:
    world(rig)
    rig.kube.fail("apply", KubeUnavailable("down"))
    with pytest.raises(KubeUnavailable):
        await rig.touched(ACP, NAME)
    calls = len(rig.kube.calls)
    await rig.touched(ACP, NAME)
    assert rig.kube.calls[calls] == ("get", ACP.kind, NS, NAME)
    assert rig.obj(CLUSTER_DEPLOYMENT, NAME)


async def test_events_map_to_the_objects_they_concern(rig: Rig) -> None:
    await converged(rig)
    start_install(rig)
    await rig.touched(AGENT_CLUSTER_INSTALL, NAME)
    kube = rig.kube
    reads = kube.reads

    async def targets(kind: ResourceKind, obj: Json, event: str = "MODIFIED") -> list[Target]:
        return await handlers.targets_of(changed(kind, obj, event), rig.deps)

    acp = Target(ACP, NS, NAME)
    cd = Target(CLUSTER_DEPLOYMENT, NS, NAME)
    aci = Target(AGENT_CLUSTER_INSTALL, NS, NAME)
    assert await targets(ACP, rig.acp()) == [acp]
    assert await targets(CAPI_CLUSTER, rig.obj(CAPI_CLUSTER, CLUSTER)) == [acp]
    assert await targets(MACHINE, rig.obj(MACHINE, f"{NAME}-r0")) == [acp]
    assert await targets(CLUSTER_DEPLOYMENT, rig.obj(CLUSTER_DEPLOYMENT, NAME)) == [cd]
    assert await targets(CLUSTER_DEPLOYMENT, rig.obj(CLUSTER_DEPLOYMENT, NAME), "DELETED") == [
        cd,
        acp,
    ]
    # the ACI's last event ran through: the ACP looks at nothing this one changes
    assert await targets(AGENT_CLUSTER_INSTALL, rig.obj(AGENT_CLUSTER_INSTALL, NAME)) == [aci]
    set_aci_state(rig, "finalizing")
    assert await targets(AGENT_CLUSTER_INSTALL, rig.obj(AGENT_CLUSTER_INSTALL, NAME)) == [aci, acp]
    assert await targets(
        AGENT_CLUSTER_INSTALL, rig.obj(AGENT_CLUSTER_INSTALL, NAME), "DELETED"
    ) == [aci, acp, cd]
    assert await targets(SECRET, rig.obj(SECRET, f"{NAME}-admin-kubeconfig")) == [aci]
    assert await targets(SECRET, rig.obj(SECRET, f"{CLUSTER}-kubeconfig")) == [aci, acp]
    assert await targets(SECRET, rig.obj(SECRET, logic.PLACEHOLDER_PULL_SECRET)) == []
    stray = {
        "metadata": {"name": "m"},
        "spec": {"controlPlaneRef": {"kind": "KubeadmControlPlane"}},
    }
    assert await targets(CAPI_CLUSTER, stray) == []
    assert await targets(MACHINE, {"metadata": {"name": "w"}}) == []
    assert kube.reads == reads  # mapping costs no read


async def test_the_replica_forgets_what_it_saw_when_partitions_move(rig: Rig) -> None:
    settings = AssistedControlPlaneSettings()
    consumer = build(settings, rig.deps, bus=rig.bus, leases=None)  # type: ignore[arg-type]
    assert consumer.claims is not None
    forgetting = consumer.claims.follower
    assert isinstance(forgetting, Forgetting)
    await converged(rig)
    await rig.touched(ACP, NAME)
    assert rig.deps.seen.current(key_of(ACP, NS, NAME)) is not None
    await forgetting.lost(frozenset({0}))
    assert rig.deps.seen.current(key_of(ACP, NS, NAME)) is None
