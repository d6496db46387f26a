"""The Tumblebug adapter's contract, against httpx.MockTransport (no network).

Pins the route, method, query and body of every call cb-ladybug makes, the basic auth and base
path, "missing" as ``None``/``False`` (including Tumblebug v0.7's 200 for a missing namespace),
and the translation of every failure into the ``Tumblebug*`` error types with Tumblebug's
innermost ``message``, so the Ladybug services never see httpx.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from shared.errors import PermanentError, TemporaryError
from shared.tumblebug import (
    Tumblebug,
    TumblebugClient,
    TumblebugError,
    TumblebugNotFound,
    TumblebugRefused,
    TumblebugUnauthorized,
    TumblebugUnavailable,
    error_message,
    key_values,
    region_zone,
    spec_size,
)

Handler = Callable[[httpx.Request], httpx.Response]
Json = dict[str, Any]
URL = "http://tumblebug.test:1323/tumblebug"


def client(handler: Handler, **kwargs: Any) -> TumblebugClient:
    return TumblebugClient(
        URL, "user", "secret", 5.0, transport=httpx.MockTransport(handler), **kwargs
    )


def recording(seen: list[httpx.Request], status: int = 200, body: object = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json={"id": "x"} if body is None else body)

    return handler


def sent(request: httpx.Request) -> object:
    return json.loads(request.content) if request.content else None


def route(request: httpx.Request) -> tuple[str, str, dict[str, str]]:
    path = request.url.path.removeprefix("/tumblebug")
    return request.method, path, dict(request.url.params)


# --- the wire ---------------------------------------------------------------------------------


async def test_basic_auth_base_path_and_accept() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen)) as api:
        await api.get_connection_config("aws-seoul")
    request = seen[0]
    expected = base64.b64encode(b"user:secret").decode()
    assert request.headers["Authorization"] == f"Basic {expected}"
    assert request.headers["Accept"] == "application/json"
    assert str(request.url) == f"{URL}/connConfig/aws-seoul"


Call = Callable[[TumblebugClient], Awaitable[object]]
VM: Json = {"name": "w-1-abcde", "subGroupSize": "", "connectionName": "aws-seoul"}


@pytest.mark.parametrize(
    ("call", "method", "path", "params", "body"),
    [
        (lambda t: t.get_namespace("ns1"), "GET", "/ns/ns1", {}, None),
        (lambda t: t.get_connection_config("c"), "GET", "/connConfig/c", {}, None),
        (lambda t: t.get_region("ap-northeast-2"), "GET", "/region/ap-northeast-2", {}, None),
        (
            lambda t: t.lookup_spec("c", "t3.large"),
            "POST",
            "/lookupSpec",
            {},
            {"connectionName": "c", "cspSpecName": "t3.large"},
        ),
        (lambda t: t.lookup_specs("c"), "POST", "/lookupSpecs", {}, {"connectionName": "c"}),
        (lambda t: t.lookup_images("c"), "POST", "/lookupImages", {}, {"connectionName": "c"}),
        (lambda t: t.get_vnet("ns1", "c-vpc"), "GET", "/ns/ns1/resources/vNet/c-vpc", {}, None),
        (
            lambda t: t.create_vnet("ns1", {"name": "c-vpc"}),
            "POST",
            "/ns/ns1/resources/vNet",
            {},
            {"name": "c-vpc"},
        ),
        (
            lambda t: t.get_security_group("ns1", "c-sg"),
            "GET",
            "/ns/ns1/resources/securityGroup/c-sg",
            {},
            None,
        ),
        (
            lambda t: t.create_security_group("ns1", {"name": "c-sg"}),
            "POST",
            "/ns/ns1/resources/securityGroup",
            {},
            {"name": "c-sg"},
        ),
        (
            lambda t: t.get_ssh_key("ns1", "c-sshkey"),
            "GET",
            "/ns/ns1/resources/sshKey/c-sshkey",
            {},
            None,
        ),
        (
            lambda t: t.create_ssh_key("ns1", {"name": "c-sshkey", "username": "cb-user"}),
            "POST",
            "/ns/ns1/resources/sshKey",
            {},
            {"name": "c-sshkey", "username": "cb-user"},
        ),
        (
            lambda t: t.get_image("ns1", "c-ubuntu1804"),
            "GET",
            "/ns/ns1/resources/image/c-ubuntu1804",
            {},
            None,
        ),
        (
            lambda t: t.register_image("ns1", {"name": "c-ubuntu1804"}),
            "POST",
            "/ns/ns1/resources/image",
            {"action": "registerWithInfo"},
            {"name": "c-ubuntu1804"},
        ),
        (
            lambda t: t.get_spec("ns1", "c-t3-large-spec"),
            "GET",
            "/ns/ns1/resources/spec/c-t3-large-spec",
            {},
            None,
        ),
        (
            lambda t: t.create_spec("ns1", {"name": "s"}),
            "POST",
            "/ns/ns1/resources/spec",
            {},
            {"name": "s"},
        ),
        (
            lambda t: t.delete_resource("ns1", "vNet", "c-vpc", connection="c"),
            "DELETE",
            "/ns/ns1/resources/vNet/c-vpc",
            {},
            {"connectionName": "c"},
        ),
        (lambda t: t.get_mcis("ns1", "k1"), "GET", "/ns/ns1/mcis/k1", {}, None),
        (
            lambda t: t.create_mcis("ns1", {"name": "k1", "vm": [VM]}),
            "POST",
            "/ns/ns1/mcis",
            {},
            {"name": "k1", "vm": [VM]},
        ),
        (
            lambda t: t.control_mcis("ns1", "k1", "terminate"),
            "GET",
            "/ns/ns1/control/mcis/k1",
            {"action": "terminate"},
            None,
        ),
        (
            lambda t: t.control_mcis("ns1", "k1", "refine"),
            "GET",
            "/ns/ns1/control/mcis/k1",
            {"action": "refine"},
            None,
        ),
        (lambda t: t.delete_mcis("ns1", "k1"), "DELETE", "/ns/ns1/mcis/k1", {}, None),
        (
            lambda t: t.get_vm("ns1", "k1", "c-1-ab-1"),
            "GET",
            "/ns/ns1/mcis/k1/vm/c-1-ab-1",
            {},
            None,
        ),
        (
            lambda t: t.get_vm_ids("ns1", "k1", "c-1-ab-1"),
            "GET",
            "/ns/ns1/mcis/k1/vm/c-1-ab-1",
            {"option": "idsInDetail"},
            None,
        ),
        (lambda t: t.add_vm("ns1", "k1", VM), "POST", "/ns/ns1/mcis/k1/vm", {}, VM),
        (
            lambda t: t.delete_vm("ns1", "k1", "w-1-ab-1"),
            "DELETE",
            "/ns/ns1/mcis/k1/vm/w-1-ab-1",
            {},
            None,
        ),
        (lambda t: t.get_nlb("ns1", "k1", "c-1-ab"), "GET", "/ns/ns1/mcis/k1/nlb/c-1-ab", {}, None),
        (
            lambda t: t.create_nlb("ns1", "k1", {"name": "c-1-ab"}),
            "POST",
            "/ns/ns1/mcis/k1/nlb",
            {},
            {"name": "c-1-ab"},
        ),
    ],
)
async def test_every_route(
    call: Call, method: str, path: str, params: dict[str, str], body: object
) -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen)) as api:
        await call(api)
    assert len(seen) == 1
    assert route(seen[0]) == (method, path, params)
    assert sent(seen[0]) == body


async def test_names_are_quoted_as_one_path_segment() -> None:
    seen: list[httpx.Request] = []
    async with client(recording(seen)) as api:
        await api.get_mcis("ns 1", "a/b")
    assert seen[0].url.raw_path == b"/tumblebug/ns/ns%201/mcis/a%2Fb"


async def test_answers_are_tumblebugs_json() -> None:
    mcis = {"id": "k1", "status": "Running-(3/3)", "vm": [{"name": "c-1-ab-1"}]}
    async with client(recording([], status=201, body=mcis)) as api:
        assert await api.create_mcis("ns1", {"name": "k1"}) == mcis


async def test_spec_lists_are_unwrapped_and_empty_when_absent() -> None:
    specs = {"vmspec": [{"name": "t3.large", "mem": "8192", "vcpu": {"count": "2"}}]}
    async with client(recording([], body=specs)) as api:
        assert await api.lookup_specs("c") == specs["vmspec"]
    async with client(recording([], body={"vmspec": None})) as api:
        assert await api.lookup_specs("c") == []
    async with client(recording([], body={"image": [{"name": "ubuntu"}]})) as api:
        assert await api.lookup_images("c") == [{"name": "ubuntu"}]


async def test_slow_calls_get_the_provision_timeout() -> None:
    timeouts: dict[str, object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        timeouts[request.method + " " + route(request)[1]] = request.extensions["timeout"]["read"]
        return httpx.Response(200, json={})

    async with client(handler, provision_timeout=600.0) as api:
        await api.get_mcis("ns1", "k1")
        await api.create_mcis("ns1", {})
        await api.add_vm("ns1", "k1", {})
        await api.control_mcis("ns1", "k1", "terminate")
        await api.delete_mcis("ns1", "k1")
        await api.delete_vm("ns1", "k1", "v")
    assert timeouts == {
        "GET /ns/ns1/mcis/k1": 5.0,
        "POST /ns/ns1/mcis": 600.0,
        "POST /ns/ns1/mcis/k1/vm": 600.0,
        "GET /ns/ns1/control/mcis/k1": 600.0,
        "DELETE /ns/ns1/mcis/k1": 600.0,
        "DELETE /ns/ns1/mcis/k1/vm/v": 600.0,
    }


async def test_the_client_is_a_tumblebug() -> None:
    async with client(recording([], body={"id": "ns1", "name": "ns1"})) as api:
        port: Tumblebug = api
        assert await port.get_namespace("ns1") == {"id": "ns1", "name": "ns1"}


# --- missing things ---------------------------------------------------------------------------


def failing(status: int, message: object = "boom", **headers: str) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"message": message}, headers=headers)

    return handler


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.get_namespace("ns1"),
        lambda t: t.get_connection_config("c"),
        lambda t: t.get_region("r"),
        lambda t: t.lookup_spec("c", "t3.large"),
        lambda t: t.get_resource("ns1", "sshKey", "c-sshkey"),
        lambda t: t.get_mcis("ns1", "k1"),
        lambda t: t.get_vm("ns1", "k1", "v"),
        lambda t: t.get_vm_ids("ns1", "k1", "v"),
        lambda t: t.get_nlb("ns1", "k1", "n"),
    ],
)
async def test_a_get_answered_404_is_none(call: Call) -> None:
    async with client(failing(404, "Failed to find sshKey c-sshkey")) as api:
        assert await call(api) is None


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.delete_mcis("ns1", "k1"),
        lambda t: t.delete_vm("ns1", "k1", "v"),
        lambda t: t.delete_resource("ns1", "spec", "s", connection="c"),
    ],
)
async def test_a_delete_reports_whether_there_was_something_to_delete(call: Call) -> None:
    async with client(failing(404)) as api:
        assert await call(api) is False
    async with client(recording([], body={"message": "Deleted"})) as api:
        assert await call(api) is True


async def test_v07_namespace_without_id_is_missing() -> None:
    # Tumblebug v0.7.0 answers 200 for a namespace that does not exist.
    body = {"message": "Failed to find the namespace ns1"}
    async with client(recording([], status=200, body=body)) as api:
        assert await api.get_namespace("ns1") is None


async def test_a_404_where_missing_is_not_an_answer_is_not_found() -> None:
    async with client(failing(404, "Failed to find the MCIS k1")) as api:
        with pytest.raises(TumblebugNotFound) as caught:
            await api.add_vm("ns1", "k1", VM)
    assert isinstance(caught.value, TumblebugRefused)
    assert caught.value.status == 404
    assert caught.value.message == "Failed to find the MCIS k1"


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 405, 409, 422])
async def test_4xx_is_a_permanent_refusal(status: int) -> None:
    async with client(failing(status, "The name k1 is already in use")) as api:
        with pytest.raises(TumblebugRefused) as caught:
            await api.create_mcis("ns1", {"name": "k1"})
    error = caught.value
    assert type(error) is TumblebugRefused
    assert isinstance(error, PermanentError)
    assert isinstance(error, TumblebugError)
    assert error.reason == "TumblebugRefused"
    assert error.status == status
    assert error.message == "The name k1 is already in use"
    assert str(error) == f"Tumblebug POST /ns/ns1/mcis: {status} The name k1 is already in use"


@pytest.mark.parametrize("status", [401, 403])
async def test_unauthorized_is_temporary_and_says_what_to_check(status: int) -> None:
    async with client(failing(status, "Unauthorized")) as api:
        with pytest.raises(TumblebugUnauthorized) as caught:
            await api.get_mcis("ns1", "k1")
    assert isinstance(caught.value, TemporaryError)
    assert caught.value.status == status
    assert "username and password" in str(caught.value)


@pytest.mark.parametrize("status", [408, 500, 502, 503])
async def test_5xx_is_unavailable(status: int) -> None:
    message = "MCIS k1 is not Terminated; cannot delete"
    async with client(failing(status, message)) as api:
        with pytest.raises(TumblebugUnavailable) as caught:
            await api.delete_mcis("ns1", "k1")
    error = caught.value
    assert isinstance(error, TemporaryError)
    assert isinstance(error, TumblebugError)
    assert error.status == status
    assert error.message == message
    assert error.delay is None
    assert "DELETE /ns/ns1/mcis/k1" in str(error)


async def test_429_honours_retry_after() -> None:
    async with client(failing(429, "slow down", **{"Retry-After": "7"})) as api:
        with pytest.raises(TumblebugUnavailable) as caught:
            await api.get_region("r")
    assert caught.value.delay == 7.0


async def test_3xx_is_an_error_as_upstream_reads_it() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"Location": "/elsewhere"})

    async with client(handler) as api:
        with pytest.raises(TumblebugRefused) as caught:
            await api.get_region("r")
    assert caught.value.status == 302


async def test_nested_json_messages_are_unwrapped() -> None:
    inner = json.dumps({"message": json.dumps({"message": "AuthFailure: credentials invalid"})})
    async with client(failing(500, inner)) as api:
        with pytest.raises(TumblebugUnavailable) as caught:
            await api.create_vnet("ns1", {"name": "c-vpc"})
    assert caught.value.message == "AuthFailure: credentials invalid"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"message":"Failed to find vNet x"}', "Failed to find vNet x"),
        ('{"message":"{\\"message\\":\\"deep\\"}"}', "deep"),
        ('{"message":{"code":3}}', '{"code": 3}'),
        ('{"error":"other"}', '{"error":"other"}'),
        ("404 page not found\n", "404 page not found"),
        ("", ""),
    ],
)
def test_error_message(body: str, expected: str) -> None:
    assert error_message(body) == expected


async def test_an_error_without_a_body_keeps_the_reason_phrase() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    async with client(handler) as api:
        with pytest.raises(TumblebugNotFound) as caught:
            await api.control_mcis("ns1", "k1", "terminate")
    assert caught.value.message == "Not Found"


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
        with pytest.raises(TumblebugUnavailable) as caught:
            await api.get_mcis("ns1", "k1")
    assert caught.value.__cause__ is failure
    assert caught.value.status is None
    assert "GET /ns/ns1/mcis/k1" in str(caught.value)


@pytest.mark.parametrize("body", ["<html>proxy</html>", "[]"])
async def test_a_success_that_is_not_a_json_object_is_unavailable(body: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body)

    async with client(handler) as api:
        with pytest.raises(TumblebugUnavailable):
            await api.get_mcis("ns1", "k1")


async def test_an_empty_success_is_an_empty_object() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200)

    async with client(handler) as api:
        assert await api.delete_vm("ns1", "k1", "v") is True
        assert await api.control_mcis("ns1", "k1", "refine") == {}


# --- reading answers --------------------------------------------------------------------------


def test_region_zone_from_key_values() -> None:
    region = {
        "RegionName": "aws-ap-northeast-2",
        "KeyValueInfoList": [
            {"key": "Region", "value": "ap-northeast-2"},
            {"key": "Zone", "value": "ap-northeast-2a"},
        ],
    }
    assert region_zone(region) == ("ap-northeast-2", "ap-northeast-2a")
    assert region_zone({}) == ("", "")
    assert key_values({"KeyValueInfoList": [{"Key": "a", "Value": "b"}]}) == {"a": "b"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"mem": "8192", "vcpu": {"count": "2", "clock": "2.5"}}, (2, 8192)),
        ({"mem": 1024, "vcpu": {"count": 1}}, (1, 1024)),
        ({"Mem": "4096", "VCpu": {"Count": "4"}}, (4, 4096)),
        ({"mem": "", "vcpu": None}, (0, 0)),
    ],
)
def test_spec_size(spec: Json, expected: tuple[int, int]) -> None:
    assert spec_size(spec) == expected
