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

Being the one transport of every client, it is also where each request becomes a client span
(``shared.tracing``): named by method and, when the client gives one (``url_template``, the
Kubernetes client's path template), the path's template, and ended once the body has been
read or the response closed (a watch's span lasts as long as the watch). Without an SDK set
up a request costs one check and nothing more.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpcore
import httpx
from opentelemetry.trace import Span

from shared import tracing

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


class _TracedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, url_template: Callable[[str], str] | None, **options: Any) -> None:
        super().__init__(**options)
        self._url_template = url_template

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not tracing.recording():
            return await super().handle_async_request(request)
        template = self._url_template(request.url.path) if self._url_template else None
        span = tracing.start_call(f"{request.method} {template}" if template else request.method)
        span.set_attributes(_request_attributes(request, template))
        try:
            response = await super().handle_async_request(request)
        except BaseException as exc:
            tracing.failed(span, exc)
            span.end()
            raise
        span.set_attribute("http.response.status_code", response.status_code)
        if response.is_error:
            tracing.unsuccessful(span, f"HTTP {response.status_code}")
        response.stream = _SpanEndingStream(response.stream, span)
        return response


def _request_attributes(request: httpx.Request, template: str | None) -> dict[str, str | int]:
    url = request.url
    attributes: dict[str, str | int] = {
        "http.request.method": request.method,
        "server.address": url.host,
        "server.port": url.port or (443 if url.scheme == "https" else 80),
        "url.path": url.path,
    }
    if template:
        attributes["url.template"] = template
    return attributes


class _SpanEndingStream(httpx.AsyncByteStream):
    """A response body that ends its request's span when it is closed."""

    def __init__(self, stream: httpx.AsyncByteStream | httpx.SyncByteStream, span: Span) -> None:
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream = stream
        self._span: Span | None = span

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            span, self._span = self._span, None
            if span is not None:
                span.end()


def http_transport(
    *, url_template: Callable[[str], str] | None = None, **options: Any
) -> httpx.AsyncHTTPTransport:
    """``httpx.AsyncHTTPTransport(**options)`` that never leaves a socket open on cancel and
    makes a span of each request, named by ``url_template(path)`` when given."""
    transport = _TracedTransport(url_template, **options)
    # The transport builds its pool from a dozen options; re-typing the pool keeps them all.
    pool = transport._pool
    pool.__class__ = _CancelSafePool
    pool._network_backend = _CancelSafeBackend()
    return transport
