"""The Zenith adapter: SSH keypairs and the registrar's admin API.

A cluster's API server reaches the outside world through a Zenith tunnel. Before the tunnel
can exist the registrar must reserve a subdomain and bind it to the tunnel's public key
(``POST /admin/reserve``); the registrar then only lets that key use the subdomain.

Errors are translated at this boundary, like ``shared.kube``::

    RegistrarUnavailable (TemporaryError)   connection failure, timeout, 408, 429, 5xx
    RegistrarConflict    (PermanentError)   409: subdomain taken or key already bound
    PermanentError "ZenithRegistrarRejected"     any other 4xx
    PermanentError "ZenithRegistrarBadResponse"  a success without subdomain and fqdn

A 409 is permanent for the request that got it, but a caller retrying a reservation whose
response was lost gets one too; only the caller knows (from its Secret) whether that subdomain
is already its own.

Subdomains chosen here are 20 characters of ``[a-z][a-z0-9]*``: the registrar accepts
hyphens, but the identity operator's Platform schema does not, and a Zenith subdomain ends up
as a Platform service key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import string
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from shared.errors import PermanentError, TemporaryError, retry_after, transient_http_status
from shared.transport import http_transport

SUBDOMAIN_LENGTH = 20
_FIRST = string.ascii_lowercase
_REST = string.ascii_lowercase + string.digits


class RegistrarUnavailable(TemporaryError):
    """The registrar could not be reached or failed (timeout, connection error, 408, 429,
    5xx)."""


class RegistrarConflict(PermanentError):
    """The registrar refused with 409: the subdomain is taken or the key is already bound."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="ZenithReservationConflict")


@dataclass(frozen=True)
class KeyPair:
    """An Ed25519 keypair in OpenSSH formats; the private half never appears in a repr."""

    private_openssh: str = field(repr=False)
    public_openssh: str


@dataclass(frozen=True)
class Reservation:
    subdomain: str
    fqdn: str
    fingerprint: str


def generate_keypair() -> KeyPair:
    # Imported here: cryptography's primitives cost a helm process ~8 MiB of RSS, and only a
    # Cluster with Zenith on ever needs a key.
    from cryptography.hazmat.primitives import serialization as ser  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: PLC0415

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    return KeyPair(private_openssh=private.decode(), public_openssh=public.decode())


def fingerprint(public_openssh: str) -> str:
    """The SHA-256 fingerprint as ``ssh-keygen -l`` prints it, without ``SHA256:``."""
    parts = public_openssh.split()
    if len(parts) < 2:
        raise ValueError("not an OpenSSH public key")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error as exc:
        raise ValueError("not an OpenSSH public key") from exc
    return base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def random_subdomain() -> str:
    """A fresh subdomain matching ``^[a-z][a-z0-9]{19}$``."""
    rest = "".join(secrets.choice(_REST) for _ in range(SUBDOMAIN_LENGTH - 1))
    return secrets.choice(_FIRST) + rest


class Registrar:
    """Client of the registrar's admin API (``zenith.registrar_admin_url``)."""

    def __init__(
        self,
        admin_url: str,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=admin_url, timeout=timeout, transport=transport or http_transport()
        )

    async def __aenter__(self) -> Registrar:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def reserve(self, public_key: str, subdomain: str | None = None) -> Reservation:
        """Reserve ``subdomain`` (or let the registrar pick one) for ``public_key``."""
        body: dict[str, Any] = {"public_keys": [public_key]}
        if subdomain is not None:
            body["subdomain"] = subdomain
        try:
            response = await self._http.post("/admin/reserve", json=body)
        except httpx.HTTPError as exc:
            raise RegistrarUnavailable(f"zenith registrar: {exc!r}") from exc
        _raise_for_status(response)
        return _reservation(response, public_key)


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    code = response.status_code
    text = f"zenith registrar: {code} {_detail(response)}"
    if code == 409:
        raise RegistrarConflict(text)
    if transient_http_status(code):
        raise RegistrarUnavailable(text, delay=retry_after(response.headers.get("Retry-After")))
    raise PermanentError(text, reason="ZenithRegistrarRejected")


def _detail(response: httpx.Response) -> str:
    # The registrar is a FastAPI app: errors come as {"detail": ...}.
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else response.text[:500]


def _reservation(response: httpx.Response, public_key: str) -> Reservation:
    try:
        data = response.json()
        subdomain, fqdn = data["subdomain"], data["fqdn"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PermanentError(
            f"zenith registrar: unexpected reply {response.text[:200]!r}",
            reason="ZenithRegistrarBadResponse",
        ) from exc
    if not isinstance(subdomain, str) or not isinstance(fqdn, str) or not subdomain or not fqdn:
        raise PermanentError(
            "zenith registrar: reply without subdomain and fqdn",
            reason="ZenithRegistrarBadResponse",
        )
    return Reservation(
        subdomain=subdomain,
        fqdn=fqdn,
        fingerprint=str(data.get("fingerprint") or fingerprint(public_key)),
    )
