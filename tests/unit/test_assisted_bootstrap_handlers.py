"""The OpenShift Assisted bootstrap provider's handlers, through its composition root.

Kubernetes and the bus are fakes (``tests.fakes``); a small "writer" merges the published
status patches into the fake objects, so each run sees what the previous one reported. The
world is what Cluster API, the control-plane provider, CAPM3 and assisted-service would have
made: a Cluster, its ClusterDeployment and AgentClusterInstall, Machines with their configs,
Metal3Machines and templates, BareMetalHosts and the Agents booted from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
from typing import Any

import pytest

from services.baremetal.assisted_bootstrap import handlers, logic
from services.baremetal.assisted_bootstrap.bootstrap import dependencies
from services.baremetal.assisted_bootstrap.configs import ImageServiceMissing
from services.baremetal.assisted_bootstrap.ports import SERVICE_KIND, Deps
from services.baremetal.assisted_bootstrap.settings import (
    AssistedBootstrapSettings,
    AssistedBootstrapTuning,
)
from shared.consumer import Batch
from shared.errors import KubeUnavailable, PermanentError
from shared.kube import ResourceKind
from shared.mergepatch import apply as merge
from shared.messages import (
    EventType,
    Message,
    ObjectRef,
    PatchStatus,
    RecheckObject,
    ResourceChanged,
)
from shared.reconcile import Target
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    METAL3_MACHINE,
    METAL3_MACHINE_TEMPLATE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
NS = "ns"
OAC = OPENSHIFT_ASSISTED_CONFIG
CAUSE = RecheckObject(
    source="test",
    correlation_id="t",
    ref=ObjectRef(api_version="v1", kind="Test", name="x"),
    reason="test",
)
URL = "https://image-service.sim/images/abc?arch=x86_64&type=full-iso"
CAPI = "cluster.x-k8s.io/v1beta1"
WRITES = ("create", "apply", "patch", "delete")

pytestmark = pytest.mark.timeout(10)


class FinalizingKube(FakeKube):
    """Deletes as the API server does: an object with finalizers only gets a deletionTimestamp."""

    def bump(self, stored: Json) -> None:
        """A change made in place gets a new resourceVersion, as every write does."""
        stored["metadata"]["resourceVersion"] = str(next(self._versions))

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        stored = self.stored(kind, namespace, name)
        if stored is not None and stored["metadata"].get("finalizers"):
            self._called("delete", kind, namespace, name)
            stored["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            self.bump(stored)
            return stored
        return await super().delete(kind, namespace, name)


@dataclasses.dataclass
class Rig:
    deps: Deps
    kube: FinalizingKube
    bus: FakeBus
    applied: int = 0

    def obj(self, kind: ResourceKind, name: str) -> Json:
        found = self.kube.stored(kind, NS, name)
        assert found is not None, name
        return found

    async def reconcile(self, kind: ResourceKind, name: str, cause: Message = CAUSE) -> None:
        """Run now, on a world the test changed in place, without the events that would have
        told the replica: it forgets what it remembers, as when partitions move."""
        self.deps.seen.clear()
        try:
            await handlers.run({Target(kind, NS, name): cause}, self.deps)
        finally:
            self.write_status()

    async def on(self, kind: ResourceKind, name: str, event: EventType = "MODIFIED") -> None:
        """The watcher's event of the stored object (changed in place by the test, so at a
        new resourceVersion), through the service's mapping."""
        self.kube.bump(self.obj(kind, name))
        await self.event(changed(kind, self.obj(kind, name), event))

    async def event(self, message: ResourceChanged) -> None:
        batch = Batch(key=message.ref.name, partition=0, messages=(message,))
        try:
            await handlers.on_changes(batch, self.deps)
        finally:
            self.write_status()

    async def targets(
        self, kind: ResourceKind, name: str, event: EventType = "MODIFIED"
    ) -> list[Target]:
        found = await handlers.targets_of(changed(kind, self.obj(kind, name), event), self.deps)
        return sorted(found, key=lambda target: target.name)

    def write_status(self) -> None:
        """The writer's part: merge every new status patch into its object."""
        patches = self.bus.of(PatchStatus)
        for message in patches[self.applied :]:
            assert message.ref.kind == OAC.kind
            stored = self.kube.stored(OAC, NS, message.ref.name)
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

    def status(self, name: str) -> Json:
        return dict(self.obj(OAC, name).get("status") or {})

    def condition(self, name: str, kind: str = logic.DATA_SECRET) -> Json:
        found = logic.condition_of(self.obj(OAC, name), kind)
        assert found is not None, (name, kind)
        return found

    def writes(self) -> list[tuple[str, str, str | None, str]]:
        return [c for c in self.kube.calls if c[0] in WRITES]


def changed(kind: ResourceKind, obj: Json, event: EventType = "MODIFIED") -> ResourceChanged:
    return ResourceChanged(
        source="t",
        correlation_id="t",
        event=event,
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=NS,
            name=obj["metadata"]["name"],
            uid=obj["metadata"].get("uid"),
        ),
        resource_version="1",
        object=obj,
    )


def rigged(**tuning: Any) -> Rig:
    kube, bus = FinalizingKube(), FakeBus()
    settings = AssistedBootstrapSettings(assistedbootstrap=AssistedBootstrapTuning(**tuning))
    return Rig(dependencies(settings, bus=bus, kube=kube), kube, bus)


@pytest.fixture
def rig() -> Rig:
    return rigged()


# --- the world the other controllers make -----------------------------------------------------


def owner(kind: str, name: str, api: str = CAPI) -> Json:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{name}"}


def cluster(rig: Rig, *, ready: bool = True, name: str = "c1") -> None:
    rig.kube.put(
        CAPI_CLUSTER,
        {"metadata": {"name": name, "namespace": NS}, "status": {"infrastructureReady": ready}},
    )


