"""Counting taps: a TCP relay per (service, endpoint) that counts what reaches a dead endpoint.

The outage run (``soak.outage``) must show how often each service knocks on an endpoint that
is down. Services export no per-endpoint request counter, and a stopped server counts
nothing, so each service reaches the API server, the Zenith registrar and the chart
repository through a tap of its own: a plain TCP relay on 127.0.0.1 (TLS passes through
untouched, the API server's certificate names 127.0.0.1 whatever the port). While the
endpoint is up a tap only relays; while it is down, each connection the tap cannot carry on
is counted, with its time, and reset at once, which the client sees as it would see a
refused connection: a transport error before any answer. A client whose connection broke
opens a new one for its next request, so during an outage every request is one counted
connection: the per-minute count is the service's request rate to the dead endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class Tap:
    """Relays ``127.0.0.1:<port>`` to ``upstream``; counts the connections it could not carry."""

    name: str
    upstream_host: str
    upstream_port: int
    #: ``time.monotonic()`` of each connection refused by the upstream
    refused: list[float] = field(default_factory=list)
    carried: int = 0
    server: asyncio.Server | None = None
    #: both ends of every relayed connection still open, closed with the tap
    writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> Tap:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None, "the tap is not started"
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self.writers):
                writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(self.server.wait_closed(), 5.0)

    def per_minute(self, start: float, end: float) -> list[int]:
        """Refused connections in each whole or partial minute from ``start`` to ``end``."""
        minutes = max(1, int((end - start + 59.999) // 60))
        counts = [0] * minutes
        for at in self.refused:
            if start <= at < end:
                counts[min(minutes - 1, int((at - start) // 60))] += 1
        return counts

    def max_window(self, start: float, end: float, window: float = 60.0) -> int:
        """The most refused connections in any ``window`` seconds between ``start`` and ``end``."""
        times = sorted(at for at in self.refused if start <= at < end)
        best, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= window:
                first += 1
            best = max(best, last - first + 1)
        return best

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            self.refused.append(time.monotonic())
            _reset(writer)
            return
        self.carried += 1
        ends = {writer, up_writer}
        self.writers |= ends
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self.writers -= ends


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (linger 0): the client's request fails at once, as on a refusal."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()
