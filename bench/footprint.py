"""(f) footprint: the resident memory of the services, one process each and all in one.

What is measured, on a stack of its own with every CRD applied and no object to work on:

- **f1, imports**: for each service module, ``VmRSS`` of a fresh interpreter right after
  importing what ``python -m services.<name>`` imports (its ``__main__``), before it connects
  to anything. That is the floor a process of that service cannot go below.
- **f2, one process per service**: every service of the default all-in-one set (the watcher
  and every consuming service) started as ``python -m services.<name>`` with the settings a
  deployment gives them; once each serves (the watcher listed every kind, each consumer owns
  every partition) and ``SETTLE`` seconds passed, ``VmRSS`` of each and their sum.
- **f3, all in one**: the same services as one ``python -m services.allinone`` process, the
  same settings; ``VmRSS`` once it serves them all and ``SETTLE`` seconds passed.

- **f4, f5: idle CPU**: in the same two runs, once the memory is read, the CPU seconds each
  process uses over ``IDLE_WINDOW`` seconds with nothing to do (``/proc/<pid>/stat``), as
  cores on average: what the services cost a management cluster where nothing happens (the
  pull loops' long polls, lease renewals, membership heartbeats). The machine's other load
  is printed beside it: CPU time taken under contention reads higher.

**The shipped dependencies, not the development ones.** Every process here runs on an
interpreter of its own environment, ``uv sync --frozen --no-dev`` from the same lock (cached in
``~/.cache/capibus/bench-venv``), which is what the image installs. The development
environment has more installed, and some libraries import whatever is there: httpx imports its
command line (click, rich, pygments: about 4 MiB) when they are installed, which only the
linters bring.

Idle is the honest comparison: the work a Cluster brings (a handler's objects, a helm child)
is the same code in both modes, while what the modes differ in (interpreters, imported
modules, connections, the metrics endpoint) is all there before the first event.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.common import PARTITIONS, Clients
from bench.deployment import deployment_env, load_average, mib, vm_status, wait_for_count
from bench.lifecycle import Figure, Section, Verdict
from bench.procs import ROOT, Child, Children, CpuSnapshot
from services.allinone import COMPONENTS, PROCESS
from shared.resources import KINDS
from testenv.harness import LocalStack

#: seconds of idleness before reading, once everything serves
SETTLE = 10.0
#: seconds over which idle CPU is counted, after the memory is read
IDLE_WINDOW = 60.0
IDLE_TARGET = 0.005
PER_SERVICE_TARGET = 70 << 20
ALL_IN_ONE_TARGET = 160 << 20
#: what ``--all`` runs, in its order
DEFAULT = tuple(c.name for c in COMPONENTS if c.default)
#: every service module with an entry point (the optional ones too, and Ladybug's REST API)
MODULES = (*(c.name for c in COMPONENTS), "ladybug.api")

_IMPORTED_RSS = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")))
"""


def shipped_python() -> str:
    """The interpreter of an environment with the lock's runtime dependencies only."""
    venv = Path.home() / ".cache" / "capibus" / "bench-venv"
    print(f"[bench] runtime-only environment: {venv} (uv sync --no-dev)", file=sys.stderr)
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    subprocess.run([uv, "sync", "--frozen", "--no-dev", "--quiet"], cwd=ROOT, env=env, check=True)
    return str(venv / "bin" / "python")


