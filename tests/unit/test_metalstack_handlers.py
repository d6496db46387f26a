"""The metal-stack provider's handlers, through its composition root.

Kubernetes and the bus are fakes; metal-api is the stand-in's server run in this process on
loopback and reached through the real client, so every request and every refusal is
metal-api's. A small "writer" applies the published status patches to the fake objects, so
each step sees what the previous one reported.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.baremetal.metalstack import handlers, logic
from services.baremetal.metalstack.bootstrap import Claims, dependencies
from services.baremetal.metalstack.ports import METAL_API, Deps, Kubeconfigs, Workload
from services.baremetal.metalstack.settings import MetalStackSettings
from shared.consumer import Batch
from shared.errors import KubeConflict, PermanentError, TemporaryError
from shared.kube import ResourceKind
from shared.mergepatch import apply as merge
from shared.messages import ObjectRef, PatchStatus, RecheckObject, ResourceChanged
from shared.metalapi import (
    MetalApiClient,
    MetalApiConfig,
    MetalApiUnauthorized,
    MetalApiUnavailable,
)
from shared.reconcile import Target
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
)
from standins.metalapi.knobs import MetalApiKnobs
from standins.metalapi.lifecycle import Lifecycle
from standins.metalapi.server import Fault, MetalApiServer
from standins.metalapi.world import World
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
NS = "ns"
PROJECT = "00000000-0000-0000-0000-000000000000"
CAUSE = RecheckObject(
    source="test",
    correlation_id="t",
    ref=ObjectRef(api_version="v1", kind="Test", name="x"),
    reason="test",
)


class FinalizingKube(FakeKube):
    """Deletes as the API server does: an object with finalizers only gets a deletionTimestamp."""

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        stored = self.stored(kind, namespace, name)
        if stored is not None and stored["metadata"].get("finalizers"):
            self._called("delete", kind, namespace, name)
            stored["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            return stored
        return await super().delete(kind, namespace, name)


class FakeNodes:
    """Workload Nodes by systemUUID; machines waiting for theirs."""

    def __init__(self) -> None:
        self.nodes: dict[str, Json] = {}
        self.waiting: dict[str, ObjectRef] = {}
        #: the kubeconfig of every lookup, in order; and what the next lookups raise
        self.kubeconfigs: list[str] = []
        self.failure: Exception | None = None

    def register(self, machine: str, name: str) -> None:
        self.nodes[machine] = {
            "metadata": {"name": name},
            "spec": {},
            "status": {"nodeInfo": {"systemUUID": machine}},
        }

    async def node_for(self, cluster: Workload, machine: str) -> Json | None:
        self.kubeconfigs.append(cluster.kubeconfig)
        if self.failure is not None:
            raise self.failure
        return self.nodes.get(machine)

    async def set_provider_id(self, cluster: Workload, node: Json, provider_id: str) -> None:
        node["spec"]["providerID"] = provider_id

    def wait_for(self, cluster: Workload, machine: str, ref: ObjectRef, partition: int) -> None:
        self.waiting[machine] = ref

    def forget(self, machine: str) -> None:
        self.waiting.pop(machine, None)


@dataclasses.dataclass
class Rig:
    deps: Deps
    kube: FakeKube
    bus: FakeBus
    nodes: FakeNodes
    server: MetalApiServer
    applied: int = 0

    def obj(self, kind: ResourceKind, name: str) -> Json:
        found = self.kube.stored(kind, NS, name)
        assert found is not None, name
        return found

    async def reconcile(self, kind: ResourceKind, name: str) -> None:
        await handlers.run({Target(kind, NS, name): CAUSE}, self.deps)
        self.write_status()

    def write_status(self) -> None:
        """The writer's part: merge every new status patch into its object."""
        patches = self.bus.of(PatchStatus)
        for message in patches[self.applied :]:
            kind = next(
                k
                for k in (METALSTACK_CLUSTER, METALSTACK_MACHINE, METALSTACK_FIREWALL)
                if k.kind == message.ref.kind
            )
            stored = self.kube.stored(kind, NS, message.ref.name)
            if stored is None:
                continue
            status = merge(stored.get("status") or {}, dict(message.patch))
            merged = {c["type"]: c for c in status.get("conditions") or []}
            merged |= {c.type: c.model_dump() for c in message.conditions}
            if merged:
                status["conditions"] = list(merged.values())
            stored["status"] = status
        self.applied = len(patches)

    def requests(self, route: str) -> int:
        return self.server.requests[route]

    async def state(self) -> Json:
        return await self._get("/_standin/state")

    async def metal_machine(self, machine: str) -> Json:
        return await self._get(f"/v1/machine/{machine}")

    async def _get(self, path: str) -> Json:
        async with httpx.AsyncClient(base_url=self.server.url) as client:
            answer: Json = (await client.get(path)).json()
            return answer


