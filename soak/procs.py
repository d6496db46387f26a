"""The soak's processes: service replicas, the stand-ins and the registrar.

Each runs in its own session (process group), so a signal reaches whatever it forked: a
SIGKILL of the helm service takes its helm processes with it, exactly the crash
``shared.helm`` recovers from, and a SIGSTOP freezes them too. A process keeps its
command, environment and log across restarts (the log is appended to), so a replica that is
killed and started again is the same member (``CAPIBUS_REPLICA``) coming back, as a pod
restarted by its controller is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT = 15.0


class SoakError(Exception):
    """The soak could not set up or control the system it runs (not a finding about it)."""


@dataclass
class Proc:
    """One long-running child: ``python -m <module>`` with its own environment and log."""

    label: str
    module: str
    env: dict[str, str]
    log_path: Path
    args: tuple[str, ...] = ()
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0

    def start(self) -> Proc:
        if self.alive():
            raise SoakError(f"{self.label} is already running")
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=ROOT,
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL to the group: no cleanup, no acknowledgement, no lease released."""
        if self.alive():
            self._signal(signal.SIGKILL)
            self._wait()

    def freeze(self) -> None:
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (thawed first, or it could not act on it), SIGKILL if it lingers."""
        if not self.alive():
            return
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)
        try:
            self._wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def _wait(self, timeout: float | None = None) -> None:
        if self.popen is not None:
            self.popen.wait(timeout)
