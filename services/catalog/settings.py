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
    max_status_schema_bytes: int = Field(
        1 << 20,
        gt=0,
        description="Largest total size (JSON) of the schemas of all versions in one status",
    )
    retry_unreachable_first_seconds: float = Field(
        2.0,
        gt=0,
        description="First wait after an unreachable repository; it doubles on every failure",
    )
    retry_unreachable_seconds: float = Field(
        600.0,
        gt=0,
        description="Longest wait between tries of an unreachable repository",
    )
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after a template's first event so a burst is one run"
    )


class CatalogSettings(ServiceSettings):
    catalog: CatalogTuning = CatalogTuning()
