"""Child processes of the benchmark: the capibus services under test, and CPU accounting.

Every service runs as ``python -m services.<name>`` in its own session (process group), so
stopping it reaches anything it forked. ``Children.stop_all`` is called from the benchmark's
``finally`` and from ``atexit``: a crash or Ctrl-C leaves no service behind (the stack
programs are stopped by ``LocalStack`` itself).

CPU accounting reads ``/proc/<pid>/stat`` (user + system ticks) of this process and of all its
direct children (the stack programs and the services), before and after a measurement. The
difference, divided by the wall time, is how many cores each program used: a program near
100% of one core is the bottleneck of a single-threaded pipeline.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT = 15.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    """One running service process and where its output goes."""

    label: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


@dataclass
class Children:
    """The services this benchmark started; all of them are stopped by ``stop_all``."""

    log_dir: Path
    running: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        atexit.register(self.stop_all)

    def start(
        self, service: str, env: dict[str, str], label: str, python: str = sys.executable
    ) -> Child:
        log_path = self.log_dir / f"{label}.log"
        # No /metrics endpoint unless asked for: services share this host's ports.
        full_env = {
            **os.environ,
            "CAPIBUS_METRICS_PORT": "0",
            **env,
            "PYTHONUNBUFFERED": "1",
            "CAPIBUS_REPLICA": label,
        }
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [python, "-m", f"services.{service}"],
                cwd=ROOT,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(label=label, proc=proc, log_path=log_path)
        self.running.append(child)
        return child

    def stop(self, child: Child) -> None:
        """SIGTERM to the process group (a graceful stop), SIGKILL if it lingers."""
        if child in self.running:
            self.running.remove(child)
        if child.proc.poll() is not None:
            return
        _signal_group(child.proc.pid, signal.SIGTERM)
        _signal_group(child.proc.pid, signal.SIGCONT)  # in case it was frozen with SIGSTOP
        try:
            child.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _signal_group(child.proc.pid, signal.SIGKILL)
            child.proc.wait()

    def stop_all(self) -> None:
        for child in list(self.running):
            self.stop(child)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def wait_for_log(child: Child, text: str, *, within: float = 60.0) -> None:
    """Until ``text`` appears in the child's log; fails early if the child died."""
    deadline = time.monotonic() + within
    while text not in child.log():
        if not child.alive():
            raise RuntimeError(f"{child.label} exited; log tail:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.label}: no {text!r} after {within}s:\n{child.log_tail()}")
        await asyncio.sleep(0.05)


# -- CPU accounting -------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    # Fields after the name, 0-based: 1 = ppid, 11 = utime, 12 = stime (clock ticks).
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _machine_busy() -> float:
    """CPU seconds all processors spent busy since boot (``/proc/stat``, not idle/iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds used so far by this process, each direct child and the whole machine."""

    wall: float
    machine: float
    seconds: dict[int, tuple[str, float]]

    @classmethod
    def take(cls, labels: dict[int, str] | None = None) -> CpuSnapshot:
        me = os.getpid()
        labels = {me: "bench process", **(labels or {})}
        seconds: dict[int, tuple[str, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            stat = _stat(int(entry.name))
            if stat and (stat[1] == me or int(entry.name) == me):
                pid = int(entry.name)
                seconds[pid] = (labels.get(pid, stat[0]), stat[2])
        return cls(wall=time.monotonic(), machine=_machine_busy(), seconds=seconds)

    def usage_since(self, before: CpuSnapshot) -> list[tuple[str, float]]:
        """(program, cores busy on average) since ``before``, busiest first.

        "other processes" is the machine's busy time not spent by the benchmark or its
        children: other tenants of the machine, which make a measurement noisy.
        """
        wall = max(self.wall - before.wall, 1e-9)
        usage = []
        for pid, (name, used) in self.seconds.items():
            earlier = before.seconds.get(pid, (name, 0.0))[1]
            usage.append((name, (used - earlier) / wall))
        ours = sum(u for _, u in usage)
        usage.append(("other processes", max(0.0, (self.machine - before.machine) / wall - ours)))
        return sorted((u for u in usage if u[1] >= 0.005), key=lambda u: -u[1])

    def cpu_line(self, before: CpuSnapshot) -> str:
        usage = ", ".join(f"{name} {cores:.2f}" for name, cores in self.usage_since(before))
        return f"CPU, cores busy on average: {usage}"

    def seconds_of(self, pid: int, before: CpuSnapshot) -> float:
        """CPU seconds ``pid`` used since ``before``."""
        return self.seconds.get(pid, ("", 0.0))[1] - before.seconds.get(pid, ("", 0.0))[1]


def labels_for(*children: Child) -> dict[int, str]:
    return {c.proc.pid: f"{c.label} (capibus service)" for c in children}
