"""The writer's subscriptions: status patches and metadata commands, per object, in order.

``Seeding`` is the work that follows partition claims: each new claim seeds the status cache
and arms the claimed objects' deadlines from one list per kind (shared by the claims of one
rebalance). It runs beside the messages, not before them: an object written before its seed
arrives just costs the GET it would have cost anyway, and the seed never overwrites that
newer write. The consumer retries it while the claim lasts and cancels it when the partition
goes; a lost partition's timers go with it.
"""

from __future__ import annotations

import logging

from services.writer import handlers
from services.writer.handlers import Deps
from shared import subjects
from shared.claims import Claim
from shared.messages import PatchMetadata, PatchStatus
from shared.timers import Timers
from shared.wiring import Routes, messages

log = logging.getLogger(__name__)

ROUTES: Routes[Deps] = Routes(
    "writer",
    messages(
        "status",
        PatchStatus,
        subjects.STATUS,
        subjects.status_patches_in_partition,
        handle=handlers.write_status,
    ),
    messages(
        "meta",
        PatchMetadata,
        subjects.STATUS,
        subjects.metadata_patches_in_partition,
        handle=handlers.write_metadata,
        coalesce=False,
    ),
)


class Seeding:
    """The writer's claim follower (``shared.claims``)."""

    def __init__(self, deps: Deps, timers: Timers | None = None) -> None:
        self.deps = deps
        self.timers = timers

    async def claimed(self, claim: Claim) -> None:
        count = await handlers.seed(claim, self.deps)
        log.info("status cache seeded with %d object(s) of partition %s", count, claim.partition)

    async def lost(self, partitions: frozenset[int]) -> None:
        if self.timers is not None:
            self.timers.drop(partitions)
        if self.deps.deadlines is not None:
            self.deps.deadlines.drop(partitions)
