"""Control-plane provider settings: the shared ones plus ``CAPIBUS_ASSISTEDCONTROLPLANE__*``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class AssistedControlPlaneTuning(BaseModel):
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )


class AssistedControlPlaneSettings(ServiceSettings):
    assistedcontrolplane: AssistedControlPlaneTuning = AssistedControlPlaneTuning()
