"""Least privilege on the bus, against the real servers (``shared.access``): a service's
credentials cannot publish on another service's subjects, read another service's consumers
or touch its Redis keys, and a wrong password stops a service with one clear line and exit
status 78 instead of retrying forever."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig

from shared import access, subjects
from shared.access import (
    EXIT_CREDENTIALS,
    CredentialsRejected,
    ServerNotTrusted,
    with_login,
    without_login,
)
from shared.bus import Bus
from shared.errors import BusUnavailable
from shared.resp import Redis, RedisCredentialsRejected, RedisReplyError, RedisUnavailable
from testenv import certs
from testenv.harness import LOOPBACK, LocalStack, ensure_binaries, free_ports

#: long enough for an allowed request to be answered on a loaded host; a refused one never is
REPLY_SECONDS = 3.0


class Session:
    """One raw connection as ``user``, recording what the server refused."""

    def __init__(self, stack: LocalStack, user: str) -> None:
        self.stack, self.user = stack, user
        self.refused: list[str] = []
        self.said = asyncio.Condition()
        self.nc: NatsClient | None = None

    async def __aenter__(self) -> Session:
        async def error_cb(exc: Exception) -> None:
            async with self.said:
                self.refused.append(str(exc))
                self.said.notify_all()

        self.nc = await nats.connect(
            [without_login(url) for url in self.stack.endpoints.nats_url.split(",")],
            user=self.user,
            password=self.stack.password(self.user),
            inbox_prefix=f"_INBOX.{self.user}",
            error_cb=error_cb,
            max_reconnect_attempts=2,
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.nc is not None
        await self.nc.close()

    async def was_refused(self, subject: str) -> bool:
        """Wait for the server's verdict on what was last sent to ``subject``."""
        async with asyncio.timeout(REPLY_SECONDS), self.said:
            await self.said.wait_for(
                lambda: any(subject.lower() in line.lower() for line in self.refused)
            )
        return True

    async def request(self, subject: str, body: bytes = b"") -> bytes:
        assert self.nc is not None
        reply = await self.nc.request(subject, body, timeout=REPLY_SECONDS)
        return bytes(reply.data)


async def test_a_service_cannot_publish_on_another_services_subjects(
    stack: LocalStack, bus: Bus
) -> None:
    event = subjects.resource_event("cluster", 0, "ns", "forged")
    async with Session(stack, "writer") as writer:
        assert writer.nc is not None
        await writer.nc.publish(event, b"{}")
        await writer.nc.flush()
        assert await writer.was_refused(event)
        # its own subjects go through
        journal = subjects.journal("statuswritten", "cluster", "ns", "own")
        ack = await writer.request(journal, b"{}")
        assert b'"stream":"CAPIBUS_JOURNAL"' in ack
    async with Session(stack, "lease") as lease:
        assert lease.nc is not None
        letter = subjects.dead_letter("writer", "x")
        await lease.nc.publish(letter, b"{}")
        await lease.nc.flush()
        assert await lease.was_refused(letter)


async def test_a_service_cannot_read_another_services_consumers(
    stack: LocalStack, bus: Bus
) -> None:
    theirs = "lease-cluster-p0"
    config = ConsumerConfig(
        name=theirs,
        durable_name=theirs,
        filter_subject=subjects.resource_events_in_partition("cluster", 0),
        ack_policy=AckPolicy.EXPLICIT,
    )
    await bus.js.add_consumer(subjects.EVENTS.name, config)  # as the operator
    info = f"$JS.API.CONSUMER.INFO.{subjects.EVENTS.name}.{theirs}"
    pull = f"$JS.API.CONSUMER.MSG.NEXT.{subjects.EVENTS.name}.{theirs}"
    async with Session(stack, "lease") as lease:
        assert b'"num_pending"' in await lease.request(info)
    # identity consumes the same stream; the watcher reads it with consumers of its own
    for user in ("identity", "watcher"):
        async with Session(stack, user) as other:
            assert other.nc is not None
            with pytest.raises(nats.errors.TimeoutError):
                await other.request(info)
            assert await other.was_refused(info)
            await other.nc.publish(pull, b'{"batch":1}')
            await other.nc.flush()
            assert await other.was_refused(pull)


async def test_a_publisher_lists_the_consumers_of_its_streams_for_the_limit_guard(
    stack: LocalStack,
) -> None:
    # shared.bus's guard asks where a stream's consumers are before it nears the limit.
    status = f"$JS.API.CONSUMER.LIST.{subjects.STATUS.name}"
    events = f"$JS.API.CONSUMER.LIST.{subjects.EVENTS.name}"
    async with Session(stack, "identity") as identity:
        assert b'"consumers"' in await identity.request(status)
        assert identity.nc is not None
        with pytest.raises(nats.errors.TimeoutError):
            await identity.request(events)  # it publishes no event
        assert await identity.was_refused(events)


async def test_a_service_cannot_touch_another_services_redis_keys(stack: LocalStack) -> None:
    redis_url = without_login(stack.endpoints.redis_url)
    writer = Redis.from_url(with_login(redis_url, ("writer", stack.password("writer"))))
    try:
        await writer.execute(
            "EVAL", "return redis.call('SET', KEYS[1], 'x')", 1, "capibus:writer:t"
        )
        with pytest.raises(RedisReplyError, match="NOPERM"):
            await writer.execute("EVAL", "return redis.call('GET', KEYS[1])", 1, "capibus:lease:t")
        with pytest.raises(RedisReplyError, match="NOPERM"):
            await writer.execute("FLUSHALL")
        with pytest.raises(RedisReplyError, match="NOPERM"):
            await writer.execute("KEYS", "*")
    finally:
        await writer.aclose()


