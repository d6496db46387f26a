"""The Cluster API stand-in for an infrastructure provider it does not play: metal-stack.

The stand-in's controllers run in this process, confined to the test's namespace; the objects
come from ``testenv.examples.metalstack_cluster``. The provider's part is played by hand here
(``Provider``): it sets what cluster-api-provider-metalstack would (finalizers, the endpoint,
``status.ready``, ``spec.providerID``) and holds its finalizers for a moment on deletion, so
the stand-in's waiting on it is observable. Orders are checked by resourceVersion: one etcd
orders every write.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.errors import KubeConflict, KubeNotFound, KubeUnavailable, TemporaryError
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
)
from standins.base import run_all
from standins.capi import CapiKnobs, controllers
from testenv.examples import metalstack_cluster, metalstack_kind
from testenv.harness import LocalStack
from tests.integration.support import eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
CP_LABEL = "cluster.x-k8s.io/control-plane"
MSC_FINALIZER = "metalstackcluster.infrastructure.cluster.x-k8s.io"
MSM_FINALIZER = "metalstackmachine.infrastructure.cluster.x-k8s.io"
ENDPOINT = "203.0.113.10"
HOLD = 0.3  # seconds the provider keeps its finalizer on an object being deleted
WATCHED = (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE_DEPLOYMENT,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE,
    SECRET,
)


# --- the provider, played by hand ----------------------------------------------------------


async def _patch(kube: KubeClient, kind: ResourceKind, obj: Json, patch: Json, **kw: Any) -> None:
    meta = obj["metadata"]
    with contextlib.suppress(KubeNotFound, KubeConflict):
        await kube.patch_merge(kind, meta["namespace"], meta["name"], patch, **kw)


def _without(obj: Json, finalizer: str) -> Json:
    kept = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
    return {"metadata": {"finalizers": kept, "resourceVersion": obj["metadata"]["resourceVersion"]}}


@dataclass
class Provider:
    """cluster-api-provider-metalstack's visible behaviour, for MetalStackMachines (ready once
    owned by a Machine that names its bootstrap data) and for deletions (its finalizers go
    ``HOLD`` seconds after the deletion started). The MetalStackCluster's readiness is set by
    the test itself."""

    kube: KubeClient
    namespace: str
    deleting_since: dict[str, float] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TemporaryError):  # an API hiccup: the next pass retries
                for msm in await _items(self.kube, METALSTACK_MACHINE, self.namespace):
                    await self._machine(msm)
                for msc in await _items(self.kube, METALSTACK_CLUSTER, self.namespace):
                    await self._release(METALSTACK_CLUSTER, msc, MSC_FINALIZER)
            await asyncio.sleep(0.05)

    async def _machine(self, msm: Json) -> None:
        if msm["metadata"].get("deletionTimestamp"):
            await self._release(METALSTACK_MACHINE, msm, MSM_FINALIZER)
            return
        owners = [r for r in msm["metadata"].get("ownerReferences") or [] if r["kind"] == "Machine"]
        if not owners or (msm.get("status") or {}).get("ready"):
            return
        try:
            machine = await self.kube.get(MACHINE, self.namespace, owners[0]["name"])
        except KubeNotFound:
            return
        if not (machine["spec"].get("bootstrap") or {}).get("dataSecretName"):
            return  # what the real provider waits for, too
        name = msm["metadata"]["name"]
        spec = {"providerID": f"metalstack://uuid-{name}"}
        meta = {
            "finalizers": [MSM_FINALIZER],
            "resourceVersion": msm["metadata"]["resourceVersion"],
        }
        await _patch(self.kube, METALSTACK_MACHINE, msm, {"metadata": meta, "spec": spec})
        status = {"ready": True, "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}
        await _patch(self.kube, METALSTACK_MACHINE, msm, {"status": status}, subresource="status")

    async def _release(self, kind: ResourceKind, obj: Json, finalizer: str) -> None:
        if not obj["metadata"].get("deletionTimestamp"):
            return
        key = f"{kind.kind}/{obj['metadata']['name']}"
        since = self.deleting_since.setdefault(key, asyncio.get_running_loop().time())
        if asyncio.get_running_loop().time() - since >= HOLD:
            await _patch(self.kube, kind, obj, _without(obj, finalizer))


# --- a record of every write ---------------------------------------------------------------


@dataclass
class Record:
    """Every event of ``WATCHED`` kinds in the namespace with its resourceVersion, which
    orders writes across kinds."""

    events: list[tuple[str, str, str, int, Json]] = field(default_factory=list)

    def of(self, kind: ResourceKind, name: str | None = None) -> list[tuple[str, int, Json]]:
        return [
            (type_, rv, obj)
            for k, type_, n, rv, obj in self.events
            if k == kind.kind and (name is None or n == name)
        ]

    def first(
        self, kind: ResourceKind, name: str, check: Callable[[str, Json], bool]
    ) -> int | None:
        return next((rv for t, rv, obj in self.of(kind, name) if check(t, obj)), None)

    def deleted(self, kind: ResourceKind, name: str) -> int:
        found = self.first(kind, name, lambda t, _: t == "DELETED")
        assert found is not None, f"{kind.kind} {name} never went"
        return found

    def deletion_started(self, kind: ResourceKind, name: str) -> int:
        found = self.first(kind, name, lambda _, o: bool(o["metadata"].get("deletionTimestamp")))
        return found if found is not None else self.deleted(kind, name)

    async def caught_up(self, kind: ResourceKind, names: list[str] | set[str]) -> None:
        """Wait until the record saw each of ``names`` go (the watch lags behind a list)."""

        async def missing() -> list[str]:
            seen = {n for k, t, n, _, _ in self.events if k == kind.kind and t == "DELETED"}
            return [n for n in names if n not in seen]

        await eventually(missing, lambda m: not m, what=f"{kind.kind} DELETED events", timeout=10)

    def names(self, kind: ResourceKind) -> set[str]:
        return {n for k, _, n, _, _ in self.events if k == kind.kind}


async def _follow(kube: KubeClient, namespace: str, kind: ResourceKind, record: Record) -> None:
    """Resumes from the last event seen: a watch may be refused for a moment while the API
    server (re)initialises a freshly applied CRD's storage (429)."""
    _, version = await kube.list(kind, namespace=namespace)
    while True:
        try:
            async for event in kube.watch(kind, resource_version=version, namespace=namespace):
                version = event.resource_version or version
                if event.type == "BOOKMARK":
                    continue
                meta = event.object["metadata"]
                rv = int(meta["resourceVersion"])
                record.events.append((kind.kind, event.type, meta["name"], rv, event.object))
        except KubeUnavailable:
            await asyncio.sleep(0.1)


