"""The metal-api adapter's contract, against httpx.MockTransport (no network).

Pins the HMAC headers to metal-stack/security's own test vectors (``mac_test.go``
``TestMacCalc2``), the wire format of every call, and the translation of every failure into
the ``MetalApi*`` error types, so the provider never sees httpx.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest

from shared.errors import PermanentError, TemporaryError
from shared.metalapi import (
    MetalApi,
    MetalApiClient,
    MetalApiConfig,
    MetalApiConflict,
    MetalApiError,
    MetalApiNotFound,
    MetalApiRefused,
    MetalApiUnauthorized,
    MetalApiUnavailable,
    MetalApiUnprocessable,
    hmac_headers,
)

Handler = Callable[[httpx.Request], httpx.Response]
URL = "http://metal-api.test"


def client(handler: Handler, **config: str) -> MetalApiClient:
    return MetalApiClient(MetalApiConfig(URL, **config), transport=httpx.MockTransport(handler))


def recording(seen: list[httpx.Request], status: int = 200, body: object = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json={} if body is None else body)

    return handler


def sent(request: httpx.Request) -> object:
    return json.loads(request.content) if request.content else None


# --- HMAC ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "moment", "expected"),
    [
        (
            "GET",
            datetime(2019, 5, 29, 9, 26, 39, tzinfo=UTC),
            "dd864d767ca9eec0337727e6ae69a30c47fa1501d1df9c7f2c4caaa83cf2f9f3",
        ),
        (
            "PUT",
            datetime(2019, 5, 29, 12, 30, 43, tzinfo=UTC),
            "e4b6f0e0f793e58efe7121fc5a3fe731f593e40f3ac27ebc1af09366ef7415f5",
        ),
    ],
)
def test_hmac_headers_match_upstream_vectors(method: str, moment: datetime, expected: str) -> None:
    headers = hmac_headers("metal-test-admin", method, now=moment, salt="")
    assert headers["Authorization"] == f"Metal-Admin {expected}"
    assert headers["X-Date"] == moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert headers["X-Data-Salt"] == ""


def test_hmac_date_is_utc_whole_seconds_and_salt_is_24_letters() -> None:
    local = datetime(2019, 5, 29, 11, 26, 39, 999_999, tzinfo=timezone(timedelta(hours=2)))
    headers = hmac_headers("metal-test-admin", "get", now=local, salt="")
    assert headers["X-Date"] == "2019-05-29T09:26:39Z"
    # the method is upper-cased, as Go's http.Request.Method always is
    assert headers["Authorization"].endswith(
        "dd864d767ca9eec0337727e6ae69a30c47fa1501d1df9c7f2c4caaa83cf2f9f3"
    )
    assert re.fullmatch(r"[A-Za-z]{24}", hmac_headers("k", "GET")["X-Data-Salt"])


async def test_every_request_is_signed_afresh() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen, body=[]), hmac="secret") as api:
        await api.list_machines()
        await api.find_networks()
    salts = {r.headers["X-Data-Salt"] for r in seen}
    assert len(salts) == 2
    for request in seen:
        data = request.headers["X-Date"] + request.method + request.headers["X-Data-Salt"]
        mac = hmac.new(b"secret", data.encode(), hashlib.sha256).hexdigest()
        assert request.headers["Authorization"] == f"Metal-Admin {mac}"
        stamp = datetime.fromisoformat(request.headers["X-Date"])
        assert abs((datetime.now(UTC) - stamp).total_seconds()) < 5


async def test_token_is_a_bearer_and_nothing_without_credentials() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen, body=[]), token="t0k") as api:
        await api.list_machines()
    async with client(recording(seen, body=[])) as api:
        await api.list_machines()
    assert seen[0].headers["Authorization"] == "Bearer t0k"
    assert "Authorization" not in seen[1].headers


async def test_hmac_wins_over_a_token() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen, body=[]), hmac="k", token="t") as api:
        await api.list_machines()
    assert seen[0].headers["Authorization"].startswith("Metal-Admin ")


# --- the wire --------------------------------------------------------------------------------


async def test_network_calls() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen, 201, {"id": "n1"})) as api:
        created = await api.allocate_network(
            name="vagrant", description="c1", partition_id="p", project_id="pr", labels={"a": "b"}
        )
        await api.free_network("n1")
    assert created == {"id": "n1"}
    assert (seen[0].method, seen[0].url.path) == ("POST", "/v1/network/allocate")
    assert sent(seen[0]) == {
        "name": "vagrant",
        "description": "c1",
        "partitionid": "p",
        "projectid": "pr",
        "labels": {"a": "b"},
        "shared": False,
    }
    assert (seen[1].method, seen[1].url.path) == ("POST", "/v1/network/free/n1")


async def test_finds_send_only_the_given_filters() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen, body=[])) as api:
        await api.find_networks(id="n1", project_id="pr", labels={"a": "b"})
        await api.find_networks()
        await api.find_ips(project_id="pr", tags=["x=y"])
        await api.find_machines(id="m1", project_id="pr", tags=["t"])
        await api.find_firewalls(project_id="pr")
    assert [(r.url.path, sent(r)) for r in seen] == [
        ("/v1/network/find", {"id": "n1", "projectid": "pr", "labels": {"a": "b"}}),
        ("/v1/network/find", {}),
        ("/v1/ip/find", {"projectid": "pr", "tags": ["x=y"]}),
        ("/v1/machine/find", {"id": "m1", "allocation_project": "pr", "tags": ["t"]}),
        ("/v1/firewall/find", {"allocation_project": "pr"}),
    ]


async def test_ip_calls() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen, 201, {"ipaddress": "185.1.2.9"})) as api:
        await api.allocate_ip(network_id="internet", project_id="pr", name="cp")
        await api.allocate_ip(
            network_id="internet", project_id="pr", name="cp", ip="185.1.2.9", static=True
        )
        await api.free_ip("185.1.2.9")
    assert seen[0].url.path == "/v1/ip/allocate"
    assert sent(seen[0]) == {
        "networkid": "internet",
        "projectid": "pr",
        "name": "cp",
        "description": "",
        "tags": [],
        "type": "ephemeral",
    }
    assert seen[1].url.path == "/v1/ip/allocate/185.1.2.9"
    assert sent(seen[1])["type"] == "static"  # type: ignore[index]
    assert (seen[2].method, seen[2].url.path) == ("DELETE", "/v1/ip/free/185.1.2.9")


async def test_machine_and_firewall_calls() -> None:
    seen: list[httpx.Request] = []
    request = {"projectid": "pr", "imageid": "img"}
    async with client(recording(seen, body={"id": "m1"})) as api:
        await api.allocate_machine(request)
        await api.get_machine("m1")
        await api.free_machine("m1")
        await api.allocate_firewall(request)
        await api.get_firewall("m1")
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/v1/machine/allocate"),
        ("GET", "/v1/machine/m1"),
        ("DELETE", "/v1/machine/m1/free"),
        ("POST", "/v1/firewall/allocate"),
        ("GET", "/v1/firewall/m1"),
    ]
    assert sent(seen[0]) == request
    assert seen[1].content == b""


async def test_the_client_is_a_metal_api() -> None:
    async with client(recording([], body=[])) as api:
        port: MetalApi = api
        assert await port.list_machines() == []


# --- errors ----------------------------------------------------------------------------------


def failing(status: int, message: str = "boom", **headers: str) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"statuscode": status, "message": message}
        return httpx.Response(status, json=body, headers=headers)

    return handler


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, MetalApiNotFound),
        (409, MetalApiConflict),
        (422, MetalApiUnprocessable),
        (400, MetalApiRefused),
        (405, MetalApiRefused),
    ],
)
async def test_4xx_is_a_typed_refusal(status: int, kind: type[MetalApiRefused]) -> None:
    async with client(failing(status, "no machine available")) as api:
        with pytest.raises(kind) as caught:
            await api.allocate_machine({})
    error = caught.value
    assert type(error) is kind
    assert isinstance(error, PermanentError)
    assert isinstance(error, MetalApiError)
    assert error.reason == "MetalApiRefused"
    assert error.status == status
    assert error.message.startswith("no machine available")
    assert str(error).startswith(f"metal-api POST /v1/machine/allocate: {status} no machine")


@pytest.mark.parametrize("status", [401, 403])
async def test_unauthorized_is_temporary_and_says_what_to_check(status: int) -> None:
    async with client(failing(status, "the timestamp in your header is too old")) as api:
        with pytest.raises(MetalApiUnauthorized) as caught:
            await api.get_machine("m1")
    # The clock or the key heals it, not the request: the work waits instead of failing.
    assert isinstance(caught.value, TemporaryError)
    assert caught.value.status == status
    assert "too old" in caught.value.message
    assert "HMAC key" in caught.value.message
    assert "clock" in str(caught.value)


@pytest.mark.parametrize("status", [408, 500, 502, 503])
async def test_5xx_is_unavailable(status: int) -> None:
    async with client(failing(status, "rethinkdb down")) as api:
        with pytest.raises(MetalApiUnavailable) as caught:
            await api.find_machines()
    error = caught.value
    assert isinstance(error, TemporaryError)
    assert isinstance(error, MetalApiError)
    assert error.status == status
    assert error.message == "rethinkdb down"
    assert error.delay is None
    assert "POST /v1/machine/find" in str(error)


async def test_429_honours_retry_after() -> None:
    async with client(failing(429, "slow down", **{"Retry-After": "7"})) as api:
        with pytest.raises(MetalApiUnavailable) as caught:
            await api.list_machines()
    assert caught.value.delay == 7.0
    assert caught.value.status == 429


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
)
async def test_transport_failures_are_unavailable(failure: httpx.HTTPError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise failure

    async with client(handler) as api:
        with pytest.raises(MetalApiUnavailable) as caught:
            await api.get_machine("m1")
    assert caught.value.__cause__ is failure
    assert caught.value.status is None
    assert "GET /v1/machine/m1" in str(caught.value)


async def test_an_error_without_a_json_body_keeps_its_text() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="404 page not found")

    async with client(handler) as api:
        with pytest.raises(MetalApiNotFound) as caught:
            await api.get_machine("m1")
    assert caught.value.message == "404 page not found"


@pytest.mark.parametrize("body", ["<html>proxy</html>", "[]"])
async def test_a_success_that_is_not_the_expected_json_is_unavailable(body: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body)

    async with client(handler) as api:
        with pytest.raises(MetalApiUnavailable):
            await api.get_machine("m1")