KNOBS = MetalApiKnobs(provisioning_delay=0, reboot_delay=0, pool_size=6, seed=1)


@contextlib.asynccontextmanager
async def rigged(knobs: MetalApiKnobs = KNOBS, *, hmac: str | None = None) -> AsyncIterator[Rig]:
    server = MetalApiServer(Lifecycle(World.seeded(knobs), knobs), knobs)
    url = await server.start()
    kube, bus, nodes = FinalizingKube(), FakeBus(), FakeNodes()
    try:
        async with MetalApiClient(MetalApiConfig(url, hmac=hmac)) as metal:
            deps = dependencies(MetalStackSettings(), bus=bus, kube=kube, metal=metal)
            yield Rig(dataclasses.replace(deps, nodes=nodes), kube, bus, nodes, server)
    finally:
        await server.stop()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with rigged() as made:
        yield made


# --- the world Cluster API would make -------------------------------------------------------


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def capi_cluster(rig: Rig, name: str = "c1", *, ready: bool = True) -> Json:
    return rig.kube.put(
        CAPI_CLUSTER,
        {
            "metadata": {"name": name, "namespace": NS},
            "spec": {"infrastructureRef": {"kind": "MetalStackCluster", "name": name}},
            "status": {"infrastructureReady": ready},
        },
    )


def metalstack_cluster(rig: Rig, name: str = "c1", *, owned: bool = True, **spec: Any) -> Json:
    owners = [
        {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": name, "uid": "u"}
    ]
    return rig.kube.put(
        METALSTACK_CLUSTER,
        {
            "metadata": {"name": name, "namespace": NS, "ownerReferences": owners if owned else []},
            "spec": {
                "projectID": PROJECT,
                "partition": "vagrant",
                "publicNetworkID": "internet-vagrant-lab",
                "firewallSpec": {"image": "firewall-ubuntu-2.0", "machineType": "v1-small-x86"},
                **spec,
            },
        },
    )


def machine(rig: Rig, name: str, *, cluster: str = "c1", control_plane: bool = False) -> None:
    labels = {logic.CLUSTER_NAME_LABEL: cluster}
    if control_plane:
        labels[logic.CONTROL_PLANE_LABEL] = ""
    rig.kube.put(
        MACHINE,
        {
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {
                "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
                "infrastructureRef": {"kind": "MetalStackMachine", "name": name},
            },
        },
    )
    rig.kube.put(
        SECRET,
        {
            "metadata": {"name": f"{name}-bootstrap", "namespace": NS},
            "data": {"value": b64(f"#{name}")},
        },
    )
    owner = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": name, "uid": "m"}
    rig.kube.put(
        METALSTACK_MACHINE,
        {
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": {logic.CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": [owner],
            },
            "spec": {"image": "ubuntu-cloud-init-20.04", "machineType": "v1-small-x86"},
        },
    )


def kubeconfig(rig: Rig, cluster: str = "c1") -> None:
    rig.kube.put(
        SECRET,
        {
            "metadata": {"name": f"{cluster}-kubeconfig", "namespace": NS},
            "data": {"value": b64("kc")},
        },
    )


async def ready_cluster(rig: Rig) -> Json:
    capi_cluster(rig)
    metalstack_cluster(rig)
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    return rig.obj(METALSTACK_CLUSTER, "c1")


