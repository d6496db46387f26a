"""An HTTPS server for Kubernetes validating admission webhooks (``AdmissionReview`` v1).

The API server POSTs an ``AdmissionReview`` to a path; this adapter decodes its ``request``
into an ``AdmissionRequest``, awaits the ``Review`` registered for the path, and encodes the
``Verdict`` as the ``response``. Services see neither aiohttp nor the wire format, and unit
tests call their review functions with hand-built ``AdmissionRequest`` values.

Design decisions:

* **A denial carries a code and a message.** The API server copies ``status.code`` and
  ``status.message`` into the error the client receives ("admission webhook ... denied the
  request: <message>"), so a rule's reason reaches ``kubectl`` and the Azimuth portal.
* **The server always answers with a verdict.** A review that raises, or that outlives
  ``review_timeout`` (set below the webhook's ``timeoutSeconds``), becomes a denial with a
  readable message instead of an HTTP error: with ``failurePolicy: Fail`` the request is
  refused either way, but this way the user learns why.
* **TLS from files, loaded once.** The API server verifies the serving certificate against the
  ``caBundle`` of the webhook configuration; a rotated certificate takes effect on restart
  (the Deployment is restarted when its certificate Secret changes, as upstream's chart does).
* **Large bodies are fine.** An UPDATE review carries the object twice; objects may reach
  etcd's 1.5 MiB limit, so the body limit is well above aiohttp's 1 MiB default.
* ``GET /healthz`` answers ``ok`` for probes, over the same TLS listener.
* A certificate that cannot be loaded, or a port that cannot be bound, raises
  ``PermanentError`` from ``start`` (the process exits; retrying cannot help). A body that is
  not an AdmissionReview gets HTTP 400: only a misconfigured caller sends one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from shared.errors import PermanentError

log = logging.getLogger(__name__)

Json = dict[str, Any]

API_VERSION = "admission.k8s.io/v1"
MAX_BODY_BYTES = 8 * 1024 * 1024

#: The ``reason`` a Kubernetes ``Status`` carries for the codes reviews use.
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class MalformedReview(ValueError):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview with a request."""


@dataclass(frozen=True)
class AdmissionRequest:
    """The parts of ``AdmissionReview.request`` a validating review needs."""

    uid: str
    operation: str  # CREATE, UPDATE, DELETE or CONNECT
    kind: str
    name: str
    namespace: str | None = None
    object: Json | None = None
    old_object: Json | None = None
    dry_run: bool = False
    username: str = ""

    @classmethod
    def from_review(cls, review: Any) -> AdmissionRequest:
        if not isinstance(review, dict) or review.get("apiVersion") != API_VERSION:
            raise MalformedReview(f"expected an {API_VERSION} AdmissionReview")
        request = review.get("request")
        if not isinstance(request, dict) or not request.get("uid"):
            raise MalformedReview("the AdmissionReview has no request uid")
        return cls(
            uid=str(request["uid"]),
            operation=str(request.get("operation", "")),
            kind=str((request.get("kind") or {}).get("kind", "")),
            name=str(request.get("name") or ""),
            namespace=request.get("namespace") or None,
            object=request.get("object"),
            old_object=request.get("oldObject"),
            dry_run=bool(request.get("dryRun", False)),
            username=str((request.get("userInfo") or {}).get("username", "")),
        )


@dataclass(frozen=True)
class Verdict:
    """A review's answer: allowed (maybe with warnings), or denied with a code and reason."""

    allowed: bool
    code: int = 200
    message: str = ""
    warnings: tuple[str, ...] = field(default=())

    @classmethod
    def allow(cls, *warnings: str) -> Verdict:
        return cls(allowed=True, warnings=warnings)

    @classmethod
    def deny(cls, message: str, *, code: int = 400) -> Verdict:
        return cls(allowed=False, code=code, message=message)


Review = Callable[[AdmissionRequest], Awaitable[Verdict]]


def encode(uid: str, verdict: Verdict) -> Json:
    """The ``AdmissionReview`` that answers request ``uid`` with ``verdict``."""
    response: Json = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "status": "Failure",
            "code": verdict.code,
            "reason": _REASONS.get(verdict.code, ""),
            "message": verdict.message,
        }
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


async def decide(review: Review, request: AdmissionRequest, *, within: float) -> Verdict:
    """``review(request)``, turning an overrun or a crash into a denial that says so."""
    try:
        async with asyncio.timeout(within):
            return await review(request)
    except TimeoutError:
        log.warning("review of %s %s timed out after %ss", request.kind, request.name, within)
        return Verdict.deny(
            f"admission review did not finish within {within:g}s; try again", code=504
        )
    except Exception as exc:
        log.exception("review of %s %s failed", request.kind, request.name)
        return Verdict.deny(f"admission review failed: {type(exc).__name__}", code=500)


def server_tls(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class WebhookServer:
    """Serves ``routes`` (path to review) and ``/healthz`` over HTTPS until stopped."""

    def __init__(
        self,
        routes: Mapping[str, Review],
        *,
        cert_file: Path,
        key_file: Path,
        host: str = "0.0.0.0",
        port: int = 8443,
        review_timeout: float = 8.0,
    ) -> None:
        self.routes = dict(routes)
        self.cert_file = cert_file
        self.key_file = key_file
        self.host = host
        self.port = port
        self.review_timeout = review_timeout
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/healthz", _healthz)
        for path, review in self.routes.items():
            app.router.add_post(path, self._handler(review))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            tls = server_tls(self.cert_file, self.key_file)
            await web.TCPSite(self._runner, self.host, self.port, ssl_context=tls).start()
        except (OSError, ssl.SSLError) as exc:
            await self.stop()
            raise PermanentError(f"cannot serve webhooks: {exc}", reason="WebhookServer") from exc
        log.info("admission webhooks on https://%s:%d %s", self.host, self.port, list(self.routes))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def serve(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    def _handler(self, review: Review) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(http: web.Request) -> web.Response:
            try:
                request = AdmissionRequest.from_review(await http.json())
            except (json.JSONDecodeError, UnicodeDecodeError, MalformedReview) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            verdict = await decide(review, request, within=self.review_timeout)
            _log_verdict(http.path, request, verdict)
            return web.json_response(encode(request.uid, verdict))

        return handle


def _log_verdict(path: str, request: AdmissionRequest, verdict: Verdict) -> None:
    target = f"{request.namespace}/{request.name}" if request.namespace else request.name
    if verdict.allowed:
        log.debug("%s %s %s: allowed", path, request.operation, target)
    else:
        log.info(
            "%s %s %s by %s: denied (%d) %s",
            path,
            request.operation,
            target,
            request.username,
            verdict.code,
            verdict.message,
        )


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")