# --- fixtures ------------------------------------------------------------------------------


Started = Callable[[], Awaitable[Record]]


@pytest.fixture
async def start(kube: KubeClient, namespace: str, stack: LocalStack) -> AsyncIterator[Started]:
    """The stand-in (kubeconfig: the workload API server's), the provider, and a record."""
    workload = stack.workload()  # blocks while it starts: before any task runs
    stop = asyncio.Event()
    standins: list[asyncio.Task[None]] = []
    helpers: list[asyncio.Task[None]] = []

    async def go() -> Record:
        record = Record()
        for kind in WATCHED:
            helpers.append(asyncio.create_task(_follow(kube, namespace, kind, record)))
        knobs = CapiKnobs(step_delay=0.01, kubeconfig_path=str(workload))
        standin = controllers(kube, namespace=namespace, knobs=knobs)
        standins.append(asyncio.create_task(run_all(standin, stop)))
        helpers.append(asyncio.create_task(Provider(kube, namespace).run()))
        await asyncio.sleep(0.2)  # the record's watches are established
        return record

    yield go
    if standins:  # a failed test's cluster: let the stand-in and the provider take it down
        for name in await _names(kube, CAPI_CLUSTER, namespace):
            with contextlib.suppress(KubeNotFound):
                await kube.delete(CAPI_CLUSTER, namespace, name)
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: _names(kube, CAPI_CLUSTER, namespace), lambda n: not n, timeout=20
            )
    stop.set()
    for task in helpers:
        task.cancel()
    await asyncio.gather(*standins, *helpers, return_exceptions=True)
    await _drop_finalizers(kube, namespace)


