"""``python -m demo``: watch capibus's foundation work on a real local stack, live.

Usage::

    uv run python -m demo [--keep-running] [--workdir DIR]     # or: make demo

What happens, in well under a minute once the binaries are built (a cold build of the pinned
etcd, kube-apiserver, kube-controller-manager and nats-server shows its own progress first):

0. **Stack.** etcd, kube-apiserver, kube-controller-manager, nats-server (JetStream) and
   redis-server start on loopback (``testenv.harness.LocalStack``); nothing is faked.
1. **CRDs.** ``deploy/crds`` (capibus's own kinds) and ``standins/crds`` (the peer kinds the
   services watch) are server-side applied and waited on until Established.
2. **Services.** ``python -m services.watcher`` and ``python -m services.writer`` run as real
   subprocesses, each in its own process group, logging to ``<workdir>/<service>.log``.
3. **Objects.** The manifests in ``demo/manifests`` are applied: namespace ``demo``, the
   ClusterTemplate ``kube-1-34``, a cloud-credentials Secret and the Cluster ``demo/demo``.
4. **Status story.** The services that compute cluster status come in a later stage, so the
   demo publishes their ``PatchClusterStatus`` messages itself: Pending, Reconciling,
   networking and control plane progress, then a burst of five (nodes appear, phase Ready)
   that the writer coalesces into fewer writes. After each step the Cluster's status is read
   back from the API server.
5. **A bad message.** A malformed body on the Cluster's status subject ends up in the
   dead-letter stream, with its reason, while the writer carries on.
6. **Deletion.** The Cluster is deleted and the watcher's DELETED event appears.

Throughout, every message on ``capibus.>`` is printed as it flows, one line each::

    time  category  type  event  object  resourceVersion/update ids  correlation id

where the category is the stream it belongs to: EVENT (watcher), STATUS (status patches),
JOURNAL (what services did), DEADLETTER (what they gave up on). Colour is off when stdout is
not a terminal or ``NO_COLOR`` is set.

``--keep-running`` leaves everything up after the story, prints the ``export KUBECONFIG=...``
lines to reach the stack, and keeps the feed running until Ctrl-C. ``--workdir`` keeps logs
and data in DIR; without it a temporary directory is used and removed afterwards, unless the
demo failed, in which case it is kept for the logs.

Ctrl-C (or SIGTERM) at any point stops the services (SIGTERM, SIGKILL after 10 s), then the
stack, and checks that no process is left behind; a second Ctrl-C during that cleanup is
ignored, since cutting it short is exactly what would leave orphans.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from demo import session
from demo.feed import DemoTimeout
from demo.processes import STOP_TIMEOUT, ServiceFailed, Services, leftovers
from demo.style import BOLD, GREEN, RED, heading, note, say
from shared.errors import CapibusError
from testenv.harness import LocalStack, StackError, ensure_binaries

EXPECTED_FAILURES = (StackError, ServiceFailed, DemoTimeout, CapibusError)


@dataclass
class Demo:
    """Everything the demo started, so one cleanup can stop it whatever happened."""

    workdir: Path
    keep_running: bool
    services: Services = field(default_factory=Services)
    stack: LocalStack | None = None

    def run(self) -> None:
        heading("0. Binaries and the local stack")
        bin_dir = ensure_binaries()
        self.stack = LocalStack(self.workdir, bin_dir=bin_dir, use_env_stack=False)
        self.stack.start()
        note(f"etcd, kube-apiserver, kube-controller-manager, nats, redis up in {self.workdir}")
        try:
            asyncio.run(
                session.run(self.stack, self.services, self.workdir, keep_running=self.keep_running)
            )
        finally:
            # Closing the event loop reset SIGTERM to the default (die on the spot).
            signal.signal(signal.SIGTERM, _interrupt)

    def cleanup(self) -> bool:
        """Stop services, then the stack; True when nothing of ours is left running."""
        with _signals_ignored():
            heading("Shutting down")
            killed = self.services.stop_all()
            for name in killed:
                say(f"   {name} ignored SIGTERM for {STOP_TIMEOUT:.0f}s and was killed", RED)
            note(f"services stopped: {', '.join(s.name for s in self.services.started) or '-'}")
            if self.stack is not None:
                self.stack.stop()
                note("stack stopped")
            left = self.services.survivors() + leftovers(self.workdir)
            for line in left:
                say(f"   still running: {line}", RED)
            if not left:
                note("no processes left behind (checked process groups and ps)")
            return not left


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="capibus-demo-")) if temporary else args.workdir
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    demo = Demo(workdir=workdir, keep_running=args.keep_running)
    status = 1
    try:
        demo.run()
        status = 0
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("\ninterrupted", BOLD)
        # With --keep-running, Ctrl-C is the expected way to finish.
        status = 0 if args.keep_running else 130
    except EXPECTED_FAILURES as exc:
        say(f"\ndemo failed: {type(exc).__name__}: {exc}", RED, BOLD)
    except Exception:
        traceback.print_exc()  # a bug in the demo or a service: the whole trace helps
    finally:
        clean = demo.cleanup()
    return _finish(status if clean else 1, workdir, temporary)


def _finish(status: int, workdir: Path, temporary: bool) -> int:
    if status in (0, 130) and temporary:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        note(f"logs and data kept in {workdir}")
    ok = status == 0
    say("demo finished" if ok else f"demo ended with status {status}", GREEN if ok else RED, BOLD)
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="Watch capibus's foundation work on a real local stack, live.",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="after the story, keep the stack, services and feed up until Ctrl-C",
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep logs and data here (default: a temporary directory)"
    )
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """Cleanup must finish: an interrupted cleanup is what leaves orphans behind."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