def machine_id(obj: Json) -> str:
    found = logic.machine_id(obj["spec"].get("providerID"))
    assert found is not None
    return found


# --- the cluster ------------------------------------------------------------------------------


async def test_a_cluster_gets_its_network_a_static_api_address_and_its_firewall_once(
    rig: Rig,
) -> None:
    msc = await ready_cluster(rig)

    assert logic.CLUSTER_FINALIZER in msc["metadata"]["finalizers"]
    assert msc["spec"]["privateNetworkID"]
    host = msc["spec"]["controlPlaneEndpoint"]["host"]
    assert host.startswith("185.1.2.")
    assert msc["status"]["ready"] is True
    assert msc["status"]["controlPlaneIPAllocated"] is True
    firewall = rig.obj(METALSTACK_FIREWALL, "c1")
    assert firewall["spec"] == {"image": "firewall-ubuntu-2.0", "machineType": "v1-small-x86"}
    assert firewall["metadata"]["labels"] == {logic.CLUSTER_NAME_LABEL: "c1"}
    assert firewall["metadata"]["ownerReferences"][0]["kind"] == "MetalStackCluster"
    (ip,) = [i for i in (await rig.state())["ips"] if i["ipaddress"] == host]
    assert ip["type"] == "static"

    for _ in range(2):
        await rig.reconcile(METALSTACK_CLUSTER, "c1")
    assert (rig.requests("network-allocate"), rig.requests("ip-allocate")) == (1, 1)


async def test_a_network_and_address_allocated_by_a_run_that_died_are_found_not_taken_again(
    rig: Rig,
) -> None:
    capi_cluster(rig)
    metalstack_cluster(rig)
    rig.kube.fail("patch", KubeConflict("died"), KubeConflict("died"))
    for _ in range(2):
        with pytest.raises(KubeConflict):
            await rig.reconcile(METALSTACK_CLUSTER, "c1")
    await rig.reconcile(METALSTACK_CLUSTER, "c1")

    assert rig.obj(METALSTACK_CLUSTER, "c1")["status"]["ready"] is True
    assert (rig.requests("network-allocate"), rig.requests("ip-allocate")) == (1, 1)


async def test_a_cluster_waits_for_its_owner_and_says_when_the_owner_does_not_exist(
    rig: Rig,
) -> None:
    metalstack_cluster(rig, owned=False)
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    assert rig.bus.of(PatchStatus) == []
    assert "finalizers" not in rig.obj(METALSTACK_CLUSTER, "c1")["metadata"]

    metalstack_cluster(rig)
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    status = rig.obj(METALSTACK_CLUSTER, "c1")["status"]
    assert status["failureReason"] == "InvalidConfiguration"
    assert status["failureMessage"] == "Unable to get OwnerCluster"

    capi_cluster(rig)
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    status = rig.obj(METALSTACK_CLUSTER, "c1")["status"]
    assert status["ready"] is True
    assert "failureReason" not in status


async def test_a_paused_cluster_is_left_alone(rig: Rig) -> None:
    capi_cluster(rig)
    cluster = rig.obj(CAPI_CLUSTER, "c1")
    cluster["spec"]["paused"] = True
    metalstack_cluster(rig)
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    assert rig.requests("network-allocate") == 0


async def test_a_partition_that_does_not_exist_is_a_clear_failure_and_nothing_is_allocated(
    rig: Rig,
) -> None:
    capi_cluster(rig)
    metalstack_cluster(rig, partition="atlantis")
    with pytest.raises(PermanentError):
        await rig.reconcile(METALSTACK_CLUSTER, "c1")
    rig.write_status()
    status = rig.obj(METALSTACK_CLUSTER, "c1")["status"]
    assert status["failureReason"] == "InvalidConfiguration"
    assert "atlantis" in status["failureMessage"]
    assert sorted(n["id"] for n in (await rig.state())["networks"]) == [
        "internet-vagrant-lab",
        "tenant-super-network-vagrant",
    ]


