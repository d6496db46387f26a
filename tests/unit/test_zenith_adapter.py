"""The Zenith adapter's contract, against httpx.MockTransport (no network).

Pins the wire format of ``POST /admin/reserve`` and the translation of every registrar
failure into a capibus error type, so the helm handler never sees an httpx exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_ssh_private_key,
)

from shared.errors import PermanentError, TemporaryError
from shared.zenith import (
    KeyPair,
    Registrar,
    RegistrarConflict,
    RegistrarUnavailable,
    Reservation,
    fingerprint,
    generate_keypair,
    random_subdomain,
)

Handler = Callable[[httpx.Request], httpx.Response]

# Generated once with ssh-keygen; ``ssh-keygen -lf`` printed SHA256:5Vz+...2Tk for it.
KNOWN_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL43TruXsXd/MpVbdNdpYw4T7MN7bcZWftgAop8IWH0l"
KNOWN_FINGERPRINT = "5Vz+rmEdmy7DnYnF/UByoqkDthwTiBEBrfuvMkV/2Tk"


def registrar(handler: Handler, url: str = "http://registrar-admin.test") -> Registrar:
    return Registrar(url, transport=httpx.MockTransport(handler))


def reply(status: int, body: object, seen: list[httpx.Request] | None = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, json=body)

    return handler


RESERVED = {
    "subdomain": "k3x9",
    "fqdn": "k3x9.apps.zenith.test",
    "token": None,
    "fingerprint": "FP",
    "fingerprints": ["FP"],
}


# --------------------------------------------------------------------------------------------
# Keys and names
# --------------------------------------------------------------------------------------------


def test_generated_keypair_is_ed25519_in_openssh_formats() -> None:
    pair = generate_keypair()
    assert pair.public_openssh.startswith("ssh-ed25519 ")
    assert pair.private_openssh.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    key = load_ssh_private_key(pair.private_openssh.encode(), password=None)
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    assert public == pair.public_openssh
    assert generate_keypair().public_openssh != pair.public_openssh


def test_the_private_key_never_appears_in_a_repr() -> None:
    pair = KeyPair(private_openssh="SECRET-MATERIAL", public_openssh="ssh-ed25519 AAAA")
    assert "SECRET-MATERIAL" not in repr(pair)
    assert "ssh-ed25519 AAAA" in repr(pair)


def test_fingerprint_matches_ssh_keygen() -> None:
    assert fingerprint(KNOWN_KEY) == KNOWN_FINGERPRINT
    assert fingerprint(KNOWN_KEY + " comment@host") == KNOWN_FINGERPRINT
    assert "=" not in fingerprint(generate_keypair().public_openssh)


@pytest.mark.parametrize("text", ["", "ssh-ed25519", "ssh-ed25519 not*base64"])
def test_fingerprint_rejects_what_is_not_a_public_key(text: str) -> None:
    with pytest.raises(ValueError, match="not an OpenSSH public key"):
        fingerprint(text)


def test_random_subdomain_fits_the_registrar_and_platform_patterns() -> None:
    names = {random_subdomain() for _ in range(200)}
    assert len(names) == 200
    assert all(re.fullmatch(r"[a-z][a-z0-9]{19}", name) for name in names)


# --------------------------------------------------------------------------------------------
# Registrar
# --------------------------------------------------------------------------------------------


async def test_reserve_posts_the_key_and_returns_the_reservation() -> None:
    seen: list[httpx.Request] = []
    async with registrar(reply(200, RESERVED, seen)) as client:
        reservation = await client.reserve(KNOWN_KEY)
    assert reservation == Reservation(
        subdomain="k3x9", fqdn="k3x9.apps.zenith.test", fingerprint="FP"
    )
    [request] = seen
    assert request.method == "POST"
    assert str(request.url) == "http://registrar-admin.test/admin/reserve"
    assert json.loads(request.content) == {"public_keys": [KNOWN_KEY]}


async def test_reserve_asks_for_a_subdomain_when_given() -> None:
    seen: list[httpx.Request] = []
    client = registrar(reply(200, RESERVED, seen), url="http://admin.test/prefix")
    await client.reserve(KNOWN_KEY, subdomain="abc")
    await client.aclose()
    assert str(seen[0].url) == "http://admin.test/prefix/admin/reserve"
    assert json.loads(seen[0].content) == {"public_keys": [KNOWN_KEY], "subdomain": "abc"}


async def test_fingerprint_falls_back_to_the_local_one() -> None:
    body = {"subdomain": "s", "fqdn": "s.test"}
    async with registrar(reply(200, body)) as client:
        reservation = await client.reserve(KNOWN_KEY)
    assert reservation.fingerprint == KNOWN_FINGERPRINT


async def test_409_is_a_permanent_conflict_with_the_servers_message() -> None:
    async with registrar(reply(409, {"detail": "subdomain 'abc' is already reserved"})) as client:
        with pytest.raises(RegistrarConflict) as caught:
            await client.reserve(KNOWN_KEY, subdomain="abc")
    assert isinstance(caught.value, PermanentError)
    assert caught.value.reason == "ZenithReservationConflict"
    assert "subdomain 'abc' is already reserved" in str(caught.value)


@pytest.mark.parametrize("status", [408, 500, 502, 503])
async def test_5xx_and_request_timeout_are_temporary(status: int) -> None:
    async with registrar(reply(status, {"detail": "boom"})) as client:
        with pytest.raises(RegistrarUnavailable) as caught:
            await client.reserve(KNOWN_KEY)
    assert isinstance(caught.value, TemporaryError)
    assert "boom" in str(caught.value)


async def test_429_is_temporary_and_honours_retry_after() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "7"}, text="slow down")

    async with registrar(handler) as client:
        with pytest.raises(RegistrarUnavailable) as caught:
            await client.reserve(KNOWN_KEY)
    assert caught.value.delay == 7.0
    assert "slow down" in str(caught.value)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
)
async def test_transport_failures_are_temporary(failure: httpx.HTTPError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise failure

    async with registrar(handler) as client:
        with pytest.raises(RegistrarUnavailable) as caught:
            await client.reserve(KNOWN_KEY)
    assert caught.value.__cause__ is failure


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_is_a_permanent_rejection(status: int) -> None:
    async with registrar(reply(status, {"detail": [{"msg": "field required"}]})) as client:
        with pytest.raises(PermanentError) as caught:
            await client.reserve(KNOWN_KEY)
    assert not isinstance(caught.value, RegistrarConflict)
    assert caught.value.reason == "ZenithRegistrarRejected"
    assert "field required" in str(caught.value)


@pytest.mark.parametrize("body", [{"fqdn": "x"}, {"subdomain": "", "fqdn": "x"}, ["list"]])
async def test_a_success_without_a_reservation_is_a_bad_response(body: object) -> None:
    async with registrar(reply(200, body)) as client:
        with pytest.raises(PermanentError) as caught:
            await client.reserve(KNOWN_KEY)
    assert caught.value.reason == "ZenithRegistrarBadResponse"


async def test_a_success_that_is_not_json_is_a_bad_response() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>login</html>")

    async with registrar(handler) as client:
        with pytest.raises(PermanentError) as caught:
            await client.reserve(KNOWN_KEY)
    assert caught.value.reason == "ZenithRegistrarBadResponse"
