"""metal-stack provider settings: the shared ones plus ``CAPIBUS_METALSTACK__*``.

The metal-api credentials follow upstream's process configuration (``METALCTL_URL`` and
``METALCTL_HMAC``, or a bearer token), read from the environment so a Deployment takes them
from a Secret; ``CAPIBUS_METALSTACK__URL`` and friends work too.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, SecretStr, model_validator

from shared.settings import ServiceSettings


class MetalStackTuning(BaseModel):
    url: str = Field("", description="metal-api base URL (default: $METALCTL_URL)")
    hmac: SecretStr | None = Field(
        None, description="HMAC key for Metal-Admin authentication (default: $METALCTL_HMAC)"
    )
    token: SecretStr | None = Field(None, description="Bearer token, when no HMAC key is set")
    request_timeout_seconds: float = Field(10.0, gt=0, description="One metal-api request")
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )
    firewall_recheck_seconds: float = Field(
        1.0, gt=0, description="First look again at a firewall that has not phoned home yet"
    )
    firewall_recheck_max_seconds: float = Field(
        30.0, gt=0, description="Longest wait between looks at a firewall not yet running"
    )
    workload_qps: float = Field(
        20.0,
        gt=0,
        description="Requests per second to one workload cluster (burst: twice as many)",
    )
    node_watch_seconds: int = Field(
        300, ge=1, description="Server-side duration of one watch of a workload cluster's Nodes"
    )


class MetalStackSettings(ServiceSettings):
    metalstack: MetalStackTuning = MetalStackTuning()

    @model_validator(mode="after")
    def _upstream_names(self) -> MetalStackSettings:
        tuning = self.metalstack
        if not tuning.url:
            tuning.url = os.environ.get("METALCTL_URL", "http://127.0.0.1:8080")
        if tuning.hmac is None and os.environ.get("METALCTL_HMAC"):
            tuning.hmac = SecretStr(os.environ["METALCTL_HMAC"])
        return self
