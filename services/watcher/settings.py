"""Watcher settings: the shared ones plus ``CAPIBUS_WATCHER__*``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.resources import KINDS
from shared.settings import ServiceSettings


class WatcherTuning(BaseModel):
    kinds: list[str] = Field(
        default_factory=lambda: list(KINDS), description="Resource kinds to watch (tokens)"
    )
    namespace: str | None = Field(None, description="Watch one namespace only (default: all)")
    watch_timeout_seconds: int = Field(300, ge=1, description="Server-side watch duration")
    idle_timeout_seconds: float = Field(70.0, gt=0, description="Silence before re-watching")
    retry_max_seconds: float = Field(30.0, gt=0, description="Longest wait between failed lists")


class WatcherSettings(ServiceSettings):
    watcher: WatcherTuning = WatcherTuning()
