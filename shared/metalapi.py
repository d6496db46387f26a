"""The metal-api adapter: the only code that speaks to metal-stack's metal-api.

A metal-stack cluster needs four things from metal-api: a private network carved from the
partition's private super network, an IP for the control plane, machines, and a firewall
(a machine allocated with a firewall image). The routes and JSON names are metal-api's own
(``cmd/metal-api/internal/service/{network,ip,machine,firewall}-service.go`` and
``service/v1/*.go``); the bodies callers pass or get back are metal-api JSON, untouched, so a
reader can hold them against the swagger. ``MetalApi`` is the Protocol services depend on.

**Authentication.** With an HMAC key every request carries fresh ``Metal-Admin`` headers, as
``metal-stack/security`` ``mac.go`` (``HMACAuth.AuthHeaders``) builds them: ``X-Date`` is the
time as RFC 3339 UTC with whole seconds (Go's ``time.RFC3339``), ``X-Data-Salt`` 24 random
ASCII letters, and ``Authorization: Metal-Admin <hex HMAC-SHA256(key, X-Date ‖ METHOD ‖
salt)>``, the three strings concatenated without separators. The body is not signed. The
server rejects a date older than its lifetime (15 s by default), so the clock matters.
Without a key, a token is sent as ``Authorization: Bearer <token>``.

**Errors** are translated at this boundary; a service never sees httpx::

    MetalApiError (CapibusError)                    .status, .message (metal-api's own words)
    ├── MetalApiUnavailable (TemporaryError)        connect error, timeout, 408, 429, 5xx,
    │   │                                           a success whose body is not JSON
    │   └── MetalApiUnauthorized                    401/403: the HMAC key or the clock
    └── MetalApiRefused (PermanentError)            any other 4xx, reason "MetalApiRefused"
        ├── MetalApiNotFound                        404
        ├── MetalApiConflict                        409
        └── MetalApiUnprocessable                   422: metal-api's answer for most refusals

A refused signature is temporary: what heals it is outside the request (the clock catching
up, the key corrected and the service restarted), and the work must still be there then,
so the message waits, retried with capped backoff, rather than becoming a dead letter.

``str(error)`` names the method, path, status and metal-api's ``message``; ``.message`` is
metal-api's ``message`` alone (or the transport failure), fit for a condition. A success
without a JSON body is counted as unavailable: a proxy answering in metal-api's place heals,
and a permanent refusal would fail a cluster for a glitch.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol

import httpx

from shared.errors import (
    CapibusError,
    PermanentError,
    TemporaryError,
    retry_after,
    transient_http_status,
)
from shared.transport import http_transport

Json = dict[str, Any]

AUTH_TYPE = "Metal-Admin"
SALT_LENGTH = 24
REFUSED = "MetalApiRefused"


class MetalApiError(CapibusError):
    """Base of every metal-api failure; ``status`` is the HTTP status when there was one."""

    def __init__(self, text: str, *, status: int | None = None, message: str = "") -> None:
        super().__init__(text)
        self.status = status
        self.message = message or text


class MetalApiUnavailable(TemporaryError, MetalApiError):
    """metal-api could not be reached, timed out, or failed (408, 429, 5xx)."""

    def __init__(
        self,
        text: str,
        *,
        status: int | None = None,
        message: str = "",
        delay: float | None = None,
    ) -> None:
        TemporaryError.__init__(self, text, delay=delay)
        self.status = status
        self.message = message or text


class MetalApiRefused(PermanentError, MetalApiError):
    """metal-api refused the request (a 4xx): the same request will be refused again."""

    def __init__(self, text: str, *, status: int | None = None, message: str = "") -> None:
        PermanentError.__init__(self, text, reason=REFUSED)
        self.status = status
        self.message = message or text


class MetalApiNotFound(MetalApiRefused):
    """404: no such network, IP, machine or firewall."""


class MetalApiConflict(MetalApiRefused):
    """409: e.g. the specific IP asked for is already allocated."""


class MetalApiUnprocessable(MetalApiRefused):
    """422: metal-api's answer to invalid requests and unmet rules (a network still in use,
    no machine available)."""


class MetalApiUnauthorized(MetalApiUnavailable):
    """401/403: metal-api did not accept our credentials (the key, or a clock out of step)."""


@dataclass(frozen=True)
class MetalApiConfig:
    url: str
    hmac: str | None = None
    token: str | None = None
    timeout: float = 10.0


def hmac_headers(
    key: str, method: str, *, now: datetime | None = None, salt: str | None = None
) -> dict[str, str]:
    """The ``Metal-Admin`` headers for one request (see the module docstring)."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if salt is None:
        salt = "".join(secrets.choice(string.ascii_letters) for _ in range(SALT_LENGTH))
    mac = hmac.new(key.encode(), (stamp + method.upper() + salt).encode(), hashlib.sha256)
    return {
        "Authorization": f"{AUTH_TYPE} {mac.hexdigest()}",
        "X-Date": stamp,
        "X-Data-Salt": salt,
    }


