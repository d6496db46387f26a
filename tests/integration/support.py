"""Test helpers that act on the real stack: service processes, stream reading, waiting.

Polling with a deadline is fine here: these are tests observing a system from outside, not
service code waiting on another controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.bus import Bus
from shared.messages import Message, MessageDeadLettered, decode_any
from shared.subjects import DEADLETTER
from testenv.harness import LocalStack

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
#: every service log of the session, for its secret scan (``leakscan.py``)
SERVICE_LOGS: list[Path] = []


class ServiceProcess:
    """One replica of a capibus service, run as ``python -m services.<name>``."""

    def __init__(
        self, name: str, env: dict[str, str], log_dir: Path, replica: str, module: str = ""
    ) -> None:
        self.name = name
        self.module = module or f"services.{name}"
        self.replica = replica
        self.env = {**os.environ, **env, "CAPIBUS_REPLICA": replica, "PYTHONUNBUFFERED": "1"}
        self.log_path = log_dir / f"{name}-{replica}.log"
        SERVICE_LOGS.append(self.log_path)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, no acks, no lease release: a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 15) -> int | None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def service_processes(stack: LocalStack, log_dir: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start service replicas on ``stack`` as real processes, with the tests' short lease and
    ack wait; all are stopped on leaving."""
    started: list[ServiceProcess] = []

    def start(
        name: str, replica: str | None = None, *, module: str = "", **env: str
    ) -> ServiceProcess:
        settings = {
            "CAPIBUS_LEASE_TTL": "2",
            "CAPIBUS_CONSUMER__ACK_WAIT": "5",
            "CAPIBUS_METRICS_PORT": "0",
            **env,
        }
        proc = ServiceProcess(
            name, {**stack.env(), **settings}, log_dir, replica or uuid.uuid4().hex[:6], module
        )
        started.append(proc.start())
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


async def eventually(
    probe: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    *,
    timeout: float = 30,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")
        await asyncio.sleep(interval)


async def read_stream(bus: Bus, stream: str, subject: str) -> list[tuple[int, Message]]:
    """Every message on ``subject`` (wildcards allowed) as (stream sequence, decoded)."""
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=10.0
    )
    psub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    try:
        remaining = (await psub.consumer_info()).num_pending
        out: list[tuple[int, Message]] = []
        while remaining > 0:
            msgs = await psub.fetch(min(remaining, 500), timeout=5)
            out += [(m.metadata.sequence.stream, decode_any(m.data)) for m in msgs]
            remaining -= len(msgs)
        return out
    finally:
        await psub.unsubscribe()


async def dead_letters(bus: Bus, original_subject: str) -> list[MessageDeadLettered]:
    """Every dead letter any service recorded for messages on ``original_subject``."""
    found = await read_stream(bus, DEADLETTER.name, f"capibus.dlq.*.{original_subject}")
    return [m for _, m in found if isinstance(m, MessageDeadLettered)]
