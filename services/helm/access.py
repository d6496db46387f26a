"""What the helm service does on the bus (``shared.access``): besides its ``ROUTES``, status
and metadata patches (the Cluster finalizer), nudges and its prerequisites, and the last
prerequisite it said (LIFECYCLE)."""

from __future__ import annotations

from services.helm.app import ROUTES
from shared import subjects
from shared.access import Access

ACCESS = Access.of(
    ROUTES,
    publish=(
        subjects.status_patches_in_partition("*"),
        subjects.metadata_patches_in_partition("*"),
        subjects.reconciles_in_partition("*"),
        subjects.prerequisites_in_partition("*"),
    ),
    reads_last=(subjects.LIFECYCLE.name,),
)
