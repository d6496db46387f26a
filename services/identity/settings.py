"""Identity settings: the shared ones plus ``CAPIBUS_IDENTITY__*``.

Whether the service acts at all is the deployment-wide ``CAPIBUS_AZIMUTH__OIDC_ENABLED``, not a
setting of its own: the helm service must agree on it to know whether to wait for identity.
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
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )

    @field_validator("oidc_client_name_template", "platform_name_template")
    @classmethod
    def _names_the_cluster(cls, template: str) -> str:
        # Fail at start, not on the first Cluster: a constant name would make every Cluster
        # fight over one object.
        try:
            one, other = template.format(cluster_name="a"), template.format(cluster_name="b")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{cluster_name}} may be used: {exc!r}") from exc
        if one == other:
            raise ValueError("the template must contain {cluster_name}")
        return template


class IdentitySettings(ServiceSettings):
    identity: IdentityTuning = IdentityTuning()
