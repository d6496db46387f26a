"""One soak from start to verdict: plan, world, episodes, the final window, the checks.

The episodes run strictly one after another (``soak.plan`` says why): issue the episode's
steps, wait the fault's lead, inject it, then poll until the system is quiet and every
Cluster is at its expected state, and time that. An episode that does not get there within
``EPISODE_TIMEOUT`` is recorded as not recovered; whatever still stood in the way (a
Cluster, a consumer) is left out of later waits, so one stuck Cluster costs one timeout and
not one per remaining fault, while the final checks still judge it.

Before a Cluster is deleted, its Helm revisions and Zenith subdomain are recorded: the
checks compare them with the changes made, and neither survives the delete.

The working directory (every program's log, the registrar's registry) is removed after a
passing run and kept after a failing one, or always with ``--keep``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from soak import inject, observe, portal
from soak.checks import Facts, Intent, all_verdicts
from soak.observe import Observer
from soak.plan import Episode, Plan, Step
from soak.procs import ROOT
from soak.report import EpisodeResult, RunSummary, recovered_verdict, render
from soak.world import TEMPLATES, World
from testenv.harness import LocalStack, ensure_binaries

RESULTS = ROOT / "soak" / "RESULTS.md"
EPISODE_TIMEOUT = 300.0
FINAL_TIMEOUT = 600.0
POLL_SECONDS = 2.0
CONFIRM_SECONDS = 1.0
PAUSE_SECONDS = 2.0
#: while waiting, say what is still in the way this often
PROGRESS_SECONDS = 20.0


def say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[soak {stamp}] {text}", file=sys.stderr, flush=True)


class Soak:
    def __init__(self, plan: Plan, world: World) -> None:
        self.plan = plan
        self.world = world
        self.intents = {name: Intent(name) for name in plan.clusters}
        self.recorded = Facts()
        self.observer: Observer | None = None
        self.quarantined: set[str] = set()

    async def run(self) -> RunSummary:
        started, clock = datetime.now(UTC), time.monotonic()
        say(f"starting the world in {self.world.workdir}")
        await self.world.start()
        self.observer = Observer(self.world.k, self.world.b, dict(TEMPLATES))
        episodes = []
        for episode in self.plan.episodes:
            episodes.append(await self.episode(episode))
        for index, steps in enumerate(self.plan.tail):
            say(f"tail round {index}: {_steps(steps)}")
            await self.issue(steps)
            await self.converge(EPISODE_TIMEOUT)
        say("final convergence window")
        final, _ = await self.converge(FINAL_TIMEOUT)
        facts = await observe.gather(
            self.world.k,
            self.world.b,
            self.world.registrar_url,
            list(self.intents.values()),
            self.recorded,
        )
        verdicts = [recovered_verdict(episodes), *all_verdicts(list(self.intents.values()), facts)]
        return RunSummary(
            plan=self.plan,
            started=started.strftime("%Y-%m-%d %H:%M"),
            minutes=(time.monotonic() - clock) / 60,
            load=", ".join(f"{x:.1f}" for x in os.getloadavg()),
            episodes=episodes,
            verdicts=verdicts,
            final_convergence=final,
            quarantined=sorted(self.quarantined),
            workdir=str(self.world.workdir),
        )

    async def episode(self, episode: Episode) -> EpisodeResult:
        fault = episode.fault
        await self.issue(episode.steps)
        await asyncio.sleep(fault.lead)
        at = datetime.now(UTC).strftime("%H:%M:%S")
        say(f"fault {episode.index}: {fault.kind} {fault.target} ({_steps(episode.steps)})")
        outcome = await inject.inject(self.world, fault, self.live)
        recovery, problems = await self.converge(EPISODE_TIMEOUT)
        note = "; ".join(part for part in (outcome.note, outcome.after()) if part)
        shown = (
            f"{recovery:.1f}s"
            if recovery is not None
            else "not recovered: " + "; ".join(problems[:3])
        )
        say(f"fault {episode.index}: {note}; recovery {shown}")
        await asyncio.sleep(PAUSE_SECONDS)
        return EpisodeResult(episode.index, fault, episode.steps, at, note, recovery, problems)

    def live(self) -> list[str]:
        return sorted(name for name, intent in self.intents.items() if intent.live)

    async def issue(self, steps: tuple[Step, ...]) -> None:
        for step in steps:
            if step.action == "delete":
                await self.record(step.cluster)
            await portal.issue(self.world.k, step, self.intents[step.cluster])

    async def record(self, name: str) -> None:
        """What the checks need of a Cluster that its delete takes away."""
        kube = self.world.k
        found = await portal.retried(lambda: observe.revisions(kube, release=name))
        self.recorded.revisions[name] = found.get(name, [])
        subdomain = await portal.retried(lambda: observe.subdomain(kube, name))
        if subdomain:
            self.recorded.subdomains[name] = subdomain

    async def converge(self, within: float) -> tuple[float | None, list[str]]:
        """Seconds until quiet and expected (seen twice, a second apart), or None and what
        still stood in the way after ``within`` seconds (then left out of later waits)."""
        assert self.observer is not None
        start, first, told = time.monotonic(), None, time.monotonic()
        while True:
            intents = list(self.intents.values())
            problems = self._relevant(await self.observer.problems(intents))
            now = time.monotonic()
            if problems and now - told > PROGRESS_SECONDS:
                told = now
                say(f"  {now - start:.0f}s: {len(problems)} to go: {'; '.join(problems[:3])}")
            if not problems:
                if first is not None:
                    return first - start, []
                first = now
                await asyncio.sleep(CONFIRM_SECONDS)
                continue
            first = None
            if now - start > within:
                everything = await self.observer.problems(intents, thorough=True)
                problems = self._relevant(everything) or problems
                self.quarantined |= {_key(p) for p in problems}
                return None, problems
            await asyncio.sleep(POLL_SECONDS)

    def _relevant(self, problems: list[str]) -> list[str]:
        return [p for p in problems if _key(p) not in self.quarantined]


def _key(problem: str) -> str:
    """What a problem line is about: a Cluster's or a consumer's name."""
    return problem.split(":", 1)[0]


def _steps(steps: tuple[Step, ...]) -> str:
    return ", ".join(f"{s.action} {s.cluster}" for s in steps) or "no steps"


def stack_for(workdir: Path, bin_dir: Path, *, tls: bool = False) -> LocalStack:
    """Three clustered nats-servers; 410s from etcd as in the integration tests' stack."""
    return LocalStack(
        workdir / "stack",
        nats_cluster=3,
        tls=tls,
        etcd_compaction_interval="5s",
        bin_dir=bin_dir,
        use_env_stack=False,
        apiserver_args=["--watch-cache-sizes=clusters.azimuth.stackhpc.com#0"],
    )


async def soak(plan: Plan, *, keep: bool, report: Path = RESULTS) -> int:
    bin_dir = ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="capibus-soak-"))
    world = World(stack_for(workdir, bin_dir, tls=plan.sizes.tls), workdir, bin_dir, plan.sizes)
    summary: RunSummary | None = None
    try:
        summary = await Soak(plan, world).run()
    finally:
        await world.close()
        if summary is not None and summary.ok and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"logs kept in {workdir}")
    text = render(summary)
    await asyncio.to_thread(report.write_text, text)
    print(text)
    if summary.ok:
        return 0
    failed = ", ".join(v.name for v in summary.verdicts if not v.ok)
    say(f"soak failed with seed {plan.seed} ({failed}); repeat: {_repeat(plan)}")
    return 1


def _repeat(plan: Plan) -> str:
    from soak.report import command  # noqa: PLC0415 (one use)

    return command(plan)
