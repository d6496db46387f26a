"""The capibus services and the stand-ins as real subprocesses, each in its own process group.

Own process groups (``start_new_session``) mean a Ctrl-C in the terminal reaches only the demo,
which then stops the services deliberately (SIGTERM, SIGKILL after ``STOP_TIMEOUT``) before the
stack they depend on; ``killpg`` also reaches anything a service may have forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT = 10.0
LOG_TAIL_LINES = 30


class ServiceFailed(Exception):
    """A service exited while the demo still needed it."""


class Service:
    """One ``python -m <module> [args]`` (``services.<name>`` by default), logging to
    ``<name>.log``."""

    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        workdir: Path,
        *,
        module: str = "",
        args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.module = module or f"services.{name}"
        self.args = tuple(args)
        self.env = dict(env)
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def wait_for_log(self, needle: str) -> None:
        """Until ``needle`` appears in the log (polling a file: there is nothing to await).

        Unbounded but for the service exiting; callers bound it with ``demo.feed.within``.
        """
        while needle not in self.log():
            self.check()
            await asyncio.sleep(0.1)

    def check(self) -> None:
        """Raise ``ServiceFailed`` with the log's tail if the process has exited."""
        if self.proc is None or self.proc.poll() is not None:
            raise ServiceFailed(self.failure("exited"))

    def signal(self, sig: signal.Signals) -> None:
        # Signal the group while the leader is unreaped: after wait() its pid may be reused.
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait(self, deadline: float) -> bool:
        """True when the service exited before ``deadline`` (a ``time.monotonic`` value)."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def group_alive(self) -> bool:
        """Whether anything of this service's process group is still running."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            # PermissionError: the id now names another user's group, so nothing of ours.
            return False
        return True

    def failure(self, what: str, lines: int = LOG_TAIL_LINES) -> str:
        tail = "\n".join(self.log().splitlines()[-lines:])
        return f"{self.name} {what}; last lines of {self.log_path}:\n{tail}"


class Services:
    """Every service the demo started, so cleanup can find them whatever went wrong."""

    def __init__(self) -> None:
        self.started: list[Service] = []

    def start(self, service: Service) -> Service:
        self.started.append(service)  # before start(): an interrupt in between is still cleaned
        service.start()
        return service

    def stop_all(self) -> list[str]:
        """SIGTERM all at once, SIGKILL whoever outlives ``STOP_TIMEOUT``; returns the killed."""
        for service in self.started:
            service.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        killed = []
        for service in self.started:
            if not service.wait(deadline):
                service.signal(signal.SIGKILL)
                service.wait(time.monotonic() + STOP_TIMEOUT)
                killed.append(service.name)
        return killed

    def check(self) -> None:
        """Raise ``ServiceFailed`` for the first started service that has exited."""
        for service in self.started:
            service.check()

    def survivors(self) -> list[str]:
        return [s.name for s in self.started if s.group_alive()]


def leftovers(workdir: Path) -> list[str]:
    """``ps`` lines of processes still naming ``workdir``: the stack's programs all do."""
    try:
        listing = subprocess.run(
            ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []  # no ps here: nothing to check with, not evidence of leftovers
    rows = [line.split(maxsplit=2) for line in listing.splitlines()]
    processes = {row[0]: (row[1], row[2] if len(row) > 2 else "") for row in rows}
    # Our own command line and our callers' (uv, make, a shell) may name it too: --workdir.
    ours, pid = set(), str(os.getpid())
    while pid in processes and pid not in ours:
        ours.add(pid)
        pid = processes[pid][0]
    return [
        f"{pid} {args}"
        for pid, (_, args) in processes.items()
        if str(workdir) in args and pid not in ours
    ]
