"""The shared HTTP transport leaves no socket open when a request is cancelled, in both places
where httpcore's own transport does (a local TCP server, no mocks: the sockets are the point).

Each trap is also run against httpx's plain transport, which must still leak there: when it no
longer does, httpcore has fixed the trap and ``shared/transport.py`` can shrink.
"""

import asyncio
import gc
import ssl
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from shared.transport import http_transport

IDLE_CONNECTIONS = 6
Scenario = Callable[[httpx.AsyncClient], Awaitable[None]]


class Server:
    """HTTP/1.1 keep-alive answers, or (``silent``) a peer that never answers a TLS hello."""

    def __init__(self) -> None:
        self.silent = False
        self.release = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.silent:
                await self.release.wait()
                return
            while await reader.readline():
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                await asyncio.sleep(0.02)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, int]]:
    handler = Server()
    listener = await asyncio.start_server(handler.serve, "127.0.0.1", 0)
    yield handler, listener.sockets[0].getsockname()[1]
    handler.release.set()
    listener.close()
    await listener.wait_closed()
    await asyncio.sleep(0.02)  # let the handlers close their side


async def cancel_soon(http: httpx.AsyncClient, url: str, after: float) -> None:
    request = asyncio.create_task(http.get(url))
    await asyncio.sleep(after)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request


async def unclosed(scenario: Scenario, transport: httpx.AsyncHTTPTransport) -> list[str]:
    """ResourceWarnings for the client's sockets once the scenario ran and the client closed."""
    async with httpx.AsyncClient(transport=transport) as http:
        await scenario(http)
    await asyncio.sleep(0.05)  # a closed transport lets go of its socket on the next tick
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def dropped_connections(port: int) -> Scenario:
    """Idle connections past their keep-alive, then a request cancelled while it drops them."""

    async def scenario(http: httpx.AsyncClient) -> None:
        url = f"http://127.0.0.1:{port}/"
        await asyncio.gather(*(http.get(url) for _ in range(IDLE_CONNECTIONS)))
        await asyncio.sleep(0.1)
        await cancel_soon(http, url, after=0)  # one tick: inside the pool's close loop

    return scenario


def handshake(server: Server, port: int) -> Scenario:
    """A request cancelled while the TLS handshake waits for the server's hello."""
    server.silent = True

    async def scenario(http: httpx.AsyncClient) -> None:
        await cancel_soon(http, f"https://127.0.0.1:{port}/", after=0.1)

    return scenario


LIMITS = httpx.Limits(keepalive_expiry=0.05)


def ours() -> httpx.AsyncHTTPTransport:
    return http_transport(limits=LIMITS, verify=ssl.create_default_context())


def plain() -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(limits=LIMITS)


async def test_dropped_connections_are_closed_even_when_the_request_is_cancelled(
    server: tuple[Server, int],
) -> None:
    assert await unclosed(dropped_connections(server[1]), ours()) == []


async def test_a_handshake_cut_short_closes_its_socket(server: tuple[Server, int]) -> None:
    assert await unclosed(handshake(*server), ours()) == []


@pytest.mark.parametrize("trap", ["dropped connections", "handshake"])
async def test_the_plain_httpx_transport_still_leaks(trap: str, server: tuple[Server, int]) -> None:
    scenario = dropped_connections(server[1]) if trap != "handshake" else handshake(*server)
    assert await unclosed(scenario, plain())