# --- machines ---------------------------------------------------------------------------------


async def test_a_machine_is_allocated_once_and_ready_when_its_node_carries_it(rig: Rig) -> None:
    msc = await ready_cluster(rig)
    machine(rig, "cp-0", control_plane=True)
    kubeconfig(rig)

    await rig.reconcile(METALSTACK_MACHINE, "cp-0")
    msm = rig.obj(METALSTACK_MACHINE, "cp-0")
    found = machine_id(msm)
    assert logic.MACHINE_FINALIZER in msm["metadata"]["finalizers"]
    types = [a["type"] for a in msm["status"]["addresses"]]
    assert types == ["Hostname", "ExternalIP", "InternalIP"]
    assert msm["status"].get("ready") is None
    assert found in rig.nodes.waiting

    networks = (await rig.metal_machine(found))["allocation"]["networks"]
    ips = {ip for network in networks for ip in network["ips"]}
    assert msc["spec"]["controlPlaneEndpoint"]["host"] in ips

    rig.nodes.register(found, "cp-0")
    await rig.reconcile(METALSTACK_MACHINE, "cp-0")
    assert rig.nodes.nodes[found]["spec"]["providerID"] == f"metalstack://{found}"
    assert rig.obj(METALSTACK_MACHINE, "cp-0")["status"]["ready"] is True
    assert rig.nodes.waiting == {}

    before = dict(rig.server.requests)
    await rig.reconcile(METALSTACK_MACHINE, "cp-0")
    assert dict(rig.server.requests) == before  # ready: nothing more to ask metal-api


def kubeconfig_reads(rig: Rig) -> int:
    return rig.kube.calls.count(("get", SECRET.kind, NS, "c1-kubeconfig"))


async def three_machines_and_their_kubeconfig(rig: Rig) -> int:
    """The kubeconfig reads so far (the firewall looked for it before it existed)."""
    await ready_cluster(rig)
    kubeconfig(rig)
    for name in ("w-0", "w-1", "w-2"):
        machine(rig, name)
    return kubeconfig_reads(rig)


async def test_a_clusters_machines_read_its_kubeconfig_once_until_an_event_of_it(
    rig: Rig,
) -> None:
    before = await three_machines_and_their_kubeconfig(rig)
    for name in ("w-0", "w-1"):
        await rig.reconcile(METALSTACK_MACHINE, name)
    assert kubeconfig_reads(rig) - before == 1

    # Rotated: the Secret's event (its cluster's label puts it in this replica's partition)
    # makes the next machine read the new one.
    rotated = {
        "metadata": {
            "name": "c1-kubeconfig",
            "namespace": NS,
            "labels": {logic.CLUSTER_NAME_LABEL: "c1"},
        },
        "data": {"value": b64("kc2")},
    }
    stored = rig.kube.put(SECRET, rotated)
    event = changed(SECRET, {"metadata": stored["metadata"]})  # the watcher strips the data
    await handlers.on_changes(Batch("ns/c1-kubeconfig", 0, (event,)), rig.deps)  # wakes all 3
    await rig.reconcile(METALSTACK_MACHINE, "w-2")
    assert rig.nodes.kubeconfigs[:2] == ["kc", "kc"]
    assert set(rig.nodes.kubeconfigs[2:]) == {"kc2"}
    assert kubeconfig_reads(rig) - before == 2


async def test_a_kubeconfig_copy_is_dropped_with_a_partition_and_after_a_failing_workload(
    rig: Rig,
) -> None:
    before = await three_machines_and_their_kubeconfig(rig)
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    await Claims(rig.deps, rig.bus).lost(frozenset({0}))
    await rig.reconcile(METALSTACK_MACHINE, "w-1")
    assert kubeconfig_reads(rig) - before == 2

    rig.nodes.failure = TemporaryError("the workload API server refused the old credentials")
    with pytest.raises(TemporaryError):
        await rig.reconcile(METALSTACK_MACHINE, "w-2")
    assert rig.deps.kubeconfigs.get(f"{NS}/c1") is None


