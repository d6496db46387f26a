"""Composition root of the admission service: an HTTPS server and a read-only API view.

Unlike the event-driven services it needs neither NATS nor Redis: the API server calls it
synchronously, and every replica answers any request (no partitions, no leases), so it scales
by adding replicas behind the Service.
"""

from __future__ import annotations

import asyncio

from services.admission import handlers
from services.admission.app import Deps, routes
from services.admission.lookups import KubeLookups
from services.admission.settings import AdmissionSettings
from shared.kube import KubeClient, KubeConfig
from shared.runtime import Infrastructure
from shared.webhook import WebhookServer

SERVICE = "admission"


def build(settings: AdmissionSettings, *, api: handlers.AdmissionApi) -> WebhookServer:
    webhook = settings.admission
    return WebhookServer(
        routes(Deps(api=api)),
        cert_file=webhook.cert_file,
        key_file=webhook.key_file,
        host=webhook.host,
        port=webhook.port,
        review_timeout=webhook.review_timeout_seconds,
    )


def connect(settings: AdmissionSettings) -> KubeLookups:
    config = KubeConfig.load(settings.kubeconfig)

    return KubeLookups(
        kube=KubeClient.from_config(
            config,
            qps=settings.kube_qps,
            burst=settings.kube_burst,
            max_in_flight=settings.kube_max_in_flight,
            # A lookup may not outlive the review that needs it.
            timeout=settings.admission.review_timeout_seconds,
            user_agent=f"capibus-{SERVICE}",
        )
    )


async def run(
    settings: AdmissionSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    """``infra`` is accepted so every root runs alike beside others, and not used: a review's
    lookups need a client whose every request times out with the review (``connect``)."""
    del infra
    lookups = connect(settings)
    try:
        await build(settings, api=lookups).serve(stop)
    finally:
        await lookups.aclose()
