"""The shared HTTP transport closes every connection it drops, even when the request that
drops them is cancelled: the trap is httpcore's anyio shield, which a plain asyncio cancel
goes through (a local TCP server, no mocks: the sockets are the point)."""

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator

import httpx
import pytest

from shared.transport import http_transport

IDLE_CONNECTIONS = 6


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Minimal HTTP/1.1 keep-alive: answer every request after a short think."""
    try:
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
async def url() -> AsyncIterator[str]:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()
    await server.wait_closed()


async def unclosed_after_cancel(url: str, transport: httpx.AsyncHTTPTransport) -> list[str]:
    """Open idle connections, let them expire, cancel the request that drops them."""
    async with httpx.AsyncClient(base_url=url, transport=transport) as http:
        await asyncio.gather(*(http.get("/") for _ in range(IDLE_CONNECTIONS)))
        await asyncio.sleep(0.1)  # past the keep-alive expiry: the next request drops them all
        request = asyncio.create_task(http.get("/"))
        await asyncio.sleep(0)  # the request is inside the pool's close loop
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    await asyncio.sleep(0.05)  # a closed transport lets go of its socket on the next tick
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def test_a_cancelled_request_leaves_no_dropped_connection_open(url: str) -> None:
    transport = http_transport(limits=httpx.Limits(keepalive_expiry=0.05))
    assert await unclosed_after_cancel(url, transport) == []


async def test_the_plain_httpx_transport_still_leaks_there(url: str) -> None:
    """The trap this module exists for; when httpcore fixes it, the workaround can go."""
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(keepalive_expiry=0.05))
    assert await unclosed_after_cancel(url, transport)
