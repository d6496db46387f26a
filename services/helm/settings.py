"""Helm service settings: the shared ones plus ``CAPIBUS_HELM__*``.

Production defaults point at the real charts, as upstream's do
(azimuth-cloud/azimuth-capi-operator ``azimuth_capi/config.py``): the openstack-cluster chart
from azimuth-cloud's capi-helm-charts and the Zenith charts. Tests and the demo point
``chart`` and ``zenith.*_chart`` at the stand-in charts shipped in ``standins/charts``, which
render the same kinds, names and labels from the same values.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from services.helm.values import ValuesSettings
from shared.settings import ServiceSettings


class ChartSettings(BaseModel):
    name: str = Field(description="Chart name in the repository, or a local path")
    repo: str | None = Field(None, description="Chart repository URL (None for a local path)")
    version: str | None = Field(None, description="Chart version (None: the newest)")


class ZenithSettings(BaseModel):
    registrar_admin_url: str | None = Field(None, description="Registrar admin API, for tenants")
    registrar_admin_url_internal: str | None = Field(
        None, description="Registrar admin API as reached from capibus (default: the above)"
    )
    sshd_host: str | None = Field(None, description="Zenith SSHD host clients connect to")
    sshd_port: int = Field(22, description="Zenith SSHD port")
    base_domain: str | None = Field(
        None, description="Zenith base domain; lets a reservation interrupted by a crash resume"
    )
    apiserver_chart: ChartSettings = ChartSettings(
        name="zenith-apiserver", repo="https://azimuth-cloud.github.io/zenith", version="0.18.1"
    )
    operator_chart: ChartSettings = ChartSettings(
        name="zenith-operator", repo="https://azimuth-cloud.github.io/zenith", version="0.18.1"
    )
    apiserver_defaults: dict[str, Any] = Field(default_factory=dict)
    operator_defaults: dict[str, Any] = Field(default_factory=dict)
    monitoring_icon_url: str = (
        "https://raw.githubusercontent.com/cncf/artwork/master/projects/prometheus/icon/color/"
        "prometheus-icon-color.png"
    )
    timeout_seconds: float = Field(10.0, gt=0, description="Registrar request timeout")

    @model_validator(mode="after")
    def _both_or_neither(self) -> ZenithSettings:
        if bool(self.registrar_admin_url) != bool(self.sshd_host):
            raise ValueError("zenith.registrar_admin_url and zenith.sshd_host go together")
        return self

    @property
    def configured(self) -> bool:
        return bool(self.registrar_admin_url and self.sshd_host)

    @property
    def admin_url(self) -> str:
        return str(self.registrar_admin_url_internal or self.registrar_admin_url)


class HelmTuning(BaseModel):
    executable: str = Field("helm", description="helm binary")
    timeout: str = Field("1h", description="helm --timeout for install and upgrade")
    history_max: int = Field(10, ge=1, description="Release revisions helm keeps")
    # 8: a first install is one helm process of ~0.15 s CPU, most of the rest of its life
    # spent waiting for the API server (31 objects applied, or deleted by an uninstall), so
    # slots held in I/O, not cores, bound a burst; at 4 the fifth Cluster's uninstall waited
    # for a whole other one. Each process peaks near 55 MiB (bench/ANALYSIS.md, "s").
    max_concurrent: int = Field(12, ge=1, description="helm processes at once per replica")
    chart: ChartSettings = ChartSettings(
        name="openstack-cluster",
        repo="https://azimuth-cloud.github.io/capi-helm-charts",
        version="0.27.0",
    )
    values: ValuesSettings = ValuesSettings()
    zenith: ZenithSettings = ZenithSettings()
    field_manager: str = Field("capibus-helm", description="Server-side apply field manager")
    finalizer: str = Field("azimuth.stackhpc.com/finalizer", description="Cluster finalizer")
    delete_deadline_seconds: float = Field(
        1800, gt=0, description="After this long deleting, the status names what is stuck"
    )
    # 0 by default: the consumer waits this long before *every* run, the first event of a
    # Cluster included, and a helm run that finds its Cluster converged costs one GET, so a
    # window only delays installs and deletions (bench/ANALYSIS.md, "s: first step"). What
    # arrives while a run works still joins the next run as one batch.
    coalesce_seconds: float = Field(
        0.0, ge=0, description="Wait after a Cluster's first event so a burst joins one run"
    )


class HelmSettings(ServiceSettings):
    helm: HelmTuning = HelmTuning()
