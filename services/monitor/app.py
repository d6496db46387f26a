"""The monitor's subscription: every watched kind's events, per object, to ``on_changes``.

One subscription rather than one per kind: each partition then costs one durable consumer
and one pull loop instead of seven. Objects of different kinds sharing a name share a queue;
``on_changes`` keeps the latest event of each kind in a batch apart.

``Resyncs`` follows the partitions rather than messages (``shared.claims``): each claim
resyncs the Clusters of its partition in a task of its own, so the consumer's lease loop
never waits on it. The claims of one rebalance share one snapshot (7 lists, taken by the
first claim that asks); only the exact path of the few Clusters it makes suspect runs per
partition (``handlers``). The snapshot also seeds the versions the monitor compares events
with (``handlers.seed_versions``, ``shared.freshness``). The consumer cancels a lost
partition's resync at once, whatever happens to the others: a removal it published after the
new owner reported a node added since the listing would erase that node.
"""

from __future__ import annotations

import logging

from services.monitor import handlers, logic
from services.monitor.handlers import Deps
from shared.claims import Claim
from shared.wiring import Routes, events

log = logging.getLogger(__name__)

ROUTES: Routes[Deps] = Routes(
    "monitor",
    events("changes", *logic.WATCHED, handle=handlers.on_changes),
)


class Resyncs:
    """The monitor's claim follower: resync each claimed partition's Clusters."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def claimed(self, claim: Claim) -> None:
        kube = self.deps.kube
        snapshot = await claim.round.once("snapshot", lambda: handlers.resync_snapshot(kube))
        handlers.seed_versions(snapshot, claim.partition, self.deps)
        patched = await handlers.resync_partitions(
            frozenset({claim.partition}), self.deps, snapshot=snapshot
        )
        log.info("partition %s: resync corrected %d Cluster(s)", claim.partition, patched)

    async def lost(self, partitions: frozenset[int]) -> None:
        """Nothing to clean up: the consumer has cancelled the lost partitions' resyncs."""
