"""The exporter's two jobs: a starting state from one list per kind, then every event after it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable
from typing import Protocol

from services.exporter.logic import KINDS, Series
from shared import ports
from shared.errors import KubeNotFound
from shared.messages import ResourceChanged
from shared.metrics import counter
from shared.oversize import complete
from shared.retry import retry_until_done

log = logging.getLogger(__name__)

EVENTS_APPLIED = counter(
    "capibus_exporter_events_applied", "Events the exporter applied to its series"
)
EVENTS_SUPERSEDED = counter(
    "capibus_exporter_events_superseded",
    "Events the exporter skipped because its list or a later event already showed newer state",
)


class Lister(ports.KubeReader, Protocol):
    """``shared.kube.KubeClient`` in production: ``list`` once per kind at start-up, ``get``
    only for an event that arrived trimmed (an object too large for one message)."""


async def take_baseline(*, lister: Lister, series: Series) -> int:
    """One list of each kind, in all namespaces, as the state events apply to; how many objects.

    A kind the API server does not serve (HelmRelease without the addon provider) has no list:
    its series come from its events alone. Any other failure propagates, for the caller to retry.
    """
    listed = 0
    for kind in KINDS:
        try:
            items, version = await lister.list(kind)
        except KubeNotFound:
            log.warning("%s are not served; their series come from events only", kind.plural)
            continue
        series.baseline(kind, items, version)
        listed += len(items)
    return listed


async def keep_current(
    *,
    events: AsyncIterable[ResourceChanged],
    series: Series,
    lister: Lister,
    applied: Callable[[ResourceChanged], None] = lambda _: None,
    retry_max_seconds: float = 30.0,
) -> None:
    """Apply every event, in stream order, until the events end; ``applied`` hears of each.

    A trimmed event is made whole from the API server first, waiting for it if it is down:
    series computed from part of an object would be wrong, not merely late.
    """
    async for event in events:
        change = await _whole(event, lister, retry_max_seconds)
        if series.apply(change):
            EVENTS_APPLIED.inc()
            applied(change)
        else:
            EVENTS_SUPERSEDED.inc()


async def _whole(
    event: ResourceChanged, lister: Lister, retry_max_seconds: float
) -> ResourceChanged:
    if event.trimmed is None:
        return event
    return await retry_until_done(
        lambda: complete(event, objects=lister),
        what=f"read {event.ref.kind} {event.ref.key}",
        cap=retry_max_seconds,
    )
