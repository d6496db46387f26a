"""The OpenShift Assisted story (``--scene assisted``): an OpenShift cluster installed on bare
metal day 1, a worker added day 2, then deleted, with capibus's two OpenShift Assisted
providers (bootstrap and control plane) against the assisted-service, hive, metal3 and
Cluster API stand-ins (steps 2 to 6 of ``demo.__main__``).

The cluster is what a cluster template renders (``testenv.examples.assisted_cluster``: the
CAPI Cluster, its Metal3Cluster, the OpenshiftAssistedControlPlane, a MachineDeployment whose
bootstrap is an OpenshiftAssistedConfigTemplate, two Metal3MachineTemplates, a pull secret),
on six BareMetalHosts enrolled first (``bare_metal_hosts``): three control-plane hosts and
two workers day 1, one more worker day 2, and every host free again after the deletion. The
demo acts as a user would, through the management API server only (enrol the hosts, create
the cluster, scale the MachineDeployment, delete the CAPI Cluster), waits for the effect on
the live feed (``demo.assistedview``) and reads the result where it lives
(``demo.assistedoutcome``). Structured as ``demo.metalstack``, whose generic parts (feed,
scene, session, the leftover check of ``demo.story``) it shares.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from demo import assistedoutcome, assistedsystem, story
from demo.assistedview import View, short, state
from demo.feed import DemoTimeout
from demo.scene import Scene
from demo.style import BOLD, GREEN, heading, note, say
from shared.kube import KubeClient, KubeConfig
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    METAL3_CLUSTER,
    METAL3_MACHINE,
    NAMESPACE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
)
from testenv.examples import assisted_cluster, assisted_kind, bare_metal_hosts
from testenv.harness import LocalStack, kubectl_line

CLUSTER_NAMESPACE = "demo"
CLUSTER_NAME = "ocp"
CONTROL_PLANES = 3
WORKERS = 2
SCALED = 3
HOSTS = 6
VERSION = "4.16.0"
HOSTS_TIMEOUT = 30.0
UP_TIMEOUT = 120.0
DAY2_TIMEOUT = 60.0
DELETE_TIMEOUT = 90.0
#: everything the cluster brings into its namespace; after deletion, none may be left
OWNED_KINDS = (
    CAPI_CLUSTER,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    OPENSHIFT_ASSISTED_CONFIG,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    MACHINE,
    METAL3_CLUSTER,
    METAL3_MACHINE,
    INFRA_ENV,
    AGENT,
    CLUSTER_DEPLOYMENT,
    AGENT_CLUSTER_INSTALL,
)


class Assisted:
    def __init__(self) -> None:
        self.workload: Path | None = None

    def prepare(self, stack: LocalStack) -> None:
        """The workload cluster's API server: starting it blocks, so before the event loop."""
        self.workload = stack.workload()
        note(f"a second kube-apiserver plays the installed OpenShift cluster: {self.workload}")

    def kubectl_args(self) -> tuple[str, ...]:
        return ("get", "baremetalhosts.metal3.io,agents.agent-install.openshift.io", "-A")

    def access_notes(self, bin_dir: Path) -> list[str]:
        assert self.workload is not None
        return [
            f"the workload cluster's Nodes: {kubectl_line(bin_dir, self.workload, 'get', 'nodes')}"
        ]

    async def play(self, scene: Scene) -> None:
        assert self.workload is not None
        heading("2. Both OpenShift Assisted providers, watcher, writer; the stand-ins")
        await assistedsystem.start(scene, self.workload)
        view = View(CLUSTER_NAMESPACE, CLUSTER_NAME)
        workload = KubeClient.from_config(KubeConfig.load(self.workload), qps=None)
        try:
            with scene.feed.observing(view):
                await self._steps(scene, view, workload)
        finally:
            await workload.aclose()

    async def _steps(self, scene: Scene, view: View, workload: KubeClient) -> None:
        key = f"{CLUSTER_NAMESPACE}/{CLUSTER_NAME}"
        heading(
            f"3. Day 1: OpenShift {VERSION} cluster {key}, {CONTROL_PLANES} control-plane"
            f" + {WORKERS} worker hosts, on {HOSTS} BareMetalHosts"
        )
        await _enrol(scene, view)
        await _create(scene)
        await _until(
            scene, view, lambda: view.installed(CONTROL_PLANES, 5), f"{key} installed", UP_TIMEOUT
        )
        say(
            f"   ⇒ {key} installed: control plane ready, {CONTROL_PLANES + WORKERS} hosts joined",
            BOLD,
            GREEN,
        )
        say(f"   ⇒ AgentClusterInstall walked: {' → '.join(view.walk)}", BOLD, GREEN)

        heading("4. What the install made: control plane, Agents, hosts, workload Nodes")
        await assistedoutcome.show_control_plane(scene, CLUSTER_NAMESPACE, CLUSTER_NAME)
        agents = await assistedoutcome.show_agents(scene, CLUSTER_NAMESPACE)
        await assistedoutcome.show_hosts(scene, CLUSTER_NAMESPACE)
        await assistedoutcome.show_nodes(workload, agents)

        heading(f"5. Day 2: one more worker (MachineDeployment {WORKERS} → {SCALED})")
        before = {a["metadata"]["name"] for a in agents}
        await _scale(scene, view)
        agents = await assistedoutcome.show_agents(scene, CLUSTER_NAMESPACE)
        added = [a for a in agents if a["metadata"]["name"] not in before]
        for agent in added:
            say(
                f"   ⇒ Agent {short(agent['metadata']['name'])} ({agent['spec'].get('role')}):"
                f" {state(agent)}",
                BOLD,
                GREEN,
            )
        await assistedoutcome.show_nodes(workload, agents)

        heading(f"6. Deleting CAPI Cluster {key}")
        await _delete(scene, view)
        await assistedoutcome.show_hosts(scene, CLUSTER_NAMESPACE)


