"""Fixtures for tests against the real stack: clients, CRDs, a namespace per test, services."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.bus import Bus
from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig
from shared.resources import NAMESPACE
from shared.resp import Redis
from testenv.crds import apply_crds
from testenv.harness import LocalStack
from tests.integration import leakscan
from tests.integration.leakscan import secret_scan
from tests.integration.support import ServiceProcess, service_processes

pytestmark = pytest.mark.integration
__all__ = ["secret_scan"]  # the session's secret scan is a fixture defined in leakscan.py


@pytest.fixture(autouse=True)
def _scanned_for_secrets(request: pytest.FixtureRequest) -> None:
    """A session that starts the stack ends with its secret scan (``leakscan.py``)."""
    if "stack" in request.fixturenames:
        request.getfixturevalue("secret_scan")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in leakscan.summary:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
async def kube(stack: LocalStack) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(stack.endpoints.kubeconfig), qps=None)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
async def bus(stack: LocalStack) -> AsyncIterator[Bus]:
    connection = await Bus.connect(stack.endpoints.nats_url, name="tests")
    await connection.ensure_streams()
    yield connection
    await connection.close()


@pytest.fixture(scope="session")
async def redis_client(stack: LocalStack) -> AsyncIterator[Redis]:
    """The services' own Redis client (``shared.resp``); ``test_stack`` checks with redis-py."""
    client = Redis.from_url(stack.endpoints.redis_url)
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def cluster_stack(
    tmp_path_factory: pytest.TempPathFactory, tools_bin: Path | None
) -> Iterator[LocalStack]:
    """A stack of the module's own whose NATS is a three-node JetStream cluster, for the tests
    that kill nodes (the session's stack has one nats-server)."""
    with LocalStack(tmp_path_factory.mktemp("cluster"), bin_dir=tools_bin, nats_cluster=3) as stack:
        yield stack


@pytest.fixture
async def cluster_bus(cluster_stack: LocalStack) -> AsyncIterator[Bus]:
    bus = await Bus.connect(cluster_stack.endpoints.nats_url, name="tests/cluster")
    yield bus
    await bus.close()


@pytest.fixture(scope="session")
async def crds(kube: KubeClient) -> list[str]:
    """Our CRDs and the peer CRDs, applied and Established."""
    return await apply_crds(kube, field_manager="capibus-tests")


@pytest.fixture
async def namespace(kube: KubeClient, crds: list[str]) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create(NAMESPACE, {"metadata": {"name": name}})
    yield name
    with contextlib.suppress(KubeNotFound):
        await kube.delete(NAMESPACE, None, name)


@pytest.fixture
def service(stack: LocalStack, tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start service replicas as real processes; all are stopped after the test."""
    with service_processes(stack, tmp_path) as start:
        yield start


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
