"""What metalstack does on the bus (``shared.access``): its ``ROUTES``, status patches, and
the ``RecheckObject`` commands it sends to itself."""

from __future__ import annotations

from services.baremetal.metalstack.app import ROUTES, SERVICE
from shared import subjects
from shared.access import Access

ACCESS = Access.of(
    ROUTES,
    publish=(
        subjects.status_patches_in_partition("*"),
        subjects.rechecks_in_partition(SERVICE, "*"),
    ),
)
