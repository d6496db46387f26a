"""The assisted-service and hive stand-ins (``standins.assisted``) against the real API servers.

One module-wide namespace and one set of reactors (in this process, confined to that
namespace) serve every test; each test names its own objects. The hosts are played by the
tests: they create Agents as the metal3 host stand-in would boot them, and approve them as
the bootstrap provider would. The workload API server is the stack's second one; the
``__main__`` test runs the whole package as a process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig, ResourceKind
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    NAMESPACE,
    NODE,
    SECRET,
)
from standins.assisted import AssistedKnobs, Workload, reactors
from standins.assisted.shapes import ACI_FINALIZER, CD_FINALIZER
from standins.base import run_all
from testenv.harness import LocalStack
from tests.integration.support import ROOT, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
DELAY = 0.05
FAULT = "standins.capibus.dev/assisted-fault"
CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
PULL_SECRET = {"auths": {"registry.example.test": {"auth": "dXNlcjpwYXNz"}}}
HAPPY_WALK = [
    "insufficient",
    "ready",
    "preparing-for-installation",
    "installing",
    "finalizing",
    "installed",
    "adding-hosts",
]


def uid() -> str:
    return uuid.uuid4().hex[:6]


def state(obj: Json | None) -> str:
    return str(((obj or {}).get("status") or {}).get("debugInfo", {}).get("state") or "")


def condition(obj: Json, kind: str) -> Json | None:
    found = ((obj.get("status") or {}).get("conditions")) or []
    return next((c for c in found if c.get("type") == kind), None)


def decoded(secret: Json, key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


async def get_or_none(kube: KubeClient, kind: ResourceKind, ns: str | None, name: str) -> Any:
    try:
        return await kube.get(kind, ns, name)
    except KubeNotFound:
        return None


# --- the module's world -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def workload_path(stack: LocalStack) -> Path:
    return stack.workload()  # blocks while it starts: before any task runs


@pytest.fixture(scope="module")
async def workload_kube(workload_path: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(workload_path), qps=None)
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
async def ns(kube: KubeClient, crds: list[str], workload_path: Path) -> AsyncIterator[str]:
    """The module's namespace, with the reactors running in it until the module ends."""
    name = f"t-assisted-{uid()}"
    await kube.create(NAMESPACE, {"metadata": {"name": name}})
    workload = Workload.open(workload_path)
    stop = asyncio.Event()
    knobs = AssistedKnobs(step_delay=DELAY, retry=0.3)
    task = asyncio.create_task(
        run_all(reactors(kube, workload=workload, knobs=knobs, namespace=name), stop)
    )
    yield name
    try:
        await deprovision_all(kube, name)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await workload.aclose()
        await drop_finalizers(kube, name)
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NAMESPACE, None, name)


async def deprovision_all(kube: KubeClient, ns: str) -> None:
    """Delete what holds finalizers and Nodes while the reactors still run to release them."""
    for kind in (CLUSTER_DEPLOYMENT, AGENT):
        items, _ = await kube.list(kind, namespace=ns)
        for item in items:
            with contextlib.suppress(KubeNotFound):
                await kube.delete(kind, ns, item["metadata"]["name"])
    for kind in (CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL):
        with contextlib.suppress(AssertionError):
            await eventually(partial(names, kube, kind, ns), lambda n: not n, timeout=10)


async def drop_finalizers(kube: KubeClient, ns: str) -> None:
    for kind in (CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL):
        items, _ = await kube.list(kind, namespace=ns)
        for item in items:
            if item["metadata"].get("finalizers"):
                patch = {"metadata": {"finalizers": None}}
                with contextlib.suppress(KubeNotFound):
                    await kube.patch_merge(kind, ns, item["metadata"]["name"], patch)


async def names(kube: KubeClient, kind: ResourceKind, ns: str) -> list[str]:
    items, _ = await kube.list(kind, namespace=ns)
    return [item["metadata"]["name"] for item in items]


class StateLog:
    """Every distinct ``status.debugInfo.state`` each object of a kind passes through."""

    def __init__(self) -> None:
        self.seen: dict[str, list[str]] = defaultdict(list)
        self._tasks: list[asyncio.Task[None]] = []

    async def follow(self, kube: KubeClient, kind: ResourceKind, ns: str) -> None:
        _, version = await kube.list(kind, namespace=ns)
        self._tasks.append(asyncio.create_task(self._watch(kube, kind, ns, version)))

    async def _watch(self, kube: KubeClient, kind: ResourceKind, ns: str, version: str) -> None:
        async for event in kube.watch(kind, resource_version=version, namespace=ns):
            history = self.seen[event.object["metadata"]["name"]]
            now = state(event.object)
            if now and (not history or history[-1] != now):
                history.append(now)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def states(kube: KubeClient, ns: str) -> AsyncIterator[StateLog]:
    log = StateLog()
    await log.follow(kube, AGENT_CLUSTER_INSTALL, ns)
    await log.follow(kube, AGENT, ns)
    yield log
    await log.stop()


