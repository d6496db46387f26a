"""The demo's asynchronous part, on a started stack: the CRDs, the chosen story, then waiting.

What every scene shares lives here: the clients, the live feed, the CRD step (both stories
start from the same CRDs, capibus's own and the peers'), ``--keep-running`` and the closing
count. A scene (``demo.azimuth``, ``demo.metalstack``) is a ``Story``: what it needs before
the event loop starts, its steps, and how a reader reaches what it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
from collections import Counter
from pathlib import Path
from typing import Protocol

from demo import portal, system
from demo.feed import Feed
from demo.processes import Services
from demo.scene import Scene
from demo.style import BOLD, heading, note, say
from shared.bus import Bus
from shared.kube import KubeClient, KubeConfig
from shared.messages import Message
from testenv.crds import apply_crds
from testenv.harness import LocalStack, kubectl_line


class Story(Protocol):
    """One scene: its steps after the CRDs, numbered from 2."""

    def prepare(self, stack: LocalStack) -> None:
        """Blocking set-up on the started stack, before the event loop runs."""

    def kubectl_args(self) -> tuple[str, ...]:
        """What to show with the pinned kubectl while the story plays."""

    def access_notes(self, bin_dir: Path) -> list[str]:
        """Lines for ``--keep-running``: how to reach what this story made."""

    async def play(self, scene: Scene) -> None: ...


async def run(
    stack: LocalStack,
    services: Services,
    workdir: Path,
    bin_dir: Path,
    story: Story,
    *,
    keep_running: bool,
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
        await _crds(scene)
        await story.play(scene)
        if keep_running:
            _print_access(stack, services, workdir, bin_dir, story)
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM cancels us
        _summary(scene.feed.seen)


async def _crds(scene: Scene) -> None:
    heading("1. CustomResourceDefinitions (server-side apply)")
    count = len(await apply_crds(scene.kube, field_manager=portal.FIELD_MANAGER))
    note(f"{count} CRDs from deploy/crds and standins/crds are Established")
    # Declared here too so the feed never depends on which service starts first.
    await scene.bus.ensure_streams()
    await scene.feed.start(scene.bus)


def kubectl_example(stack: LocalStack, bin_dir: Path, story: Story) -> str:
    """How to list the story's objects with the pinned kubectl."""
    return kubectl_line(bin_dir, stack.endpoints.kubeconfig, *story.kubectl_args())


def _print_access(
    stack: LocalStack, services: Services, workdir: Path, bin_dir: Path, story: Story
) -> None:
    heading("The stack keeps running: Ctrl-C to stop everything")
    for name, value in stack.env().items():
        say(f"export {name}={shlex.quote(value)}", BOLD)
    note(f"then e.g.: {kubectl_example(stack, bin_dir, story)}")
    note("           nats sub 'capibus.>'  (if the nats CLI is installed)")
    for line in story.access_notes(bin_dir):
        note(line)
    logs = " ".join(s.log_path.name for s in services.started)
    note(f"logs in {workdir}: {logs}, and the stack's")
    note("the live feed continues below")


def _summary(seen: list[Message]) -> None:
    heading("Done")
    counts = Counter(type(m).__name__ for m in seen)
    note(", ".join(f"{n} {name}" for name, n in counts.most_common()))
