"""Identity settings: the shared ones plus ``CAPIBUS_IDENTITY__*``.

What the service does follows the deployment-wide switches, not settings of its own: with
``CAPIBUS_AZIMUTH__OIDC_ENABLED`` it gives Clusters OIDC (the helm service must agree, to know
whether to wait for identity); with it or ``CAPIBUS_AZIMUTH__ZENITH_ENABLED`` it keeps the
cluster and app Platforms that Zenith's service authentication relies on.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from shared.settings import ServiceSettings


class IdentityTuning(BaseModel):
    field_manager: str = Field(
        "capibus-identity", min_length=1, description="Server-side apply field manager"
    )
    oidc_client_name_template: str = Field(
        "kube-{cluster_name}", description="Name of a Cluster's OIDCClient ({cluster_name})"
    )
    platform_name_template: str = Field(
        "kube-{cluster_name}", description="Name of a Cluster's Platform ({cluster_name})"
    )
    app_platform_name_template: str = Field(
        "kubeapp-{app_name}", description="Name of a Kubernetes app's Platform ({app_name})"
    )
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )

    @field_validator("oidc_client_name_template", "platform_name_template")
    @classmethod
    def _names_the_cluster(cls, template: str) -> str:
        return _naming(template, "cluster_name")

    @field_validator("app_platform_name_template")
    @classmethod
    def _names_the_app(cls, template: str) -> str:
        return _naming(template, "app_name")


def _naming(template: str, key: str) -> str:
    # Fail at start, not on the first object: a constant name would make every Cluster (or
    # app) fight over one object.
    try:
        one, other = template.format(**{key: "a"}), template.format(**{key: "b"})
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"only {{{key}}} may be used: {exc!r}") from exc
    if one == other:
        raise ValueError(f"the template must contain {{{key}}}")
    return template


class IdentitySettings(ServiceSettings):
    identity: IdentityTuning = IdentityTuning()