# --- making objects ---------------------------------------------------------------------------


def manifest(kind: ResourceKind, ns: str, name: str, spec: Json, **meta: Any) -> Json:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": ns, **meta},
        "spec": spec,
    }


async def capi_cluster(kube: KubeClient, ns: str, name: str, fault: str = "") -> None:
    annotations = {FAULT: fault} if fault else {}
    await kube.create(CAPI_CLUSTER, manifest(CAPI_CLUSTER, ns, name, {}, annotations=annotations))


async def pull_secret(kube: KubeClient, ns: str, name: str, content: Any = None) -> None:
    text = json.dumps(PULL_SECRET if content is None else content)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(text.encode()).decode()},
    }
    await kube.create(SECRET, secret)


async def cluster_deployment(
    kube: KubeClient, ns: str, name: str, *, cluster: str = "", install: bool = True
) -> Json:
    spec: Json = {
        "clusterName": name,
        "baseDomain": "example.test",
        "platform": {"agentBareMetal": {"agentSelector": {}}},
        "pullSecretRef": {"name": f"{name}-pull"},
    }
    if install:
        spec["clusterInstallRef"] = {
            "group": "extensions.hive.openshift.io",
            "version": "v1beta1",
            "kind": "AgentClusterInstall",
            "name": name,
        }
    labels = {CLUSTER_NAME: cluster} if cluster else {}
    return await kube.create(
        CLUSTER_DEPLOYMENT, manifest(CLUSTER_DEPLOYMENT, ns, name, spec, labels=labels)
    )


async def agent_cluster_install(
    kube: KubeClient, ns: str, name: str, *, masters: int = 1, workers: int = 1, **extra: Any
) -> Json:
    spec: Json = {
        "clusterDeploymentRef": {"name": name},
        "imageSetRef": {"name": name},
        "platformType": "None",
        "provisionRequirements": {"controlPlaneAgents": masters, "workerAgents": workers},
        "networking": {
            "clusterNetwork": [{"cidr": "10.128.0.0/14", "hostPrefix": 23}],
            "serviceNetwork": ["172.30.0.0/16"],
        },
        **extra,
    }
    return await kube.create(AGENT_CLUSTER_INSTALL, manifest(AGENT_CLUSTER_INSTALL, ns, name, spec))


async def install(kube: KubeClient, ns: str, *, fault: str = "", **aci: Any) -> str:
    """A CAPI Cluster (for its fault), a ClusterDeployment and its ACI, all named alike."""
    name = f"c-{uid()}"
    await capi_cluster(kube, ns, name, fault)
    await cluster_deployment(kube, ns, name, cluster=name)
    await agent_cluster_install(kube, ns, name, **aci)
    return name


async def host(
    kube: KubeClient,
    ns: str,
    cd: str,
    *,
    role: str = "master",
    approved: bool = True,
    node_labels: dict[str, str] | None = None,
) -> tuple[str, str]:
    """An Agent as a booted host reports it; returns (agent name, hostname)."""
    name, hostname = str(uuid.uuid4()), f"host-{uid()}"
    spec = {
        "approved": approved,
        "role": role,
        "clusterDeploymentName": {"name": cd, "namespace": ns},
        "nodeLabels": node_labels or {},
    }
    labels = {"infraenvs.agent-install.openshift.io": f"{cd}-control-plane"}
    await kube.create(AGENT, manifest(AGENT, ns, name, spec, labels=labels))
    mac = ":".join(f"{b:02x}" for b in uuid.UUID(name).bytes[:6])
    reported = {
        "inventory": {"hostname": hostname, "interfaces": [{"macAddress": mac}]},
        "debugInfo": {"state": "known"},
    }
    await kube.patch_merge(AGENT, ns, name, {"status": reported}, subresource="status")
    return name, hostname


async def aci_state(kube: KubeClient, ns: str, name: str, wanted: str, timeout: float = 10) -> Json:
    found: Json = await eventually(
        lambda: kube.get(AGENT_CLUSTER_INSTALL, ns, name),
        lambda o: state(o) == wanted,
        timeout=timeout,
        what=f"ACI {name} {wanted}",
    )
    return found


