"""The CB-Tumblebug adapter: the only code that speaks to Tumblebug's REST API.

CB-Ladybug asks Tumblebug for everything a cluster runs on: the connection configs and regions
it reads, the spec catalogue, the MCIR it gets or creates by deterministic names (vNet,
securityGroup, sshKey, image, spec), the MCIS with its VMs, and an NLB. The routes are the
ones cb-ladybug calls (``src/core/tumblebug/*.go`` of cloud-barista/cb-ladybug), served by
Tumblebug v0.7 (``src/api/rest/server/server.go`` of cloud-barista/cb-tumblebug); bodies are
Tumblebug JSON, untouched, so a reader can hold them against Tumblebug's swagger.
``Tumblebug`` is the Protocol services depend on; ``TumblebugClient`` the real one (httpx,
HTTP basic auth: upstream's ``BASIC_AUTH_USERNAME``/``BASIC_AUTH_PASSWORD``).

**Missing things.** Every ``get_*`` returns ``None`` when Tumblebug answers 404 (upstream reads
404 as "does not exist", and a level-triggered caller's next move is to create it), every
``delete_*`` returns ``False`` when there was nothing to delete, so both are idempotent. Any
other call answered 404 (adding a VM to an MCIS that is gone, controlling a missing MCIS)
raises ``TumblebugNotFound``. One quirk is absorbed here: Tumblebug v0.7 answers
``GET /ns/{ns}`` with **200** and ``{"message": "Failed to find the namespace …"}`` for a
namespace that does not exist, so a namespace without ``id`` counts as missing too.

**Errors** are translated at this boundary; a service never sees httpx::

    TumblebugError (CapibusError)                  .status, .message (Tumblebug's own words)
    ├── TumblebugUnavailable (TemporaryError)      connect error, timeout, 408, 429, 5xx,
    │   │                                          a success whose body is not a JSON object
    │   └── TumblebugUnauthorized                  401/403: the basic-auth credentials
    └── TumblebugRefused (PermanentError)          any other 4xx, reason "TumblebugRefused"
        └── TumblebugNotFound                      404, where "missing" is not an answer

Tumblebug answers many refusals with **500** (a DELETE of an MCIS that is not Terminated,
an MCIS request naming MCIR that does not exist), so a 5xx is ``TumblebugUnavailable``
(retrying may heal it: the MCIS may be Terminated by then) and callers that count attempts
read ``.status`` and ``.message`` to say what failed. Refused credentials are temporary, as in
``shared.metalapi``: what heals them (a corrected Secret, a restarted Tumblebug) is outside the
request, and failing a cluster for them would be wrong.

``.message`` is Tumblebug's ``message``, unwrapped: Tumblebug passes CB-Spider's errors on as a
``message`` whose text is itself JSON with a ``message`` (sometimes twice), and the innermost
text is the one a human can act on. ``str(error)`` adds the method, path and status.

**Timeouts.** Creating an MCIS, adding a VM, terminating and deleting are synchronous in
Tumblebug and take as long as the CSP does (minutes), so they get ``provision_timeout``; every
other call gets ``timeout``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, Protocol
from urllib.parse import quote

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

REFUSED = "TumblebugRefused"
#: The MCIR kinds, by the name Tumblebug's routes use.
McirType = Literal["vNet", "securityGroup", "sshKey", "image", "spec"]
#: What ``GET /ns/{ns}/control/mcis/{mcis}?action=`` can do.
ControlAction = Literal["terminate", "refine", "suspend", "resume", "reboot"]
#: How deep a ``message`` holding JSON with a ``message`` is unwrapped.
_MAX_NESTING = 5


class TumblebugError(CapibusError):
    """Base of every Tumblebug failure; ``status`` is the HTTP status when there was one."""

    def __init__(self, text: str, *, status: int | None = None, message: str = "") -> None:
        super().__init__(text)
        self.status = status
        self.message = message or text


class TumblebugUnavailable(TemporaryError, TumblebugError):
    """Tumblebug could not be reached, timed out, or failed (408, 429, 5xx)."""

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


class TumblebugUnauthorized(TumblebugUnavailable):
    """401/403: Tumblebug did not accept the basic-auth credentials."""


class TumblebugRefused(PermanentError, TumblebugError):
    """Tumblebug refused the request (a 4xx): the same request will be refused again."""

    def __init__(self, text: str, *, status: int | None = None, message: str = "") -> None:
        PermanentError.__init__(self, text, reason=REFUSED)
        self.status = status
        self.message = message or text


class TumblebugNotFound(TumblebugRefused):
    """404 from a call for which "missing" is not an answer (``get_*`` return ``None``)."""


# --------------------------------------------------------------------------------------------
# Reading Tumblebug's answers
# --------------------------------------------------------------------------------------------


def key_values(obj: Mapping[str, Any]) -> dict[str, str]:
    """A ``KeyValueInfoList`` (``[{key, value}]``, as regions and connections carry) as a dict."""
    pairs = obj.get("KeyValueInfoList") or obj.get("keyValueInfoList") or []
    return {
        str(pair.get("key", pair.get("Key", ""))): str(pair.get("value", pair.get("Value", "")))
        for pair in pairs
        if isinstance(pair, Mapping)
    }


def region_zone(region: Mapping[str, Any]) -> tuple[str, str]:
    """The ``Region`` and ``Zone`` of a ``GET /region/{name}`` answer (empty when absent)."""
    values = key_values(region)
    return values.get("Region", ""), values.get("Zone", "")


def spec_size(spec: Mapping[str, Any]) -> tuple[int, int]:
    """vCPUs and memory in MiB of a ``lookupSpec`` answer (Tumblebug sends both as strings;
    an unreadable value counts as 0, which fails every minimum)."""
    vcpu = spec.get("vcpu") or spec.get("VCpu") or {}
    count = vcpu.get("count", vcpu.get("Count", 0)) if isinstance(vcpu, Mapping) else 0
    memory = spec.get("mem", spec.get("Mem", 0))
    return _int(count), _int(memory)


def _int(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


# --------------------------------------------------------------------------------------------
# The port
# --------------------------------------------------------------------------------------------


class Tumblebug(Protocol):
    """What CB-Ladybug asks of Tumblebug; ``TumblebugClient`` is the real one."""

    async def get_namespace(self, namespace: str) -> Json | None: ...

    async def get_connection_config(self, name: str) -> Json | None: ...

    async def get_region(self, name: str) -> Json | None: ...

    async def lookup_spec(self, connection: str, csp_spec_name: str) -> Json | None: ...

    async def lookup_specs(self, connection: str) -> list[Json]: ...

    async def lookup_images(self, connection: str) -> list[Json]: ...

    async def get_resource(self, namespace: str, kind: McirType, name: str) -> Json | None: ...

    async def create_resource(self, namespace: str, kind: McirType, body: Json) -> Json: ...

    async def delete_resource(
        self, namespace: str, kind: McirType, name: str, *, connection: str
    ) -> bool: ...

    async def get_vnet(self, namespace: str, name: str) -> Json | None: ...

    async def create_vnet(self, namespace: str, body: Json) -> Json: ...

    async def get_security_group(self, namespace: str, name: str) -> Json | None: ...

    async def create_security_group(self, namespace: str, body: Json) -> Json: ...

    async def get_ssh_key(self, namespace: str, name: str) -> Json | None: ...

    async def create_ssh_key(self, namespace: str, body: Json) -> Json: ...

    async def get_image(self, namespace: str, name: str) -> Json | None: ...

    async def register_image(self, namespace: str, body: Json) -> Json: ...

    async def get_spec(self, namespace: str, name: str) -> Json | None: ...

    async def create_spec(self, namespace: str, body: Json) -> Json: ...

    async def get_mcis(self, namespace: str, mcis: str) -> Json | None: ...

    async def create_mcis(self, namespace: str, body: Json) -> Json: ...

    async def control_mcis(self, namespace: str, mcis: str, action: ControlAction) -> Json: ...

    async def delete_mcis(self, namespace: str, mcis: str) -> bool: ...

    async def get_vm(self, namespace: str, mcis: str, vm: str) -> Json | None: ...

    async def get_vm_ids(self, namespace: str, mcis: str, vm: str) -> Json | None: ...

    async def add_vm(self, namespace: str, mcis: str, body: Json) -> Json: ...

    async def delete_vm(self, namespace: str, mcis: str, vm: str) -> bool: ...

    async def get_nlb(self, namespace: str, mcis: str, name: str) -> Json | None: ...

    async def create_nlb(self, namespace: str, mcis: str, body: Json) -> Json: ...


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


class TumblebugClient:
    """Tumblebug over httpx; one instance per process, closed with ``aclose``.

    ``base_url`` includes Tumblebug's base path (``http://localhost:1323/tumblebug``, upstream's
    ``TUMBLEBUG_URL`` default).
    """

    def __init__(
        self,
        base_url: str,
        username: str = "default",
        password: str = "default",
        timeout: float = 30.0,
        *,
        provision_timeout: float = 900.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.provision_timeout = provision_timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            auth=httpx.BasicAuth(username, password),
            headers={"Accept": "application/json"},
            timeout=timeout,
            transport=transport or http_transport(),
        )

    async def __aenter__(self) -> TumblebugClient:
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

    # --- namespace, connections, regions, the spec catalogue --------------------------------

    async def get_namespace(self, namespace: str) -> Json | None:
        found = await self._get(f"/ns/{_q(namespace)}")
        # Tumblebug v0.7: 200 {"message": "Failed to find the namespace ..."} when missing.
        return found if found is not None and found.get("id") else None

    async def get_connection_config(self, name: str) -> Json | None:
        return await self._get(f"/connConfig/{_q(name)}")

    async def get_region(self, name: str) -> Json | None:
        return await self._get(f"/region/{_q(name)}")

    async def lookup_spec(self, connection: str, csp_spec_name: str) -> Json | None:
        body = {"connectionName": connection, "cspSpecName": csp_spec_name}
        return await self._get_by_post("/lookupSpec", body)

    async def lookup_specs(self, connection: str) -> list[Json]:
        answer = _object(await self._call("POST", "/lookupSpecs", {"connectionName": connection}))
        return _items(answer, "vmspec")

    async def lookup_images(self, connection: str) -> list[Json]:
        answer = _object(await self._call("POST", "/lookupImages", {"connectionName": connection}))
        return _items(answer, "image")

    # --- MCIR -------------------------------------------------------------------------------

    async def get_resource(self, namespace: str, kind: McirType, name: str) -> Json | None:
        return await self._get(f"/ns/{_q(namespace)}/resources/{kind}/{_q(name)}")

    async def create_resource(self, namespace: str, kind: McirType, body: Json) -> Json:
        path = f"/ns/{_q(namespace)}/resources/{kind}"
        return _object(await self._call("POST", path, body))

    async def delete_resource(
        self, namespace: str, kind: McirType, name: str, *, connection: str
    ) -> bool:
        path = f"/ns/{_q(namespace)}/resources/{kind}/{_q(name)}"
        return await self._delete(path, {"connectionName": connection})

    async def get_vnet(self, namespace: str, name: str) -> Json | None:
        return await self.get_resource(namespace, "vNet", name)

    async def create_vnet(self, namespace: str, body: Json) -> Json:
        return await self.create_resource(namespace, "vNet", body)

    async def get_security_group(self, namespace: str, name: str) -> Json | None:
        return await self.get_resource(namespace, "securityGroup", name)

    async def create_security_group(self, namespace: str, body: Json) -> Json:
        return await self.create_resource(namespace, "securityGroup", body)

    async def get_ssh_key(self, namespace: str, name: str) -> Json | None:
        return await self.get_resource(namespace, "sshKey", name)

    async def create_ssh_key(self, namespace: str, body: Json) -> Json:
        return await self.create_resource(namespace, "sshKey", body)

    async def get_image(self, namespace: str, name: str) -> Json | None:
        return await self.get_resource(namespace, "image", name)

    async def register_image(self, namespace: str, body: Json) -> Json:
        path = f"/ns/{_q(namespace)}/resources/image"
        answer = await self._call("POST", path, body, params={"action": "registerWithInfo"})
        return _object(answer)

    async def get_spec(self, namespace: str, name: str) -> Json | None:
        return await self.get_resource(namespace, "spec", name)

    async def create_spec(self, namespace: str, body: Json) -> Json:
        return await self.create_resource(namespace, "spec", body)

    # --- MCIS -------------------------------------------------------------------------------

    async def get_mcis(self, namespace: str, mcis: str) -> Json | None:
        return await self._get(f"/ns/{_q(namespace)}/mcis/{_q(mcis)}")

    async def create_mcis(self, namespace: str, body: Json) -> Json:
        path = f"/ns/{_q(namespace)}/mcis"
        return _object(await self._call("POST", path, body, slow=True))

    async def control_mcis(self, namespace: str, mcis: str, action: ControlAction) -> Json:
        path = f"/ns/{_q(namespace)}/control/mcis/{_q(mcis)}"
        answer = await self._call("GET", path, params={"action": action}, slow=True)
        return _object(answer)

    async def delete_mcis(self, namespace: str, mcis: str) -> bool:
        return await self._delete(f"/ns/{_q(namespace)}/mcis/{_q(mcis)}", slow=True)

    # --- VMs and the NLB --------------------------------------------------------------------

    async def get_vm(self, namespace: str, mcis: str, vm: str) -> Json | None:
        return await self._get(f"/ns/{_q(namespace)}/mcis/{_q(mcis)}/vm/{_q(vm)}")

    async def get_vm_ids(self, namespace: str, mcis: str, vm: str) -> Json | None:
        """``idInTb``, ``idInSp``, ``idInCsp`` and ``nameInCsp`` of a VM."""
        path = f"/ns/{_q(namespace)}/mcis/{_q(mcis)}/vm/{_q(vm)}"
        return await self._get(path, params={"option": "idsInDetail"})

    async def add_vm(self, namespace: str, mcis: str, body: Json) -> Json:
        path = f"/ns/{_q(namespace)}/mcis/{_q(mcis)}/vm"
        return _object(await self._call("POST", path, body, slow=True))

    async def delete_vm(self, namespace: str, mcis: str, vm: str) -> bool:
        path = f"/ns/{_q(namespace)}/mcis/{_q(mcis)}/vm/{_q(vm)}"
        return await self._delete(path, slow=True)

    async def get_nlb(self, namespace: str, mcis: str, name: str) -> Json | None:
        return await self._get(f"/ns/{_q(namespace)}/mcis/{_q(mcis)}/nlb/{_q(name)}")

    async def create_nlb(self, namespace: str, mcis: str, body: Json) -> Json:
        path = f"/ns/{_q(namespace)}/mcis/{_q(mcis)}/nlb"
        return _object(await self._call("POST", path, body, slow=True))

    # --- the wire ---------------------------------------------------------------------------

    async def _get(self, path: str, *, params: Mapping[str, str] | None = None) -> Json | None:
        try:
            return _object(await self._call("GET", path, params=params))
        except TumblebugNotFound:
            return None

    async def _get_by_post(self, path: str, body: Json) -> Json | None:
        try:
            return _object(await self._call("POST", path, body))
        except TumblebugNotFound:
            return None

    async def _delete(self, path: str, body: Json | None = None, *, slow: bool = False) -> bool:
        try:
            await self._call("DELETE", path, body, slow=slow)
        except TumblebugNotFound:
            return False
        return True

    async def _call(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        *,
        params: Mapping[str, str] | None = None,
        slow: bool = False,
    ) -> Any:
        what = f"Tumblebug {method} {path}"
        timeout = self.provision_timeout if slow else httpx.USE_CLIENT_DEFAULT
        try:
            response = await self._http.request(
                method, path, json=body, params=params, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise TumblebugUnavailable(f"{what}: {exc!r}", message=repr(exc)) from exc
        raise_for_status(response, what)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as exc:
            text = f"{what}: {response.status_code} with a body that is not JSON"
            raise TumblebugUnavailable(f"{text}: {response.text[:200]!r}", message=text) from exc


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _object(value: Any) -> Json:
    if not isinstance(value, dict):
        raise TumblebugUnavailable(f"Tumblebug answered {type(value).__name__}, not an object")
    return value


def _items(answer: Json, key: str) -> list[Json]:
    # Tumblebug omits (or nulls) an empty list.
    items = answer.get(key) or []
    if not isinstance(items, list):
        raise TumblebugUnavailable(f"Tumblebug answered {key} as {type(items).__name__}")
    return [item for item in items if isinstance(item, dict)]


def raise_for_status(response: httpx.Response, what: str, *, service: str = "Tumblebug") -> None:
    # Upstream treats every status above 300 as an error (``src/core/tumblebug/*.go``).
    code = response.status_code
    if 200 <= code < 300:
        return
    message = error_message(response.text) or response.reason_phrase
    text = f"{what}: {code} {message}"
    if transient_http_status(code):
        delay = retry_after(response.headers.get("Retry-After"))
        raise TumblebugUnavailable(text, status=code, message=message, delay=delay)
    if code in (401, 403):
        raise TumblebugUnauthorized(
            f"{text} (check the {service} username and password)", status=code, message=message
        )
    if code == 404:
        raise TumblebugNotFound(text, status=code, message=message)
    raise TumblebugRefused(text, status=code, message=message)


def error_message(body: str) -> str:
    """The innermost ``message`` of a Tumblebug error body, or the body itself (trimmed).

    ``{"message": "{\\"message\\":\\"Failed to find vNet x\\"}"}`` gives ``Failed to find
    vNet x``; a body that is not JSON, or JSON without a ``message``, gives its text.
    """
    text = body.strip()
    for _ in range(_MAX_NESTING):
        try:
            parsed = json.loads(text)
        except ValueError:
            break
        if not isinstance(parsed, dict) or "message" not in parsed:
            break
        inner = parsed["message"]
        text = inner.strip() if isinstance(inner, str) else json.dumps(inner)
    return text[:1000]
