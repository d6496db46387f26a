"""The catalog's subscriptions.

- ``apptemplate``: AppTemplate events from the watcher, in the template's partition.
- ``sync``: ``SyncAppTemplate`` commands from the timers, in the same partition, run as
  they come (a command is due at its moment; nothing is gained by waiting for a burst).

Both run under one lock per template (``Deps.locks``), since each has its own per-object
queue.

``SyncClaims`` is the work that follows partition claims: each new claim arms the timers of
the partition's templates, from one list of AppTemplates shared by the claims of one
rebalance (an overdue template fires at once). The consumer retries it while the claim lasts
and cancels it when the partition goes; a lost partition's timers go with it, and its next
owner arms them.
"""

from __future__ import annotations

import logging

from services.catalog import handlers
from services.catalog.handlers import Deps
from shared import subjects
from shared.claims import Claim
from shared.messages import SyncAppTemplate
from shared.resources import APP_TEMPLATE
from shared.wiring import Routes, events, messages

log = logging.getLogger(__name__)

ROUTES: Routes[Deps] = Routes(
    "catalog",
    events(APP_TEMPLATE.token, APP_TEMPLATE, handle=handlers.on_template_event),
    messages(
        "sync",
        SyncAppTemplate,
        subjects.LIFECYCLE,
        subjects.app_template_syncs_in_partition,
        handle=handlers.on_sync_command,
        coalesce=False,
    ),
)


class SyncClaims:
    """The catalog's claim follower (``shared.claims``)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def claimed(self, claim: Claim) -> None:
        armed = await handlers.arm_claimed(claim, self.deps)
        log.info("partition %s: armed the sync timers of %d AppTemplate(s)", claim.partition, armed)

    async def lost(self, partitions: frozenset[int]) -> None:
        self.deps.timers.drop(partitions)