def installer(rig: Rig, state: str | None = "insufficient", *, cluster: str = "c1") -> None:
    """The control plane's ClusterDeployment and ACI (state None: no status yet)."""
    name = f"{cluster}-control-plane"
    labels = {logic.CLUSTER_NAME_LABEL: cluster, logic.CONTROL_PLANE_LABEL: ""}
    rig.kube.put(
        CLUSTER_DEPLOYMENT,
        {
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"clusterInstallRef": {"kind": "AgentClusterInstall", "name": name}},
        },
    )
    aci: Json = {"metadata": {"name": name, "namespace": NS, "labels": labels}}
    if state is not None:
        aci["status"] = {"debugInfo": {"state": state}}
    rig.kube.put(AGENT_CLUSTER_INSTALL, aci)


def set_state(rig: Rig, state: str, cluster: str = "c1") -> None:
    rig.obj(AGENT_CLUSTER_INSTALL, f"{cluster}-control-plane")["status"] = {
        "debugInfo": {"state": state}
    }


def templates(rig: Rig) -> None:
    for name in ("c1-control-plane", "c1-workers"):
        rig.kube.put(
            METAL3_MACHINE_TEMPLATE,
            {"metadata": {"name": name, "namespace": NS}, "spec": {"template": {"spec": {}}}},
        )
    rig.kube.put(
        OPENSHIFT_ASSISTED_CONTROL_PLANE,
        {
            "metadata": {"name": "c1-control-plane", "namespace": NS},
            "spec": {
                "machineTemplate": {
                    "infrastructureRef": {
                        "kind": "Metal3MachineTemplate",
                        "name": "c1-control-plane",
                    }
                }
            },
        },
    )
    template = {
        "spec": {"infrastructureRef": {"kind": "Metal3MachineTemplate", "name": "c1-workers"}}
    }
    rig.kube.put(
        MACHINE_SET,
        {"metadata": {"name": "c1-md-0-x", "namespace": NS}, "spec": {"template": template}},
    )
    rig.kube.put(
        MACHINE_DEPLOYMENT,
        {"metadata": {"name": "md-0", "namespace": NS}, "spec": {"template": template}},
    )


def host_machine(
    rig: Rig,
    name: str,
    *,
    control_plane: bool = False,
    deployment: str | None = "md-0",
    machine_set: str | None = "c1-md-0-x",
    owned: bool = True,
    **oac_spec: Any,
) -> None:
    """A Machine with its config and Metal3Machine, as CAPI (or the ACP) creates them."""
    labels = {logic.CLUSTER_NAME_LABEL: "c1"}
    if control_plane:
        labels[logic.CONTROL_PLANE_LABEL] = ""
        owners = [owner("OpenshiftAssistedControlPlane", "c1-control-plane", CONTROL_PLANE_API)]
    else:
        if deployment:
            labels[logic.DEPLOYMENT_LABEL] = deployment
        owners = [owner("MachineSet", machine_set)] if machine_set else []
    rig.kube.put(
        MACHINE,
        {
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": labels,
                "ownerReferences": owners,
            },
            "spec": {
                "clusterName": "c1",
                "bootstrap": {
                    "configRef": {
                        "apiVersion": OAC.api_version,
                        "kind": "OpenshiftAssistedConfig",
                        "name": name,
                    }
                },
                "infrastructureRef": {"kind": "Metal3Machine", "name": name},
            },
        },
    )
    rig.kube.put(
        OAC,
        {
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": labels,
                "ownerReferences": [owner("Machine", name)] if owned else [],
            },
            "spec": {"cpuArchitecture": "x86_64", "pullSecretRef": {"name": "pull"}, **oac_spec},
        },
    )
    rig.kube.put(
        METAL3_MACHINE,
        {
            "metadata": {
                "name": name,
                "namespace": NS,
                "ownerReferences": [owner("Machine", name)],
            },
            "spec": {},
        },
    )


CONTROL_PLANE_API = OPENSHIFT_ASSISTED_CONTROL_PLANE.api_version


def publish_url(rig: Rig, infra: str, url: str = URL) -> None:
    rig.obj(INFRA_ENV, infra)["status"] = {"isoDownloadURL": url}


def host(rig: Rig, name: str, mac: str, *, claimed_by: str | None = None) -> Json:
    owners = [owner("Metal3Machine", claimed_by, METAL3_MACHINE.api_version)] if claimed_by else []
    return rig.kube.put(
        BARE_METAL_HOST,
        {
            "metadata": {"name": name, "namespace": NS, "ownerReferences": owners},
            "spec": {"bootMACAddress": mac},
        },
    )


def agent(rig: Rig, name: str, mac: str, *, pool: str = "c1-control-plane", **spec: Any) -> None:
    rig.kube.put(
        AGENT,
        {
            "metadata": {"name": name, "namespace": NS, "labels": {logic.INFRAENV_LABEL: pool}},
            "spec": {"approved": False, "role": "", **spec},
            "status": {
                "inventory": {"hostname": name, "interfaces": [{"macAddress": mac}]},
                "debugInfo": {"state": "known"},
            },
        },
    )


async def ready_world(rig: Rig, *, state: str = "insufficient") -> None:
    """One control plane and one worker host, both configs ready."""
    cluster(rig)
    installer(rig, state)
    templates(rig)
    host_machine(rig, "cp-0", control_plane=True)
    host_machine(rig, "w-0")
    for name in ("cp-0", "w-0"):
        await rig.reconcile(OAC, name)
    publish_url(rig, "c1-control-plane")
    publish_url(rig, "c1-md-0")
    for name in ("cp-0", "w-0"):
        await rig.reconcile(OAC, name)
        assert rig.status(name)["ready"] is True


# --- §B.11 2: waits for the Machine, the Cluster, its infrastructure ---------------------------


