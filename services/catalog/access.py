"""What the catalog does on the bus (``shared.access``): its ``ROUTES``, status patches, and
the ``SyncAppTemplate`` commands its timers send to itself."""

from __future__ import annotations

from services.catalog.app import ROUTES
from shared import subjects
from shared.access import Access

ACCESS = Access.of(
    ROUTES,
    publish=(
        subjects.status_patches_in_partition("*"),
        subjects.app_template_syncs_in_partition("*"),
    ),
)
