"""The watcher's work: remember, list, follow, publish.

Each function converges one step and returns where it got to; ``app.watch_kind`` strings them
into the list-then-watch cycle. ``known`` is updated only after JetStream acknowledged the
change, so whatever failed to publish is found again by the next re-list.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from services.watcher import logic
from services.watcher.logic import Change, Known
from shared import oversize, ports, subjects
from shared.bus import Published
from shared.errors import BadMessage
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged, ResourcesListed, decode, stable_id
from shared.metrics import counter
from shared.resources import scrub

log = logging.getLogger(__name__)

Json = dict[str, Any]

#: Changes the stream stored (JetStream's duplicates from other replicas are not counted).
EVENTS_PUBLISHED = counter(
    "capibus_events_published", "Resource changes stored on the stream", ["kind", "event"]
)
#: Changes published without fields that did not fit in one message (consumers read them back).
EVENTS_TRIMMED = counter(
    "capibus_events_trimmed",
    "Resource changes too large for one message, published without their largest fields",
    ["kind"],
)


KubeReader = ports.KubeWatcher


class Publisher(ports.Publisher, Protocol):
    @property
    def max_payload(self) -> int: ...

    async def publish_many(
        self, items: list[tuple[str, Message, str | None]], *, ack_timeout: float = 10.0
    ) -> list[Published]: ...

    async def last_per_subject(self, stream: str, filter_subject: str) -> list[bytes]: ...


@dataclass(frozen=True)
class Scope:
    """Where and as whom one kind is watched."""

    kind: ResourceKind
    source: str
    partitions: int
    namespace: str | None = None
    watch_timeout_seconds: int = 300


async def load_known(*, scope: Scope, bus: Publisher) -> dict[str, Known]:
    """What the stream already says about every object of this kind."""
    bodies = await bus.last_per_subject(
        subjects.EVENTS.name, subjects.resource_events_of_kind(scope.kind.token)
    )
    known: dict[str, Known] = {}
    for body in bodies:
        try:
            message = decode(body, ResourceChanged)
        except BadMessage:
            continue  # not ours to judge here; the consumers dead-letter it
        logic.remember(known, Change(message.event, message.object, message.resource_version))
    return known


async def relist(*, scope: Scope, known: dict[str, Known], kube: KubeReader, bus: Publisher) -> str:
    """Publish everything that changed since ``known``; returns the list's resourceVersion."""
    items, version = await kube.list(scope.kind, namespace=scope.namespace)
    items = [scrub(scope.kind, item) for item in items]
    changes = logic.changes_from_list(known, items, version)
    await publish(scope=scope, known=known, bus=bus, changes=changes)
    marker = ResourcesListed(
        id=stable_id("listed", scope.kind.token, version, scope.source),
        source=scope.source,
        correlation_id=f"{scope.kind.token}:list",
        api_version=scope.kind.api_version,
        kind=scope.kind.kind,
        resource_version=version,
        count=len(items),
    )
    await bus.publish(subjects.resource_listed(scope.kind.token), marker)
    return version


async def follow(
    *,
    scope: Scope,
    known: dict[str, Known],
    kube: KubeReader,
    bus: Publisher,
    resource_version: str,
) -> str:
    """Publish watch events until the server ends the watch; returns the last version seen.

    Raises ``WatchExpired`` (re-list) or ``KubeUnavailable`` (re-watch from the returned
    version after a pause) from the adapter.
    """
    version = resource_version
    async for event in kube.watch(
        scope.kind,
        resource_version=version,
        namespace=scope.namespace,
        timeout_seconds=scope.watch_timeout_seconds,
    ):
        if event.type != "BOOKMARK":
            change = logic.change_from_watch(known, event.type, scrub(scope.kind, event.object))
            if change:
                await publish(scope=scope, known=known, bus=bus, changes=[change])
        version = event.resource_version or version
    return version


async def publish(
    *, scope: Scope, known: dict[str, Known], bus: Publisher, changes: list[Change]
) -> int:
    """Store ``changes`` in order; returns how many were new to the stream."""
    items: list[tuple[str, Message, str | None]] = []
    limit = oversize.limit_for(bus.max_payload)
    for change in changes:
        subject, message, dedupe = logic.to_message(
            scope.kind, change, partitions=scope.partitions, source=scope.source
        )
        items.append((subject, _fitted(scope, message, limit), dedupe))
    acks = await bus.publish_many(items)
    for change, ack in zip(changes, acks, strict=True):
        logic.remember(known, change)
        if not ack.duplicate:
            EVENTS_PUBLISHED.inc(scope.kind.token, change.event)
    return sum(not ack.duplicate for ack in acks)


def _fitted(scope: Scope, message: ResourceChanged, limit: int) -> ResourceChanged:
    """``message`` within the bus's limit: one oversized object must not block its kind."""
    fitted = oversize.fit(message, plural=scope.kind.plural, limit=limit)
    if fitted.trimmed is not None:
        EVENTS_TRIMMED.inc(scope.kind.token)
        log.warning(
            "%s %s is %d bytes as an event, over the %d the bus takes: published without %s",
            scope.kind.kind,
            message.ref.key,
            fitted.trimmed.size,
            limit,
            ", ".join(fitted.trimmed.fields),
        )
    return fitted
