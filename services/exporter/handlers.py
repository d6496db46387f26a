"""The exporter's one job: keep ``Series`` equal to what the latest events say."""

from __future__ import annotations

from collections.abc import AsyncIterable

from services.exporter.logic import Series
from shared.messages import ResourceChanged


async def keep_current(*, events: AsyncIterable[ResourceChanged], series: Series) -> None:
    """Apply every event, in stream order, until the events end."""
    async for change in events:
        series.apply(change)