async def _enrol(scene: Scene, view: View) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CLUSTER_NAMESPACE}}
    await scene.kube.create(NAMESPACE, namespace)
    note(f"created Namespace {CLUSTER_NAMESPACE}")
    for manifest in bare_metal_hosts(CLUSTER_NAMESPACE, HOSTS):
        await scene.kube.create(assisted_kind(manifest), manifest)
    note(f"enrolled {HOSTS} BareMetalHosts host-0…host-{HOSTS - 1} (Redfish virtual media)")
    what = f"{HOSTS} BareMetalHosts available"
    await _until(scene, view, lambda: view.hosts_available(HOSTS), what, HOSTS_TIMEOUT)
    say(f"   ⇒ {what}", BOLD, GREEN)


async def _create(scene: Scene) -> None:
    manifests = assisted_cluster(
        CLUSTER_NAMESPACE,
        CLUSTER_NAME,
        control_planes=CONTROL_PLANES,
        workers=WORKERS,
        version=VERSION,
    )
    for manifest in manifests:
        await scene.kube.create(assisted_kind(manifest), manifest)
        note(f"created {manifest['kind']} {CLUSTER_NAMESPACE}/{manifest['metadata']['name']}")


async def _scale(scene: Scene, view: View) -> None:
    name = f"{CLUSTER_NAME}-md-0"
    note(f"merge-patching MachineDeployment {CLUSTER_NAMESPACE}/{name}: {WORKERS} → {SCALED}")
    note("the ACI's worker count was fixed on day 1: the new host joins as a day-2 host")
    patch = {"spec": {"replicas": SCALED}}
    await scene.kube.patch_merge(MACHINE_DEPLOYMENT, CLUSTER_NAMESPACE, name, patch)
    hosts = CONTROL_PLANES + SCALED
    what = f"{hosts} hosts joined, the new one added-to-existing-cluster"

    def done() -> bool:
        added = [a for a in view.of(AGENT.kind) if state(a) == "added-to-existing-cluster"]
        return view.installed(CONTROL_PLANES, hosts) and len(added) == SCALED - WORKERS

    await _until(scene, view, done, what, DAY2_TIMEOUT)
    say(f"   ⇒ {what}", BOLD, GREEN)


async def _delete(scene: Scene, view: View) -> None:
    note("DELETE the CAPI Cluster: Cluster API removes the workers, then waits for the control")
    note("plane; the control-plane provider deletes the ClusterDeployment (hive deprovisions),")
    note("metal3 frees each host and deletes its Agent; the InfraEnvs go last, by the API")
    note("server's garbage collector, through their owner references")
    await scene.kube.delete(CAPI_CLUSTER, CLUSTER_NAMESPACE, CLUSTER_NAME)
    what = f"{CLUSTER_NAMESPACE}/{CLUSTER_NAME} gone, all {HOSTS} hosts free"
    await _until(scene, view, lambda: view.gone(HOSTS), what, DELETE_TIMEOUT)
    say(f"   ⇒ {what}", BOLD, GREEN)
    found = await story.until_nothing_left(scene, CLUSTER_NAMESPACE, OWNED_KINDS)
    story.show_leftovers(found, OWNED_KINDS)
    note("left on purpose: the namespace, the hosts and their BMC credentials, the pull secret")
    note("and the Metal3MachineTemplates and config template (created next to the Cluster)")


async def _until(
    scene: Scene, view: View, done: Callable[[], bool], what: str, seconds: float
) -> None:
    try:
        await scene.expect(lambda _: True if done() else None, what, seconds=seconds)
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; last: {view.summary()}; logs: {scene.logs()}") from None