async def agent_state(kube: KubeClient, ns: str, name: str, wanted: str) -> Json:
    found: Json = await eventually(
        lambda: kube.get(AGENT, ns, name),
        lambda o: state(o) == wanted,
        timeout=10,
        what=f"Agent {name} {wanted}",
    )
    return found


async def stays(kube: KubeClient, kind: ResourceKind, ns: str, name: str, check: Any) -> Json:
    """``check`` holds for 20 step delays: what a fault promises never changes."""
    deadline = time.monotonic() + 20 * DELAY
    while True:
        obj = await kube.get(kind, ns, name)
        assert check(obj), obj
        if time.monotonic() > deadline:
            return obj
        await asyncio.sleep(DELAY)


# --- InfraEnv ---------------------------------------------------------------------------------


async def infraenv(
    kube: KubeClient, ns: str, name: str, *, cd: str, secret: str, cluster: str = ""
) -> None:
    spec = {
        "clusterRef": {"name": cd, "namespace": ns},
        "pullSecretRef": {"name": secret},
        "cpuArchitecture": "x86_64",
    }
    labels = {CLUSTER_NAME: cluster} if cluster else {}
    await kube.create(INFRA_ENV, manifest(INFRA_ENV, ns, name, spec, labels=labels))


async def image_condition(kube: KubeClient, ns: str, name: str, status: str) -> Json:
    found: Json = await eventually(
        lambda: kube.get(INFRA_ENV, ns, name),
        lambda o: (condition(o, "ImageCreated") or {}).get("status") == status,
        timeout=10,
        what=f"InfraEnv {name} ImageCreated {status}",
    )
    return found


async def test_an_infraenv_gets_its_iso_after_the_delay(kube: KubeClient, ns: str) -> None:
    cd = f"c-{uid()}"
    await cluster_deployment(kube, ns, cd, install=False)
    await pull_secret(kube, ns, f"{cd}-pull")
    started = time.monotonic()
    await infraenv(kube, ns, f"{cd}-control-plane", cd=cd, secret=f"{cd}-pull")

    found = await image_condition(kube, ns, f"{cd}-control-plane", "True")

    assert time.monotonic() - started >= DELAY
    status = found["status"]
    match = re.fullmatch(
        r"https://image-service\.sim/images/([0-9a-f-]{36})\?arch=x86_64&type=full-iso",
        status["isoDownloadURL"],
    )
    assert match, status["isoDownloadURL"]
    events = status["debugInfo"]["eventsURL"]
    assert events.startswith("https://assisted.sim/api/assisted-install/v2/events?api_key=")
    assert events.endswith(f"&infra_env_id={match.group(1)}")
    created = condition(found, "ImageCreated")
    assert created is not None
    assert created["reason"] == "ImageCreated"
    assert created["message"] == "Image has been created"
    assert created["lastTransitionTime"]


async def test_a_wrong_pull_secret_or_a_missing_cluster_deployment_is_named(
    kube: KubeClient, ns: str
) -> None:
    cd = f"c-{uid()}"
    await cluster_deployment(kube, ns, cd, install=False)
    await infraenv(kube, ns, f"{cd}-a", cd=cd, secret=f"{cd}-pull")
    missing = await image_condition(kube, ns, f"{cd}-a", "False")
    assert (condition(missing, "ImageCreated") or {})["message"] == (
        f"Failed to create image: pull secret {ns}/{cd}-pull not found"
    )
    assert not missing["status"].get("isoDownloadURL")

    await pull_secret(kube, ns, f"{cd}-pull", {"registry": "no auths here"})
    await eventually(
        lambda: kube.get(INFRA_ENV, ns, f"{cd}-a"),
        lambda o: "has no auths" in (condition(o, "ImageCreated") or {}).get("message", ""),
        timeout=10,
        what="the invalid pull secret named",
    )
    await kube.delete(SECRET, ns, f"{cd}-pull")
    await pull_secret(kube, ns, f"{cd}-pull")
    await image_condition(kube, ns, f"{cd}-a", "True")  # the retry found the fix

    other = f"c-{uid()}"
    await infraenv(kube, ns, f"{other}-b", cd=other, secret=f"{cd}-pull")
    found = await image_condition(kube, ns, f"{other}-b", "False")
    message = (condition(found, "ImageCreated") or {})["message"]
    assert f"clusterDeployment {ns}/{other}" in message
    await cluster_deployment(kube, ns, other, install=False)
    await image_condition(kube, ns, f"{other}-b", "True")