async def test_a_kubeconfig_read_overtaken_by_an_event_of_it_is_not_kept() -> None:
    copies = Kubeconfigs()
    started = copies.epoch
    copies.forget("ns/c1")  # the Secret's event, while the read was on its way
    copies.keep(Workload("ns", "c1", version="1", kubeconfig="old"), started)
    assert copies.get("ns/c1") is None

    copies.keep(Workload("ns", "c1", version="2", kubeconfig="new"), copies.epoch)
    assert copies.get("ns/c1") == Workload("ns", "c1", version="2", kubeconfig="new")


async def test_a_machine_allocated_by_a_run_killed_before_recording_it_is_adopted(
    rig: Rig,
) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    # The finalizer lands; the providerID write does not (the process "dies" there).
    real_patch = rig.kube.patch_merge
    calls = 0

    async def dying(*args: Any, **kwargs: Any) -> Json:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise TemporaryError("killed")
        return await real_patch(*args, **kwargs)

    rig.kube.patch_merge = dying  # type: ignore[method-assign]
    with pytest.raises(TemporaryError):
        await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert rig.requests("machine-allocate") == 1
    assert "providerID" not in rig.obj(METALSTACK_MACHINE, "w-0")["spec"]

    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert rig.requests("machine-allocate") == 1
    assert len((await rig.state())["machines"]["allocated"]) == 1
    machine_id(rig.obj(METALSTACK_MACHINE, "w-0"))


async def test_a_machine_waits_for_bootstrap_data_infrastructure_and_its_owner(rig: Rig) -> None:
    capi_cluster(rig, ready=False)
    metalstack_cluster(rig)
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    machine(rig, "w-0")
    rig.kube.objects.pop((SECRET.token, NS, "w-0-bootstrap"))

    await rig.reconcile(METALSTACK_MACHINE, "w-0")  # infrastructure not ready
    assert "finalizers" not in rig.obj(METALSTACK_MACHINE, "w-0")["metadata"]
    capi_cluster(rig)
    await rig.reconcile(METALSTACK_MACHINE, "w-0")  # no bootstrap Secret yet
    assert rig.requests("machine-allocate") == 0
    rig.kube.put(
        SECRET,
        {"metadata": {"name": "w-0-bootstrap", "namespace": NS}, "data": {"value": b64("#")}},
    )
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert rig.requests("machine-allocate") == 1


async def test_metal_api_refusing_the_allocation_is_a_terminal_create_error(rig: Rig) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    rig.obj(METALSTACK_MACHINE, "w-0")["spec"]["machineType"] = "v9-huge"

    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    status = rig.obj(METALSTACK_MACHINE, "w-0")["status"]
    assert status["failureReason"] == "CreateError"
    assert "v9-huge" in status["failureMessage"]

    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert rig.requests("machine-allocate") == 1


async def test_metal_api_failing_is_temporary_and_the_retry_allocates_once(rig: Rig) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    rig.server.faults["machine-allocate"] = Fault(status=500, count=1, message="boom")
    with pytest.raises(MetalApiUnavailable):
        await rig.reconcile(METALSTACK_MACHINE, "w-0")
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert "failureReason" not in rig.obj(METALSTACK_MACHINE, "w-0").get("status", {})
    assert len([m for m in (await rig.state())["machines"]["allocated"]]) == 1


async def test_a_deleted_machine_is_freed_even_when_its_cluster_went_first(rig: Rig) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    found = machine_id(rig.obj(METALSTACK_MACHINE, "w-0"))
    for kind, name in ((CAPI_CLUSTER, "c1"), (METALSTACK_CLUSTER, "c1"), (MACHINE, "w-0")):
        rig.kube.objects.pop((kind.token, NS, name))
    rig.obj(METALSTACK_MACHINE, "w-0")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert rig.kube.stored(METALSTACK_MACHINE, NS, "w-0") is None
    assert found not in {m["id"] for m in (await rig.state())["machines"]["allocated"]}


# --- the firewall -----------------------------------------------------------------------------


