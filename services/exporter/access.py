"""What the exporter does on the bus (``shared.access``): it only follows the EVENTS stream,
with an ephemeral consumer; it publishes nothing and holds no leases."""

from __future__ import annotations

from shared import subjects
from shared.access import Access

ACCESS = Access.of(user="exporter", follows=(subjects.EVENTS.name,))