async def test_a_wrong_password_is_a_clear_error(stack: LocalStack) -> None:
    wrong = ("writer", "not-the-password")
    url = without_login(stack.endpoints.nats_url.split(",")[0])
    with pytest.raises(CredentialsRejected, match=r"nats at .* refused user 'writer'"):
        async with asyncio.timeout(30):
            await Bus.connect(url, name="tests/wrong", login=wrong)
    redis = Redis.from_url(with_login(without_login(stack.endpoints.redis_url), wrong))
    with pytest.raises(RedisCredentialsRejected, match=r"redis at .* refused user 'writer'"):
        await redis.execute("PING")
    await redis.aclose()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("wrong", ["nats", "redis"])
def test_a_service_with_a_wrong_password_exits_78(
    stack: LocalStack, tmp_path: Path, wrong: str
) -> None:
    home = tmp_path / "credentials" / "writer"
    home.mkdir(parents=True)
    for system in ("nats", "redis"):
        password = "not-the-password" if system == wrong else stack.password("writer")
        (home / f"{system}-password").write_text(password)
    env = {
        **os.environ,
        **stack.env(),
        "CAPIBUS_CREDENTIALS__DIR": str(tmp_path / "credentials"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.writer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_CREDENTIALS, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1, done.stderr[-2000:]
    assert f"{wrong} at " in lines[0]
    assert "refused user 'writer'" in lines[0]
    url = stack.endpoints.nats_url if wrong == "nats" else stack.endpoints.redis_url
    server = urlsplit(url.split(",")[0])
    assert f"{server.hostname}:{server.port}" in lines[0]
    assert "not-the-password" not in done.stderr


@dataclass(frozen=True)
class TlsServer:
    port: int
    ca: Path
    passwords: dict[str, str]


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[TlsServer]:
    """A nats-server of its own requiring TLS, with every declared user."""
    from services.__main__ import accesses  # noqa: PLC0415 (imports every service)

    files = certs.issue(tmp_path)
    declared = accesses()
    passwords = {user: f"pw-{user}" for user in access.users(declared)}
    (port,) = free_ports(1)
    config = tmp_path / "nats.conf"
    tls = f'tls {{\n  cert_file: "{files.cert}"\n  key_file: "{files.key}"\n}}\n'
    config.write_text(tls + access.render_nats(access.nats_users(declared, 1, passwords)))
    binary = ensure_binaries() / "nats-server"
    command = [str(binary), "-c", str(config), "-a", LOOPBACK, "-p", str(port)]
    command += ["-js", "-sd", str(tmp_path / "jetstream")]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield TlsServer(port, files.ca, passwords)
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.timeout(60)
async def test_tls_with_a_service_user(tls_nats: TlsServer) -> None:
    """A service connects over ``tls://`` as itself, trusting the CA (``SSL_CERT_FILE`` does
    the same for a service process); a plain connection to the TLS-only server fails."""
    context = ssl.create_default_context(cafile=str(tls_nats.ca))
    login = ("writer", tls_nats.passwords["writer"])
    url = f"tls://{LOOPBACK}:{tls_nats.port}"
    # Bus.connect waits for a server that is still starting (reconnect attempts: forever).
    writer = await asyncio.wait_for(
        Bus.connect(url, name="tests/tls", login=login, tls=context), 30
    )
    try:
        assert writer.nc.connected_url is not None
        assert writer.nc.connected_url.scheme == "tls"
        await writer.ensure_streams()
        published = await writer.js.publish(subjects.journal("x", "cluster", "ns", "a"), b"{}")
        assert published.stream == subjects.JOURNAL.name
    finally:
        await writer.close()
    with pytest.raises(BusUnavailable):
        await Bus.connect(
            f"nats://{LOOPBACK}:{tls_nats.port}",
            name="tests/plain",
            login=login,
            allow_reconnect=False,
            connect_timeout=2,
        )


@pytest.mark.timeout(60)
async def test_a_tls_url_never_speaks_plaintext(stack: LocalStack) -> None:
    """nats-py upgrades only when the server asks, and the session's servers are plaintext:
    a ``tls://`` URL to them is refused."""
    login = ("writer", stack.password("writer"))
    plain = urlsplit(stack.endpoints.nats_url.split(",")[0])
    with pytest.raises(ServerNotTrusted, match=r"nats at .*: the server does not require TLS"):
        async with asyncio.timeout(30):
            await Bus.connect(f"tls://{plain.hostname}:{plain.port}", name="t/tls", login=login)
    # A plaintext Redis waits for the rest of what it takes for a command: never an answer,
    # so never plaintext either, and the error says what to check.
    redis_plain = urlsplit(stack.endpoints.redis_url)
    url = with_login(f"rediss://{redis_plain.hostname}:{redis_plain.port}/0", login)
    redis = Redis.from_url(url, timeout=1)
    with pytest.raises(RedisUnavailable, match=r"no answer to the TLS greeting"):
        await redis.execute("PING")
    await redis.aclose()


@pytest.mark.timeout(60)
async def test_a_certificate_from_another_ca_is_refused_at_once(
    tls_nats: TlsServer, tmp_path: Path
) -> None:
    """Not an outage to wait out: ``ServerNotTrusted`` on the first attempt."""
    other = certs.issue(tmp_path / "other")
    context = ssl.create_default_context(cafile=str(other.ca))
    login = ("writer", tls_nats.passwords["writer"])
    with pytest.raises(ServerNotTrusted, match=r"certificate verify failed|unable to get"):
        async with asyncio.timeout(30):
            await Bus.connect(
                f"tls://{LOOPBACK}:{tls_nats.port}", name="t/other", login=login, tls=context
            )
