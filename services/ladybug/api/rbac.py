"""What CB-Ladybug's REST API asks of the Kubernetes API: the LadybugClusters it writes and
answers from (in the one namespace of all of them, ``CAPIBUS_LADYBUG__NAMESPACE``), and the
kubeconfigs it hands out."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import LADYBUG_CLUSTER, SECRET

RULES = (
    Rule(
        LADYBUG_CLUSTER,
        "get list watch create patch delete",
        why="the API's store: create, list, read, change (a guarded JSON patch), delete; a "
        "blocking request watches its cluster until it settles",
    ),
    Rule(SECRET, "get list", why="the admin kubeconfig Secrets of the clusters it returns"),
)
