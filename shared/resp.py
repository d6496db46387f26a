"""The Redis adapter: the few commands the partition leases need, over one RESP2 connection.

Why not redis-py: ``import redis`` loads its whole command set, the cluster client and its
OpenTelemetry hooks, 20 MiB of resident memory in every partitioned service (a quarter of
it; ``bench/ANALYSIS.md``, "f: footprint"), while ``shared.coordination`` sends five commands
(``EVAL``, and ``ZADD``/``ZREMRANGEBYSCORE``/``ZRANGE`` in one ``MULTI``, ``ZREM``). RESP2 is a
small protocol; this speaks just enough of it.

- **One connection, one exchange at a time.** A call writes its commands and reads their
  replies under a lock, so replies can never be matched to the wrong caller. The lease traffic
  is a few commands per second per service, far from what one connection carries.
- **A broken exchange drops the connection.** A timeout, a reset, a cancellation or a reply
  that does not parse leave the stream at an unknown place: the connection is closed and the
  next call opens a new one (with ``AUTH`` and ``SELECT`` again). The caller sees
  ``RedisUnavailable``; an error *reply* (``-ERR …``) is ``RedisReplyError`` and keeps the
  connection, whose stream is still in step.
- **Every exchange has a deadline** (``timeout``, 5 s like the clients before), connecting
  included, so a Redis that hangs is a Redis that is down (``shared.coordination`` then stops
  consuming before a lease could expire).
- **A refused login is its own error**: ``WRONGPASS`` or ``NOAUTH`` in answer to ``AUTH``
  raises ``RedisCredentialsRejected`` (``shared.access.CredentialsRejected``, not a
  ``RedisError``), so it is not taken for an outage and retried forever: it reaches
  ``shared.runtime``, which names the user and server and exits. So does a TLS handshake that
  fails for a reason time cannot heal (``ServerNotTrusted``: a certificate from another CA,
  a server that speaks no TLS), while one cut short by a restarting server is an outage.
- URLs as redis-py reads them: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://``
  for TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from shared.access import TRANSIENT_TLS_ERRORS, CredentialsRejected, ServerNotTrusted, tls_failure

Arg = str | bytes | int | float
Reply = None | int | bytes | list["Reply"] | Exception

DEFAULT_PORT = 6379


class RedisError(Exception):
    """Anything that went wrong talking to Redis."""


class RedisUnavailable(RedisError):
    """No answer in time, a lost or refused connection, or a reply that does not parse."""


class RedisReplyError(RedisError):
    """Redis answered with an error (``-ERR …``, ``-NOSCRIPT …``)."""


class RedisCredentialsRejected(CredentialsRejected):
    """Redis refused the user or password (``WRONGPASS``, ``NOAUTH``)."""


def encode(args: Sequence[Arg]) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts += [b"$%d\r\n" % len(data), data, b"\r\n"]
    return b"".join(parts)


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    """One RESP2 reply; an error reply is returned (as ``RedisReplyError``), not raised."""
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        return RedisReplyError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else (await reader.readexactly(size + 2))[:-2]
    if kind == b"*":
        count = int(rest)
        return None if count < 0 else [await read_reply(reader) for _ in range(count)]
    raise ValueError(f"not a RESP2 reply: {line[:40]!r}")


class Redis:
    """A Redis client with the commands capibus uses; safe to share between tasks."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password, self.tls = username, password, tls
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._handshaking = False

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 5.0, tls: ssl.SSLContext | None = None
    ) -> Redis:
        """``tls``: the context for a ``rediss://`` URL (default: the system's CAs); the
        scheme alone decides whether TLS is used."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"not a redis:// or rediss:// URL: {parts.scheme}://…")
        path = parts.path.strip("/")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or DEFAULT_PORT,
            db=int(path) if path else 0,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=(tls or ssl.create_default_context()) if parts.scheme == "rediss" else None,
            timeout=timeout,
        )

    async def execute(self, *args: Arg) -> Reply:
        """One command's reply; an error reply raises ``RedisReplyError``."""
        (reply,) = await self._exchange([args])
        return _checked(reply)

    async def transaction(self, *commands: Sequence[Arg]) -> list[Reply]:
        """``commands`` in one ``MULTI``/``EXEC``, one round trip; their replies, in order."""
        replies = await self._exchange([("MULTI",), *commands, ("EXEC",)])
        for reply in replies[:-1]:
            _checked(reply)  # a command refused while queueing aborts the EXEC too
        results = _checked(replies[-1])
        if not isinstance(results, list):
            raise RedisReplyError("transaction aborted")
        return [_checked(r) for r in results]

    async def eval(self, script: str, numkeys: int, *keys_and_args: Arg) -> Reply:
        return await self.execute("EVAL", script, numkeys, *keys_and_args)

    async def zrem(self, key: str, *members: Arg) -> Reply:
        return await self.execute("ZREM", key, *members)

    async def aclose(self) -> None:
        async with self._lock:
            streams = self._drop()
        if streams is not None:
            with contextlib.suppress(OSError):
                await streams[1].wait_closed()

    async def _exchange(self, commands: Sequence[Sequence[Arg]]) -> list[Reply]:
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout):
                    reader, writer = self._streams or await self._connect()
                    writer.write(b"".join(encode(c) for c in commands))
                    await writer.drain()
                    return [await read_reply(reader) for _ in commands]
            except BaseException as exc:
                self._drop()
                if isinstance(exc, (OSError, EOFError, TimeoutError, ValueError)):
                    raise RedisUnavailable(f"{self.host}:{self.port}: {self._why(exc)}") from exc
                raise

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError) and self._handshaking:
            # A plaintext Redis reads a TLS greeting as the start of a command and waits for
            # the rest; a stalled server looks the same, so this stays an outage.
            return f"{exc!r}: no answer to the TLS greeting (is this port TLS?)"
        return repr(exc)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._handshaking = self.tls is not None
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls)
        except ssl.SSLError as exc:
            if isinstance(exc, TRANSIENT_TLS_ERRORS):
                raise
            raise ServerNotTrusted(
                system="redis", server=f"{self.host}:{self.port}", detail=tls_failure(exc)
            ) from exc
        self._handshaking = False
        self._streams = (reader, writer)
        hello: list[Sequence[Arg]] = []
        if self.password is not None:
            hello.append(("AUTH", *filter(None, [self.username]), self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        if hello:
            writer.write(b"".join(encode(c) for c in hello))
            await writer.drain()
            for command in hello:
                reply = await read_reply(reader)
                if command[0] == "AUTH" and isinstance(reply, RedisReplyError):
                    self._refused(reply)
                _checked(reply)
        return reader, writer

    def _refused(self, reply: RedisReplyError) -> None:
        text = str(reply)
        if text.startswith(("WRONGPASS", "NOAUTH", "NOPERM")):
            raise RedisCredentialsRejected(
                system="redis", user=self.username, server=f"{self.host}:{self.port}", detail=text
            )

    def _drop(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Forget the connection and close it; nothing awaited (this runs while cancelled)."""
        streams, self._streams = self._streams, None
        if streams is not None:
            streams[1].close()
        return streams


def _checked(reply: Reply) -> Reply:
    if isinstance(reply, Exception):
        raise reply
    return reply
