"""What the writer asks of the Kubernetes API: for every kind it writes
(``shared.status.WRITTEN``), the object and a list to seed its cache, and merge patches on
``status`` (on the object itself for a kind served without that subresource); and on the
metadata of Azimuth Clusters, the one kind any service asks it to change the finalizers, labels
or annotations of (the helm service, ``change_metadata``). A new sender of ``PatchMetadata``
for another kind adds that kind here."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import CLUSTER
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
        [kind for kind in WRITTEN if not kind.status_subresource],
        "patch",
        why="the status of a kind served without a status subresource, on the object",
    ),
    Rule(
        CLUSTER,
        "patch",
        why="the finalizer, labels and annotations the helm service asks for (`PatchMetadata`)",
    ),
)
