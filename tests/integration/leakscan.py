"""The session's secret scan: every message on every stream, every service log line.

Principle 7 says no credential travels on the bus or reaches a log. The integration tests
make the credentials that could leak (cloud credentials, kubeconfigs, SSH keys, tokens), run
the real services on them and leave everything behind: this module looks through it once,
at the end of the session, with ``testenv.secretscan``.

How it works:

* ``secret_scan`` is a session fixture that every test using the stack pulls in
  (``tests/integration/conftest.py``), so it runs in any session that started the stack,
  whichever tests were selected. It registers the stack's admin token and starts
  ``SecretWatch``: a thread with its own event loop and API client that lists, then watches,
  every Secret in every namespace and registers each one's data as it appears. Tests need not
  register what they create, and nothing is missed because a namespace (and its Secrets) was
  deleted before the end; ``register_secret`` is there for a value that is never a Secret.
* Its teardown runs before the stack's (it depends on ``stack``), so NATS is still up: it
  reads every stream the server has, ``CAPIBUS_DEADLETTER`` and any a test made included,
  through one ephemeral consumer per stream (headers and body of each message), and every
  log of every ``ServiceProcess`` the session started (``support.SERVICE_LOGS``).
* Findings fail the session as an error of that teardown, listed one per line with where
  they are (stream, sequence and subject, or log file and line) and a masked prefix. A
  teardown error is pytest's own way to fail a run after the last test: it cannot be
  deselected with ``-k`` or skipped by ``-x`` as a test ordered last could, it counts in the
  summary line, and it makes the exit status non-zero. (A ``pytest_sessionfinish`` hook
  would run after the stack has stopped.)
* A planted leak proves the scan is not blind: ``expect_planted`` registers a marker and the
  session scan then requires it at exactly one place, where its findings are expected
  (``tests/integration/test_secretscan.py`` plants one on the bus and one in a log). Seen
  nowhere, or twice, fails the session too.

Cost: reading the streams, then one pass over their bytes with a handful of regular
expressions and a substring search per known value (4 MiB of clean messages are searched at
once); sessions of 500 to 900 messages took 0.1 to 0.3 s. It grows with the streams' bytes
and runs in the last test's teardown, so it counts against that test's timeout, by far less
than the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.bus import NATS_ERRORS, Bus
from shared.errors import CapibusError
from shared.kube import KubeClient, KubeConfig
from shared.resources import SECRET
from testenv.harness import LocalStack
from testenv.secretscan import Finding, Scanner
from tests.integration.support import SERVICE_LOGS

log = logging.getLogger(__name__)

SCANNER = Scanner()
PLANTED = "a planted marker"
_planted: dict[str, str] = {}
#: what the session scan read and how long it took, for the terminal summary
summary: list[str] = []


def register_secret(value: str | bytes, what: str = "a test-made secret") -> None:
    """Look for ``value`` on the bus and in the logs at the end of the session."""
    SCANNER.register(value, what)


def expect_planted(marker: str) -> None:
    """``marker`` is planted once on purpose: the session scan must find it exactly once."""
    label = f"{PLANTED} {len(_planted) + 1}"
    _planted[marker] = label
    SCANNER.register(marker, label)


# --- every Secret of the session --------------------------------------------------------------


class SecretWatch:
    """Registers the data of every Secret in the API server, from start until ``stop``."""

    def __init__(self, kubeconfig: Path, scanner: Scanner) -> None:
        self.kubeconfig = kubeconfig
        self.scanner = scanner
        self.seen = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="secret-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(15)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._task = self._loop.create_task(self._follow())
            self._started.set()
            with contextlib.suppress(asyncio.CancelledError):
                self._loop.run_until_complete(self._task)
        finally:
            self._loop.close()

    async def _follow(self) -> None:
        client = KubeClient.from_config(KubeConfig.load(self.kubeconfig), qps=None)
        try:
            while True:
                try:
                    await self._list_then_watch(client)
                except (CapibusError, OSError, ValueError) as exc:
                    # A test restarting the API server, or a compacted watch: list again.
                    log.info("secret watch: %s; listing again", exc)
                    await asyncio.sleep(1)
        finally:
            # The final list catches whatever the watch had not delivered yet.
            with contextlib.suppress(CapibusError):
                for secret in (await client.list(SECRET))[0]:
                    self._register(secret)
            await client.aclose()

    async def _list_then_watch(self, client: KubeClient) -> None:
        secrets, version = await client.list(SECRET)
        for secret in secrets:
            self._register(secret)
        async for event in client.watch(SECRET, resource_version=version):
            if event.type in ("ADDED", "MODIFIED"):
                self._register(event.object)

    def _register(self, secret: dict[str, Any]) -> None:
        self.seen += 1
        self.scanner.register_secret(secret)


# --- reading what the session left --------------------------------------------------------------


async def stream_messages(bus: Bus) -> list[tuple[str, bytes]]:
    """(where, headers and body) of every message of every stream on the server."""
    found: list[tuple[str, bytes]] = []
    for info in await bus.js.streams_info():
        if info.state.messages and info.config.name:
            found += await _read(bus, info.config.name)
    return found


async def _read(bus: Bus, stream: str) -> list[tuple[str, bytes]]:
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
        num_replicas=1,
    )
    consumer = await bus.js.add_consumer(stream, config)
    psub = await bus.js.pull_subscribe_bind(consumer=consumer.name, stream=stream)
    found: list[tuple[str, bytes]] = []
    try:
        remaining = consumer.num_pending or 0
        while remaining > 0:
            msgs = await psub.fetch(min(remaining, 256), timeout=10)
            for msg in msgs:
                where = f"stream {stream} #{msg.metadata.sequence.stream} {msg.subject}"
                headers = "".join(f"{k}: {v}\n" for k, v in (msg.headers or {}).items())
                found.append((where, headers.encode() + msg.data))
            remaining = (msgs[-1].metadata.num_pending or 0) if msgs else 0
    finally:
        with contextlib.suppress(*NATS_ERRORS):
            await psub.unsubscribe()
        with contextlib.suppress(*NATS_ERRORS):
            await bus.js.delete_consumer(stream, consumer.name)
    return found


async def scan_streams(nats_url: str, scanner: Scanner = SCANNER) -> tuple[list[Finding], int]:
    """Findings on the bus, and how many messages were read."""
    bus = await Bus.connect(nats_url, name="secret-scan")
    try:
        messages = await stream_messages(bus)
    finally:
        await bus.close()
    return scanner.scan_many(messages), len(messages)


def scan_logs(scanner: Scanner = SCANNER) -> list[Finding]:
    return [finding for path in dict.fromkeys(SERVICE_LOGS) for finding in scanner.scan_file(path)]


# --- judging ----------------------------------------------------------------------------------


def unexpected(findings: list[Finding]) -> list[str]:
    """The findings that are leaks, and each planted marker not seen exactly once."""
    places: dict[str, set[str]] = {label: set() for label in _planted.values()}
    for finding in findings:
        label = next((p for p in places if finding.what.startswith(p)), None)
        if label is not None:
            places[label].add(finding.where)
    expected = set().union(*places.values())
    problems = [str(f) for f in findings if f.where not in expected]
    problems += [
        f"{label} was found {len(seen)} times instead of once: the scan is blind or it leaked"
        for label, seen in places.items()
        if len(seen) != 1
    ]
    return problems


@pytest.fixture(scope="session")
async def secret_scan(stack: LocalStack) -> AsyncIterator[Scanner]:
    SCANNER.register(stack.endpoints.token, "the stack's admin token")
    watch = SecretWatch(stack.endpoints.kubeconfig, SCANNER)
    watch.start()
    yield SCANNER
    watch.stop()
    began = time.monotonic()
    findings, read = await scan_streams(stack.endpoints.nats_url)
    findings += scan_logs()
    problems = unexpected(findings)
    summary.append(
        f"secret scan: {read} messages on the bus and {len(set(SERVICE_LOGS))} service logs "
        f"against {SCANNER.known} known values from {watch.seen} Secret versions, "
        f"{len(problems)} leaks, {time.monotonic() - began:.1f}s"
    )
    if problems:
        pytest.fail("\n".join([f"{summary[-1]}; credentials found:", *problems]), pytrace=False)
