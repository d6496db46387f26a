"""Exporter settings: the shared ones plus ``CAPIBUS_EXPORTER__*``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class ExporterTuning(BaseModel):
    fetch_batch: int = Field(500, ge=1, description="Events read per request while catching up")
    idle_seconds: float = Field(
        5.0, gt=0, description="Quiet seconds before checking the stream consumer still exists"
    )


class ExporterSettings(ServiceSettings):
    exporter: ExporterTuning = ExporterTuning()