async def test_a_config_waits_for_its_machine_its_cluster_and_the_infrastructure(rig: Rig) -> None:
    host_machine(rig, "cp-0", control_plane=True, owned=False)
    await rig.reconcile(OAC, "cp-0")
    assert rig.bus.of(PatchStatus) == []
    assert "finalizers" not in rig.obj(OAC, "cp-0")["metadata"]

    host_machine(rig, "cp-0", control_plane=True)
    await rig.reconcile(OAC, "cp-0")  # no Cluster yet: nothing to say
    assert rig.bus.of(PatchStatus) == []
    assert rig.obj(OAC, "cp-0")["metadata"]["finalizers"] == [logic.FINALIZER]

    cluster(rig, ready=False)
    await rig.reconcile(OAC, "cp-0")
    available = rig.condition("cp-0")
    assert (available["status"], available["reason"]) == ("False", logic.WAITING_FOR_INFRA)
    assert rig.condition("cp-0", logic.READY)["reason"] == logic.WAITING_FOR_INFRA
    assert rig.status("cp-0")["observedGeneration"] == 1
    assert "ready" not in rig.status("cp-0")

    cluster(rig)
    await rig.on(CAPI_CLUSTER, "c1")
    assert rig.condition("cp-0")["reason"] == logic.WAITING_FOR_INSTALLER


# --- §B.11 3: exactly one ClusterDeployment, and its ACI -------------------------------------


async def test_a_config_needs_exactly_one_cluster_deployment_and_its_install(rig: Rig) -> None:
    cluster(rig)
    templates(rig)
    host_machine(rig, "cp-0", control_plane=True)
    await rig.reconcile(OAC, "cp-0")
    assert rig.condition("cp-0")["reason"] == logic.WAITING_FOR_INSTALLER
    assert "0 ClusterDeployments" in rig.condition("cp-0")["message"]

    installer(rig)
    rig.kube.objects.pop((AGENT_CLUSTER_INSTALL.token, NS, "c1-control-plane"))
    await rig.on(CLUSTER_DEPLOYMENT, "c1-control-plane")
    assert "AgentClusterInstall" in rig.condition("cp-0")["message"]

    rig.kube.put(
        CLUSTER_DEPLOYMENT,
        {
            "metadata": {
                "name": "other",
                "namespace": NS,
                "labels": {logic.CLUSTER_NAME_LABEL: "c1"},
            }
        },
    )
    await rig.on(CLUSTER_DEPLOYMENT, "other")
    installer(rig)
    await rig.on(AGENT_CLUSTER_INSTALL, "c1-control-plane")
    assert "2 ClusterDeployments" in rig.condition("cp-0")["message"]

    other = rig.kube.objects.pop((CLUSTER_DEPLOYMENT.token, NS, "other"))
    await rig.event(changed(CLUSTER_DEPLOYMENT, other, "DELETED"))  # one left
    assert rig.condition("cp-0")["reason"] == logic.WAITING_FOR_URL


# --- §B.11 4: the day-2 gate -----------------------------------------------------------------


@pytest.mark.parametrize("state", ["installing", "preparing-for-installation", "finalizing"])
async def test_a_worker_is_held_while_the_cluster_installs(rig: Rig, state: str) -> None:
    cluster(rig)
    installer(rig, state)
    templates(rig)
    host_machine(rig, "cp-0", control_plane=True)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "cp-0")
    await rig.reconcile(OAC, "w-0")

    assert rig.condition("cp-0")["reason"] == logic.WAITING_FOR_URL  # the control plane passes
    held = rig.condition("w-0")
    assert (held["status"], held["reason"]) == ("False", logic.WAITING_FOR_INSTALL)
    assert state in held["message"]
    assert rig.kube.stored(INFRA_ENV, NS, "c1-md-0") is None

    # an ACI event that does not open the gate leaves the worker alone
    assert await rig.targets(AGENT_CLUSTER_INSTALL, "c1-control-plane") == []
    set_state(rig, "adding-hosts")
    assert await rig.targets(AGENT_CLUSTER_INSTALL, "c1-control-plane") == [Target(OAC, NS, "w-0")]
    await rig.on(AGENT_CLUSTER_INSTALL, "c1-control-plane")
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_URL


@pytest.mark.parametrize("state", ["insufficient", "adding-hosts", "pending-for-input", None, ""])
async def test_a_worker_passes_before_the_install_and_once_hosts_are_added(
    rig: Rig, state: str | None
) -> None:
    cluster(rig)
    installer(rig, state)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "w-0")
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_URL


# --- §B.11 5: one InfraEnv per pool ---------------------------------------------------------


