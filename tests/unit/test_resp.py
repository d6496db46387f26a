"""The Redis adapter against a scripted RESP server: replies, errors, broken exchanges."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from shared.resp import Redis, RedisReplyError, RedisUnavailable, encode, read_reply

pytestmark = pytest.mark.timeout(10)

Answer = Callable[[list[bytes]], bytes | None]


class Server:
    """Reads commands, answers each with ``answer(command)`` (None: never answers)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.commands: list[list[bytes]] = []
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                command = await read_reply(reader)
                assert isinstance(command, list)
                self.commands.append([bytes(part) for part in command if isinstance(part, bytes)])
                reply = self.answer(self.commands[-1])
                if reply is not None:
                    writer.write(reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


Start = Callable[[Answer], Awaitable[tuple["Server", Redis]]]


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    servers: list[asyncio.Server] = []
    clients: list[Redis] = []

    async def start(answer: Answer) -> tuple[Server, Redis]:
        script = Server(answer)
        server = await asyncio.start_server(script.serve, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        client = Redis.from_url(f"redis://:s%40cret@127.0.0.1:{port}/2", timeout=0.5)
        clients.append(client)
        return script, client

    yield start
    for client in clients:
        await client.aclose()
    for server in servers:
        server.close()


def ok_then(answer: Answer) -> Answer:
    """``+OK`` for AUTH and SELECT, ``answer`` for the rest."""
    return lambda c: b"+OK\r\n" if c[0] in (b"AUTH", b"SELECT") else answer(c)


def test_a_command_is_an_array_of_bulk_strings() -> None:
    assert (
        encode(["SET", b"k", 5, 1.5]) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n$3\r\n1.5\r\n"
    )


async def test_every_reply_type_parses() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"*5\r\n+OK\r\n:-3\r\n$3\r\nab\n\r\n$-1\r\n*1\r\n-ERR no\r\n*-1\r\n")
    reply = await read_reply(reader)
    assert isinstance(reply, list)
    assert reply[:4] == [b"OK", -3, b"ab\n", None]
    assert isinstance(reply[4], list)
    assert isinstance(reply[4][0], RedisReplyError)
    assert await read_reply(reader) is None


async def test_the_url_authenticates_and_selects_then_commands_answer(serve: Start) -> None:
    script, client = await serve(ok_then(lambda c: b":1\r\n"))
    assert await client.eval("return 1", 1, "key", "arg") == 1
    assert await client.zrem("members", "m") == 1
    assert script.commands[:2] == [[b"AUTH", b"s@cret"], [b"SELECT", b"2"]]
    assert script.commands[2] == [b"EVAL", b"return 1", b"1", b"key", b"arg"]
    assert script.connections == 1


async def test_an_error_reply_raises_and_keeps_the_connection(serve: Start) -> None:
    script, client = await serve(
        ok_then(lambda c: b"-NOSCRIPT gone\r\n" if c[0] == b"EVAL" else b"+PONG\r\n")
    )
    with pytest.raises(RedisReplyError, match="NOSCRIPT"):
        await client.eval("x", 0)
    assert await client.execute("PING") == b"PONG"
    assert script.connections == 1


async def test_a_transaction_is_one_round_trip_with_its_replies(serve: Start) -> None:
    replies = {b"MULTI": b"+OK\r\n", b"EXEC": b"*3\r\n:1\r\n:0\r\n*1\r\n$1\r\nm\r\n"}
    script, client = await serve(ok_then(lambda c: replies.get(c[0], b"+QUEUED\r\n")))
    results = await client.transaction(
        ("ZADD", "k", 1, "m"), ("ZREM", "k", "x"), ("ZRANGE", "k", 0, -1)
    )
    assert results == [1, 0, [b"m"]]
    assert [c[0] for c in script.commands[2:]] == [b"MULTI", b"ZADD", b"ZREM", b"ZRANGE", b"EXEC"]


async def test_an_aborted_transaction_raises(serve: Start) -> None:
    replies = {
        b"MULTI": b"+OK\r\n",
        b"EXEC": b"-EXECABORT discarded\r\n",
        b"BAD": b"-ERR unknown\r\n",
    }
    _, client = await serve(ok_then(lambda c: replies.get(c[0], b"+QUEUED\r\n")))
    with pytest.raises(RedisReplyError, match="unknown"):
        await client.transaction(("BAD",), ("ZRANGE", "k", 0, -1))


async def test_silence_is_unavailable_and_the_next_call_reconnects(serve: Start) -> None:
    calls = 0

    def answer(command: list[bytes]) -> bytes | None:
        nonlocal calls
        calls += 1
        return None if calls == 1 else b"+PONG\r\n"

    script, client = await serve(ok_then(answer))
    with pytest.raises(RedisUnavailable):
        await client.execute("PING")
    assert await client.execute("PING") == b"PONG"
    assert script.connections == 2


async def test_a_cancelled_call_leaves_no_half_read_reply_behind(serve: Start) -> None:
    script, client = await serve(ok_then(lambda c: None if c[0] == b"SLOW" else b":7\r\n"))
    slow = asyncio.create_task(client.execute("SLOW"))
    await asyncio.sleep(0.1)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert await client.execute("FAST") == 7
    assert script.connections == 2


async def test_a_refused_connection_is_unavailable() -> None:
    client = Redis(port=1, timeout=0.5)
    with pytest.raises(RedisUnavailable):
        await client.execute("PING")
    await client.aclose()


def test_urls_as_redis_py_reads_them() -> None:
    plain = Redis.from_url("redis://127.0.0.1:6390")
    assert (plain.host, plain.port, plain.db, plain.password, plain.tls) == (
        "127.0.0.1",
        6390,
        0,
        None,
        None,
    )
    secure = Redis.from_url("rediss://user:pw@redis.example:6380/3")
    assert (secure.username, secure.password, secure.db) == ("user", "pw", 3)
    assert secure.tls is not None
    with pytest.raises(ValueError, match="redis://"):
        Redis.from_url("http://127.0.0.1")
