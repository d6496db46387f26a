"""What discovery asks of the Kubernetes API of the management cluster: the Cluster, its
kubeconfig Secret (to watch the tenant cluster's Zenith Reservations, with the credentials
that Secret holds, not with these rules) and the addons whose services annotation it writes."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import CLUSTER, HELM_RELEASE, MANIFESTS, SECRET

RULES = (
    Rule(CLUSTER, "get list", why="the Cluster; all Clusters of a partition it claims"),
    Rule(SECRET, "get", why="the `<cluster>-kubeconfig` Secret that reaches the tenant cluster"),
    Rule(
        [HELM_RELEASE, MANIFESTS],
        "get list patch",
        why="the Cluster's addons, and their `azimuth.stackhpc.com/services` annotation",
    ),
)