async def test_iso_never_writes_nothing(kube: KubeClient, ns: str) -> None:
    cd = f"c-{uid()}"
    await capi_cluster(kube, ns, cd, "iso-never")
    await cluster_deployment(kube, ns, cd, cluster=cd, install=False)
    await pull_secret(kube, ns, f"{cd}-pull")
    await infraenv(kube, ns, f"{cd}-w", cd=cd, secret=f"{cd}-pull", cluster=cd)

    await stays(kube, INFRA_ENV, ns, f"{cd}-w", lambda o: not o.get("status"))


# --- the install ------------------------------------------------------------------------------


async def test_the_install_walks_to_adding_hosts_then_adds_day2_hosts(
    kube: KubeClient, ns: str, states: StateLog, workload_kube: KubeClient, workload_path: Path
) -> None:
    name = await install(kube, ns, masters=1, workers=1)
    await aci_state(kube, ns, name, "insufficient")
    labels = {"metal3.io/uuid": str(uuid.uuid4())}
    master, master_host = await host(kube, ns, name, node_labels=labels)
    worker, _ = await host(kube, ns, name, role="")  # approved, no role yet: not counted
    await stays(kube, AGENT_CLUSTER_INSTALL, ns, name, lambda o: state(o) == "insufficient")

    await kube.patch_merge(AGENT, ns, worker, {"spec": {"role": "worker"}})

    aci = await aci_state(kube, ns, name, "adding-hosts")
    assert states.seen[name] == HAPPY_WALK
    assert states.seen[master] == ["known", "installing", "installed"]
    assert states.seen[worker] == ["known", "installing", "installed"]
    assert aci["metadata"]["finalizers"] == [ACI_FINALIZER]
    assert aci["status"]["debugInfo"]["stateInfo"]

    kubeconfig = await kube.get(SECRET, ns, f"{name}-admin-kubeconfig")
    assert decoded(kubeconfig, "kubeconfig") == await asyncio.to_thread(workload_path.read_text)
    assert kubeconfig["metadata"]["labels"] == {
        "hive.openshift.io/cluster-deployment-name": name,
        "hive.openshift.io/secret-type": "kubeconfig",
    }
    cd = await kube.get(CLUSTER_DEPLOYMENT, ns, name)
    [owner] = kubeconfig["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("ClusterDeployment", cd["metadata"]["uid"])
    metadata = aci["spec"]["clusterMetadata"]
    assert metadata["adminKubeconfigSecretRef"] == {"name": f"{name}-admin-kubeconfig"}
    assert metadata["clusterID"]
    assert metadata["infraID"].startswith(f"{name}-")
    assert cd["spec"]["installed"] is True
    assert cd["spec"]["clusterMetadata"]["clusterID"] == metadata["clusterID"]
    assert cd["spec"]["clusterMetadata"]["adminPasswordSecretRef"] == {
        "name": f"{name}-admin-password"
    }
    password = await kube.get(SECRET, ns, f"{name}-admin-password")
    assert decoded(password, "username") == "kubeadmin"
    assert cd["metadata"]["finalizers"] == [CD_FINALIZER]

    node = await eventually(
        lambda: get_or_none(workload_kube, NODE, None, master_host),
        lambda n: n is not None,
        timeout=10,
        what=f"Node {master_host}",
    )
    assert node["metadata"]["labels"].items() >= labels.items()
    ready = condition(node, "Ready")
    assert ready is not None
    assert ready["status"] == "True"
    assert node["status"]["nodeInfo"]["systemUUID"] == master

    day2, day2_host = await host(kube, ns, name, role="worker", node_labels={"day": "2"})
    await agent_state(kube, ns, day2, "added-to-existing-cluster")
    assert states.seen[day2] == ["known", "installing", "added-to-existing-cluster"]
    added = await eventually(
        lambda: get_or_none(workload_kube, NODE, None, day2_host),
        lambda n: n is not None,
        timeout=10,
        what=f"Node {day2_host}",
    )
    assert added["metadata"]["labels"]["day"] == "2"
    assert state(await kube.get(AGENT_CLUSTER_INSTALL, ns, name)) == "adding-hosts"

    await kube.delete(AGENT, ns, day2)
    await eventually(
        lambda: get_or_none(workload_kube, NODE, None, day2_host),
        lambda n: n is None,
        timeout=10,
        what=f"Node {day2_host} gone",
    )


async def test_hold_installation_keeps_a_ready_cluster_ready(
    kube: KubeClient, ns: str, states: StateLog
) -> None:
    name = await install(kube, ns, masters=1, workers=0, holdInstallation=True)
    await aci_state(kube, ns, name, "insufficient")
    await host(kube, ns, name)
    await aci_state(kube, ns, name, "ready")
    await stays(kube, AGENT_CLUSTER_INSTALL, ns, name, lambda o: state(o) == "ready")

    await kube.patch_merge(AGENT_CLUSTER_INSTALL, ns, name, {"spec": {"holdInstallation": False}})

    await aci_state(kube, ns, name, "adding-hosts")
    assert states.seen[name] == HAPPY_WALK


async def test_baremetal_without_vips_is_pending_for_input(kube: KubeClient, ns: str) -> None:
    name = await install(kube, ns, masters=1, workers=0, platformType="BareMetal")
    await host(kube, ns, name)
    await aci_state(kube, ns, name, "pending-for-input")

    vips = {"apiVIPs": ["192.0.2.10"], "ingressVIPs": ["192.0.2.11"]}
    await kube.patch_merge(AGENT_CLUSTER_INSTALL, ns, name, {"spec": vips})

    await aci_state(kube, ns, name, "adding-hosts")


async def test_aci_insufficient_fault_holds_the_install(kube: KubeClient, ns: str) -> None:
    name = await install(kube, ns, fault="aci-insufficient", masters=1, workers=0)
    await host(kube, ns, name)
    await aci_state(kube, ns, name, "insufficient")
    await stays(kube, AGENT_CLUSTER_INSTALL, ns, name, lambda o: state(o) == "insufficient")


async def test_install_error_fault_ends_in_error_after_installing(
    kube: KubeClient, ns: str, states: StateLog
) -> None:
    name = await install(kube, ns, fault="install-error", masters=1, workers=0)
    await aci_state(kube, ns, name, "insufficient")
    _, hostname = await host(kube, ns, name)

    aci = await aci_state(kube, ns, name, "error")

    assert states.seen[name] == [*HAPPY_WALK[:4], "error"]
    assert aci["status"]["debugInfo"]["stateInfo"] == (
        f"Host {hostname}: failed to write image to disk"
    )
    await stays(kube, AGENT_CLUSTER_INSTALL, ns, name, lambda o: state(o) == "error")


async def test_deleting_the_cluster_deployment_takes_its_install_and_unbinds(
    kube: KubeClient, ns: str
) -> None:
    name = await install(kube, ns, masters=3, workers=0)
    agent, _ = await host(kube, ns, name)
    await aci_state(kube, ns, name, "insufficient")
    await eventually(
        lambda: kube.get(CLUSTER_DEPLOYMENT, ns, name),
        lambda o: o["metadata"].get("finalizers") == [CD_FINALIZER],
        timeout=10,
        what="the ClusterDeployment's finalizer",
    )

    await kube.delete(CLUSTER_DEPLOYMENT, ns, name)

    await eventually(
        lambda: get_or_none(kube, CLUSTER_DEPLOYMENT, ns, name),
        lambda o: o is None,
        timeout=10,
        what="the ClusterDeployment gone",
    )
    assert await get_or_none(kube, AGENT_CLUSTER_INSTALL, ns, name) is None
    unbound = await kube.get(AGENT, ns, agent)
    assert state(unbound) == "known-unbound"
    assert not unbound["spec"].get("clusterDeploymentName")


# --- the process ------------------------------------------------------------------------------


async def test_python_m_standins_assisted_runs_until_sigterm(
    kube: KubeClient, namespace: str, stack: LocalStack, workload_path: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        **stack.env(),
        "STANDIN_ASSISTED_DELAY": str(DELAY),
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "assisted.log"
    with log_path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "standins.assisted"),
            *("--workload-kubeconfig", str(workload_path), "--namespace", namespace),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        cd = f"c-{uid()}"
        await cluster_deployment(kube, namespace, cd, install=False)
        await pull_secret(kube, namespace, f"{cd}-pull")
        await infraenv(kube, namespace, f"{cd}-p", cd=cd, secret=f"{cd}-pull")
        await image_condition(kube, namespace, f"{cd}-p", "True")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 15)
    text = await asyncio.to_thread(log_path.read_text)
    assert code == 0, text
    assert "image created" in text
    assert "assisted stand-ins stopped" in text
