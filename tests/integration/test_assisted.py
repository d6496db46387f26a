"""OpenShift Assisted end to end: real API servers (management and workload), NATS, Redis,
capibus's watcher, writer and both OpenShift Assisted providers as processes, the
assisted-service, hive and metal3 stand-ins as one process, and the Cluster API stand-in in
this process, confined to the test's namespace.

One module-wide set of processes serves every test (each test has its own namespace, hosts
and clusters), so the expensive start happens once.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig, ResourceKind
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    MACHINE_DEPLOYMENT,
    METAL3_MACHINE,
    NODE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)
from standins.base import run_all
from standins.capi import CapiKnobs, controllers
from testenv.examples import assisted_cluster, assisted_kind, bare_metal_hosts
from testenv.harness import LocalStack
from tests.integration.support import ROOT, ServiceProcess, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
KINDS = (
    '["openshiftassistedconfig","openshiftassistedcontrolplane","infraenv","agent",'
    '"clusterdeployment","agentclusterinstall","baremetalhost","capicluster","machine","secret"]'
)
FAULT = "standins.capibus.dev/assisted-fault"
CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
PROVIDERS = {
    "assistedbootstrap": "services.baremetal.assisted_bootstrap",
    "assistedcontrolplane": "services.baremetal.assisted_controlplane",
}


@dataclass
class Assisted:
    stack: LocalStack
    workload: Path
    log_dir: Path
    providers: dict[str, list[ServiceProcess]] = field(default_factory=dict)

    def start(self, name: str) -> ServiceProcess:
        proc = ServiceProcess(
            name,
            {**self.stack.env(), **_settings()},
            self.log_dir,
            uuid.uuid4().hex[:6],
            PROVIDERS[name],
        ).start()
        self.providers.setdefault(name, []).append(proc)
        return proc


def _settings() -> dict[str, str]:
    return {
        "CAPIBUS_LEASE_TTL": "2",
        "CAPIBUS_CONSUMER__ACK_WAIT": "5",
        "CAPIBUS_METRICS_PORT": "0",
    }


@pytest.fixture(scope="module")
def assisted(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Assisted]:
    log_dir = tmp_path_factory.mktemp("assisted")
    workload = stack.workload()
    env = {**os.environ, **stack.env(), "STANDIN_ASSISTED_DELAY": "0.1"}
    with (log_dir / "standins.log").open("ab") as log:
        standins = subprocess.Popen(
            [sys.executable, "-m", "standins.assisted", "--workload-kubeconfig", str(workload)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    services = [
        ServiceProcess(
            name, {**stack.env(), **_settings(), **extra}, log_dir, uuid.uuid4().hex[:6]
        ).start()
        for name, extra in (("watcher", {"CAPIBUS_WATCHER__KINDS": KINDS}), ("writer", {}))
    ]
    world = Assisted(stack, workload, log_dir)
    try:
        for name in PROVIDERS:
            world.start(name)
        yield world
    finally:
        for service in [*services, *(p for ps in world.providers.values() for p in ps)]:
            service.stop()
        standins.terminate()
        standins.wait(10)


@pytest.fixture
async def workload_kube(assisted: Assisted) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(assisted.workload), qps=None)
    yield client
    await client.aclose()


@pytest.fixture
async def capi(kube: KubeClient, namespace: str, assisted: Assisted) -> AsyncIterator[None]:
    stop = asyncio.Event()
    knobs = CapiKnobs(kubeconfig_path=str(assisted.workload))
    task = asyncio.create_task(run_all(controllers(kube, namespace=namespace, knobs=knobs), stop))
    yield
    stop.set()
    await asyncio.wait_for(task, 30)


# --- making and reading the world -----------------------------------------------------------


async def create(
    kube: KubeClient,
    namespace: str,
    name: str,
    *,
    control_planes: int = 3,
    workers: int = 2,
    version: str = "4.16.0",
    fault: str | None = None,
) -> None:
    for manifest in assisted_cluster(
        namespace, name, control_planes=control_planes, workers=workers, version=version
    ):
        if fault and manifest["kind"] == "Cluster" and "cluster.x-k8s.io" in manifest["apiVersion"]:
            manifest["metadata"].setdefault("annotations", {})[FAULT] = fault
        await kube.create(assisted_kind(manifest), manifest)


async def seed_hosts(kube: KubeClient, namespace: str, count: int, prefix: str) -> None:
    for manifest in bare_metal_hosts(namespace, count, prefix=prefix):
        await kube.create(assisted_kind(manifest), manifest)


async def of_cluster(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> list[Json]:
    found, _ = await kube.list(kind, namespace=namespace, label_selector=f"{CLUSTER_NAME}={name}")
    return found


async def agents_of(kube: KubeClient, namespace: str, cluster: str) -> list[Json]:
    found, _ = await kube.list(AGENT, namespace=namespace)
    return [
        a
        for a in found
        if ((a["spec"].get("clusterDeploymentName") or {}).get("name") or "").startswith(cluster)
    ]


def state_of(obj: Json) -> str:
    return str(((obj.get("status") or {}).get("debugInfo") or {}).get("state") or "")


def condition(obj: Json, kind: str) -> Json:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return {}


async def control_plane(kube: KubeClient, namespace: str, name: str) -> Json:
    return await kube.get(OPENSHIFT_ASSISTED_CONTROL_PLANE, namespace, f"{name}-control-plane")


async def wait_ready(kube: KubeClient, namespace: str, name: str, timeout: float = 180) -> Json:
    return await eventually(
        lambda: control_plane(kube, namespace, name),
        lambda acp: bool((acp.get("status") or {}).get("ready")),
        timeout=timeout,
        interval=0.5,
        what=f"{name}'s control plane ready",
    )


async def wait_agents(
    kube: KubeClient, namespace: str, name: str, count: int, states: set[str]
) -> list[Json]:
    async def probe() -> list[Json]:
        return [a for a in await agents_of(kube, namespace, name) if state_of(a) in states]

    return await eventually(
        probe,
        lambda agents: len(agents) == count,
        timeout=120,
        interval=0.5,
        what=f"{count} agents of {name} in {sorted(states)}",
    )


async def get_or_none(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str
) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def gone(kube: KubeClient, kind: ResourceKind, namespace: str | None, name: str) -> bool:
    try:
        await kube.get(kind, namespace, name)
    except KubeNotFound:
        return True
    return False


async def scale(kube: KubeClient, namespace: str, name: str, workers: int) -> None:
    await kube.patch_merge(
        MACHINE_DEPLOYMENT, namespace, f"{name}-md-0", {"spec": {"replicas": workers}}
    )


class AciStates:
    """Every ``status.debugInfo.state`` one ACI shows, in order, from a watch."""

    def __init__(self, kube: KubeClient, namespace: str, name: str) -> None:
        self.seen: list[str] = []
        self._task = asyncio.create_task(self._follow(kube, namespace, name))

    async def _follow(self, kube: KubeClient, namespace: str, name: str) -> None:
        while True:
            try:
                items, version = await kube.list(AGENT_CLUSTER_INSTALL, namespace=namespace)
                for item in items:
                    if item["metadata"]["name"] == name:
                        self._note(item)
                async for event in kube.watch(
                    AGENT_CLUSTER_INSTALL, resource_version=version, namespace=namespace
                ):
                    if event.object.get("metadata", {}).get("name") == name:
                        self._note(event.object)
            except Exception:
                await asyncio.sleep(0.2)

    def _note(self, obj: Json) -> None:
        state = state_of(obj)
        if state and (not self.seen or self.seen[-1] != state):
            self.seen.append(state)

    def stop(self) -> None:
        self._task.cancel()


# --- the tests --------------------------------------------------------------------------------


@pytest.mark.timeout(360)
async def test_day_one_installs_three_masters_and_two_workers_then_day_two_adds_two(
    kube: KubeClient, namespace: str, assisted: Assisted, capi: None, workload_kube: KubeClient
) -> None:
    await seed_hosts(kube, namespace, 7, "h1")
    states = AciStates(kube, namespace, "oa1-control-plane")
    try:
        await create(kube, namespace, "oa1")
        acp = await wait_ready(kube, namespace, "oa1")
    finally:
        states.stop()
    assert states.seen[-1] == "adding-hosts"
    walk = ["ready", "preparing-for-installation", "installing", "finalizing", "installed"]
    assert [s for s in states.seen if s in walk] == walk, states.seen
    assert acp["status"]["initialized"] is True
    # The last Machine's readiness comes from the host stand-in, the ACI's adding-hosts from
    # the install reactor: the count may follow `ready` by a moment.
    await eventually(
        lambda: control_plane(kube, namespace, "oa1"),
        lambda found: found["status"].get("readyReplicas") == 3,
        what="three ready control-plane Machines",
    )

    kubeconfig = await kube.get(SECRET, namespace, "oa1-kubeconfig")
    assert kubeconfig["type"] == "cluster.x-k8s.io/secret"
    assert set(kubeconfig["data"]) == {"value"}

    agents = await wait_agents(kube, namespace, "oa1", 5, {"installed"})
    roles = sorted(a["spec"]["role"] for a in agents)
    assert roles == ["master", "master", "master", "worker", "worker"]
    assert all(a["spec"]["approved"] for a in agents)
    hosts = {
        h["metadata"]["uid"]: h for h in (await kube.list(BARE_METAL_HOST, namespace=namespace))[0]
    }
    for agent in agents:
        assert agent["spec"]["nodeLabels"]["metal3.io/uuid"] in hosts
    assert len(await of_cluster(kube, INFRA_ENV, namespace, "oa1")) == 2  # one per pool
    for oac in await of_cluster(kube, OPENSHIFT_ASSISTED_CONFIG, namespace, "oa1"):
        assert oac["status"]["ready"] is True
        assert oac["status"]["agentRef"]["name"]
        assert oac["status"]["isoDownloadURL"].startswith("https://image-service.sim/images/")

    await scale(kube, namespace, "oa1", 4)
    added = await wait_agents(kube, namespace, "oa1", 2, {"added-to-existing-cluster"})
    assert sorted(a["spec"]["role"] for a in added) == ["worker", "worker"]
    wanted = {a["spec"]["nodeLabels"]["metal3.io/uuid"] for a in [*agents, *added]}

    async def labelled() -> set[str]:
        nodes, _ = await workload_kube.list(NODE)
        return {n["metadata"]["labels"].get("metal3.io/uuid") for n in nodes}

    # The install reactor writes an Agent's Node on its event after the state it reports.
    await eventually(labelled, lambda found: wanted <= found, what="a Node for every Agent")

    await delete_and_check_free(kube, namespace, "oa1")


@pytest.mark.timeout(300)
async def test_a_worker_created_during_installation_waits_then_joins_day_two(
    kube: KubeClient, namespace: str, assisted: Assisted, capi: None
) -> None:
    await seed_hosts(kube, namespace, 3, "h2")
    await create(kube, namespace, "oa2", control_planes=1, workers=1)
    await eventually(
        lambda: get_or_none(kube, AGENT_CLUSTER_INSTALL, namespace, "oa2-control-plane"),
        bool,
        what="the ACI",
    )
    await kube.patch_merge(
        AGENT_CLUSTER_INSTALL, namespace, "oa2-control-plane", {"spec": {"holdInstallation": True}}
    )
    await eventually(
        lambda: kube.get(AGENT_CLUSTER_INSTALL, namespace, "oa2-control-plane"),
        lambda a: state_of(a) == "ready",
        timeout=120,
        what="the install held at ready",
    )
    await scale(kube, namespace, "oa2", 2)
    held = await eventually(
        lambda: of_cluster(kube, OPENSHIFT_ASSISTED_CONFIG, namespace, "oa2"),
        lambda oacs: any(
            condition(o, "DataSecretAvailable").get("reason") == "WaitingForInstallComplete"
            for o in oacs
        ),
        what="the new worker held",
    )
    assert len(held) == 3
    await kube.patch_merge(
        AGENT_CLUSTER_INSTALL, namespace, "oa2-control-plane", {"spec": {"holdInstallation": False}}
    )
    await wait_ready(kube, namespace, "oa2")
    added = await wait_agents(kube, namespace, "oa2", 1, {"added-to-existing-cluster"})
    assert added[0]["spec"]["role"] == "worker"
    await delete_and_check_free(kube, namespace, "oa2")


@pytest.mark.timeout(240)
async def test_each_fault_shows_a_clear_condition(
    kube: KubeClient, namespace: str, assisted: Assisted, capi: None
) -> None:
    await seed_hosts(kube, namespace, 3, "h3")
    for name, fault in (
        ("iso", "iso-never"),
        ("stuck", "aci-insufficient"),
        ("err", "install-error"),
    ):
        await create(kube, namespace, name, control_planes=1, workers=0, fault=fault)
    await create(kube, namespace, "old", control_planes=1, workers=0, version="4.13.9")

    await eventually(
        lambda: of_cluster(kube, OPENSHIFT_ASSISTED_CONFIG, namespace, "iso"),
        lambda oacs: (
            len(oacs) == 1
            and condition(oacs[0], "DataSecretAvailable").get("reason") == "WaitingForLiveISOURL"
        ),
        what="the config waiting for the ISO",
    )
    stuck = await eventually(
        lambda: control_plane(kube, namespace, "stuck"),
        lambda acp: "insufficient" in condition(acp, "ControlPlaneReady").get("message", ""),
        timeout=90,
        what="the control plane showing the install stuck",
    )
    assert condition(stuck, "ControlPlaneReady")["status"] == "False"
    failed = await eventually(
        lambda: control_plane(kube, namespace, "err"),
        lambda acp: condition(acp, "ControlPlaneReady").get("reason") == "InstallationFailed",
        timeout=90,
        what="the install error on the control plane",
    )
    assert condition(failed, "ControlPlaneReady")["message"]
    old = await eventually(
        lambda: control_plane(kube, namespace, "old"),
        lambda acp: condition(acp, "MachinesCreated").get("reason") == "MachineGenerationFailed",
        what="the old version refused",
    )
    assert "4.14.0" in condition(old, "MachinesCreated")["message"]
    assert await of_cluster(kube, MACHINE, namespace, "old") == []


@pytest.mark.timeout(180)
async def test_a_host_booting_with_an_unknown_mac_is_shown_on_its_config(
    kube: KubeClient, namespace: str, assisted: Assisted, capi: None
) -> None:
    await seed_hosts(kube, namespace, 1, "h4")
    host = (await kube.list(BARE_METAL_HOST, namespace=namespace))[0][0]
    await kube.patch_merge(
        BARE_METAL_HOST,
        namespace,
        host["metadata"]["name"],
        {"metadata": {"annotations": {"standins.capibus.dev/fault": "mac-mismatch"}}},
    )
    await create(kube, namespace, "mac", control_planes=1, workers=0)
    oacs = await eventually(
        lambda: of_cluster(kube, OPENSHIFT_ASSISTED_CONFIG, namespace, "mac"),
        lambda found: any(condition(o, "AgentBound").get("status") == "False" for o in found),
        timeout=90,
        what="the unmatched agent shown on the config",
    )
    assert "NoMatchingHost" in {condition(o, "AgentBound").get("reason") for o in oacs}
    agents = await agents_of(kube, namespace, "mac")
    assert agents
    assert not any(a["spec"].get("approved") for a in agents)


@pytest.mark.timeout(420)
async def test_kills_and_restarts_mid_install_leave_exactly_one_of_everything(
    kube: KubeClient, namespace: str, assisted: Assisted, capi: None, stack: LocalStack
) -> None:
    """Each provider is SIGKILLed mid-install and replaced; NATS and Redis restart. The
    cluster installs with one InfraEnv per pool, one ClusterDeployment, one ACI, as many
    Machines as replicas, and no agent ever approved with two roles."""
    await seed_hosts(kube, namespace, 5, "h5")
    roles = RoleAudit(kube, namespace)
    try:
        await create(kube, namespace, "oa5")
        await eventually(
            lambda: of_cluster(kube, OPENSHIFT_ASSISTED_CONFIG, namespace, "oa5"),
            lambda oacs: len(oacs) >= 3,
            what="configs under way",
        )
        for name in PROVIDERS:
            assisted.providers[name].pop(0).kill()
            assisted.start(name)
        await eventually(
            lambda: agents_of(kube, namespace, "oa5"), lambda a: len(a) >= 2, what="agents booting"
        )
        if stack.managed:
            stack.restart("nats")
            stack.restart("redis")
        await wait_ready(kube, namespace, "oa5", timeout=240)
    finally:
        roles.stop()
    assert roles.changed == [], roles.changed
    assert len(await of_cluster(kube, INFRA_ENV, namespace, "oa5")) == 2
    deployments, _ = await kube.list(CLUSTER_DEPLOYMENT, namespace=namespace)
    installs, _ = await kube.list(AGENT_CLUSTER_INSTALL, namespace=namespace)
    assert [d["metadata"]["name"] for d in deployments] == ["oa5-control-plane"]
    assert [i["metadata"]["name"] for i in installs] == ["oa5-control-plane"]
    assert len(await of_cluster(kube, MACHINE, namespace, "oa5")) == 5
    assert len(await of_cluster(kube, METAL3_MACHINE, namespace, "oa5")) == 5
    await delete_and_check_free(kube, namespace, "oa5")


class RoleAudit:
    """Every role an Agent is given, from a watch: none may change once set."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.roles: dict[str, str] = {}
        self.changed: list[tuple[str, str, str]] = []
        self._task = asyncio.create_task(self._follow(kube, namespace))

    async def _follow(self, kube: KubeClient, namespace: str) -> None:
        while True:
            try:
                items, version = await kube.list(AGENT, namespace=namespace)
                for item in items:
                    self._note(item)
                async for event in kube.watch(AGENT, resource_version=version, namespace=namespace):
                    if event.type != "BOOKMARK":
                        self._note(event.object)
            except Exception:
                await asyncio.sleep(0.2)

    def _note(self, agent: Json) -> None:
        name, role = agent["metadata"]["name"], (agent.get("spec") or {}).get("role") or ""
        if not role:
            return
        before = self.roles.setdefault(name, role)
        if before != role:
            self.changed.append((name, before, role))

    def stop(self) -> None:
        self._task.cancel()


