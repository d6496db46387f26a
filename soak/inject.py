"""Carrying out one planned fault against the running world, and saying when it ended.

Each fault is one process or server made to fail the way production sees it fail, for the
fault's ``duration``, then let back:

=================  ===========================================================================
kill               SIGKILL of one service replica (its helm processes die with it); down for
                   the duration, then started again under the same member name
freeze             SIGSTOP of one replica for longer than its lease TTL (its partitions move,
                   its in-flight work is redelivered elsewhere), then SIGCONT: it must notice
                   it lost its leases and act on nothing it no longer owns
nats-node          SIGKILL of one NATS node, restarted after the duration with its store
nats-leader        the same for the node leading the target stream at that moment
redis              SIGKILL of Redis (no persistence: every lease is gone), then started again
apiserver          SIGKILL of kube-apiserver, then started again on its port and certificate
etcd-compaction    both watchers frozen past their server-side watch timeout while the live
                   Clusters are touched, etcd compacted at its current revision, watchers
                   thawed: their watches resume from a compacted resourceVersion, a real 410
                   that must end in a re-list (counted from their logs)
registrar          the Zenith registrar process killed, restarted with its registry
standins           the stand-ins process (identity, schedule, Cluster API) killed, restarted
=================  ===========================================================================

The harness's start/stop calls block (they wait for readiness), so they run in a thread and
the event loop stays free. A fault ends when the failed thing is back (a process started, a
server ready), which is where the recovery clock starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from soak import plan, portal
from soak.plan import Fault
from soak.procs import Proc
from soak.world import World
from testenv.harness import APISERVER, REDIS

WATCH_EXPIRED = "watch expired"


@dataclass(frozen=True)
class Outcome:
    #: ``time.monotonic()`` when the fault began and when it was over
    began: float
    ended: float
    #: what the fault hit and what it found (the leader it killed)
    note: str
    #: what to add to the note once the system has recovered (the 410s met meanwhile)
    after: Callable[[], str] = lambda: ""


async def inject(world: World, fault: Fault, live: Callable[[], list[str]]) -> Outcome:
    """Carry out ``fault``; ``live`` names the Clusters the compaction fault touches."""
    began = time.monotonic()
    if fault.kind == plan.COMPACTION:
        note, after = await _compaction(world, fault, live())
        return Outcome(began, time.monotonic(), note, after)
    if fault.kind in (plan.KILL, plan.FREEZE):
        note = await _replica(world, fault)
    elif fault.kind in (plan.NATS_NODE, plan.NATS_LEADER):
        note = await _nats(world, fault)
    elif fault.kind in (plan.REDIS, plan.APISERVER):
        component = REDIS if fault.kind == plan.REDIS else APISERVER
        note = await _server(world, component, fault.duration)
    else:
        note = await _peer(world, fault)
    return Outcome(began, time.monotonic(), note)


async def _replica(world: World, fault: Fault) -> str:
    proc = world.services[fault.target]
    if fault.kind == plan.KILL:
        proc.kill()
        await asyncio.sleep(fault.duration)
        proc.start()
        return f"{fault.target} killed, down {fault.duration:.1f}s"
    proc.freeze()
    await asyncio.sleep(fault.duration)
    proc.thaw()
    return f"{fault.target} frozen {fault.duration:.1f}s"


async def _nats(world: World, fault: Fault) -> str:
    node = fault.target
    if fault.kind == plan.NATS_LEADER:
        node = await world.stack.stream_leader(fault.target)
    await _server(world, node, fault.duration)
    leads = "leader of " + fault.target if fault.kind == plan.NATS_LEADER else "node"
    return f"{node} ({leads}) killed, down {fault.duration:.1f}s"


async def _server(world: World, component: str, seconds: float) -> str:
    await asyncio.to_thread(world.stack.stop_component, component)
    await asyncio.sleep(seconds)
    await asyncio.to_thread(world.stack.start_component, component)
    return f"{component} killed, down {seconds:.1f}s"


async def _compaction(world: World, fault: Fault, live: list[str]) -> tuple[str, Callable[[], str]]:
    watchers = [world.services[label] for label in world.replicas_of("watcher")]
    before = _expired(watchers)
    for watcher in watchers:
        watcher.freeze()
    try:
        touched = await portal.touch(world.k, live, mark=str(time.time()))
        await asyncio.sleep(fault.duration)
        revision = await asyncio.to_thread(world.stack.compact_etcd)
    finally:
        for watcher in watchers:
            watcher.thaw()
    note = (
        f"watchers frozen {fault.duration:.1f}s, {touched} Clusters touched, "
        f"etcd compacted at revision {revision}"
    )
    return note, lambda: f"{_expired(watchers) - before} watches expired (410) and re-listed"


def _expired(watchers: list[Proc]) -> int:
    return sum(w.log().count(WATCH_EXPIRED) for w in watchers)


async def _peer(world: World, fault: Fault) -> str:
    proc = world.peers[fault.kind]
    proc.kill()
    await asyncio.sleep(fault.duration)
    proc.start()
    return f"{fault.kind} process killed, down {fault.duration:.1f}s"
