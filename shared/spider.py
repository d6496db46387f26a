"""The CB-Spider adapter: ``POST /anycall``, the one Spider route CB-Ladybug calls.

A single-cloud Ladybug cluster runs its CSP's cloud controller manager, and preparing it needs
calls Tumblebug does not offer: tagging AWS resources, giving AWS instances an IAM instance
profile, and reading the connection's region or OpenStack credentials for the cloud config.
Upstream reaches CB-Spider's generic ``anycall`` for them (``src/core/spider/*.go`` and
``src/core/service/cloud_provider.go`` of cloud-barista/cb-ladybug, v0.7.2):

    POST {SPIDER_URL}/anycall
    {"connectionName": …, "reqInfo": {"fId": …, "iKeyValueList": [{"key", "value"}]}}
    → {"FID": …, "IKeyValueList": […], "OKeyValueList": [{"Key", "Value"}]}

Spider answers with Go's field names (no json tags), Ladybug sends lower-case ones (Go's
decoder ignores case either way), so both spellings are read here.

**Secrets in the answer.** ``getRegionInfo`` and ``getConnectionInfo`` answer with every value
encrypted the way Spider stores credentials: base64 of a 16-byte IV followed by the AES-256-CFB
ciphertext, under the key every Spider shares (``spider_key`` in the same upstream file).
``reveal`` undoes it (CFB is among ``cryptography``'s "decrepit" modes: Spider's choice, read
here, never used for anything of ours). The revealed OpenStack password is a credential:
callers keep it out of logs, statuses and the bus.

**Errors** are Tumblebug's (``shared.tumblebug``): Spider is the same kind of Echo server with
the same ``{"message"}`` bodies, and the provisioner treats both alike (unreachable → retry,
refused → the step fails with Spider's words). An anycall whose output says ``Result: false``
is refused too, with Spider's ``Reason``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import httpx

if TYPE_CHECKING:
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
    from cryptography.hazmat.primitives.ciphers import Cipher

from shared.transport import http_transport
from shared.tumblebug import TumblebugRefused, TumblebugUnavailable, raise_for_status

#: the anycall functions CB-Ladybug uses
CREATE_TAGS = "createTags"
ASSOCIATE_IAM_INSTANCE_PROFILE = "associateIamInstanceProfile"
GET_REGION_INFO = "getRegionInfo"
GET_CONNECTION_INFO = "getConnectionInfo"

#: Spider's credential key: public, the same in every Spider (upstream's ``spider_key``)
SPIDER_KEY = b"cloud-barista-cb-spider-cloud-ba"
_IV = 16


class Spider(Protocol):
    async def anycall(
        self, connection: str, function: str, inputs: Sequence[tuple[str, str]] = ()
    ) -> dict[str, str]:
        """The output key/value list of one anycall, as a dict (values as Spider sent them)."""
        ...


class SpiderClient:
    """CB-Spider over httpx, basic auth (upstream uses Tumblebug's credentials for it)."""

    def __init__(
        self,
        base_url: str,
        username: str = "default",
        password: str = "default",
        timeout: float = 30.0,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            auth=httpx.BasicAuth(username, password),
            headers={"Accept": "application/json"},
            timeout=timeout,
            transport=transport or http_transport(),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def anycall(
        self, connection: str, function: str, inputs: Sequence[tuple[str, str]] = ()
    ) -> dict[str, str]:
        what = f"Spider anycall {function}"
        body = {
            "connectionName": connection,
            "reqInfo": {
                "fId": function,
                "iKeyValueList": [{"key": k, "value": v} for k, v in inputs],
            },
        }
        try:
            response = await self._http.post("/anycall", json=body)
        except httpx.HTTPError as exc:
            raise TumblebugUnavailable(f"{what}: {exc!r}", message=repr(exc)) from exc
        raise_for_status(response, what, service="Spider")
        try:
            answer = response.json()
        except ValueError as exc:
            raise TumblebugUnavailable(f"{what}: an answer that is not JSON") from exc
        return outputs(answer, what)


def outputs(answer: Any, what: str = "Spider anycall") -> dict[str, str]:
    """The ``OKeyValueList`` of an anycall answer as a dict; ``Result: false`` is a refusal."""
    if not isinstance(answer, Mapping):
        raise TumblebugUnavailable(f"{what}: answered {type(answer).__name__}, not an object")
    pairs = _get(answer, "OKeyValueList") or []
    found = {
        str(_get(p, "Key") or ""): str(_get(p, "Value") or "")
        for p in pairs
        if isinstance(p, Mapping)
    }
    if found.get("Result") == "false":
        reason = found.get("Reason") or "Empty"
        raise TumblebugRefused(f"{what}: Reason: {reason}", message=f"Reason: {reason}")
    return found


def reveal(value: str) -> str:
    """A value Spider encrypted (base64 of IV + AES-256-CFB ciphertext), in clear."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TumblebugRefused("Spider sent a value that is not base64") from exc
    if len(raw) < _IV:
        raise TumblebugRefused("Spider sent an encrypted value shorter than its IV")
    decryptor = _cipher(raw[:_IV]).decryptor()
    return (decryptor.update(raw[_IV:]) + decryptor.finalize()).decode(errors="replace")


def conceal(text: str, iv: bytes) -> str:
    """What ``reveal`` undoes (for the Spider stand-in and tests)."""
    encryptor = _cipher(iv).encryptor()
    return base64.b64encode(iv + encryptor.update(text.encode()) + encryptor.finalize()).decode()


def _cipher(iv: bytes) -> Cipher[CFB]:
    # imported when a single-cloud cluster needs it: ``cryptography`` is megabytes of memory
    # that most provisioners never use
    from cryptography.hazmat.decrepit.ciphers.modes import CFB  # noqa: PLC0415
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms  # noqa: PLC0415

    return Cipher(algorithms.AES(SPIDER_KEY), CFB(iv))


def _get(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` matched without regard to case, as Go's JSON decoder does."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    return next((v for k, v in obj.items() if k.lower() == lowered), None)