async def delete_and_check_free(kube: KubeClient, namespace: str, name: str) -> None:
    """Deleting the Cluster leaves nothing the providers made, and every host free."""
    await kube.delete(CAPI_CLUSTER, namespace, name)
    await eventually(
        lambda: gone(kube, CAPI_CLUSTER, namespace, name),
        bool,
        timeout=120,
        interval=0.5,
        what=f"{name} to go",
    )
    for kind in (OPENSHIFT_ASSISTED_CONFIG, INFRA_ENV, MACHINE, METAL3_MACHINE):
        await eventually(
            lambda kind=kind: of_cluster(kube, kind, namespace, name),  # type: ignore[misc]
            lambda left: left == [],
            timeout=60,
            what=f"{kind.kind}s of {name} gone",
        )
    assert await gone(kube, OPENSHIFT_ASSISTED_CONTROL_PLANE, namespace, f"{name}-control-plane")
    assert await gone(kube, CLUSTER_DEPLOYMENT, namespace, f"{name}-control-plane")
    assert await gone(kube, AGENT_CLUSTER_INSTALL, namespace, f"{name}-control-plane")
    assert await agents_of(kube, namespace, name) == []
    hosts = await eventually(
        lambda: kube.list(BARE_METAL_HOST, namespace=namespace),
        lambda found: not any((h["spec"] or {}).get("consumerRef") for h in found[0]),
        timeout=60,
        what="every host free",
    )
    assert hosts