def imported_rss(module: str, python: str) -> int:
    """``VmRSS`` of a fresh interpreter once ``module`` is imported, in bytes."""
    out = subprocess.run(
        [python, "-c", _IMPORTED_RSS, module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[-1]) * 1024


async def serving(child: Child, names: tuple[str, ...]) -> None:
    """Until ``child`` runs ``names``: every kind listed, every partition owned by each."""
    if "watcher" in names:
        await wait_for_count(child, "listed at", len(KINDS))
    consumers = len(names) - ("watcher" in names)
    await wait_for_count(child, "owns partition", PARTITIONS * consumers)


@dataclass(frozen=True)
class Idle:
    """What one process used, idle: memory now and at its peak, and cores over the window."""

    rss: int
    peak: int
    cores: float


async def idle(running: dict[str, Child]) -> tuple[dict[str, Idle], str]:
    """Each of ``running``'s memory after ``SETTLE`` s, then its CPU over ``IDLE_WINDOW`` s;
    with the machine's CPU line of the window."""
    await asyncio.sleep(SETTLE)
    memory = {
        n: (vm_status(c.proc.pid, "VmRSS"), vm_status(c.proc.pid, "VmHWM"))
        for n, c in running.items()
    }
    labels = {c.proc.pid: n for n, c in running.items()}
    before = CpuSnapshot.take(labels)
    await asyncio.sleep(IDLE_WINDOW)
    after = CpuSnapshot.take(labels)
    found = {
        n: Idle(*memory[n], after.seconds_of(c.proc.pid, before) / (after.wall - before.wall))
        for n, c in running.items()
    }
    return found, after.cpu_line(before)


async def per_service(
    children: Children, env: dict[str, str], python: str
) -> tuple[dict[str, Idle], str]:
    """Each default service run as its own process, idle."""
    running = {name: children.start(name, env, f"f-{name}", python) for name in DEFAULT}
    try:
        await asyncio.gather(*(serving(child, (name,)) for name, child in running.items()))
        return await idle(running)
    finally:
        for child in running.values():
            children.stop(child)


async def all_in_one(children: Children, env: dict[str, str], python: str) -> tuple[Idle, str]:
    """The default services run as one process, idle."""
    child = children.start("allinone", {**env, "CAPIBUS_SERVICES": "all"}, f"f-{PROCESS}", python)
    try:
        await serving(child, DEFAULT)
        found, line = await idle({PROCESS: child})
        return found[PROCESS], line
    finally:
        children.stop(child)


def _sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name} {mib(size)}" for name, size in sizes.items())


def _verdict(over: bool) -> Verdict:
    return "MISSED" if over else "pass"


async def measure(clients: Clients, stack: LocalStack, children: Children, helm: Path) -> Section:
    del clients  # nothing to create: the figures are of idle processes
    env = {**stack.env(), **deployment_env(helm, oidc=False)}
    python = shipped_python()
    imports = {m: imported_rss(f"services.{m}.__main__", python) for m in MODULES}
    separate, separate_cpu = await per_service(children, env, python)
    one, one_cpu = await all_in_one(children, env, python)
    together, together_peak = one.rss, one.peak
    rss = {name: found.rss for name, found in separate.items()}
    total = sum(rss.values())
    cores = sum(found.cores for found in separate.values())
    figures = [
        Figure(
            "f1",
            "RSS after imports, per service module (VmRSS, before connecting)",
            _sizes(imports),
            "≤ 70 MiB each",
            _verdict(max(imports.values()) > PER_SERVICE_TARGET),
        ),
        Figure(
            "f2",
            f"RSS per service, one process each, idle ({len(rss)} processes)",
            f"{_sizes(rss)}; sum {mib(total)}",
            "≤ 70 MiB each",
            _verdict(max(rss.values()) > PER_SERVICE_TARGET),
        ),
        Figure(
            "f3",
            f"RSS of the same {len(rss)} services in one process (`services run --all`), idle",
            f"{mib(together)} (peak {mib(together_peak)}); {together / total:.2f} of f2's sum",
            "≤ 160 MiB",
            _verdict(together > ALL_IN_ONE_TARGET),
        ),
        Figure(
            "f4",
            f"idle CPU of the {len(rss)} processes, no object ({IDLE_WINDOW:.0f} s), cores",
            f"{cores:.4f} in all: "
            + ", ".join(f"{n} {found.cores:.4f}" for n, found in separate.items()),
            f"≤ {IDLE_TARGET} in all",
            _verdict(cores > IDLE_TARGET),
        ),
        Figure(
            "f5",
            f"idle CPU of the same services in one process, no object ({IDLE_WINDOW:.0f} s)",
            f"{one.cores:.4f} cores",
            f"≤ {IDLE_TARGET}",
            _verdict(one.cores > IDLE_TARGET),
        ),
    ]
    peaks = {name: found.peak for name, found in separate.items()}
    return Section(
        "f",
        "footprint",
        __doc__.split("\n\n", 1)[1].strip(),
        figures,
        [
            f"per-service peaks (VmHWM): {_sizes(peaks)}",
            f"services: {json.dumps(list(DEFAULT))}; settled {SETTLE:.0f} s before reading",
            f"f4 window: {separate_cpu}",
            f"f5 window: {one_cpu}",
            f"load average at the end: {load_average()}",
        ],
    )
