"""The lease service's subscriptions, straight to its handlers (``shared.wiring``).

- ``cluster``: Azimuth Cluster events; the Cluster is the one to converge.
- ``lease``: Lease events. An owned Lease hashes to its Cluster's partition through the
  ownerReference the portal sets; an ownerless one only nudges the Clusters naming it.
- ``capicluster``: Cluster API cluster events (same namespace and name as the Azimuth
  Cluster, so the same partition); its deletion is what a Lease release waits for. Not
  coalesced: every other event is dropped without a read, so a window would only delay the
  release, and with it the Cluster's deletion.
- ``reconcile``: ``ReconcileCluster`` nudges from any service, in the Clusters' partitions;
  handled like a Cluster event.

Each runs one handler at a time per object; ``Deps.locks`` makes that one at a time per
Cluster across all four.
"""

from __future__ import annotations

from services.lease import handlers
from services.lease.handlers import Deps
from shared import subjects
from shared.messages import ReconcileCluster
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE
from shared.wiring import Routes, events, messages

ROUTES: Routes[Deps] = Routes(
    "lease",
    events(CLUSTER.token, CLUSTER, handle=handlers.on_cluster),
    events(LEASE.token, LEASE, handle=handlers.on_lease_event),
    events(CAPI_CLUSTER.token, CAPI_CLUSTER, handle=handlers.on_capi_cluster_event, coalesce=False),
    messages(
        "reconcile",
        ReconcileCluster,
        subjects.LIFECYCLE,
        subjects.reconciles_in_partition,
        handle=handlers.on_cluster,
    ),
)
