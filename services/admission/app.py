"""The admission routes: one path per webhook of ``deploy/webhooks``, each a thin translator."""

from __future__ import annotations

from dataclasses import dataclass

from services.admission import handlers
from shared.webhook import AdmissionRequest, Review, Verdict

CLUSTER_PATH = "/validate-cluster"
CLUSTER_TEMPLATE_PATH = "/validate-cluster-template"


@dataclass(frozen=True)
class Deps:
    api: handlers.AdmissionApi


def routes(deps: Deps) -> dict[str, Review]:
    async def on_cluster(request: AdmissionRequest) -> Verdict:
        return await handlers.review_cluster(request, api=deps.api)

    async def on_cluster_template(request: AdmissionRequest) -> Verdict:
        return await handlers.review_cluster_template(request, api=deps.api)

    return {CLUSTER_PATH: on_cluster, CLUSTER_TEMPLATE_PATH: on_cluster_template}