class MetalApi(Protocol):
    """What services ask of metal-api; ``MetalApiClient`` is the real one."""

    async def allocate_network(
        self,
        *,
        name: str,
        description: str,
        partition_id: str,
        project_id: str,
        labels: Mapping[str, str],
    ) -> Json: ...

    async def find_networks(
        self,
        *,
        id: str | None = None,  # noqa: A002 (metal-api's field name)
        project_id: str | None = None,
        partition_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Json]: ...

    async def free_network(self, network_id: str) -> None: ...

    async def allocate_ip(
        self,
        *,
        network_id: str,
        project_id: str,
        name: str,
        description: str = "",
        tags: Sequence[str] = (),
        ip: str | None = None,
        static: bool = False,
    ) -> Json: ...

    async def find_ips(
        self,
        *,
        project_id: str | None = None,
        network_id: str | None = None,
        ipaddress: str | None = None,
        tags: Sequence[str] = (),
    ) -> list[Json]: ...

    async def free_ip(self, ip: str) -> None: ...

    async def allocate_machine(self, request: Json) -> Json: ...

    async def get_machine(self, machine_id: str) -> Json: ...

    async def find_machines(
        self,
        *,
        id: str | None = None,  # noqa: A002 (metal-api's field name)
        project_id: str | None = None,
        tags: Sequence[str] = (),
    ) -> list[Json]: ...

    async def free_machine(self, machine_id: str) -> Json: ...

    async def list_machines(self) -> list[Json]: ...

    async def allocate_firewall(self, request: Json) -> Json: ...

    async def get_firewall(self, firewall_id: str) -> Json: ...

    async def find_firewalls(
        self,
        *,
        id: str | None = None,  # noqa: A002 (metal-api's field name)
        project_id: str | None = None,
        tags: Sequence[str] = (),
    ) -> list[Json]: ...