async def test_the_firewall_waits_for_the_kubeconfig_and_is_ready_once_it_phoned_home(
    rig: Rig,
) -> None:
    await ready_cluster(rig)
    await rig.reconcile(METALSTACK_FIREWALL, "c1")
    assert rig.requests("firewall-allocate") == 0

    kubeconfig(rig)
    await rig.reconcile(METALSTACK_FIREWALL, "c1")
    firewall = rig.obj(METALSTACK_FIREWALL, "c1")
    assert logic.FIREWALL_FINALIZER in firewall["metadata"]["finalizers"]
    assert firewall["status"]["ready"] is True  # the stand-in phones home at once here
    assert rig.requests("firewall-allocate") == 1
    metal = next(
        m for m in (await rig.state())["machines"]["allocated"] if m["id"] == machine_id(firewall)
    )
    assert metal["hostname"] == "c1-firewall"


# --- deletion ---------------------------------------------------------------------------------


async def test_cluster_deletion_waits_for_machines_and_firewall_then_frees_everything(
    rig: Rig,
) -> None:
    await ready_cluster(rig)
    kubeconfig(rig)
    machine(rig, "w-0")
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    await rig.reconcile(METALSTACK_FIREWALL, "c1")
    rig.obj(METALSTACK_CLUSTER, "c1")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    assert rig.kube.stored(MACHINE, NS, "w-0") is None  # deleted, as upstream does
    deleting = {c["type"]: c for c in rig.obj(METALSTACK_CLUSTER, "c1")["status"]["conditions"]}
    assert deleting["Deleting"]["reason"] == "WaitingForMachines"

    rig.obj(METALSTACK_MACHINE, "w-0")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    deleting = {c["type"]: c for c in rig.obj(METALSTACK_CLUSTER, "c1")["status"]["conditions"]}
    assert deleting["Deleting"]["reason"] == "WaitingForFirewall"
    await rig.reconcile(METALSTACK_FIREWALL, "c1")
    assert rig.kube.stored(METALSTACK_FIREWALL, NS, "c1") is None
    await rig.reconcile(METALSTACK_CLUSTER, "c1")

    assert rig.kube.stored(METALSTACK_CLUSTER, NS, "c1") is None or (
        logic.CLUSTER_FINALIZER not in rig.obj(METALSTACK_CLUSTER, "c1")["metadata"]["finalizers"]
    )
    state = await rig.state()
    assert state["ips"] == []
    assert sorted(n["id"] for n in state["networks"]) == [
        "internet-vagrant-lab",
        "tenant-super-network-vagrant",
    ]


# --- which events concern which objects -------------------------------------------------------


def changed(kind: ResourceKind, obj: Json, event: str = "MODIFIED") -> ResourceChanged:
    meta = obj["metadata"]
    return ResourceChanged(
        source="t",
        correlation_id="t",
        event=event,  # type: ignore[arg-type]
        ref=ObjectRef(
            api_version=kind.api_version, kind=kind.kind, namespace=NS, name=meta["name"], uid="u"
        ),
        resource_version="1",
        object=obj,
    )


async def test_events_map_to_the_objects_they_concern(rig: Rig) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    kube = rig.kube

    cluster = rig.obj(CAPI_CLUSTER, "c1")
    assert await handlers.targets_of(changed(CAPI_CLUSTER, cluster), kube) == [
        Target(METALSTACK_CLUSTER, NS, "c1")
    ]
    assert await handlers.targets_of(changed(MACHINE, rig.obj(MACHINE, "w-0")), kube) == [
        Target(METALSTACK_MACHINE, NS, "w-0")
    ]
    gone = changed(METALSTACK_MACHINE, rig.obj(METALSTACK_MACHINE, "w-0"), "DELETED")
    assert await handlers.targets_of(gone, kube) == [
        Target(METALSTACK_MACHINE, NS, "w-0"),
        Target(METALSTACK_CLUSTER, NS, "c1"),
    ]
    secret = {"metadata": {"name": "c1-kubeconfig", "labels": {logic.CLUSTER_NAME_LABEL: "c1"}}}
    assert await handlers.targets_of(changed(SECRET, secret), kube) == [
        Target(METALSTACK_MACHINE, NS, "w-0"),
        Target(METALSTACK_FIREWALL, NS, "c1"),
    ]
    unrelated = {"metadata": {"name": "other"}, "spec": {"infrastructureRef": {"kind": "X"}}}
    assert await handlers.targets_of(changed(CAPI_CLUSTER, unrelated), kube) == []


