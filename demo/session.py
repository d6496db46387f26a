"""The demo's asynchronous part, on a started stack: the story's steps in order, then waiting."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
from collections import Counter
from pathlib import Path

from demo import cluster, outcome, portal, story, system
from demo.feed import Feed
from demo.processes import Services
from demo.scene import Scene
from demo.style import BOLD, heading, note, say
from shared.bus import Bus
from shared.kube import KubeClient, KubeConfig
from shared.messages import Message
from testenv.crds import apply_crds
from testenv.harness import LocalStack, kubectl_line


async def run(
    stack: LocalStack, services: Services, workdir: Path, bin_dir: Path, *, keep_running: bool
) -> None:
    """Play the story; with ``keep_running``, then follow the bus until cancelled."""
    main = asyncio.current_task()
    assert main is not None
    # SIGTERM ends the demo like Ctrl-C does: cancel, unwind, let ``__main__`` clean up.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    async with contextlib.AsyncExitStack() as cleanup:
        kube = KubeClient.from_config(KubeConfig.load(stack.endpoints.kubeconfig), qps=None)
        cleanup.push_async_callback(kube.aclose)
        bus = await Bus.connect(stack.endpoints.nats_url, name="capibus-demo")
        cleanup.push_async_callback(bus.close)
        env = {**system.inherited_env(), **stack.env()}
        scene = Scene(kube, bus, Feed(), services, workdir, bin_dir, env)
        cleanup.push_async_callback(scene.feed.stop)
        await _play(scene)
        if keep_running:
            _print_access(stack, services, workdir, bin_dir)
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM cancels us
        _summary(scene.feed.seen)


async def _play(scene: Scene) -> None:
    heading("1. CustomResourceDefinitions (server-side apply)")
    count = len(await apply_crds(scene.kube, field_manager=portal.FIELD_MANAGER))
    note(f"{count} CRDs from deploy/crds and standins/crds are Established")
    # Declared here too so the feed never depends on which service starts first.
    await scene.bus.ensure_streams()
    await scene.feed.start(scene.bus)

    heading("2. Seven services and the stand-ins, as real processes")
    await system.start(scene)

    heading("3. The portal creates a tenancy's objects (demo/manifests)")
    ref = await portal.create_objects(scene.kube, scene.feed)
    await cluster.show(scene, ref)

    heading(f"4. Cluster {ref.key} converges: identity, lease, Zenith, Helm, machines")
    await cluster.until_converged(scene, ref)
    await cluster.show(scene, ref)

    heading("5. What the services made")
    await outcome.show_outcome(scene, ref)

    heading("6. A spec change: one more worker in md-0")
    await story.scale(scene, ref)

    heading("7. A malformed message on the Cluster's status subject")
    await story.send_bad_message(scene, ref)

    heading(f"8. The portal deletes Cluster {ref.key}")
    await story.delete(scene, ref)


def kubectl_example(stack: LocalStack, bin_dir: Path) -> str:
    """How to list the demo's Clusters with the pinned kubectl.

    The full resource name: plain ``clusters`` may resolve to the stand-ins' Cluster API kind.
    """
    args = ("get", "clusters.azimuth.stackhpc.com", "-A")
    return kubectl_line(bin_dir, stack.endpoints.kubeconfig, *args)


def _print_access(stack: LocalStack, services: Services, workdir: Path, bin_dir: Path) -> None:
    heading("The stack keeps running: Ctrl-C to stop everything")
    for name, value in stack.env().items():
        say(f"export {name}={shlex.quote(value)}", BOLD)
    note(f"then e.g.: {kubectl_example(stack, bin_dir)}")
    note("           nats sub 'capibus.>'  (if the nats CLI is installed)")
    note("a new Cluster needs no Lease: drop leaseName from demo/manifests/40-cluster.yaml")
    logs = " ".join(s.log_path.name for s in services.started)
    note(f"logs in {workdir}: {logs}, and the stack's")
    note("the live feed continues below")


def _summary(seen: list[Message]) -> None:
    heading("Done")
    counts = Counter(type(m).__name__ for m in seen)
    note(", ".join(f"{n} {name}" for name, n in counts.most_common()))
