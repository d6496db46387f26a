"""The HTTP transport every capibus client uses: httpx's, with cancellation made leak-free.

httpcore closes pooled connections it drops (keep-alive expired, closed by the server, over
the keep-alive limit) inside the next request, one after another, under an anyio shield. That
shield only holds against anyio cancel scopes: a plain ``asyncio`` ``Task.cancel()`` (a
stopping service, a lost partition, a cancelled watch) goes straight through it at the first
close, and every connection after it is out of the pool but still open. Its socket lingers
until the garbage collector finds it (a ``ResourceWarning``; a flaky failure in the tests,
where warnings are errors). Measured before the fix: six idle connections past their
keep-alive and one cancelled request left five sockets open.

The pool here runs those closes in a task of their own under ``asyncio.shield``, so they
finish whatever happens to the request that triggered them. Requests that drop nothing (the
common case) take the same path as before at no extra cost.
"""

from __future__ import annotations

import asyncio
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


def http_transport(**options: Any) -> httpx.AsyncHTTPTransport:
    """``httpx.AsyncHTTPTransport(**options)`` whose pool never leaves a dropped socket open."""
    transport = httpx.AsyncHTTPTransport(**options)
    # The transport builds its pool from a dozen options; re-typing it keeps them all.
    transport._pool.__class__ = _CancelSafePool
    return transport
