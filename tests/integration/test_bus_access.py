"""Least privilege on the bus, against the real servers (``shared.access``): a service's
credentials cannot publish on another service's subjects, read another service's consumers
or touch its Redis keys, and a wrong password stops a service with one clear line and exit
status 78 instead of retrying forever."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig

from shared import subjects
from shared.access import EXIT_CREDENTIALS, CredentialsRejected, with_login, without_login
from shared.bus import Bus
from shared.resp import Redis, RedisCredentialsRejected, RedisReplyError
from testenv.harness import LocalStack

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
def test_a_service_with_a_wrong_password_exits_78(stack: LocalStack, tmp_path: Path) -> None:
    home = tmp_path / "credentials" / "writer"
    home.mkdir(parents=True)
    for system in ("nats", "redis"):
        (home / f"{system}-password").write_text("not-the-password")
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
    assert "refused user 'writer'" in lines[0]
    assert without_login(stack.endpoints.nats_url.split(",")[0]) in lines[0]
    assert "not-the-password" not in done.stderr
