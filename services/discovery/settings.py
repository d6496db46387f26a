"""Discovery settings: the shared ones plus ``CAPIBUS_DISCOVERY__*``.

Discovery only runs tenant watches when ``CAPIBUS_AZIMUTH__ZENITH_ENABLED`` is true.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class DiscoveryTuning(BaseModel):
    resync_seconds: int = Field(
        300,
        ge=1,
        description="Each tenant watch is renewed after this long, from the newest version seen",
    )
    quiet_seconds: float = Field(
        0.5, ge=0, description="Recompute a cluster's services after this long without changes"
    )
    max_delay_seconds: float = Field(
        5.0, ge=0, description="Recompute at the latest this long after the first change"
    )
    retry_max_seconds: float = Field(
        60.0, gt=0, description="Longest wait before reconnecting to a failing tenant cluster"
    )
    replay_seconds: float = Field(
        30.0, ge=0, description="How long a published status patch may take to reach the Cluster"
    )
    tenant_qps: float = Field(5.0, gt=0, description="Requests per second to one tenant cluster")
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )


class DiscoverySettings(ServiceSettings):
    discovery: DiscoveryTuning = DiscoveryTuning()
