"""Exporter settings: the shared ones plus ``CAPIBUS_EXPORTER__*``."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator

from shared.settings import ServiceSettings


class ExporterTuning(BaseModel):
    fetch_batch: int = Field(500, ge=1, description="Events read per request while catching up")
    idle_seconds: float = Field(
        5.0, gt=0, description="Quiet seconds before checking the stream consumer still exists"
    )
    list_retry_max_seconds: float = Field(
        30.0, gt=0, description="Longest wait between failed start-up lists of the four kinds"
    )
    caught_up_window_seconds: float = Field(
        60.0,
        gt=0,
        description="Without word from the stream reader for this long, it counts as behind",
    )

    @model_validator(mode="after")
    def _window_spans_a_quiet_read(self) -> Self:
        # A quiet stream is confirmed once per idle_seconds; a shorter window would flap.
        if self.caught_up_window_seconds <= self.idle_seconds:
            raise ValueError("caught_up_window_seconds must be longer than idle_seconds")
        return self


class ExporterSettings(ServiceSettings):
    exporter: ExporterTuning = ExporterTuning()
