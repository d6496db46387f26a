"""The metal-stack story (``--scene metalstack``): a Cluster API cluster on metal-stack comes
up, scales and goes, with capibus's metal-stack provider playing the infrastructure provider
against a metal-api stand-in (steps 2 to 6 of ``demo.__main__``).

The cluster is what a cluster template renders (``testenv.examples.metalstack_cluster``):
the CAPI Cluster, its MetalStackCluster, a KubeadmControlPlane, a MachineDeployment and the
two MetalStackMachineTemplates. The demo acts as a user would, through the management API
server only (create, scale the MachineDeployment, delete the CAPI Cluster), then waits for
the effect on the live feed (``demo.metalview``) and reads the result where it lives
(``demo.metaloutcome``): metal-api, the workload cluster's Nodes, the MetalStackCluster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from demo import metaloutcome, metalsystem, story
from demo.feed import DemoTimeout
from demo.metalview import View
from demo.scene import Scene
from demo.style import BOLD, GREEN, heading, note, say
from shared.kube import KubeClient, KubeConfig
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    NAMESPACE,
    SECRET,
)
from testenv.examples import metalstack_cluster, metalstack_kind
from testenv.harness import LocalStack, kubectl_line

CLUSTER_NAMESPACE = "demo"
CLUSTER_NAME = "ms"
WORKERS = 2
SCALED = (4, 1)
UP_TIMEOUT = 180.0
DELETE_TIMEOUT = 120.0
#: everything the cluster brings into its namespace; after deletion, none may be left
OWNED_KINDS = (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE_DEPLOYMENT,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE,
    METALSTACK_FIREWALL,
    SECRET,
)


class MetalStack:
    def __init__(self) -> None:
        self.workload: Path | None = None
        self.url = ""

    def prepare(self, stack: LocalStack) -> None:
        """The workload cluster's API server: starting it blocks, so before the event loop."""
        self.workload = stack.workload()
        note(f"a second kube-apiserver plays the workload cluster: {self.workload}")

    def kubectl_args(self) -> tuple[str, ...]:
        return ("get", "metalstackmachines.infrastructure.cluster.x-k8s.io", "-A")

    def access_notes(self, bin_dir: Path) -> list[str]:
        assert self.workload is not None
        nodes = kubectl_line(bin_dir, self.workload, "get", "nodes")
        return [
            f"the workload cluster's Nodes: {nodes}",
            f"metal-api's state: curl {self.url}/_standin/state",
        ]

    async def play(self, scene: Scene) -> None:
        assert self.workload is not None
        heading("2. The metal-stack provider, watcher and writer; metal-api and CAPI stand-ins")
        self.url = await metalsystem.start(scene, self.workload)
        view = View(CLUSTER_NAMESPACE, CLUSTER_NAME)
        workload = KubeClient.from_config(KubeConfig.load(self.workload), qps=None)
        try:
            with scene.feed.observing(view):
                await self._steps(scene, view, workload)
        finally:
            await workload.aclose()

    async def _steps(self, scene: Scene, view: View, workload: KubeClient) -> None:
        key = f"{CLUSTER_NAMESPACE}/{CLUSTER_NAME}"
        heading(f"3. A CAPI cluster {key} on metal-stack: 1 control plane, {WORKERS} workers")
        await _create(scene)
        await _until_up(scene, view, 1 + WORKERS)

        heading("4. What the provider made: metal-api machines, workload Nodes, the network")
        found = await metaloutcome.until_allocated(scene, self.url, 2 + WORKERS)
        metaloutcome.show_machines(found)
        await metaloutcome.show_nodes(workload)
        await metaloutcome.show_cluster(scene, CLUSTER_NAMESPACE, CLUSTER_NAME, found)

        steps = " → ".join(str(n) for n in (WORKERS, *SCALED))
        heading(f"5. Scaling the workers: {steps}")
        before = WORKERS
        for workers in SCALED:
            await _scale(scene, view, self.url, before, workers)
            before = workers

        heading(f"6. Deleting CAPI Cluster {key}")
        await _delete(scene, view, self.url)


async def _create(scene: Scene) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CLUSTER_NAMESPACE}}
    await scene.kube.create(NAMESPACE, namespace)
    note(f"created Namespace {CLUSTER_NAMESPACE}")
    for manifest in metalstack_cluster(CLUSTER_NAMESPACE, CLUSTER_NAME, workers=WORKERS):
        await scene.kube.create(metalstack_kind(manifest), manifest)
        note(f"created {manifest['kind']} {CLUSTER_NAMESPACE}/{manifest['metadata']['name']}")


async def _until_up(scene: Scene, view: View, machines: int) -> None:
    what = f"{CLUSTER_NAMESPACE}/{CLUSTER_NAME} up with {machines} ready machines"
    await _until(scene, view, lambda: view.up(machines), what, UP_TIMEOUT)
    say(f"   ⇒ {what}, the firewall running", BOLD, GREEN)


async def _scale(scene: Scene, view: View, url: str, before: int, workers: int) -> None:
    name = f"{CLUSTER_NAME}-md-0"
    note(f"merge-patching MachineDeployment {CLUSTER_NAMESPACE}/{name}: {before} → {workers}")
    patch = {"spec": {"replicas": workers}}
    await scene.kube.patch_merge(MACHINE_DEPLOYMENT, CLUSTER_NAMESPACE, name, patch)
    await _until_up(scene, view, 1 + workers)
    found = await metaloutcome.until_allocated(scene, url, 2 + workers)
    say(f"   ⇒ metal-api: {metaloutcome.pool_line(found)}", BOLD, GREEN)


async def _delete(scene: Scene, view: View, url: str) -> None:
    note("DELETE the CAPI Cluster: Cluster API removes the Machines, then the MetalStackCluster;")
    note("the provider frees each machine, then the firewall, the API address and the network")
    await scene.kube.delete(CAPI_CLUSTER, CLUSTER_NAMESPACE, CLUSTER_NAME)
    what = f"{CLUSTER_NAMESPACE}/{CLUSTER_NAME} gone"
    await _until(scene, view, view.gone, what, DELETE_TIMEOUT)
    found = await story.until_nothing_left(scene, CLUSTER_NAMESPACE, OWNED_KINDS)
    story.show_leftovers(found, OWNED_KINDS)
    note("left on purpose: the namespace and the two MetalStackMachineTemplates (no Cluster owns")
    note("them here: the demo created them next to the Cluster)")
    metaloutcome.show_pool(await metaloutcome.until_allocated(scene, url, 0))


async def _until(
    scene: Scene, view: View, done: Callable[[], bool], what: str, seconds: float
) -> None:
    try:
        await scene.expect(lambda _: True if done() else None, what, seconds=seconds)
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; last: {view.summary()}; logs: {scene.logs()}") from None
