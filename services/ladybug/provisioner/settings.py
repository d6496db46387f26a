"""Ladybug provisioner settings: the shared ones plus ``CAPIBUS_LADYBUG__*``.

The section is ``ladybug``, shared with the REST API (both read ``CAPIBUS_LADYBUG__NAMESPACE``);
each ignores the other's keys. Tumblebug's address and credentials follow upstream's process
configuration (``TUMBLEBUG_URL``, ``SPIDER_URL``, ``BASIC_AUTH_USERNAME``,
``BASIC_AUTH_PASSWORD``, see
``conf/setup.env`` of cloud-barista/cb-ladybug) when the ``CAPIBUS_LADYBUG__TUMBLEBUG_*``
variables are not set, so a Deployment takes them from a Secret either way.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, SecretStr, model_validator

from shared.models.ladybug import DEFAULT_NAMESPACE
from shared.settings import ServiceSettings


class ProvisionerTuning(BaseModel):
    namespace: str = Field(
        DEFAULT_NAMESPACE, description="The Kubernetes namespace of every LadybugCluster"
    )
    tumblebug_url: str = Field("", description="Tumblebug base URL (default: $TUMBLEBUG_URL)")
    tumblebug_username: str = Field(
        "", description="Tumblebug basic-auth user (default: $BASIC_AUTH_USERNAME)"
    )
    tumblebug_password: SecretStr | None = Field(
        None, description="Tumblebug basic-auth password (default: $BASIC_AUTH_PASSWORD)"
    )
    spider_url: str = Field(
        "", description="CB-Spider base URL, for single-cloud CCM (default: $SPIDER_URL)"
    )
    tumblebug_timeout_seconds: float = Field(
        120.0, gt=0, description="One Tumblebug request (an MCIS create answers when VMs run)"
    )
    ssh_port: int = Field(22, ge=1, le=65535, description="The nodes' SSH port (upstream: 22)")
    ssh_timeout_seconds: float = Field(
        600.0, gt=0, description="One SSH command (bootstrap.sh installs packages)"
    )
    ssh_attempts: int = Field(
        15, ge=1, description="Tries to reach a new node over SSH before it counts as failed"
    )
    ssh_retry_seconds: float = Field(
        2.0, ge=0, description="Pause after a node refused or dropped the connection"
    )
    bootstrap_parallel: int = Field(
        10, ge=1, description="Nodes bootstrapped (and workers joined) at once per cluster"
    )
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )


class ProvisionerSettings(ServiceSettings):
    ladybug: ProvisionerTuning = ProvisionerTuning()

    @model_validator(mode="after")
    def _upstream_names(self) -> ProvisionerSettings:
        tuning = self.ladybug
        if not tuning.tumblebug_url:
            tuning.tumblebug_url = os.environ.get(
                "TUMBLEBUG_URL", "http://127.0.0.1:1323/tumblebug"
            )
        if not tuning.spider_url:
            tuning.spider_url = os.environ.get("SPIDER_URL", "http://127.0.0.1:1024/spider")
        if not tuning.tumblebug_username:
            tuning.tumblebug_username = os.environ.get("BASIC_AUTH_USERNAME", "default")
        if tuning.tumblebug_password is None:
            tuning.tumblebug_password = SecretStr(os.environ.get("BASIC_AUTH_PASSWORD", "default"))
        return self
