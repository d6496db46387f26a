"""Admission settings: the shared ones plus ``CAPIBUS_ADMISSION__*``.

The certificate and key have no default: a webhook without TLS is refused by the API server,
so a missing file should stop the service at start, not at the first review.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from shared.settings import ServiceSettings


class WebhookTuning(BaseModel):
    cert_file: Path = Field(description="PEM serving certificate (chain) the API server verifies")
    key_file: Path = Field(description="PEM private key of the serving certificate")
    host: str = Field("0.0.0.0", description="Address to listen on")
    port: int = Field(8443, ge=1, le=65535, description="HTTPS port")
    review_timeout_seconds: float = Field(
        8.0,
        gt=0,
        description="Deadline of one review; keep it below the webhook's timeoutSeconds (10)",
    )


class AdmissionSettings(ServiceSettings):
    admission: WebhookTuning
