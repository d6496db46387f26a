"""Writer settings: the shared ones plus ``CAPIBUS_WRITER__*``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class WriterTuning(BaseModel):
    coalesce_seconds: float = Field(
        0.02, ge=0, description="Wait after a Cluster's first patch so a burst becomes one write"
    )
    conflict_retries: int = Field(3, ge=0, description="Re-reads after 409/422 before giving up")
    cache_size: int = Field(10_000, ge=0, description="Clusters whose last written status is kept")
    cluster_timeout_seconds: float = Field(
        1800, gt=0, description="Pending/Reconciling/Upgrading longer than this shows Unhealthy"
    )


class WriterSettings(ServiceSettings):
    writer: WriterTuning = WriterTuning()