async def _drop_finalizers(kube: KubeClient, namespace: str) -> None:
    """Whatever a failed test left holding a finalizer, so the namespace can go."""
    for kind in (CAPI_CLUSTER, MACHINE, METALSTACK_MACHINE, METALSTACK_CLUSTER):
        for obj in await _items(kube, kind, namespace):
            if obj["metadata"].get("finalizers"):
                await _patch(kube, kind, obj, {"metadata": {"finalizers": None}})


async def _items(kube: KubeClient, kind: ResourceKind, namespace: str) -> list[Json]:
    found, _ = await kube.list(kind, namespace=namespace)
    return found


async def _names(kube: KubeClient, kind: ResourceKind, namespace: str) -> list[str]:
    return sorted(i["metadata"]["name"] for i in await _items(kube, kind, namespace))


def _running(machines: list[Json]) -> int:
    return sum((m.get("status") or {}).get("phase") == "Running" for m in machines)


def _workers(machines: list[Json]) -> list[Json]:
    return [m for m in machines if CP_LABEL not in m["metadata"].get("labels", {})]


def _decoded(secret: Json, key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


# --- the test ------------------------------------------------------------------------------


async def test_metalstack_cluster_lifecycle(
    kube: KubeClient, namespace: str, start: Started, stack: LocalStack
) -> None:
    record = await start()
    for manifest in metalstack_cluster(namespace, "ms", control_planes=1, workers=2):
        await kube.create(metalstack_kind(manifest), manifest)
    cluster = await kube.get(CAPI_CLUSTER, namespace, "ms")
    uid = cluster["metadata"]["uid"]

    # 1. CAPI core links the MetalStackCluster to its Cluster, and waits for the provider.
    msc = await eventually(
        lambda: kube.get(METALSTACK_CLUSTER, namespace, "ms"),
        lambda o: bool(o["metadata"].get("ownerReferences")),
        what="ownerReference on the MetalStackCluster",
    )
    assert msc["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Cluster",
            "name": "ms",
            "uid": uid,
            "blockOwnerDeletion": True,
        }
    ]
    assert msc["metadata"]["labels"][CLUSTER_LABEL] == "ms"
    await asyncio.sleep(0.5)
    cluster = await kube.get(CAPI_CLUSTER, namespace, "ms")
    assert cluster["status"]["phase"] == "Provisioning"
    assert cluster["status"]["infrastructureReady"] is False
    assert not await _names(kube, MACHINE, namespace)

    # The provider: finalizer and endpoint on the object, then ready on its status.
    patch: Json = {
        "metadata": {"finalizers": [MSC_FINALIZER]},
        "spec": {"controlPlaneEndpoint": {"host": ENDPOINT, "port": 6443}},
    }
    await kube.patch_merge(METALSTACK_CLUSTER, namespace, "ms", patch)
    await asyncio.sleep(0.3)
    cluster = await kube.get(CAPI_CLUSTER, namespace, "ms")
    assert cluster["status"]["infrastructureReady"] is False  # not before status.ready
    await kube.patch_merge(
        METALSTACK_CLUSTER, namespace, "ms", {"status": {"ready": True}}, subresource="status"
    )
    cluster = await eventually(
        lambda: kube.get(CAPI_CLUSTER, namespace, "ms"),
        lambda c: (c.get("status") or {}).get("infrastructureReady") is True,
        what="infrastructureReady",
    )
    assert cluster["spec"]["controlPlaneEndpoint"] == {"host": ENDPOINT, "port": 6443}
    assert cluster["status"]["phase"] == "Provisioned"

    # 2. Three Machines, each with a MetalStackMachine, bootstrap data, a providerID.
    machines = await eventually(
        lambda: _items(kube, MACHINE, namespace),
        lambda ms: len(ms) == 3 and _running(ms) == 3,
        what="three Machines running",
        timeout=60,
    )
    await _check_machines(kube, namespace, machines, record)
    kubeconfig = await kube.get(SECRET, namespace, "ms-kubeconfig")
    assert _decoded(kubeconfig, "value") == stack.workload().read_text()
    assert kubeconfig["metadata"]["labels"][CLUSTER_LABEL] == "ms"
    owner = kubeconfig["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Cluster", "ms", uid)
    # Written before any Machine: the provider needs it to bring the first one up.
    first_machine = min(rv for t, rv, _ in record.of(MACHINE) if t == "ADDED")
    kubeconfig_written = record.first(SECRET, "ms-kubeconfig", lambda t, _: t == "ADDED")
    assert kubeconfig_written is not None
    assert kubeconfig_written < first_machine
    cluster = await eventually(
        lambda: kube.get(CAPI_CLUSTER, namespace, "ms"),
        lambda c: (c.get("status") or {}).get("controlPlaneReady") is True,
        what="control plane ready",
    )

    # 3. Scaling the workers: 2 -> 3 -> 1; every Machine that goes takes its infra machine.
    await _scale(kube, namespace, 3)
    await _scale(kube, namespace, 1)
    gone = record.names(MACHINE) - set(await _names(kube, MACHINE, namespace))
    assert len(gone) == 2
    await record.caught_up(METALSTACK_MACHINE, gone)
    await record.caught_up(MACHINE, gone)
    for name in gone:
        # The Machine kept its finalizer until the provider let the MetalStackMachine go.
        assert record.deleted(METALSTACK_MACHINE, name) < record.deleted(MACHINE, name)
        assert record.deletion_started(MACHINE, name) < record.deletion_started(
            METALSTACK_MACHINE, name
        )
    assert len(await _names(kube, METALSTACK_MACHINE, namespace)) == 2

    # 4. Deletion in CAPI's order; the firewall is the provider's, never touched.
    firewall = await kube.create(METALSTACK_FIREWALL, _firewall(namespace))
    left = await _names(kube, MACHINE, namespace)
    await kube.delete(CAPI_CLUSTER, namespace, "ms")
    await eventually(
        lambda: _names(kube, CAPI_CLUSTER, namespace), lambda n: not n, what="Cluster gone"
    )
    for kind, names in (
        (CAPI_CLUSTER, ["ms"]),
        (METALSTACK_CLUSTER, ["ms"]),
        (CONTROL_PLANE, ["ms-control-plane"]),
        (MACHINE_DEPLOYMENT, ["ms-md-0"]),
        (MACHINE, left),
        (METALSTACK_MACHINE, left),
    ):
        await record.caught_up(kind, names)
    await _check_deletion_order(record, left)
    for kind in (CONTROL_PLANE, MACHINE_DEPLOYMENT, MACHINE, METALSTACK_MACHINE):
        assert not await _names(kube, kind, namespace), kind.kind
    assert not await _names(kube, METALSTACK_CLUSTER, namespace)
    still = await kube.get(METALSTACK_FIREWALL, namespace, "ms")
    assert still["metadata"]["resourceVersion"] == firewall["metadata"]["resourceVersion"]
    await kube.delete(METALSTACK_FIREWALL, namespace, "ms")


