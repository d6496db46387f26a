"""Stand-in for Zenith: the registrar's admin API and the operator's Reservation controller.

What the registrar and reservations do: ``docs/upstream.md`` §5.

- **Registrar.** ``POST /admin/reserve`` reserves a subdomain for a public key, exactly one
  per key and per subdomain (409 otherwise), in an in-memory registry; ``GET
  /admin/reservations`` lists it so tests can count reservations. Failure knobs answer 409 or
  500, always or for the first N requests, to exercise the caller's retry paths.
- **Reservation controller.** ``Pending``; the credential Secret (an OpenSSH Ed25519 key pair)
  is created when missing; the key is reserved; ``Ready`` with subdomain, fqdn and fingerprint
  in one write. It calls the registry in-process: one registry, so the failure knobs and the
  reservation count cover both capibus's HTTP calls and the tenant-side Reservations. A key
  that is already registered (a retry after a crash between reserve and the status write)
  reuses its reservation instead of wedging on 409. The spec is immutable upstream, so a Ready
  or Failed Reservation is never looked at again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import string
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.errors import KubeConflict, KubeNotFound
from shared.kube import KubeClient
from shared.resources import RESERVATION, SECRET
from standins.base import (
    Controller,
    Json,
    Knobs,
    env_float,
    fresh,
    key_of,
    phase_of,
    write_status,
)

log = logging.getLogger("standins.zenith")

SUBDOMAIN = re.compile(r"^[a-z][a-z0-9-]*?[a-z0-9]$")
MANAGER = "zenith-operator"


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else None


@dataclass
class ZenithKnobs(Knobs):
    base_domain: str = field(
        default_factory=lambda: os.environ.get("STANDIN_ZENITH_BASE_DOMAIN", "apps.example.test")
    )
    registrar_fail: str = field(
        default_factory=lambda: os.environ.get("STANDIN_ZENITH_REGISTRAR_FAIL", "").strip()
    )
    registrar_fail_times: int | None = field(
        default_factory=lambda: _env_int("STANDIN_ZENITH_REGISTRAR_FAIL_TIMES")
    )
    registrar_host: str = field(
        default_factory=lambda: os.environ.get("STANDIN_ZENITH_REGISTRAR_HOST", "127.0.0.1")
    )
    registrar_port: int = field(
        default_factory=lambda: _env_int("STANDIN_ZENITH_REGISTRAR_PORT") or 0
    )
    retry_delay: float = field(
        default_factory=lambda: env_float("STANDIN_ZENITH_RETRY_SECONDS", 2.0)
    )


class RegistrarError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status} {detail}")
        self.status = status
        self.detail = detail


def fingerprint(public_key: str) -> str:
    """SHA-256 of the key blob, base64 without padding (what ``ssh-keygen -l`` prints)."""
    parts = public_key.split()
    if len(parts) < 2:
        raise ValueError("not an OpenSSH public key")
    blob = base64.b64decode(parts[1], validate=True)
    return base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def generate_keypair() -> tuple[str, str]:
    """An OpenSSH Ed25519 key pair: (private key PEM, public key line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private.decode(), public.decode()


def random_subdomain() -> str:
    rest = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(19))
    return secrets.choice(string.ascii_lowercase) + rest


