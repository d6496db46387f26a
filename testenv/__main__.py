"""Command line for the local stack.

``python -m testenv up [--workdir DIR] [--tls]`` starts the stack, prints shell ``export`` lines on
stdout (progress goes to stderr, so ``eval "$(...)"``-style capture stays clean) and keeps it
running until Ctrl-C or SIGTERM, then tears it down. A ``# kubectl:`` comment line shows how to
reach it with the pinned kubectl (it applies no CRDs: the demo and the tests apply their own).
Without ``--workdir`` a temporary directory is used and removed afterwards; with one, logs and
data stay for inspection. ``--tls`` serves NATS and Redis over TLS only (``tls://``,
``rediss://``) with a CA made for the run; the exports then name it for the services
(``CAPIBUS_TLS__*``).
``up`` always starts its own programs, even when ``KUBECONFIG``/``NATS_URL``/``REDIS_URL`` are
set, because its purpose is to provide them.

``python -m testenv build`` only builds (or reuses) the binaries and prints their directory.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from testenv.harness import LocalStack, ensure_binaries, kubectl_line


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        print(ensure_binaries())
        return 0
    return _up(args.workdir, args.etcd_compaction_interval, tls=args.tls)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testenv", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build or reuse the pinned binaries")
    up = commands.add_parser("up", help="run the stack until Ctrl-C")
    up.add_argument("--workdir", type=Path, help="keep logs and data here (default: temporary)")
    up.add_argument("--etcd-compaction-interval", default="5m", help="default: %(default)s")
    up.add_argument("--tls", action="store_true", help="NATS and Redis over TLS only")
    return parser


def _up(workdir: Path | None, compaction: str, *, tls: bool = False) -> int:
    temporary = workdir is None
    root = Path(tempfile.mkdtemp(prefix="capibus-stack-")) if workdir is None else workdir
    # SIGTERM (e.g. from a demo script's cleanup) must tear down as cleanly as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        bin_dir = ensure_binaries()
        with LocalStack(
            root,
            etcd_compaction_interval=compaction,
            bin_dir=bin_dir,
            use_env_stack=False,
            tls=tls,
        ) as stack:
            for name, value in stack.env().items():
                print(f"export {name}={shlex.quote(value)}")
            # A comment: eval of the captured output still only sets the variables.
            kubectl = kubectl_line(bin_dir, stack.endpoints.kubeconfig, "get", "namespaces")
            print(f"# kubectl: {kubectl}")
            # NATS_URL and REDIS_URL log in as the operator; a service as itself (these files).
            print(f"# bus users' passwords: {stack.credentials_dir}/<user>/")
            print(f"# stack running in {root}; Ctrl-C to stop", flush=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        print("stack stopped", file=sys.stderr)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
