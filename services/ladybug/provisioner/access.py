"""What this service does on the bus (``shared.access``): its ``ROUTES`` and status patches."""

from __future__ import annotations

from services.ladybug.provisioner.app import ROUTES
from shared import subjects
from shared.access import Access

ACCESS = Access.of(ROUTES, publish=(subjects.status_patches_in_partition("*"),))