def requested_keys(body: Json) -> list[str]:
    """``public_key`` or the legacy ``public_keys``; no key at all asks for a token."""
    if body.get("public_key"):
        return [str(body["public_key"])]
    keys = body.get("public_keys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise RegistrarError(422, "public_keys must be a list of strings")
    return list(keys)


@dataclass
class Registrar:
    """The registrar's in-memory registry and its failure knobs."""

    base_domain: str = "apps.example.test"
    fail: str = ""
    fail_times: int | None = None
    requests: int = 0
    _by_subdomain: dict[str, Json] = field(default_factory=dict)
    _by_fingerprint: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_knobs(cls, knobs: ZenithKnobs) -> Registrar:
        return cls(knobs.base_domain, knobs.registrar_fail, knobs.registrar_fail_times)

    def reserve(self, body: Json) -> Json:
        """The ``/admin/reserve`` answer for ``body``; ``RegistrarError`` carries the status."""
        self.requests += 1
        self._maybe_fail()
        keys = requested_keys(body)
        try:
            fingerprints = [fingerprint(k) for k in keys]
        except ValueError as exc:
            raise RegistrarError(422, f"invalid public key: {exc}") from exc
        if any(f in self._by_fingerprint for f in fingerprints):
            raise RegistrarError(409, "public key is already associated with a subdomain")
        subdomain = str(body.get("subdomain") or self._unused_subdomain())
        if len(subdomain) > 63 or not SUBDOMAIN.match(subdomain):
            raise RegistrarError(422, f"invalid subdomain {subdomain!r}")
        if subdomain in self._by_subdomain:
            raise RegistrarError(409, f"subdomain {subdomain} is already reserved")
        entry = {
            "subdomain": subdomain,
            "fqdn": f"{subdomain}.{self.base_domain}",
            "token": None if keys else secrets.token_urlsafe(32),
            "fingerprint": fingerprints[0] if fingerprints else None,
            "fingerprints": fingerprints,
        }
        self._by_subdomain[subdomain] = entry
        self._by_fingerprint.update(dict.fromkeys(fingerprints, subdomain))
        return dict(entry)

    def lookup(self, key_fingerprint: str) -> Json | None:
        subdomain = self._by_fingerprint.get(key_fingerprint)
        return dict(self._by_subdomain[subdomain]) if subdomain else None

    def reservations(self) -> list[Json]:
        return [dict(entry) for entry in self._by_subdomain.values()]

    def _maybe_fail(self) -> None:
        status = self.fail or ("500" if self.fail_times else "")
        if not status or (self.fail_times is not None and self.requests > self.fail_times):
            return
        raise RegistrarError(
            int(status), f"failing on purpose (STANDIN_ZENITH_REGISTRAR_FAIL={status})"
        )

    def _unused_subdomain(self) -> str:
        while (subdomain := random_subdomain()) in self._by_subdomain:
            continue
        return subdomain


class RegistrarServer:
    """The registrar's admin API over HTTP (aiohttp), for capibus's own reservations."""

    def __init__(self, registrar: Registrar, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registrar = registrar
        self.host = host
        self.port = port
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/admin/reserve", self._reserve)
        app.router.add_get("/admin/reservations", self._reservations)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # Binding our own socket is how port 0 reveals the port it got.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://{self.host}:{sock.getsockname()[1]}"
        log.info("registrar listening on %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _reserve(self, request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"detail": "body is not JSON"}, status=422)
        if not isinstance(body, dict):
            return web.json_response({"detail": "body must be an object"}, status=422)
        try:
            result = self.registrar.reserve(body)
        except RegistrarError as exc:
            log.info("registrar: POST /admin/reserve -> %s %s", exc.status, exc.detail)
            return web.json_response({"detail": exc.detail}, status=exc.status)
        log.info("registrar: reserved %s", result["fqdn"])
        return web.json_response(result)

    async def _reservations(self, request: web.Request) -> web.Response:
        return web.json_response(self.registrar.reservations())


async def start_registrar(registrar: Registrar | None = None) -> RegistrarServer:
    """Serve ``registrar`` (by default one built from the environment's knobs)."""
    knobs = ZenithKnobs()
    server = RegistrarServer(
        registrar or Registrar.from_knobs(knobs),
        host=knobs.registrar_host,
        port=knobs.registrar_port,
    )
    await server.start()
    return server


class Reservations:
    """The zenith operator's Reservation controller."""

    def __init__(
        self,
        kube: KubeClient,
        registrar: Registrar,
        *,
        knobs: ZenithKnobs | None = None,
        namespace: str | None = None,
    ) -> None:
        self.kube = kube
        self.registrar = registrar
        self.knobs = knobs or ZenithKnobs()
        self.controller = Controller(
            kube, RESERVATION, self.reconcile, namespace=namespace, name="zenith.reservations"
        )

    async def reconcile(self, seen: Json) -> None:
        reservation = await fresh(self.kube, RESERVATION, seen)
        key = key_of(reservation)
        if reservation["metadata"].get("deletionTimestamp"):
            return
        if phase_of(reservation) in ("Ready", "Failed"):
            return
        if phase_of(reservation) == "Unknown":
            reservation = await write_status(
                self.kube, RESERVATION, reservation, {"phase": "Pending"}
            )
            log.info("reservation %s: Pending", key)
            await self.knobs.step()
        try:
            result = self._reserve(await self._public_key(reservation))
        except RegistrarError as exc:
            if exc.status == 422:
                log.warning("reservation %s: %s; left Pending", key, exc.detail)
                return
            delay = self.knobs.retry_delay
            log.info("reservation %s: registrar said %s; again in %ss", key, exc, delay)
            self.controller.requeue(reservation, delay)
            return
        await self.knobs.step()
        status = {
            "phase": "Ready",
            "subdomain": result["subdomain"],
            "fqdn": result["fqdn"],
            "fingerprint": result["fingerprints"][0],
        }
        await write_status(self.kube, RESERVATION, reservation, status)
        log.info("reservation %s: Ready, %s", key, result["fqdn"])

    def _reserve(self, public_key: str) -> Json:
        try:
            existing = self.registrar.lookup(fingerprint(public_key))
        except ValueError as exc:
            raise RegistrarError(422, f"invalid public key in secret: {exc}") from exc
        return existing or self.registrar.reserve({"public_keys": [public_key]})

    async def _public_key(self, reservation: Json) -> str:
        """The public key from the credential Secret, created with a fresh key pair if missing."""
        spec = reservation.get("spec") or {}
        namespace = reservation["metadata"]["namespace"]
        name = str(spec["credentialSecretName"])
        public_name = str(spec.get("credentialSecretPublicKeyName") or "ssh-publickey")
        try:
            secret = await self.kube.get(SECRET, namespace, name)
        except KubeNotFound:
            try:
                return await self._create_secret(reservation, name, public_name)
            except KubeConflict:
                secret = await self.kube.get(SECRET, namespace, name)  # created meanwhile
        encoded = (secret.get("data") or {}).get(public_name)
        if not encoded:
            raise RegistrarError(422, f"secret {name} has no {public_name}")
        return base64.b64decode(encoded).decode().strip()

    async def _create_secret(self, reservation: Json, name: str, public_name: str) -> str:
        meta = reservation["metadata"]
        spec = reservation.get("spec") or {}
        private_name = str(spec.get("credentialSecretPrivateKeyName") or "ssh-privatekey")
        private_key, public_key = generate_keypair()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    "app.kubernetes.io/managed-by": MANAGER,
                    "zenith.stackhpc.com/reservation": meta["name"],
                },
                "ownerReferences": [
                    {
                        "apiVersion": RESERVATION.api_version,
                        "kind": RESERVATION.kind,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "stringData": {private_name: private_key, public_name: public_key},
        }
        await self.kube.create(SECRET, secret)
        log.info("reservation %s: created key pair secret %s", key_of(reservation), name)
        return public_key


def controllers(
    kube: KubeClient, *, registrar: Registrar | None = None, namespace: str | None = None
) -> list[Controller]:
    """The Reservation controller, reserving in ``registrar`` (by default a private one)."""
    knobs = ZenithKnobs()
    registry = registrar or Registrar.from_knobs(knobs)
    return [Reservations(kube, registry, knobs=knobs, namespace=namespace).controller]
