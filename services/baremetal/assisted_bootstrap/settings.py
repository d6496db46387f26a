"""Bootstrap provider settings: the shared ones plus ``CAPIBUS_ASSISTEDBOOTSTRAP__*``.

The internal image URL rewrite follows upstream's process configuration
(``bootstrap/internal/controller/infraenv_controller.go`` of
openshift-assisted/cluster-api-provider-openshift-assisted v0.2.0): ``USE_INTERNAL_IMAGE_URL``,
``IMAGE_SERVICE_NAME`` (default ``assisted-image-service``) and ``IMAGE_SERVICE_NAMESPACE``
(failing that ``NAMESPACE``), read from the environment when the capibus names are not set,
so a Deployment written for upstream keeps working.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, model_validator

from shared.settings import ServiceSettings

DEFAULT_IMAGE_SERVICE = "assisted-image-service"


class AssistedBootstrapTuning(BaseModel):
    coalesce_seconds: float = Field(
        0.05, ge=0, description="Wait after an object's first event so a burst is one run"
    )
    use_internal_image_url: bool | None = Field(
        None,
        description="Rewrite ISO URLs to the image service's cluster address "
        "(default: $USE_INTERNAL_IMAGE_URL == 'true')",
    )
    image_service_name: str = Field(
        "",
        description="The image service's Service (default: $IMAGE_SERVICE_NAME or "
        f"{DEFAULT_IMAGE_SERVICE})",
    )
    image_service_namespace: str = Field(
        "", description="Its namespace (default: $IMAGE_SERVICE_NAMESPACE, else $NAMESPACE)"
    )


class AssistedBootstrapSettings(ServiceSettings):
    assistedbootstrap: AssistedBootstrapTuning = AssistedBootstrapTuning()

    @model_validator(mode="after")
    def _upstream_names(self) -> AssistedBootstrapSettings:
        tuning = self.assistedbootstrap
        if tuning.use_internal_image_url is None:
            tuning.use_internal_image_url = os.environ.get("USE_INTERNAL_IMAGE_URL") == "true"
        if not tuning.image_service_name:
            tuning.image_service_name = os.environ.get("IMAGE_SERVICE_NAME", DEFAULT_IMAGE_SERVICE)
        if not tuning.image_service_namespace:
            tuning.image_service_namespace = os.environ.get(
                "IMAGE_SERVICE_NAMESPACE", os.environ.get("NAMESPACE", "")
            )
        if tuning.use_internal_image_url and not tuning.image_service_namespace:
            raise ValueError(
                "the internal image URL needs the image service's namespace "
                "(CAPIBUS_ASSISTEDBOOTSTRAP__IMAGE_SERVICE_NAMESPACE or IMAGE_SERVICE_NAMESPACE)"
            )
        return self