async def _check_machines(
    kube: KubeClient, namespace: str, machines: list[Json], record: Record
) -> None:
    assert len(_workers(machines)) == 2
    provisioned = record.first(
        CAPI_CLUSTER, "ms", lambda _, o: (o.get("status") or {}).get("infrastructureReady") is True
    )
    assert provisioned is not None
    for m in machines:
        name, labels = m["metadata"]["name"], m["metadata"]["labels"]
        ref = m["spec"]["infrastructureRef"]
        assert (ref["apiVersion"], ref["kind"], ref["name"]) == (
            METALSTACK_MACHINE.api_version,
            "MetalStackMachine",
            name,
        )
        msm = await kube.get(METALSTACK_MACHINE, namespace, name)
        assert msm["metadata"]["labels"][CLUSTER_LABEL] == "ms"
        assert (CP_LABEL in msm["metadata"]["labels"]) == (CP_LABEL in labels)
        if CP_LABEL in labels:
            assert msm["metadata"]["labels"][CP_LABEL] == ""
        owners = [r for r in msm["metadata"]["ownerReferences"] if r["kind"] == "Machine"]
        assert owners == [
            {
                "apiVersion": "cluster.x-k8s.io/v1beta1",
                "kind": "Machine",
                "name": name,
                "uid": m["metadata"]["uid"],
                "blockOwnerDeletion": True,
                "controller": True,
            }
        ]
        assert msm["spec"] == {
            "image": "ubuntu-cloud-init-20.04",
            "machineType": "v1-small-x86",
            "providerID": f"metalstack://uuid-{name}",
        }
        assert m["spec"]["providerID"] == msm["spec"]["providerID"]
        assert m["status"]["addresses"] == [{"type": "InternalIP", "address": "10.0.0.7"}]
        await _check_bootstrap(kube, namespace, m, record, after=provisioned)