async def test_one_infra_env_per_pool_owned_by_its_first_config(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(
        rig,
        "w-0",
        sshAuthorizedKey="ssh-ed25519 AAA",
        additionalNTPSources=["ntp.example"],
        proxy={"httpProxy": "http://proxy:3128"},
    )
    host_machine(rig, "w-1")
    host_machine(rig, "cp-0", control_plane=True)
    for name in ("w-0", "w-1", "cp-0"):
        await rig.reconcile(OAC, name)

    infra = rig.obj(INFRA_ENV, "c1-md-0")
    assert infra["metadata"]["labels"] == {
        logic.CONFIG_LABEL: "w-0",
        logic.CLUSTER_NAME_LABEL: "c1",
    }
    assert [o["name"] for o in infra["metadata"]["ownerReferences"]] == ["w-0"]
    assert infra["metadata"]["ownerReferences"][0]["kind"] == "OpenshiftAssistedConfig"
    assert infra["spec"] == {
        "clusterRef": {"name": "c1-control-plane", "namespace": NS},
        "cpuArchitecture": "x86_64",
        "pullSecretRef": {"name": "pull"},
        "sshAuthorizedKey": "ssh-ed25519 AAA",
        "additionalNTPSources": ["ntp.example"],
        "proxy": {"httpProxy": "http://proxy:3128"},
    }
    assert rig.obj(INFRA_ENV, "c1-control-plane")["metadata"]["labels"][logic.CONFIG_LABEL] == (
        "cp-0"
    )
    applied = [c for c in rig.kube.calls if c[0] == "apply"]
    assert applied == [
        ("apply", "InfraEnv", NS, "c1-md-0"),
        ("apply", "InfraEnv", NS, "c1-control-plane"),
    ]
    for name, pool in (("w-0", "c1-md-0"), ("w-1", "c1-md-0"), ("cp-0", "c1-control-plane")):
        ref = rig.status(name)["infraEnvRef"]
        assert (ref["kind"], ref["name"], ref["namespace"]) == ("InfraEnv", pool, NS)
        assert rig.condition(name)["reason"] == logic.WAITING_FOR_URL


class YieldingKube(FinalizingKube):
    """Every read lets other tasks run while its answer travels, as a real API server's does."""

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        try:
            return await super().get(kind, namespace, name)
        finally:
            await asyncio.sleep(0)

    async def list(self, kind: ResourceKind, **selectors: Any) -> tuple[list[Json], str]:
        try:
            return await super().list(kind, **selectors)
        finally:
            await asyncio.sleep(0)


async def test_the_configs_of_a_pool_running_at_once_write_its_objects_once() -> None:
    kube, bus = YieldingKube(), FakeBus()
    rig = Rig(dependencies(AssistedBootstrapSettings(), bus=bus, kube=kube), kube, bus)
    cluster(rig)
    installer(rig)
    templates(rig)
    names = ("w-0", "w-1", "w-2")
    for name in names:
        host_machine(rig, name)
    await asyncio.gather(*(rig.reconcile(OAC, name) for name in names))
    publish_url(rig, "c1-md-0")
    await asyncio.gather(*(rig.reconcile(OAC, name) for name in names))

    assert [c for c in rig.writes() if c[1] in ("InfraEnv", "Metal3MachineTemplate")] == [
        ("apply", "InfraEnv", NS, "c1-md-0"),
        ("patch", "Metal3MachineTemplate", NS, "c1-workers"),
    ]
    assert all(rig.status(name)["ready"] is True for name in names)


async def test_the_configs_an_event_wakes_run_at_once() -> None:
    kube, bus = YieldingKube(), FakeBus()
    rig = Rig(dependencies(AssistedBootstrapSettings(), bus=bus, kube=kube), kube, bus)
    cluster(rig)
    installer(rig)
    templates(rig)
    names = ("cp-0", "cp-1", "cp-2")
    for name in names:
        host_machine(rig, name, control_plane=True)
        await rig.on(OAC, name)
    publish_url(rig, "c1-control-plane")
    calls = len(kube.calls)
    await rig.on(INFRA_ENV, "c1-control-plane")
    made = [c[:2] for c in kube.calls[calls:] if c[0] in ("patch", "create")]
    # every Metal3Machine has its image before the first config is through (its Secret)
    first_secret = made.index(("create", "Secret"))
    assert made[:first_secret].count(("patch", "Metal3Machine")) == 3
    assert all(rig.status(name)["ready"] is True for name in names)


async def test_a_failure_of_one_woken_config_is_raised_once_all_have_run(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0", deployment=None)  # its pool cannot be named
    host_machine(rig, "cp-0", control_plane=True)
    for name in ("w-0", "cp-0"):
        with contextlib.suppress(PermanentError):
            await rig.reconcile(OAC, name)
    publish_url(rig, "c1-control-plane")
    rig.deps.seen.clear()
    with pytest.raises(PermanentError):
        await handlers.run(
            {Target(OAC, NS, "w-0"): CAUSE, Target(OAC, NS, "cp-0"): CAUSE}, rig.deps
        )
    rig.write_status()
    assert rig.status("cp-0")["ready"] is True  # ran all the same


# --- §B.11 6, 7, 8: the ISO URL everywhere, the Secret, ready ----------------------------------


async def test_the_iso_url_reaches_the_configs_templates_and_machines_then_ready(
    rig: Rig,
) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "cp-0", control_plane=True)
    host_machine(rig, "w-0")
    for name in ("cp-0", "w-0"):
        await rig.reconcile(OAC, name)
    publish_url(rig, "c1-md-0")
    assert await rig.targets(INFRA_ENV, "c1-md-0") == [Target(OAC, NS, "w-0")]
    await rig.on(INFRA_ENV, "c1-md-0")

    image = {"url": URL, "format": "live-iso"}
    assert rig.obj(METAL3_MACHINE_TEMPLATE, "c1-workers")["spec"]["template"]["spec"] == {
        "image": image
    }
    assert rig.obj(METAL3_MACHINE, "w-0")["spec"] == {"image": image}
    assert (
        "image"
        not in rig.obj(METAL3_MACHINE_TEMPLATE, "c1-control-plane")["spec"]["template"]["spec"]
    )
    status = rig.status("w-0")
    assert (status["ready"], status["dataSecretName"], status["isoDownloadURL"]) == (
        True,
        "w-0",
        URL,
    )
    available = rig.condition("w-0")
    assert (available["status"], available["reason"]) == ("True", logic.SECRET_CREATED)
    assert rig.condition("w-0", logic.READY)["status"] == "True"
    secret = rig.obj(SECRET, "w-0")
    assert "data" not in secret
    assert secret["metadata"]["ownerReferences"][0]["name"] == "w-0"
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "OpenshiftAssistedConfig"
    assert rig.condition("cp-0")["reason"] == logic.WAITING_FOR_URL  # the other pool waits

    publish_url(rig, "c1-control-plane")
    await rig.on(INFRA_ENV, "c1-control-plane")
    assert rig.obj(METAL3_MACHINE_TEMPLATE, "c1-control-plane")["spec"]["template"]["spec"] == {
        "image": image
    }
    assert rig.status("cp-0")["ready"] is True


async def test_a_worker_without_machine_set_finds_its_template_through_its_deployment(
    rig: Rig,
) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0", machine_set=None)
    await rig.reconcile(OAC, "w-0")
    publish_url(rig, "c1-md-0")
    await rig.reconcile(OAC, "w-0")
    assert (
        rig.obj(METAL3_MACHINE_TEMPLATE, "c1-workers")["spec"]["template"]["spec"]["image"]["url"]
        == URL
    )
    assert rig.status("w-0")["ready"] is True


async def test_the_template_is_the_one_the_metal3_machine_was_cloned_from(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    rig.obj(METAL3_MACHINE, "w-0")["metadata"]["annotations"] = {
        logic.CLONED_FROM_NAME: "c1-workers",
        logic.CLONED_FROM_GROUPKIND: "Metal3MachineTemplate.infrastructure.cluster.x-k8s.io",
    }
    await rig.reconcile(OAC, "w-0")
    publish_url(rig, "c1-md-0")
    await rig.on(INFRA_ENV, "c1-md-0")
    assert rig.obj(METAL3_MACHINE_TEMPLATE, "c1-workers")["spec"]["template"]["spec"]["image"]
    owners = [c for c in rig.kube.calls if c[1] in ("MachineSet", "MachineDeployment")]
    assert owners == []  # not looked up through the Machine's owners


async def test_a_new_iso_url_is_propagated_to_ready_configs(rig: Rig) -> None:
    await ready_world(rig)
    other = "https://image-service.sim/images/def?arch=x86_64&type=full-iso"
    publish_url(rig, "c1-md-0", other)
    assert await rig.targets(INFRA_ENV, "c1-md-0") == [Target(OAC, NS, "w-0")]
    await rig.on(INFRA_ENV, "c1-md-0")
    assert rig.status("w-0")["isoDownloadURL"] == other
    assert rig.obj(METAL3_MACHINE, "w-0")["spec"]["image"]["url"] == other
    assert await rig.targets(INFRA_ENV, "c1-md-0") == []  # holds it now


async def test_the_iso_url_can_go_to_the_image_services_cluster_address() -> None:
    rig = rigged(
        use_internal_image_url=True,
        image_service_name="assisted-image-service",
        image_service_namespace="assisted",
    )
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "w-0")
    publish_url(rig, "c1-md-0")

    with pytest.raises(ImageServiceMissing):
        await rig.reconcile(OAC, "w-0", changed(INFRA_ENV, rig.obj(INFRA_ENV, "c1-md-0")))
    failed = rig.condition("w-0")
    assert (failed["status"], failed["reason"]) == ("False", logic.PROPAGATING_FAILED)

    rig.kube.put(
        SERVICE_KIND,
        {
            "metadata": {"name": "assisted-image-service", "namespace": "assisted"},
            "spec": {"clusterIP": "10.96.0.7", "ports": [{"port": 8080}]},
        },
    )
    await rig.on(INFRA_ENV, "c1-md-0")
    internal = "http://10.96.0.7:8080/images/abc?arch=x86_64&type=full-iso"
    assert rig.status("w-0")["isoDownloadURL"] == internal
    assert rig.obj(METAL3_MACHINE, "w-0")["spec"]["image"]["url"] == internal
    assert await rig.targets(INFRA_ENV, "c1-md-0") == []  # the rewritten URL is the same image


def test_the_internal_image_url_needs_a_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("IMAGE_SERVICE_NAMESPACE", "NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USE_INTERNAL_IMAGE_URL", "true")
    with pytest.raises(ValueError, match="namespace"):
        AssistedBootstrapSettings()
    monkeypatch.setenv("NAMESPACE", "assisted")
    tuning = AssistedBootstrapSettings().assistedbootstrap
    assert (tuning.use_internal_image_url, tuning.image_service_name) == (
        True,
        "assisted-image-service",
    )
    assert tuning.image_service_namespace == "assisted"


# --- idempotence and reads -------------------------------------------------------------------


async def test_a_second_run_writes_nothing(rig: Rig) -> None:
    await ready_world(rig)
    reports, writes = len(rig.bus.of(PatchStatus)), len(rig.writes())

    for name, pool in (("cp-0", "c1-control-plane"), ("w-0", "c1-md-0")):
        # a full walk (as the InfraEnv's event causes), from a replica with no memory
        rig.deps.settled.forget(Target(OAC, NS, name).key)
        await rig.reconcile(OAC, name, changed(INFRA_ENV, rig.obj(INFRA_ENV, pool)))
        await rig.reconcile(OAC, name)
    assert len(rig.bus.of(PatchStatus)) == reports
    assert len(rig.writes()) == writes


async def test_a_ready_config_woken_by_its_own_event_reads_nothing(rig: Rig) -> None:
    await ready_world(rig)
    rig.deps.settled.forget(Target(OAC, NS, "w-0").key)
    rig.deps.seen.forget(Target(OAC, NS, "w-0").key)
    before = rig.kube.reads
    await rig.on(OAC, "w-0")  # the event carries the config
    await rig.on(MACHINE, "w-0")  # a Machine changing phase wakes nobody
    assert rig.kube.reads - before == 0


async def test_a_waiting_config_woken_by_the_write_of_its_own_decision_does_nothing(
    rig: Rig,
) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.on(OAC, "w-0")
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_URL
    reads, reports = rig.kube.reads, len(rig.bus.of(PatchStatus))

    await rig.on(OAC, "w-0")  # the writer's write of that report: nothing new
    assert (rig.kube.reads, len(rig.bus.of(PatchStatus))) == (reads, reports)

    rig.obj(OAC, "w-0")["metadata"]["labels"]["new"] = "label"
    await rig.on(OAC, "w-0")  # a change beyond the reported status: decided again
    assert rig.kube.reads > reads


async def test_an_own_event_older_than_what_this_replica_decided_is_dropped(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    before = changed(OAC, copy.deepcopy(rig.obj(OAC, "w-0")))  # no finalizer yet
    await rig.on(OAC, "w-0")  # adds the finalizer, decides
    calls = len(rig.kube.calls)
    await rig.event(before)  # arriving late: it would undo the finalizer in our view
    assert rig.kube.calls[calls:] == []


async def test_a_failed_run_leaves_its_config_to_be_read_and_decided_again(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.on(OAC, "w-0")
    publish_url(rig, "c1-md-0")
    rig.kube.fail("patch", KubeUnavailable("down"))  # the template's image
    with pytest.raises(KubeUnavailable):
        await rig.on(INFRA_ENV, "c1-md-0")
    calls = len(rig.kube.calls)
    await rig.on(OAC, "w-0")  # the retry: read, not taken from the event, nor skipped
    assert ("get", OAC.kind, NS, "w-0") in rig.kube.calls[calls:]
    assert rig.status("w-0")["ready"] is True


async def test_a_mapping_wakes_a_config_whose_report_is_not_written_yet(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "w-0")
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_URL
    cluster(rig, ready=False)  # a new Cluster, not ready
    await rig.on(CAPI_CLUSTER, "c1")
    await handlers.run({Target(OAC, NS, "w-0"): CAUSE}, rig.deps)  # its report not written
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_URL
    cluster(rig)
    assert await rig.targets(CAPI_CLUSTER, "c1") == [Target(OAC, NS, "w-0")]


async def test_the_clusters_readiness_and_installer_are_read_until_known(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "cp-0", control_plane=True)
    host_machine(rig, "cp-1", control_plane=True)
    for name in ("cp-0", "cp-1"):
        await rig.on(OAC, name)

    def read(verb: str, kind: str) -> int:
        return sum(1 for c in rig.kube.calls if c[:2] == (verb, kind))

    assert (read("get", "Cluster"), read("list", "ClusterDeployment")) == (1, 1)
    assert read("get", "AgentClusterInstall") == 1

    rig.kube.put(
        CLUSTER_DEPLOYMENT,
        {
            "metadata": {
                "name": "other",
                "namespace": NS,
                "labels": {logic.CLUSTER_NAME_LABEL: "c1"},
            },
            "spec": {"clusterInstallRef": {"name": "c1-control-plane"}},
        },
    )
    await rig.on(CLUSTER_DEPLOYMENT, "other")  # a second one: the installer is looked up again
    await rig.reconcile(OAC, "cp-0")
    assert "2 ClusterDeployments" in rig.condition("cp-0")["message"]
    cluster(rig, ready=False)
    await rig.on(CAPI_CLUSTER, "c1")  # no longer ready: the next walk knows
    await handlers.run({Target(OAC, NS, "cp-1"): CAUSE}, rig.deps)
    rig.write_status()
    assert rig.condition("cp-1")["reason"] == logic.WAITING_FOR_INFRA


async def test_a_config_a_mapping_listed_is_not_read_again_by_its_run(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "w-0")
    publish_url(rig, "c1-md-0")
    calls = len(rig.kube.calls)
    await rig.on(INFRA_ENV, "c1-md-0")
    assert rig.status("w-0")["ready"] is True
    assert ("get", OAC.kind, NS, "w-0") not in rig.kube.calls[calls:]


async def test_an_agents_machine_is_known_by_its_infrastructure_reference(rig: Rig) -> None:
    await ready_world(rig)
    host(rig, "host-1", "aa:bb:cc:00:00:02", claimed_by="w-0")
    agent(rig, "a-1", "aa:bb:cc:00:00:02", pool="c1-md-0")
    calls = len(rig.kube.calls)
    await rig.on(AGENT, "a-1")
    assert rig.obj(AGENT, "a-1")["spec"]["approved"] is True
    read = [c[1] for c in rig.kube.calls[calls:] if c[0] in ("get", "list")]
    assert read == ["BareMetalHost"]  # the Agent, its Machine and config as last seen


async def test_a_clusters_configs_are_listed_once_then_kept_by_their_events(rig: Rig) -> None:
    cluster(rig, ready=False)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.on(OAC, "w-0")
    cluster(rig)
    await rig.on(CAPI_CLUSTER, "c1")  # lists the cluster's configs
    listed = [c for c in rig.kube.calls if c[:2] == ("list", OAC.kind)]
    assert len(listed) == 1
    host_machine(rig, "w-1")
    await rig.on(OAC, "w-1")  # a new one: its event keeps it
    installer(rig)
    await rig.on(CLUSTER_DEPLOYMENT, "c1-control-plane")
    assert [rig.condition(n)["reason"] for n in ("w-0", "w-1")] == [logic.WAITING_FOR_URL] * 2
    assert [c for c in rig.kube.calls if c[:2] == ("list", OAC.kind)] == listed


async def test_a_config_in_doubt_is_woken_whatever_its_last_known_status(rig: Rig) -> None:
    await ready_world(rig)
    rig.deps.seen.distrust(Target(OAC, NS, "w-0").key)  # its last run failed
    assert await rig.targets(CAPI_CLUSTER, "c1") == [Target(OAC, NS, "w-0")]  # not cp-0: ready


async def test_events_that_change_nothing_a_mapping_looks_at_wake_nobody(rig: Rig) -> None:
    cluster(rig, ready=False)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "w-0")
    cluster(rig)
    await rig.on(CAPI_CLUSTER, "c1")
    installer(rig, "installing")
    await rig.on(CLUSTER_DEPLOYMENT, "c1-control-plane")
    await rig.on(AGENT_CLUSTER_INSTALL, "c1-control-plane")
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_INSTALL
    reads = rig.kube.reads

    rig.obj(CAPI_CLUSTER, "c1")["status"]["phase"] = "Provisioned"
    await rig.on(CAPI_CLUSTER, "c1")
    rig.obj(CLUSTER_DEPLOYMENT, "c1-control-plane")["status"] = {"installed": False}
    await rig.on(CLUSTER_DEPLOYMENT, "c1-control-plane")
    set_state(rig, "finalizing")  # the gate stays shut
    await rig.on(AGENT_CLUSTER_INSTALL, "c1-control-plane")
    assert rig.kube.reads == reads

    set_state(rig, "adding-hosts")
    await rig.on(AGENT_CLUSTER_INSTALL, "c1-control-plane")
    assert rig.condition("w-0")["reason"] == logic.WAITING_FOR_URL


async def test_events_wake_only_the_configs_whose_wait_they_can_end(rig: Rig) -> None:
    cluster(rig, ready=False)
    templates(rig)
    host_machine(rig, "cp-0", control_plane=True)
    host_machine(rig, "w-0")
    for name in ("cp-0", "w-0"):
        await rig.reconcile(OAC, name)
    assert await rig.targets(CAPI_CLUSTER, "c1") == []  # not ready: ends no wait
    cluster(rig)
    both = [Target(OAC, NS, "cp-0"), Target(OAC, NS, "w-0")]
    assert await rig.targets(CAPI_CLUSTER, "c1") == both
    await rig.on(CAPI_CLUSTER, "c1")
    assert await rig.targets(CAPI_CLUSTER, "c1") == []  # now waiting for the installer
    installer(rig, "installing")
    assert await rig.targets(CLUSTER_DEPLOYMENT, "c1-control-plane") == both
    await rig.on(CLUSTER_DEPLOYMENT, "c1-control-plane")
    assert await rig.targets(CLUSTER_DEPLOYMENT, "c1-control-plane") == []
    assert await rig.targets(MACHINE, "w-0") == []
    assert await rig.targets(MACHINE, "w-0", "ADDED") == [Target(OAC, NS, "w-0")]


# --- §B.11 9: the Agent ------------------------------------------------------------------------


async def test_an_agent_is_bound_to_the_machine_that_claimed_its_host(rig: Rig) -> None:
    await ready_world(rig)
    cp_host = host(rig, "host-0", "AA:BB:CC:00:00:01", claimed_by="cp-0")
    w_host = host(rig, "host-1", "aa:bb:cc:00:00:02", claimed_by="w-0")
    agent(rig, "a-0", "aa:bb:cc:00:00:01")
    agent(rig, "a-1", "AA:BB:CC:00:00:02", pool="c1-md-0")
    await rig.on(AGENT, "a-0")
    await rig.on(AGENT, "a-1")

    bound = rig.obj(AGENT, "a-0")
    assert bound["spec"]["role"] == "master"
    assert bound["spec"]["approved"] is True
    assert bound["spec"]["nodeLabels"] == {"metal3.io/uuid": cp_host["metadata"]["uid"]}
    assert bound["metadata"]["labels"][logic.CLUSTER_NAME_LABEL] == "c1"
    assert json.loads(bound["spec"]["ignitionConfigOverrides"]) == {
        "ignition": {"version": "3.1.0"},
        "storage": {
            "files": [
                {
                    "path": "/run/cluster-api/bootstrap-success.complete",
                    "user": {"name": "root"},
                    "mode": 420,
                    "overwrite": True,
                    "contents": {"source": "data:text/plain;charset=utf-8;base64,c3VjY2Vzcw=="},
                }
            ]
        },
    }
    worker = rig.obj(AGENT, "a-1")
    assert worker["spec"]["role"] == "worker"
    assert worker["spec"]["nodeLabels"] == {"metal3.io/uuid": w_host["metadata"]["uid"]}
    assert rig.status("cp-0")["agentRef"] == {"name": "a-0"}
    assert rig.status("w-0")["agentRef"] == {"name": "a-1"}
    assert rig.condition("cp-0", logic.AGENT_BOUND)["status"] == "True"

    patches = [c for c in rig.kube.calls if c[:2] == ("patch", "Agent")]
    assert len(patches) == 2  # one patch each
    reports, writes = len(rig.bus.of(PatchStatus)), len(rig.writes())
    await rig.on(AGENT, "a-0")  # its next event: nothing to do, nothing read
    rig.deps.settled.forget(Target(AGENT, NS, "a-1").key)
    rig.deps.seen.clear()
    await rig.on(AGENT, "a-1")  # a replica with no memory: reads, writes nothing
    assert (len(rig.bus.of(PatchStatus)), len(rig.writes())) == (reports, writes)


async def test_an_agent_approved_for_the_other_role_is_refused(rig: Rig) -> None:
    await ready_world(rig)
    host(rig, "host-0", "aa:bb:cc:00:00:01", claimed_by="cp-0")
    agent(rig, "a-0", "aa:bb:cc:00:00:01", approved=True, role="worker")
    with pytest.raises(PermanentError) as refused:
        await rig.reconcile(AGENT, "a-0")
    assert refused.value.reason == logic.ROLE_CONFLICT
    assert rig.obj(AGENT, "a-0")["spec"]["role"] == "worker"
    condition = rig.condition("cp-0", logic.AGENT_BOUND)
    assert (condition["status"], condition["reason"]) == ("False", logic.ROLE_CONFLICT)


async def test_a_malformed_ignition_override_is_refused_not_overwritten(rig: Rig) -> None:
    await ready_world(rig)
    host(rig, "host-0", "aa:bb:cc:00:00:01", claimed_by="cp-0")
    agent(rig, "a-0", "aa:bb:cc:00:00:01", ignitionConfigOverrides="{not json")
    with pytest.raises(PermanentError) as refused:
        await rig.reconcile(AGENT, "a-0")
    assert refused.value.reason == "MalformedIgnition"
    assert rig.obj(AGENT, "a-0")["spec"]["approved"] is False


async def test_an_agent_matching_no_host_is_shown_and_waits_for_a_host_event(rig: Rig) -> None:
    await ready_world(rig)
    host(rig, "host-0", "aa:bb:cc:00:00:01")  # not claimed yet
    host(rig, "host-9", "aa:bb:cc:00:00:09", claimed_by="w-0")
    agent(rig, "a-0", "aa:bb:cc:00:00:01")
    agent(rig, "a-x", "de:ad:be:ef:00:00")  # the MAC of no host
    await rig.on(AGENT, "a-0")
    await rig.on(AGENT, "a-x")
    assert rig.obj(AGENT, "a-0")["spec"]["approved"] is False
    unmatched = rig.condition("cp-0", logic.AGENT_BOUND)
    assert (unmatched["status"], unmatched["reason"]) == ("False", logic.NO_MATCHING_HOST)
    assert "de:ad:be:ef:00:00" in unmatched["message"]
    assert logic.condition_of(rig.obj(OAC, "w-0"), logic.AGENT_BOUND) is None  # other pool

    assert await rig.targets(BARE_METAL_HOST, "host-0") == []  # unclaimed: cannot bind yet
    host(rig, "host-0", "AA:BB:CC:00:00:01", claimed_by="cp-0")
    assert await rig.targets(BARE_METAL_HOST, "host-0") == [Target(AGENT, NS, "a-0")]
    await rig.on(BARE_METAL_HOST, "host-0")
    assert rig.obj(AGENT, "a-0")["spec"]["approved"] is True
    assert rig.condition("cp-0", logic.AGENT_BOUND)["status"] == "True"
    assert await rig.targets(BARE_METAL_HOST, "host-0") == []  # bound: nothing to wake


async def test_an_agent_of_a_host_not_bootstrapped_by_us_is_left_alone(rig: Rig) -> None:
    await ready_world(rig)
    spec = {
        "clusterName": "c1",
        "bootstrap": {"dataSecretName": "other"},
        "infrastructureRef": {"kind": "Metal3Machine", "name": "x-0"},
    }
    rig.kube.put(MACHINE, {"metadata": {"name": "x-0", "namespace": NS}, "spec": spec})
    owned = {"name": "x-0", "namespace": NS, "ownerReferences": [owner("Machine", "x-0")]}
    rig.kube.put(METAL3_MACHINE, {"metadata": owned, "spec": {}})
    host(rig, "host-1", "aa:bb:cc:00:00:02", claimed_by="x-0")
    agent(rig, "a-1", "aa:bb:cc:00:00:02", pool="c1-md-0")
    await rig.on(AGENT, "a-1")
    assert rig.obj(AGENT, "a-1")["spec"]["approved"] is False
    assert [c for c in rig.kube.calls if c[:2] == ("patch", "Agent")] == []


# --- §B.11 10: deletion ------------------------------------------------------------------------


async def bound_world(rig: Rig) -> None:
    await ready_world(rig)
    host(rig, "host-0", "aa:bb:cc:00:00:01", claimed_by="cp-0")
    host(rig, "host-1", "aa:bb:cc:00:00:02", claimed_by="w-0")
    agent(rig, "a-0", "aa:bb:cc:00:00:01")
    agent(rig, "a-1", "aa:bb:cc:00:00:02", pool="c1-md-0")
    await rig.on(AGENT, "a-0")
    await rig.on(AGENT, "a-1")


async def test_deleting_a_worker_config_deletes_its_agent_and_lets_go(rig: Rig) -> None:
    await bound_world(rig)
    await rig.kube.delete(OAC, NS, "w-0")
    await rig.on(OAC, "w-0")
    assert rig.kube.stored(AGENT, NS, "a-1") is None
    assert rig.kube.stored(OAC, NS, "w-0") is None
    assert rig.bus.of(PatchStatus)[-1].patch == {"agentRef": None}
    assert rig.kube.stored(AGENT, NS, "a-0") is not None


async def test_a_control_plane_config_is_deleted_only_with_its_machine(rig: Rig) -> None:
    await bound_world(rig)
    await rig.kube.delete(OAC, NS, "cp-0")
    await rig.on(OAC, "cp-0")
    refused = rig.condition("cp-0", logic.DELETING)
    assert (refused["status"], refused["reason"]) == ("False", logic.MACHINE_NOT_DELETED)
    assert rig.obj(OAC, "cp-0")["metadata"]["finalizers"] == [logic.FINALIZER]
    assert rig.kube.stored(AGENT, NS, "a-0") is not None
    await rig.on(OAC, "cp-0")  # said once
    said = [
        m for m in rig.bus.of(PatchStatus) if any(c.type == logic.DELETING for c in m.conditions)
    ]
    assert len(said) == 1

    rig.obj(MACHINE, "cp-0")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert await rig.targets(MACHINE, "cp-0") == [Target(OAC, NS, "cp-0")]
    await rig.on(MACHINE, "cp-0")
    assert rig.kube.stored(OAC, NS, "cp-0") is None
    assert rig.kube.stored(AGENT, NS, "a-0") is None


async def test_a_config_whose_agent_or_machine_is_gone_still_lets_go(rig: Rig) -> None:
    await bound_world(rig)
    await rig.kube.delete(AGENT, NS, "a-0")
    rig.kube.objects.pop((MACHINE.token, NS, "cp-0"))
    await rig.kube.delete(OAC, NS, "cp-0")
    await rig.on(OAC, "cp-0")
    assert rig.kube.stored(OAC, NS, "cp-0") is None


# --- malformed input and an unavailable API ---------------------------------------------------


async def test_a_worker_machine_without_its_deployment_label_is_a_clear_failure(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0", deployment=None)
    with pytest.raises(PermanentError) as failed:
        await rig.reconcile(OAC, "w-0")
    assert failed.value.reason == logic.INFRA_ENV_FAILED
    condition = rig.condition("w-0")
    assert (condition["status"], condition["reason"]) == ("False", logic.INFRA_ENV_FAILED)
    assert logic.DEPLOYMENT_LABEL in condition["message"]
    assert "observedGeneration" not in rig.status("w-0")


async def test_a_malformed_install_state_is_a_clear_failure(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    rig.obj(AGENT_CLUSTER_INSTALL, "c1-control-plane")["status"] = {"debugInfo": "broken"}
    with pytest.raises(PermanentError) as failed:
        await rig.reconcile(OAC, "w-0")
    assert failed.value.reason == "MalformedAgentClusterInstall"
    assert rig.condition("w-0")["reason"] == "MalformedAgentClusterInstall"


async def test_a_missing_infrastructure_template_is_a_clear_failure(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0", machine_set=None, deployment="md-9")
    await rig.reconcile(OAC, "w-0")
    publish_url(rig, "c1-md-9")
    with pytest.raises(PermanentError):
        await rig.reconcile(OAC, "w-0")
    assert rig.condition("w-0")["reason"] == logic.PROPAGATING_FAILED
    assert "ready" not in rig.status("w-0")


async def test_an_unavailable_api_is_temporary_and_the_retry_converges(rig: Rig) -> None:
    cluster(rig)
    installer(rig)
    templates(rig)
    host_machine(rig, "w-0")
    await rig.reconcile(OAC, "w-0")
    publish_url(rig, "c1-md-0")
    reports = len(rig.bus.of(PatchStatus))
    rig.kube.fail("patch", KubeUnavailable("down"))
    with pytest.raises(KubeUnavailable):
        await rig.reconcile(OAC, "w-0")
    assert len(rig.bus.of(PatchStatus)) == reports  # no condition for a blip
    await rig.reconcile(OAC, "w-0")
    assert rig.status("w-0")["ready"] is True
