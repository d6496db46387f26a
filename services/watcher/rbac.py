"""What the watcher asks of the Kubernetes API: a list, then a watch, of every kind capibus
reacts to, in all namespaces (``shared.resources.KINDS``; its settings may pick fewer of them,
never others). It reads nothing by name and writes nothing."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import KINDS, SECRET

RULES = (
    Rule(
        [kind for kind in KINDS.values() if kind != SECRET],
        "list watch",
        why="list-then-watch of every kind capibus reacts to, each change stored once on the bus",
    ),
    Rule(
        SECRET,
        "list watch",
        why="kubeconfig, credentials and bootstrap Secrets wake the services waiting for "
        "them; their data is dropped before anything is published (`shared.resources.scrub`)",
    ),
)
