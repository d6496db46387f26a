"""What the lease service asks of the Kubernetes API: the Cluster, its Lease (adopted and
released with a JSON patch: ownerReference and finalizer) and whether the Cluster API cluster
is gone yet."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE

RULES = (
    Rule(CLUSTER, "get list", why="the Cluster; the Clusters naming a Lease that names no owner"),
    Rule(
        LEASE,
        "get patch",
        why="adopts the Lease (ownerReference, finalizer) and releases it (finalizer removed)",
    ),
    Rule(
        CAPI_CLUSTER,
        "get",
        why="a Lease is released only once the Cluster API cluster is gone",
    ),
)
