"""The FastAPI application of CB-Ladybug's REST API: routes, error rendering, OpenAPI.

Why FastAPI (aiohttp is already a dependency, and runs the stand-ins): upstream publishes a
Swagger document, and its counterpart here should be **generated from the very pydantic
models the handlers parse requests into and serialise responses from** (``models``), so it
cannot drift from the code. FastAPI does that from the handlers' signatures, with the
security schemes and per-route error models, where aiohttp would need a second description
of every route. The document is served at upstream's Swagger path (``/swagger/doc.json``,
under the base path too) and at FastAPI's ``/openapi.json``; the interactive page is at
``<base>/swagger/index.html``.

Errors: every failure is upstream's ``Status`` body with the code as its ``code``: an
``ApiError`` as raised; ``InvalidRequest`` (upstream's validation) 400; a request body that
does not bind (wrong JSON types) 400, as Echo's ``Bind``; a ``TemporaryError`` (Tumblebug or
the API server unreachable) 503 with the reason; any other ``PermanentError`` 500.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from services.ladybug import logic
from services.ladybug.api import routes
from services.ladybug.api.errors import ApiError
from services.ladybug.api.ports import Deps
from shared.errors import PermanentError, TemporaryError

log = logging.getLogger(__name__)

SERVICE = "ladybug-api"
TITLE = "CB-Ladybug REST API (capibus)"
VERSION = "0.7.0"

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def create_app(deps: Deps, *, lifespan: Lifespan | None = None) -> FastAPI:
    """The app serving ``deps``; ``lifespan`` (the composition root's) closes the clients."""
    base = deps.base_path
    app = FastAPI(
        title=TITLE,
        version=VERSION,
        description="CB-Ladybug's API (cloud-barista/cb-ladybug) served by capibus: "
        "clusters are LadybugCluster resources; see docs/ladybug.md.",
        docs_url=f"{base}/swagger/index.html",
        redoc_url=None,
        openapi_url="/openapi.json",
        separate_input_output_schemas=False,
        lifespan=lifespan,
    )
    app.state.deps = deps
    app.include_router(routes.build(base))
    app.openapi = functools.partial(_document, app)  # type: ignore[method-assign]
    _serve_document(app, [f"{base}/swagger/doc.json", "/swagger/doc.json"])
    _render_errors(app)
    return app


def _document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document without its 422 answers: a request that does not bind is a 400
    ``Status`` here, as upstream's (already declared on every route)."""
    if app.openapi_schema:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    app.openapi_schema = document
    return document


def _serve_document(app: FastAPI, paths: list[str]) -> None:
    async def document() -> dict[str, Any]:
        return app.openapi()

    for path in paths:
        app.add_api_route(path, document, methods=["GET"], include_in_schema=False)


def _status(code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(logic.status_body(code, message), status_code=code, headers=headers)


def _render_errors(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _status(exc.code, exc.message, exc.headers)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        return _status(400, str(exc))

    async def unbound(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _status(400, _bind_message(exc))

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        log.warning("unavailable: %s", exc)
        return _status(503, str(exc))

    async def refused(_: Request, exc: Exception) -> JSONResponse:
        log.warning("refused: %s", exc)
        return _status(500, str(exc))

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return _status(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(logic.InvalidRequest, invalid)
    app.add_exception_handler(RequestValidationError, unbound)
    app.add_exception_handler(TemporaryError, unavailable)
    app.add_exception_handler(PermanentError, refused)
    app.add_exception_handler(HTTPException, http_error)


def _bind_message(exc: RequestValidationError) -> str:
    """Echo's bind error, in pydantic's words: where and what."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts) or "Bad request"
