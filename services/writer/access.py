"""What the writer does on the bus (``shared.access``): it consumes status and metadata
patches (its ``ROUTES``), journals what it wrote, and, when a Cluster's deadline passes, sends
itself a status patch (its timers) and nudges the Cluster."""

from __future__ import annotations

from services.writer.app import ROUTES
from shared import subjects
from shared.access import Access

ACCESS = Access.of(
    ROUTES,
    publish=(
        subjects.journal("*", "*", "*", "*"),
        subjects.status_patches_in_partition("*"),
        subjects.reconciles_in_partition("*"),
    ),
)
