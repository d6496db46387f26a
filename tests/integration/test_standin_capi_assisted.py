"""The Cluster API stand-in's OpenShift Assisted paths, with the other providers played by hand.

The stand-in's controllers run in this process, confined to the test's namespace; the objects
come from ``testenv.examples.assisted_cluster``. What the control-plane provider, the bootstrap
provider and metal3 would write (a control-plane Machine with its config and clone,
``status.ready``/``dataSecretName`` on configs, ``ready``/``initialized`` on the control
plane, ready infrastructure, finalizers held a moment on deletion) the test writes itself, so
each wait of the stand-in is observable. Orders are checked by resourceVersion: one etcd
orders every write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.errors import KubeConflict, KubeNotFound, KubeUnavailable, TemporaryError
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    METAL3_CLUSTER,
    METAL3_MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
)
from standins.base import run_all
from standins.capi import CapiKnobs, controllers
from testenv.examples import assisted_cluster, assisted_kind
from testenv.harness import LocalStack
from tests.integration.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Json = dict[str, Any]
OAC, ACP = OPENSHIFT_ASSISTED_CONFIG, OPENSHIFT_ASSISTED_CONTROL_PLANE
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
CP_LABEL = "cluster.x-k8s.io/control-plane"
OAC_FINALIZER = "openshiftassistedconfig.bootstrap.cluster.x-k8s.io/deprovision"
ACP_FINALIZER = "openshiftassistedcontrolplane.controlplane.cluster.x-k8s.io/deprovision"
HOLD = 0.3  # seconds a provider keeps its finalizer on an object being deleted
HELD = {OAC.kind: OAC_FINALIZER, ACP.kind: ACP_FINALIZER}
WATCHED = (
    CAPI_CLUSTER,
    ACP,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    MACHINE,
    OAC,
    METAL3_MACHINE,
    METAL3_CLUSTER,
)


# --- the providers' finalizers, played by hand ---------------------------------------------


async def _patch(kube: KubeClient, kind: ResourceKind, obj: Json, patch: Json, **kw: Any) -> None:
    meta = obj["metadata"]
    with contextlib.suppress(KubeNotFound, KubeConflict):
        await kube.patch_merge(kind, meta["namespace"], meta["name"], patch, **kw)


async def _items(kube: KubeClient, kind: ResourceKind, namespace: str) -> list[Json]:
    found, _ = await kube.list(kind, namespace=namespace)
    return found


@dataclass
class Finalizers:
    """The bootstrap and control-plane providers' finalizers: put on every OAC and ACP, let
    go ``HOLD`` seconds after its deletion started."""

    kube: KubeClient
    namespace: str
    since: dict[str, float] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TemporaryError):
                for kind in (OAC, ACP):
                    for obj in await _items(self.kube, kind, self.namespace):
                        await self._hold(kind, obj, HELD[kind.kind])
            await asyncio.sleep(0.05)

    async def _hold(self, kind: ResourceKind, obj: Json, finalizer: str) -> None:
        meta = obj["metadata"]
        held = finalizer in (meta.get("finalizers") or [])
        if not meta.get("deletionTimestamp"):
            if not held:
                patch = {"metadata": {"finalizers": [*(meta.get("finalizers") or []), finalizer]}}
                patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
                await _patch(self.kube, kind, obj, patch)
            return
        loop = asyncio.get_running_loop()
        started = self.since.setdefault(f"{kind.kind}/{meta['name']}", loop.time())
        if held and loop.time() - started >= HOLD:
            kept = [f for f in meta["finalizers"] if f != finalizer]
            patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
            await _patch(self.kube, kind, obj, patch)


# --- a record of every write ---------------------------------------------------------------


@dataclass
class Record:
    events: list[tuple[str, str, str, int, Json]] = field(default_factory=list)

    def first(self, kind: ResourceKind, name: str, check: Callable[[str, Json], bool]) -> int:
        for k, type_, n, rv, obj in self.events:
            if k == kind.kind and n == name and check(type_, obj):
                return rv
        raise AssertionError(f"no such event of {kind.kind} {name}")

    def deleted(self, kind: ResourceKind, name: str) -> int:
        return self.first(kind, name, lambda t, _: t == "DELETED")

    def deletion_started(self, kind: ResourceKind, name: str) -> int:
        return self.first(
            kind, name, lambda t, o: t == "DELETED" or bool(o["metadata"].get("deletionTimestamp"))
        )

    async def caught_up(self, kind: ResourceKind, names: list[str]) -> None:
        async def missing() -> list[str]:
            seen = {n for k, t, n, _, _ in self.events if k == kind.kind and t == "DELETED"}
            return [n for n in names if n not in seen]

        await eventually(missing, lambda m: not m, what=f"{kind.kind} DELETED events", timeout=10)


async def _follow(kube: KubeClient, namespace: str, kind: ResourceKind, record: Record) -> None:
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


Started = Callable[[], Awaitable[Record]]


@pytest.fixture
async def start(kube: KubeClient, namespace: str, stack: LocalStack) -> AsyncIterator[Started]:
    workload = stack.workload()
    stop = asyncio.Event()
    standins: list[asyncio.Task[None]] = []
    helpers: list[asyncio.Task[None]] = []

    async def go() -> Record:
        record = Record()
        for kind in WATCHED:
            helpers.append(asyncio.create_task(_follow(kube, namespace, kind, record)))
        knobs = CapiKnobs(step_delay=0.01, kubeconfig_path=str(workload))
        standins.append(
            asyncio.create_task(run_all(controllers(kube, namespace=namespace, knobs=knobs), stop))
        )
        helpers.append(asyncio.create_task(Finalizers(kube, namespace).run()))
        await asyncio.sleep(0.2)  # the record's watches are established
        return record

    yield go
    if standins:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(CAPI_CLUSTER, namespace, "oc")
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: _items(kube, CAPI_CLUSTER, namespace), lambda n: not n, timeout=20
            )
    stop.set()
    for task in helpers:
        task.cancel()
    await asyncio.gather(*standins, *helpers, return_exceptions=True)
    for kind in (CAPI_CLUSTER, MACHINE, OAC, ACP):
        for obj in await _items(kube, kind, namespace):
            if obj["metadata"].get("finalizers"):
                await _patch(kube, kind, obj, {"metadata": {"finalizers": None}})


# --- helpers -------------------------------------------------------------------------------


def _owners(obj: Json, kind: str) -> list[Json]:
    return [r for r in obj["metadata"].get("ownerReferences") or [] if r["kind"] == kind]


async def _status(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str, **s: Any
) -> None:
    await kube.patch_merge(kind, namespace, name, {"status": s}, subresource="status")


async def _owned(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> Json:
    """``name`` once its Machine owns it."""
    return await eventually(
        lambda: kube.get(kind, namespace, name),
        lambda o: bool(_owners(o, "Machine")),
        what=f"the Machine's ownerReference on {kind.kind} {name}",
    )


def _ref(kind: ResourceKind, name: str) -> Json:
    return {"apiVersion": kind.api_version, "kind": kind.kind, "name": name}


async def _control_plane_machine(kube: KubeClient, namespace: str, acp: Json) -> str:
    """What the control-plane provider creates for a replica: an infra clone and a config it
    controls, and the Machine."""
    name = "oc-control-plane-abcde"
    labels = {
        CLUSTER_LABEL: "oc",
        CP_LABEL: "",
        "cluster.x-k8s.io/control-plane-name": "oc-control-plane",
    }
    owner = {**_ref(ACP, acp["metadata"]["name"]), "uid": acp["metadata"]["uid"]}
    controller = {**owner, "controller": True, "blockOwnerDeletion": True}
    meta = {"name": name, "namespace": namespace, "labels": labels}

    def obj(kind: ResourceKind, owners: list[Json], spec: Json) -> Json:
        return {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": {**meta, "ownerReferences": owners},
            "spec": spec,
        }

    await kube.create(METAL3_MACHINE, obj(METAL3_MACHINE, [owner], {}))
    await kube.create(OAC, obj(OAC, [controller], acp["spec"]["openshiftAssistedConfigSpec"]))
    spec = {
        "clusterName": "oc",
        "version": acp["spec"]["version"],
        "bootstrap": {"configRef": {**_ref(OAC, name), "namespace": namespace}},
        "infrastructureRef": {**_ref(METAL3_MACHINE, name), "namespace": namespace},
    }
    await kube.create(MACHINE, obj(MACHINE, [controller], spec))
    return name


async def _ready_machine(kube: KubeClient, namespace: str, name: str) -> None:
    """Bootstrap provider and metal3: the config ready with its data, the host provisioned."""
    await _status(kube, OAC, namespace, name, ready=True, dataSecretName=name)
    await eventually(
        lambda: kube.get(MACHINE, namespace, name),
        lambda m: m["spec"]["bootstrap"].get("dataSecretName") == name,
        what=f"dataSecretName on {name}",
    )
    spec = {"spec": {"providerID": f"metal3://{namespace}/host/{name}"}}
    await kube.patch_merge(METAL3_MACHINE, namespace, name, spec)
    await _status(kube, METAL3_MACHINE, namespace, name, ready=True)


# --- the test ------------------------------------------------------------------------------


async def test_openshift_assisted_cluster(kube: KubeClient, namespace: str, start: Started) -> None:
    record = await start()
    manifests = assisted_cluster(namespace, "oc", control_planes=1, workers=2)
    for manifest in manifests:
        await kube.create(assisted_kind(manifest), manifest)
    cluster = await kube.get(CAPI_CLUSTER, namespace, "oc")
    uid = cluster["metadata"]["uid"]

    # 1. The control plane is linked to its Cluster; the stand-in makes no Machine for it.
    acp = await eventually(
        lambda: kube.get(ACP, namespace, "oc-control-plane"),
        lambda o: bool(_owners(o, "Cluster")),
        what="ownerReference on the control plane",
    )
    assert _owners(acp, "Cluster") == [
        {
            "apiVersion": CAPI_CLUSTER.api_version,
            "kind": "Cluster",
            "name": "oc",
            "uid": uid,
            "blockOwnerDeletion": True,
        }
    ]
    assert acp["metadata"]["labels"][CLUSTER_LABEL] == "oc"

    # 2. Workers at once, before the infrastructure is ready: a MachineSet owning two Machines,
    # each with a config cloned from the template and a Metal3Machine.
    workers = await eventually(
        lambda: _items(kube, MACHINE, namespace), lambda ms: len(ms) == 2, what="two workers"
    )
    cluster = await kube.get(CAPI_CLUSTER, namespace, "oc")
    assert not (cluster.get("status") or {}).get("infrastructureReady")
    [machine_set] = await _items(kube, MACHINE_SET, namespace)
    assert machine_set["metadata"]["labels"][DEPLOYMENT_LABEL] == "oc-md-0"
    assert _owners(machine_set, "MachineDeployment")[0]["name"] == "oc-md-0"
    template = next(m for m in manifests if m["kind"] == "OpenshiftAssistedConfigTemplate")
    for m in workers:
        name, labels = m["metadata"]["name"], m["metadata"]["labels"]
        assert labels[CLUSTER_LABEL] == "oc"
        assert labels[DEPLOYMENT_LABEL] == "oc-md-0"
        assert [o["name"] for o in _owners(m, "MachineSet")] == [machine_set["metadata"]["name"]]
        assert m["spec"]["bootstrap"] == {"configRef": {**_ref(OAC, name), "namespace": namespace}}
        oac = await _owned(kube, OAC, namespace, name)
        assert oac["spec"] == template["spec"]["template"]["spec"]
        assert oac["metadata"]["labels"][CLUSTER_LABEL] == "oc"
        assert oac["metadata"]["labels"][DEPLOYMENT_LABEL] == "oc-md-0"
        assert _owners(oac, "Machine")[0]["controller"] is True
        m3m = await _owned(kube, METAL3_MACHINE, namespace, name)
        assert m3m["metadata"]["annotations"]["cluster.x-k8s.io/cloned-from-name"] == "oc-workers"
    assert not (await kube.get(MACHINE, namespace, workers[0]["metadata"]["name"]))["spec"][
        "bootstrap"
    ].get("dataSecretName")

    # 3. Infrastructure: mirrored from the Metal3Cluster, endpoint copied.
    await _status(kube, METAL3_CLUSTER, namespace, "oc", ready=True)
    cluster = await eventually(
        lambda: kube.get(CAPI_CLUSTER, namespace, "oc"),
        lambda c: (c.get("status") or {}).get("infrastructureReady") is True,
        what="infrastructureReady",
    )
    assert cluster["spec"]["controlPlaneEndpoint"] == {"host": "api.oc.example.test", "port": 6443}

    # 4. A control-plane Machine as the provider makes it: its config already has a
    # controller (the control plane), so the Machine's reference is a plain owner link.
    acp = await kube.get(ACP, namespace, "oc-control-plane")
    cp = await _control_plane_machine(kube, namespace, acp)
    oac = await _owned(kube, OAC, namespace, cp)
    assert "controller" not in _owners(oac, "Machine")[0]
    assert _owners(oac, ACP.kind)[0]["controller"] is True

    # 5. Bootstrap data named once the configs are ready; Running once metal3 is.
    for name in [cp, *(m["metadata"]["name"] for m in workers)]:
        await _ready_machine(kube, namespace, name)
    machines = await eventually(
        lambda: _items(kube, MACHINE, namespace),
        lambda ms: len(ms) == 3 and all(m.get("status", {}).get("phase") == "Running" for m in ms),
        what="three Machines running",
    )
    for m in machines:
        assert m["spec"]["providerID"] == f"metal3://{namespace}/host/{m['metadata']['name']}"

    # 6. The Cluster mirrors the control plane's initialized and ready.
    await _status(kube, ACP, namespace, "oc-control-plane", initialized=True)
    cluster = await eventually(
        lambda: kube.get(CAPI_CLUSTER, namespace, "oc"),
        lambda c: _condition(c, "ControlPlaneInitialized") == "True",
        what="ControlPlaneInitialized",
    )
    assert cluster["status"]["controlPlaneReady"] is False
    await _status(kube, ACP, namespace, "oc-control-plane", ready=True)
    cluster = await eventually(
        lambda: kube.get(CAPI_CLUSTER, namespace, "oc"),
        lambda c: (c.get("status") or {}).get("controlPlaneReady") is True,
        what="controlPlaneReady",
    )
    assert _condition(cluster, "Ready") == "True"

    # 7. Deletion: workers (each with its config and Metal3Machine), then the control plane
    # (waited for) with its Machine, then the Metal3Cluster, then the Cluster.
    names = [m["metadata"]["name"] for m in machines]
    worker_names = [n for n in names if n != cp]
    await kube.delete(CAPI_CLUSTER, namespace, "oc")
    await eventually(
        lambda: _items(kube, CAPI_CLUSTER, namespace), lambda n: not n, what="Cluster gone"
    )
    for kind, gone in (
        (MACHINE, names),
        (OAC, names),
        (METAL3_MACHINE, names),
        (ACP, ["oc-control-plane"]),
        (METAL3_CLUSTER, ["oc"]),
        (CAPI_CLUSTER, ["oc"]),
    ):
        await record.caught_up(kind, gone)
    for name in names:
        # A Machine kept its finalizer until its config (held by its provider) had gone.
        assert record.deleted(OAC, name) < record.deleted(MACHINE, name)
        assert record.deleted(METAL3_MACHINE, name) < record.deleted(MACHINE, name)
    acp_deleting = record.deletion_started(ACP, "oc-control-plane")
    for name in worker_names:
        assert record.deleted(MACHINE, name) < acp_deleting
    assert record.deletion_started(MACHINE, cp) >= acp_deleting
    infra_deleting = record.deletion_started(METAL3_CLUSTER, "oc")
    assert record.deleted(ACP, "oc-control-plane") < infra_deleting
    assert record.deleted(MACHINE, cp) < infra_deleting
    assert record.deleted(METAL3_CLUSTER, "oc") < record.deleted(CAPI_CLUSTER, "oc")
    for kind in (MACHINE_DEPLOYMENT, MACHINE_SET, MACHINE, OAC, METAL3_MACHINE, ACP):
        assert not await _items(kube, kind, namespace), kind.kind


def _condition(obj: Json, kind: str) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return ""