class MetalApiClient:
    """metal-api over httpx; one instance per process, closed with ``aclose``."""

    def __init__(
        self, config: MetalApiConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        headers = {"Accept": "application/json"}
        if not config.hmac and config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._http = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            headers=headers,
            timeout=config.timeout,
            transport=transport or http_transport(),
        )

    async def __aenter__(self) -> MetalApiClient:
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

    # --- networks -------------------------------------------------------------------------

    async def allocate_network(
        self,
        *,
        name: str,
        description: str,
        partition_id: str,
        project_id: str,
        labels: Mapping[str, str],
    ) -> Json:
        body = {
            "name": name,
            "description": description,
            "partitionid": partition_id,
            "projectid": project_id,
            "labels": dict(labels),
            "shared": False,
        }
        return _object(await self._call("POST", "/v1/network/allocate", body))

    async def find_networks(
        self,
        *,
        id: str | None = None,  # noqa: A002 (metal-api's field name)
        project_id: str | None = None,
        partition_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Json]:
        body = _given(id=id, projectid=project_id, partitionid=partition_id)
        if labels:
            body["labels"] = dict(labels)
        return _list(await self._call("POST", "/v1/network/find", body))

    async def free_network(self, network_id: str) -> None:
        await self._call("POST", f"/v1/network/free/{network_id}")

    # --- IPs ------------------------------------------------------------------------------

    async def allocate_ip(
        self,
        *,
        network_id: str,
        project_id: str,
        name: str,
        description: str = "",
        tags: Sequence[str] = (),
        ip: str | None = None,
        static: bool = False,
    ) -> Json:
        body = {
            "networkid": network_id,
            "projectid": project_id,
            "name": name,
            "description": description,
            "tags": list(tags),
            "type": "static" if static else "ephemeral",
        }
        path = f"/v1/ip/allocate/{ip}" if ip else "/v1/ip/allocate"
        return _object(await self._call("POST", path, body))

    async def find_ips(
        self,
        *,
        project_id: str | None = None,
        network_id: str | None = None,
        ipaddress: str | None = None,
        tags: Sequence[str] = (),
    ) -> list[Json]:
        body = _given(projectid=project_id, networkid=network_id, ipaddress=ipaddress)
        if tags:
            body["tags"] = list(tags)
        return _list(await self._call("POST", "/v1/ip/find", body))

    async def free_ip(self, ip: str) -> None:
        await self._call("DELETE", f"/v1/ip/free/{ip}")

    # --- machines and firewalls -----------------------------------------------------------

    async def allocate_machine(self, request: Json) -> Json:
        return _object(await self._call("POST", "/v1/machine/allocate", request))

    async def get_machine(self, machine_id: str) -> Json:
        return _object(await self._call("GET", f"/v1/machine/{machine_id}"))

    async def find_machines(
        self,
        *,
        id: str | None = None,  # noqa: A002 (metal-api's field name)
        project_id: str | None = None,
        tags: Sequence[str] = (),
    ) -> list[Json]:
        body = _machine_query(id, project_id, tags)
        return _list(await self._call("POST", "/v1/machine/find", body))

    async def free_machine(self, machine_id: str) -> Json:
        return _object(await self._call("DELETE", f"/v1/machine/{machine_id}/free"))

    async def list_machines(self) -> list[Json]:
        return _list(await self._call("GET", "/v1/machine"))

    async def allocate_firewall(self, request: Json) -> Json:
        return _object(await self._call("POST", "/v1/firewall/allocate", request))

    async def get_firewall(self, firewall_id: str) -> Json:
        return _object(await self._call("GET", f"/v1/firewall/{firewall_id}"))

    async def find_firewalls(
        self,
        *,
        id: str | None = None,  # noqa: A002 (metal-api's field name)
        project_id: str | None = None,
        tags: Sequence[str] = (),
    ) -> list[Json]:
        body = _machine_query(id, project_id, tags)
        return _list(await self._call("POST", "/v1/firewall/find", body))

    # --- the wire -------------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: Json | None = None) -> Any:
        what = f"metal-api {method} {path}"
        headers = hmac_headers(self.config.hmac, method) if self.config.hmac else None
        try:
            response = await self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise MetalApiUnavailable(f"{what}: {exc!r}", message=repr(exc)) from exc
        _raise_for_status(response, what)
        try:
            return response.json()
        except ValueError as exc:
            text = f"{what}: {response.status_code} with a body that is not JSON"
            raise MetalApiUnavailable(f"{text}: {response.text[:200]!r}", message=text) from exc


def _given(**fields: str | None) -> Json:
    return {key: value for key, value in fields.items() if value is not None}


def _machine_query(machine_id: str | None, project_id: str | None, tags: Sequence[str]) -> Json:
    body = _given(id=machine_id, allocation_project=project_id)
    if tags:
        body["tags"] = list(tags)
    return body


def _object(value: Any) -> Json:
    if not isinstance(value, dict):
        raise MetalApiUnavailable(f"metal-api answered {type(value).__name__}, not an object")
    return value


def _list(value: Any) -> list[Json]:
    if not isinstance(value, list):
        raise MetalApiUnavailable(f"metal-api answered {type(value).__name__}, not a list")
    return value


def _raise_for_status(response: httpx.Response, what: str) -> None:
    if response.is_success:
        return
    code = response.status_code
    message = _message(response)
    text = f"{what}: {code} {message}"
    if transient_http_status(code):
        delay = retry_after(response.headers.get("Retry-After"))
        raise MetalApiUnavailable(text, status=code, message=message, delay=delay)
    if code in (401, 403):
        message += " (check the metal-api HMAC key or token, and this host's clock)"
        raise MetalApiUnauthorized(f"{what}: {code} {message}", status=code, message=message)
    refusal = _REFUSALS.get(code, MetalApiRefused)
    raise refusal(text, status=code, message=message)


_REFUSALS: dict[int, type[MetalApiRefused]] = {
    404: MetalApiNotFound,
    409: MetalApiConflict,
    422: MetalApiUnprocessable,
}


def _message(response: httpx.Response) -> str:
    # metal-api errors are httperrors.HTTPErrorResponse: {"statuscode": int, "message": str}.
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return response.text[:500] or response.reason_phrase
