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
    # Half the shared default. httpx's pool (httpcore 1.0.9) looks at every connection,
    # with two system calls each, whenever a request starts or ends, so the client's CPU per
    # request grows with the connections it keeps. In a burst over hundreds of Clusters the
    # writer holds every slot: at 16 it spent 2.9 ms CPU per status write, at 8 2.2 ms, at
    # the same or better writes/s (bench/ANALYSIS.md, 2026-11-25). 8 in flight still allow
    # hundreds of writes/s against an API server answering in 10-20 ms, far above the QPS.
    kube_max_in_flight: int = Field(
        8, ge=1, description="Concurrent API requests (not watches); the writer's own default"
    )
    writer: WriterTuning = WriterTuning()