# --- the rest of upstream's checklist -----------------------------------------------------------


async def test_a_preset_api_address_is_allocated_as_that_address(rig: Rig) -> None:
    capi_cluster(rig)
    metalstack_cluster(rig, controlPlaneEndpoint={"host": "185.1.2.50", "port": 6443})
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    assert rig.obj(METALSTACK_CLUSTER, "c1")["spec"]["controlPlaneEndpoint"]["host"] == "185.1.2.50"
    assert "185.1.2.50" in {ip["ipaddress"] for ip in (await rig.state())["ips"]}


async def test_network_and_address_errors_of_metal_api_are_temporary(rig: Rig) -> None:
    capi_cluster(rig)
    metalstack_cluster(rig)
    for route in ("network-allocate", "ip-allocate"):
        rig.server.faults[route] = Fault(status=503, count=1)
        with pytest.raises(MetalApiUnavailable):
            await rig.reconcile(METALSTACK_CLUSTER, "c1")
    await rig.reconcile(METALSTACK_CLUSTER, "c1")
    assert rig.obj(METALSTACK_CLUSTER, "c1")["status"]["ready"] is True
    assert "failureReason" not in rig.obj(METALSTACK_CLUSTER, "c1")["status"]


async def test_a_pinned_machine_is_the_one_allocated_and_adopted_once_allocated(rig: Rig) -> None:
    await ready_cluster(rig)
    pool = (await rig.state())["machines"]["waiting"]
    for name, pinned in (("w-0", pool[0]), ("w-1", pool[1])):
        machine(rig, name)
        rig.obj(METALSTACK_MACHINE, name)["spec"]["providerID"] = f"metalstack://{pinned}"
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert machine_id(rig.obj(METALSTACK_MACHINE, "w-0")) == pool[0]
    assert {m["id"] for m in (await rig.state())["machines"]["allocated"]} == {pool[0]}

    # w-1's machine is allocated in the cluster's project meanwhile (say, by upstream's provider).
    place = logic.ClusterPlace.of(rig.obj(METALSTACK_CLUSTER, "c1"))
    request = {
        "uuid": pool[1],
        "projectid": PROJECT,
        "partitionid": "vagrant",
        "sizeid": "v1-small-x86",
        "imageid": "ubuntu-cloud-init-20.04",
        "ssh_pub_keys": [],
        "networks": [
            {"networkid": "internet-vagrant-lab", "autoacquire": True},
            {
                "networkid": rig.obj(METALSTACK_CLUSTER, "c1")["spec"]["privateNetworkID"],
                "autoacquire": True,
            },
        ],
        "tags": [place.cluster_tag],
    }
    await rig.deps.metal.allocate_machine(request)
    await rig.reconcile(METALSTACK_MACHINE, "w-1")
    assert rig.requests("machine-allocate") == 2  # ours for w-0, and the one above
    assert rig.obj(METALSTACK_MACHINE, "w-1")["status"]["addresses"]


async def test_a_pinned_machine_of_another_project_is_refused(rig: Rig) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    rig.obj(METALSTACK_MACHINE, "w-0")["spec"]["providerID"] = "metalstack://no-such-machine"
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    status = rig.obj(METALSTACK_MACHINE, "w-0")["status"]
    assert status["failureReason"] == "CreateError"
    assert "does not exist" in status["failureMessage"]


