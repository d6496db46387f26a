"""What the watcher does on the bus (``shared.access``): it publishes every resource event and
each kind's "listed" marker, and reads the EVENTS stream back with ephemeral consumers (the
newest event of every object at a re-list, and the follow). It holds no leases."""

from __future__ import annotations

from shared import subjects
from shared.access import Access

ACCESS = Access.of(
    user="watcher",
    publish=(subjects.resource_events_of_kind("*"), subjects.resource_listed("*")),
    follows=(subjects.EVENTS.name,),
)
