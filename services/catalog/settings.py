"""Catalog settings: the shared ones plus ``CAPIBUS_CATALOG__*``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class CatalogTuning(BaseModel):
    http_timeout_seconds: float = Field(
        30.0, gt=0, description="Timeout of each request to a chart repository"
    )
    max_index_bytes: int = Field(
        64 << 20, gt=0, description="Largest index.yaml accepted from a repository"
    )
    max_chart_bytes: int = Field(16 << 20, gt=0, description="Largest chart archive downloaded")
    max_schema_bytes: int = Field(
        1 << 20, gt=0, description="Largest values.schema.json or azimuth-ui.schema.yaml read"
    )
    retry_unreachable_seconds: float = Field(
        600.0,
        gt=0,
        description="After an unreachable repository, try again this much later at the latest",
    )
    rearm_retry_max_seconds: float = Field(
        30.0, gt=0, description="Longest wait between failed lists when re-arming timers"
    )
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after a template's first event so a burst is one run"
    )


class CatalogSettings(ServiceSettings):
    catalog: CatalogTuning = CatalogTuning()