async def test_a_firewall_runs_on_phoned_home_even_where_metal_api_never_says_succeeded() -> None:
    knobs = dataclasses.replace(KNOBS, succeeded_on_phoned_home=False, provisioning_delay=0.2)
    async with rigged(knobs) as rig:
        await ready_cluster(rig)
        kubeconfig(rig)
        await rig.reconcile(METALSTACK_FIREWALL, "c1")
        firewall = rig.obj(METALSTACK_FIREWALL, "c1")
        assert "ready" not in (firewall.get("status") or {})
        armed = rig.deps.rechecks.timers.pending()  # type: ignore[attr-defined]
        (timer,) = armed.values()
        assert isinstance(timer.message, RecheckObject)
        assert timer.message.reason == "FirewallNotRunning"

        await asyncio.sleep(0.4)
        gets = rig.requests("firewall-get")
        await handlers.run({Target(METALSTACK_FIREWALL, NS, "c1"): timer.message}, rig.deps)
        rig.write_status()
        assert rig.obj(METALSTACK_FIREWALL, "c1")["status"]["ready"] is True
        assert rig.requests("firewall-get") == gets + 1
        metal = await rig.metal_machine(machine_id(firewall))
        assert metal["allocation"]["succeeded"] is False
        assert rig.deps.rechecks.timers.pending() == {}  # type: ignore[attr-defined]


async def test_a_refused_signature_waits_with_a_clear_condition_and_heals() -> None:
    async with rigged(dataclasses.replace(KNOBS, hmac="right"), hmac="wrong") as rig:
        capi_cluster(rig)
        metalstack_cluster(rig)
        with pytest.raises(MetalApiUnauthorized):  # temporary: the consumer retries
            await rig.reconcile(METALSTACK_CLUSTER, "c1")
        rig.write_status()
        (condition,) = [
            c
            for c in rig.obj(METALSTACK_CLUSTER, "c1")["status"]["conditions"]
            if c["type"] == METAL_API
        ]
        assert (condition["type"], condition["status"]) == (METAL_API, "False")
        assert condition["reason"] == "MetalApiUnauthorized"
        assert "HMAC key" in condition["message"]

        rig.server.knobs = dataclasses.replace(rig.server.knobs, hmac="wrong")
        await rig.reconcile(METALSTACK_CLUSTER, "c1")
        status = rig.obj(METALSTACK_CLUSTER, "c1")["status"]
        assert status["ready"] is True
        assert {c["type"]: c["status"] for c in status["conditions"]}[METAL_API] == "True"


async def test_a_follow_up_failing_for_good_does_not_fail_the_message_that_woke_it(
    rig: Rig,
) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    rig.obj(SECRET, "w-0-bootstrap")["data"] = {}
    await rig.reconcile(METALSTACK_CLUSTER, "c1")  # wakes w-0, which cannot go on
    with pytest.raises(PermanentError, match="Key 'value' is missing in bootstrap secret"):
        await rig.reconcile(METALSTACK_MACHINE, "w-0")


async def test_a_ready_machines_deletion_sharing_a_batch_with_its_machine_is_not_skipped(
    rig: Rig,
) -> None:
    await ready_cluster(rig)
    machine(rig, "w-0")
    kubeconfig(rig)
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    rig.nodes.register(machine_id(rig.obj(METALSTACK_MACHINE, "w-0")), "w-0")
    await rig.reconcile(METALSTACK_MACHINE, "w-0")
    assert rig.obj(METALSTACK_MACHINE, "w-0")["status"]["ready"] is True

    # A ready machine ignores its Machine's changes...
    reads = rig.kube.reads
    machine_event = changed(MACHINE, rig.obj(MACHINE, "w-0"))
    await handlers.on_changes(Batch("ns/w-0", 0, (machine_event,)), rig.deps)
    assert rig.kube.reads == reads

    # ...but not its own deletion, even when the Machine's event comes first in the batch.
    rig.obj(METALSTACK_MACHINE, "w-0")["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    own = changed(METALSTACK_MACHINE, rig.obj(METALSTACK_MACHINE, "w-0"))
    await handlers.on_changes(Batch("ns/w-0", 0, (machine_event, own)), rig.deps)
    assert rig.kube.stored(METALSTACK_MACHINE, NS, "w-0") is None
