"""Monitor settings: the shared ones plus ``CAPIBUS_MONITOR__*``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class MonitorTuning(BaseModel):
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst becomes one run"
    )
    view_seconds: float = Field(
        5.0, ge=0, description="How long a Cluster read stands in for a fresh GET"
    )
    replay_seconds: float = Field(
        30.0, ge=0, description="How long a published patch may take to reach the Cluster"
    )
    cache_size: int = Field(10_000, ge=0, description="Clusters whose status view is kept")
    versions_size: int = Field(
        50_000,
        ge=1,
        description="Objects whose newest applied resourceVersion is kept (shared.freshness)",
    )
    resync: bool = Field(
        True, description="On claiming a partition, prune status entries no object backs"
    )


class MonitorSettings(ServiceSettings):
    monitor: MonitorTuning = MonitorTuning()
