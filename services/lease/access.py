"""What the lease service does on the bus (``shared.access``): besides its ``ROUTES``, status
patches, nudges and its prerequisites; it reads the newest event of an object (EVENTS) and the
last prerequisite it said (LIFECYCLE)."""

from __future__ import annotations

from services.lease.app import ROUTES
from shared import subjects
from shared.access import Access

ACCESS = Access.of(
    ROUTES,
    publish=(
        subjects.status_patches_in_partition("*"),
        subjects.reconciles_in_partition("*"),
        subjects.prerequisites_in_partition("*"),
    ),
    reads_last=(subjects.EVENTS.name, subjects.LIFECYCLE.name),
)
