"""The helm service's subscriptions: everything that can end a Cluster's wait.

- ``clusters``: the Cluster's own events (not its deletion: the finalizer keeps it until we
  are done, so a DELETED event finds nothing to do);
- ``capiclusters``: the CAPI Cluster's DELETED event, what a deleting Cluster waits for;
- ``prerequisites`` and ``nudges``: the identity and lease services' facts, and nudges (from
  the deletion deadline's timer, or from other services);
- ``templates`` and ``secrets``: a ClusterTemplate or a credentials Secret appearing wakes the
  Clusters that wait for it.

The first four run ``handlers.reconcile`` for the Cluster under its lock; a burst of the
Cluster's own events, facts or nudges joins one run.

``DeadlineClaims`` is the work that follows partition claims: each new claim arms the
deletion deadlines of the partition's Clusters already being deleted, from one list of
Clusters shared by the claims of one rebalance; a lost partition's timers go with it.
"""

from __future__ import annotations

import logging

from services.helm import handlers
from services.helm.ports import Deps
from shared import subjects
from shared.claims import Claim
from shared.messages import PrerequisiteChanged, ReconcileCluster
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, SECRET
from shared.wiring import Routes, events, messages

log = logging.getLogger(__name__)

ROUTES: Routes[Deps] = Routes(
    "helm",
    events("clusters", CLUSTER, handle=handlers.on_cluster_event),
    events("capiclusters", CAPI_CLUSTER, handle=handlers.on_capi_cluster_event, coalesce=False),
    messages(
        "prerequisites",
        PrerequisiteChanged,
        subjects.LIFECYCLE,
        subjects.prerequisites_in_partition,
        handle=handlers.on_cluster_message,
    ),
    messages(
        "nudges",
        ReconcileCluster,
        subjects.LIFECYCLE,
        subjects.reconciles_in_partition,
        handle=handlers.on_cluster_message,
    ),
    events("templates", CLUSTER_TEMPLATE, handle=handlers.on_template_event, coalesce=False),
    events("secrets", SECRET, handle=handlers.on_secret_event, coalesce=False),
)


class DeadlineClaims:
    """The helm service's claim follower (``shared.claims``)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def claimed(self, claim: Claim) -> None:
        armed = await handlers.arm_claimed(claim, self.deps)
        log.info("partition %s: armed %d deletion deadline(s)", claim.partition, armed)

    async def lost(self, partitions: frozenset[int]) -> None:
        handlers.drop_deadlines(partitions, self.deps)
