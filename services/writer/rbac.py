"""What the writer asks of the Kubernetes API: for every kind it writes
(``shared.status.WRITTEN``), the object, a list to seed its cache, and merge patches on
``status`` (on the object itself for a kind served without that subresource) and on
finalizers, labels and annotations."""

from __future__ import annotations

from shared.rbac import Rule
from shared.status import WRITTEN

RULES = (
    Rule(
        WRITTEN,
        "get list",
        why="reads an object a status patch is computed against; one list per kind seeds "
        "the status cache and the deadlines of a partition it claims",
    ),
    Rule(
        [kind for kind in WRITTEN if kind.status_subresource],
        "patch",
        subresource="status",
        why="the one writer of status: a merge patch guarded by uid and resourceVersion",
    ),
    Rule(
        WRITTEN,
        "patch",
        why="finalizers, labels and annotations the services ask for (`PatchMetadata`), and "
        "the status of a kind served without a status subresource (MetalStackFirewall)",
    ),
)