async def _check_bootstrap(
    kube: KubeClient, namespace: str, machine: Json, record: Record, *, after: int
) -> None:
    name = machine["metadata"]["name"]
    assert machine["spec"]["bootstrap"]["dataSecretName"] == f"{name}-bootstrap"
    secret = await kube.get(SECRET, namespace, f"{name}-bootstrap")
    assert secret["type"] == "cluster.x-k8s.io/secret"
    assert secret["metadata"]["labels"][CLUSTER_LABEL] == "ms"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == machine["metadata"]["uid"]
    assert _decoded(secret, "format") == "cloud-config"
    value = _decoded(secret, "value")
    assert value.startswith("#cloud-config\n")
    assert name in value
    # Infrastructure ready, then the Secret, then (a window later) its name on the Machine.
    written = record.first(SECRET, f"{name}-bootstrap", lambda t, _: t == "ADDED")
    named = record.first(
        MACHINE, name, lambda _, o: bool((o["spec"].get("bootstrap") or {}).get("dataSecretName"))
    )
    assert written is not None
    assert named is not None
    assert after < written < named
    unnamed = record.of(MACHINE, name)[0][2]
    assert not unnamed["spec"]["bootstrap"].get("dataSecretName")


async def _scale(kube: KubeClient, namespace: str, replicas: int) -> None:
    patch = {"spec": {"replicas": replicas}}
    await kube.patch_merge(MACHINE_DEPLOYMENT, namespace, "ms-md-0", patch)

    async def probe() -> tuple[list[Json], list[str]]:
        machines = _workers(await _items(kube, MACHINE, namespace))
        return machines, await _names(kube, METALSTACK_MACHINE, namespace)

    await eventually(
        probe,
        lambda found: (
            len(found[0]) == replicas == _running(found[0]) and len(found[1]) == replicas + 1
        ),
        what=f"{replicas} workers",
        timeout=60,
    )


async def _check_deletion_order(record: Record, machines: list[str]) -> None:
    msc_deleting = record.deletion_started(METALSTACK_CLUSTER, "ms")
    for name in machines:
        assert record.deleted(METALSTACK_MACHINE, name) < record.deleted(MACHINE, name)
        assert record.deleted(MACHINE, name) < msc_deleting
    workers = [n for n in machines if n.startswith("ms-md-0")]
    control_plane = [n for n in machines if n not in workers]
    assert workers
    assert control_plane
    last_worker = max(record.deleted(MACHINE, n) for n in workers)
    assert all(record.deletion_started(MACHINE, n) > last_worker for n in control_plane)
    assert record.deleted(MACHINE_DEPLOYMENT, "ms-md-0") < msc_deleting
    assert record.deleted(CONTROL_PLANE, "ms-control-plane") < msc_deleting
    assert record.deleted(METALSTACK_CLUSTER, "ms") < record.deleted(CAPI_CLUSTER, "ms")
    phases = [(o.get("status") or {}).get("phase") for _, _, o in record.of(CAPI_CLUSTER, "ms")]
    assert phases[-1] == "Deleting"


def _firewall(namespace: str) -> Json:
    return {
        "apiVersion": METALSTACK_FIREWALL.api_version,
        "kind": METALSTACK_FIREWALL.kind,
        "metadata": {"name": "ms", "namespace": namespace, "labels": {CLUSTER_LABEL: "ms"}},
        "spec": {"image": "firewall-ubuntu-2.0", "machineType": "v1-small-x86"},
    }
