"""What CB-Ladybug's provisioner asks of the Kubernetes API: its LadybugClusters (finalizer,
removed workers) and the Secrets of their SSH keys, host keys and kubeconfigs. Tumblebug,
Spider and the nodes are reached over HTTP and SSH, not through Kubernetes."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import LADYBUG_CLUSTER, SECRET

RULES = (
    Rule(
        LADYBUG_CLUSTER,
        "get patch",
        why="the cluster to converge: its finalizer, and workers removed from its spec",
    ),
    Rule(
        SECRET,
        "get create patch delete",
        why="server-side applies the SSH key, host keys and kubeconfig Secrets; deletes them "
        "with the cluster",
    ),
)
