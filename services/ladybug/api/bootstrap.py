"""Composition root of the Ladybug REST API: real clients in production, fakes in tests.

``dependencies`` builds ``Deps`` from settings and the clients it is handed (tests hand it a
fake Kubernetes API and a fake Tumblebug); ``build`` makes the real clients, and an app whose
lifespan closes them. The API has no bus consumer: it reads and writes LadybugClusters and
waits on their watch, so it needs neither NATS nor Redis.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.ladybug.api.app import SERVICE, create_app
from services.ladybug.api.ports import Credentials, Deps, KnownNamespaces, KubeApi, Tumblebug
from services.ladybug.api.settings import LadybugApiSettings
from shared.runtime import kube_client
from shared.tumblebug import TumblebugClient


class NoCredentials(RuntimeError):
    """The API would be open: no token and no user name with password are configured."""


def credentials(settings: LadybugApiSettings) -> Credentials:
    tuning = settings.ladybug
    found = Credentials(
        token=tuning.api_token.get_secret_value() if tuning.api_token else None,
        username=tuning.api_username or None,
        password=tuning.api_password.get_secret_value() if tuning.api_password else None,
    )
    if not found.configured:
        raise NoCredentials(
            "set CAPIBUS_LADYBUG__API_TOKEN, or CAPIBUS_LADYBUG__API_USERNAME and "
            "CAPIBUS_LADYBUG__API_PASSWORD: the Ladybug API is never open"
        )
    return found


def dependencies(
    settings: LadybugApiSettings,
    *,
    kube: KubeApi,
    tumblebug: Tumblebug,
    rng: random.Random | None = None,
) -> Deps:
    tuning = settings.ladybug
    return Deps(
        kube=kube,
        tumblebug=tumblebug,
        credentials=credentials(settings),
        namespace=tuning.namespace,
        base_path=tuning.base_path,
        wait_timeout=tuning.wait_timeout_seconds,
        rng=rng or random.SystemRandom(),
        namespaces=KnownNamespaces(tuning.namespace_known_seconds),
    )


def tumblebug_client(settings: LadybugApiSettings) -> TumblebugClient:
    tuning = settings.ladybug
    password = tuning.tumblebug_password
    return TumblebugClient(
        tuning.tumblebug_url,
        tuning.tumblebug_username,
        password.get_secret_value() if password else "",
        tuning.tumblebug_timeout_seconds,
    )


def build(settings: LadybugApiSettings) -> FastAPI:
    """The app with real clients, closed when the server stops."""
    kube = kube_client(settings, service=SERVICE)
    tumblebug = tumblebug_client(settings)
    deps = dependencies(settings, kube=kube, tumblebug=tumblebug)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await tumblebug.aclose()
            await kube.aclose()

    return create_app(deps, lifespan=lifespan)
