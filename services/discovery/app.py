"""Discovery's subscription: Cluster, Secret and addon events of a partition, to the tracker.

One subscription rather than one per kind: each partition then costs one durable consumer.
Objects of different kinds sharing a name share a queue; ``handlers.on_changes`` keeps the
latest event of each kind in a batch apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.discovery import handlers
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.messages import ResourceChanged


@dataclass(frozen=True)
class Deps:
    tracker: handlers.Tracker
    coalesce_seconds: float = 0.05


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def on_changes(batch: Batch[ResourceChanged]) -> None:
        await handlers.on_changes(batch=batch, tracker=deps.tracker)

    return [
        Subscription(
            name="changes",
            stream=subjects.EVENTS,
            filters=lambda p: [
                subjects.resource_events_in_partition(kind.token, p) for kind in handlers.WATCHED
            ],
            model=ResourceChanged,
            handle=on_changes,
            coalesce_seconds=deps.coalesce_seconds,
        )
    ]
