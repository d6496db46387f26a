"""What the admission webhook asks of the Kubernetes API: reads only, to judge a request."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, SECRET

RULES = (
    Rule(CLUSTER_TEMPLATE, "get", why="the template a Cluster names (exists, deprecated, version)"),
    Rule(CLUSTER, "list", why="whether a template being deleted is in use (one item at most)"),
    Rule(
        SECRET,
        "get",
        why="whether the cloud credentials Secret exists: a metadata-only read, its data never "
        "reaches the webhook",
    ),
)
