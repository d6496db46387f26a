"""The demo's asynchronous part, on a started stack: CRDs, feed, services, story, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections import Counter
from pathlib import Path

from demo import story
from demo.feed import Feed, within
from demo.processes import Service, Services
from demo.story import PARTITIONS, Scene
from demo.style import BOLD, heading, note, say, subheading
from shared.bus import Bus
from shared.kube import KubeClient, KubeConfig
from shared.messages import Message, ResourcesListed
from shared.resources import KINDS
from testenv.crds import apply_crds
from testenv.harness import LocalStack

LEASE_TTL_SECONDS = 3
READY_TIMEOUT = 30.0


async def run(stack: LocalStack, services: Services, workdir: Path, *, keep_running: bool) -> None:
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
        scene = Scene(kube=kube, bus=bus, feed=Feed())
        cleanup.push_async_callback(scene.feed.stop)
        await _play(scene, stack, services, workdir)
        if keep_running:
            _print_access(stack, services, workdir)
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM cancels us
        _summary(scene.feed.seen)


async def _play(scene: Scene, stack: LocalStack, services: Services, workdir: Path) -> None:
    heading("1. CustomResourceDefinitions (server-side apply)")
    count = len(await apply_crds(scene.kube, field_manager=story.FIELD_MANAGER))
    note(f"{count} CRDs from deploy/crds and standins/crds are Established")
    # Declared here too so the feed and the story never depend on which service starts first.
    await scene.bus.ensure_streams()
    await scene.feed.start(scene.bus)

    heading("2. The services: watcher and writer, as real processes")
    await _start_services(scene, stack, services, workdir)

    heading("3. Example objects from demo/manifests")
    ref = await story.apply_manifests(scene)
    await story.show_status(scene.kube, ref)

    heading("4. A status story for the Cluster")
    note("status comes from services of a later stage; the demo publishes their messages")
    for number, step in enumerate(story.STEPS, start=1):
        subheading(f"4.{number} {step.title}")
        await story.play_step(scene, ref, step)

    heading("5. A malformed message on the Cluster's status subject")
    await story.send_bad_message(scene, ref)

    heading(f"6. Deleting Cluster {ref.key}")
    await story.delete_cluster(scene, ref)


async def _start_services(
    scene: Scene, stack: LocalStack, services: Services, workdir: Path
) -> None:
    env = _service_env(stack)
    watcher = services.start(Service("watcher", {**env, "CAPIBUS_REPLICA": "watcher-1"}, workdir))
    writer = services.start(Service("writer", {**env, "CAPIBUS_REPLICA": "writer-1"}, workdir))
    # A lone writer claims every partition, in ascending order: the last one means all.
    last = PARTITIONS - 1
    logs = f"; see {watcher.log_path} and {writer.log_path}"
    async with within(READY_TIMEOUT, "the services becoming ready", hint=logs):
        await asyncio.gather(
            watcher.wait_for_log("listed at"), writer.wait_for_log(f"owns partition {last} (")
        )
        # "listed at" is logged per kind; the feed tells exactly when every kind is listed.
        await scene.feed.wait_until(lambda seen: _all_listed(seen) or None)
    note(f"watcher (pid {watcher.pid}) listed all {len(KINDS)} kinds and is watching them")
    note(f"writer (pid {writer.pid}) owns all {PARTITIONS} partitions of the status stream")
    if "previous owner unknown" in writer.log():
        note(
            f"on a fresh Redis the writer waits one lease TTL ({LEASE_TTL_SECONDS}s) before "
            "consuming: it cannot prove no earlier owner is still at work"
        )


def _service_env(stack: LocalStack) -> dict[str, str]:
    # The caller's CAPIBUS_* settings are dropped so the demo behaves the same in any shell;
    # the partition count is pinned because the demo addresses status subjects by partition.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CAPIBUS_")}
    return {
        **inherited,
        **stack.env(),
        "CAPIBUS_LEASE_TTL": str(LEASE_TTL_SECONDS),
        "CAPIBUS_PARTITIONS": str(PARTITIONS),
        "PYTHONUNBUFFERED": "1",
    }


def _all_listed(seen: list[Message]) -> bool:
    listed = {(m.api_version, m.kind) for m in seen if isinstance(m, ResourcesListed)}
    return listed >= {(k.api_version, k.kind) for k in KINDS.values()}


def _print_access(stack: LocalStack, services: Services, workdir: Path) -> None:
    heading("The stack keeps running: Ctrl-C to stop everything")
    for name, value in stack.env().items():
        say(f"export {name}={shlex.quote(value)}", BOLD)
    note("then e.g.: kubectl apply --server-side -f demo/manifests/  (if kubectl is installed)")
    note("           nats sub 'capibus.>'                            (if the nats CLI is)")
    logs = " ".join(str(s.log_path) for s in services.started)
    note(f"service logs: {logs}")
    note(f"stack logs:   {workdir}/*.log")
    note("the live feed continues below")


def _summary(seen: list[Message]) -> None:
    heading("Done")
    counts = Counter(type(m).__name__ for m in seen)
    note(", ".join(f"{n} {name}" for name, n in counts.most_common()))
