"""The HTTP transport every capibus client uses: httpx's, with cancellation made leak-free.

Services cancel requests all the time (a stopping service, a lost partition, a watch that is
no longer wanted), and httpcore 1.0 leaves a socket open in two places when a plain
``asyncio`` ``Task.cancel()`` lands at the wrong moment. The socket lingers, out of every
pool, until the garbage collector finds it: a ``ResourceWarning`` in production, a flaky
failure in the tests, where warnings are errors.

- **Dropped connections.** The pool closes the connections it drops (keep-alive expired,
  closed by the server, over the keep-alive limit) inside the next request, one after another,
  under an anyio shield. That shield holds against anyio cancel scopes only: a native cancel
  goes through it at the first close and the rest stay open. Here the closes run in a task of
  their own under ``asyncio.shield``. Measured: six expired connections and one cancelled
  request left five sockets open before, none now.
- **The TLS handshake.** httpcore closes the TCP stream when the handshake fails with an
  ``Exception``, not when it is cancelled (``CancelledError`` is a ``BaseException``). Here
  the stream is closed on any way out.

Requests that drop nothing and reuse a connection (the common case) take httpcore's path
unchanged. Both traps are pinned by ``tests/unit/test_transport.py``, which also tells us when
httpcore fixes them and this module can go.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

# Closers still running after their request was cancelled: the loop only holds tasks weakly.
_closing: set[asyncio.Task[None]] = set()


class _CancelSafePool(httpcore.AsyncConnectionPool):
    async def _close_connections(self, closing: list[httpcore.AsyncConnectionInterface]) -> None:
        if not closing:
            return
        closer = asyncio.ensure_future(super()._close_connections(closing))
        _closing.add(closer)
        closer.add_done_callback(_closing.discard)
        await asyncio.shield(closer)


class _HandshakeSafeStream(httpcore.AsyncNetworkStream):
    """A fresh TCP stream that is closed if its TLS handshake ends in any way but success."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        try:
            return await self._stream.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            await self._stream.aclose()  # anyio aborts the transport before its first await
            raise

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _CancelSafeBackend(httpcore.AnyIOBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await super().connect_tcp(host, port, timeout, local_address, socket_options)
        return _HandshakeSafeStream(stream)


def http_transport(**options: Any) -> httpx.AsyncHTTPTransport:
    """``httpx.AsyncHTTPTransport(**options)`` that never leaves a socket open on cancel."""
    transport = httpx.AsyncHTTPTransport(**options)
    # The transport builds its pool from a dozen options; re-typing the pool keeps them all.
    pool = transport._pool
    pool.__class__ = _CancelSafePool
    pool._network_backend = _CancelSafeBackend()
    return transport
