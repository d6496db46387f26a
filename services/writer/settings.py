"""Writer settings (``CAPIBUS_WRITER_*`` plus the shared ones)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class WriterSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CAPIBUS_WRITER_", env_nested_delimiter="__")

    coalesce_seconds: float = Field(
        0.02, ge=0, description="Wait after a Cluster's first patch so a burst becomes one write"
    )
    conflict_retries: int = Field(3, ge=0, description="Re-reads after 409/422 before giving up")
    cache_size: int = Field(10_000, ge=0, description="Clusters whose last written status is kept")
