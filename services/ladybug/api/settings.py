"""Settings of the Ladybug REST API: the shared ones plus ``CAPIBUS_LADYBUG__*``.

Upstream's own environment names work as fallbacks, so a deployment configured for
CB-Ladybug keeps working: ``BASE_URL`` (the base path), ``TUMBLEBUG_URL``, and
``BASIC_AUTH_USERNAME``/``BASIC_AUTH_PASSWORD`` (the credentials *towards* Tumblebug, as
upstream uses them). The API's own credentials (upstream has none) are
``CAPIBUS_LADYBUG__API_TOKEN`` (bearer) and/or ``CAPIBUS_LADYBUG__API_USERNAME`` with
``CAPIBUS_LADYBUG__API_PASSWORD`` (basic); a Deployment takes them from a Secret. Without any
of them the API refuses to start: an open API would let anyone create VMs on the
deployment's clouds.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, SecretStr, model_validator

from shared.models.ladybug import DEFAULT_NAMESPACE
from shared.settings import ServiceSettings


class LadybugApiTuning(BaseModel):
    namespace: str = Field(
        DEFAULT_NAMESPACE, description="The Kubernetes namespace of every LadybugCluster"
    )
    api_host: str = Field("0.0.0.0", description="Address the REST API listens on")
    api_port: int = Field(1470, ge=0, le=65535, description="Port of the REST API (upstream's)")
    base_path: str = Field(
        "", description="Base path of every route (default: $BASE_URL or /ladybug)"
    )
    api_token: SecretStr | None = Field(None, description="Bearer token clients must present")
    api_username: str = Field("", description="Basic-auth user name clients may present")
    api_password: SecretStr | None = Field(None, description="Basic-auth password")
    wait_timeout_seconds: float = Field(
        1800.0,
        gt=0,
        description="Longest a blocking create, add, remove or delete waits for its outcome "
        "(then 504 with the phase reached; the work goes on)",
    )
    tumblebug_url: str = Field("", description="CB-Tumblebug base URL (default: $TUMBLEBUG_URL)")
    tumblebug_username: str = Field(
        "", description="Basic-auth user towards Tumblebug (default: $BASIC_AUTH_USERNAME)"
    )
    tumblebug_password: SecretStr | None = Field(
        None, description="Basic-auth password towards Tumblebug (default: $BASIC_AUTH_PASSWORD)"
    )
    tumblebug_timeout_seconds: float = Field(30.0, gt=0, description="One Tumblebug request")
    namespace_known_seconds: float = Field(
        5.0,
        ge=0,
        description="How long a Tumblebug namespace seen to exist is taken to exist without "
        "asking again (0: ask on every call, as upstream)",
    )


class LadybugApiSettings(ServiceSettings):
    ladybug: LadybugApiTuning = LadybugApiTuning()

    @model_validator(mode="after")
    def _upstream_names(self) -> LadybugApiSettings:
        tuning = self.ladybug
        env = os.environ
        tuning.base_path = (tuning.base_path or env.get("BASE_URL") or "/ladybug").rstrip("/")
        if not tuning.tumblebug_url:
            tuning.tumblebug_url = env.get("TUMBLEBUG_URL", "http://localhost:1323/tumblebug")
        if not tuning.tumblebug_username:
            tuning.tumblebug_username = env.get("BASIC_AUTH_USERNAME", "default")
        if tuning.tumblebug_password is None:
            tuning.tumblebug_password = SecretStr(env.get("BASIC_AUTH_PASSWORD", "default"))
        return self
