"""Every service over TLS: a stack whose NATS and Redis speak nothing else.

The session's stack speaks plaintext on loopback (``testenv.harness``: TLS on demand), so this
module starts a stack of its own with ``tls=True``: nats-server requires TLS of every client
and redis-server listens on a TLS port only, both with a certificate from a CA made for the
run. The services run as one all-in-one process configured the way the chart configures them
(``tls://`` and ``rediss://`` URLs, ``CAPIBUS_TLS__*`` naming the CA), with the stand-ins, and
a Cluster goes through its whole life. A server that is not the one the CA vouches for stops
a service at start with one line and the configuration exit status, like a wrong password.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.access import ALL_IN_ONE, EXIT_CREDENTIALS
from shared.kube import KubeClient, KubeConfig
from shared.resources import CLUSTER_TEMPLATE, NAMESPACE
from testenv import certs
from testenv.crds import apply_crds
from testenv.harness import LocalStack
from tests.integration.lifecycle.conftest import (
    SERVICES,
    World,
    deployment_env,
    free_port,
    template_manifest,
)
from tests.integration.lifecycle.test_lifecycle import deleted_without_leftovers, ready
from tests.integration.support import ServiceProcess, eventually, service_processes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_stack(
    tmp_path_factory: pytest.TempPathFactory, tools_bin: Path | None
) -> Iterator[LocalStack]:
    if tools_bin is None:
        pytest.skip("an external stack is configured: its NATS and Redis are not ours to start")
    workdir = tmp_path_factory.mktemp("tls-stack")
    with LocalStack(workdir, bin_dir=tools_bin, use_env_stack=False, tls=True) as stack:
        yield stack


@pytest.fixture(scope="module")
async def tls_kube(tls_stack: LocalStack) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(tls_stack.endpoints.kubeconfig), qps=None)
    await apply_crds(client, field_manager="capibus-tests")
    yield client
    await client.aclose()


@pytest.fixture
def tls_service(tls_stack: LocalStack, tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    with service_processes(tls_stack, tmp_path) as start:
        yield start


@pytest.mark.timeout(240)
async def test_a_cluster_lives_and_dies_with_every_connection_over_tls(
    tls_stack: LocalStack,
    tls_kube: KubeClient,
    tools_bin: Path | None,
    tls_service: Callable[..., ServiceProcess],
) -> None:
    endpoints = tls_stack.endpoints
    assert endpoints.nats_url.startswith("tls://")
    assert endpoints.redis_url.startswith("rediss://")
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    await tls_kube.create(NAMESPACE, {"metadata": {"name": namespace}})
    template = f"tpl-{uuid.uuid4().hex[:6]}"
    await tls_kube.create(CLUSTER_TEMPLATE, template_manifest(template))
    world = World(kube=tls_kube, namespace=namespace, template=template, registrar_url=None)
    tls_service(
        "standins",
        module="standins",
        STANDIN_STEP_DELAY="0.02",
        STANDIN_ZENITH_REGISTRAR_PORT=str(free_port()),
    )
    env = deployment_env(tools_bin, oidc=False, registrar=None)
    together = tls_service(
        "allinone", module="services.allinone", CAPIBUS_SERVICES=",".join(SERVICES), **env
    )

    await world.create_cluster("secure")
    cluster = await ready(world, "secure")
    assert cluster["status"]["nodeCount"] == 5
    await deleted_without_leftovers(world, "secure")

    # Every connection is one the server counts as TLS (it accepts no other): the services'
    # (one process, so one user for all of them) and the stand-ins'.
    users = await tls_connections(tls_stack)
    assert ALL_IN_ONE in users, users
    assert all(users.values()), users
    assert together.stop() == 0, together.log()[-3000:]


async def tls_connections(stack: LocalStack) -> dict[str, bool]:
    """The users connected to NATS, each with whether its connection speaks TLS."""
    monitor = stack.nats_monitor_url()
    async with httpx.AsyncClient() as client:
        connz: dict[str, Any] = (await client.get(f"{monitor}/connz?auth=1&limit=1024")).json()
    found: dict[str, bool] = {}
    for connection in connz.get("connections") or []:
        user = connection.get("authorized_user", "")
        found[user] = found.get(user, True) and bool(connection.get("tls_version"))
    return found


@pytest.mark.timeout(120)
async def test_a_server_the_ca_does_not_vouch_for_stops_the_service_at_start(
    tls_service: Callable[..., ServiceProcess], tmp_path: Path
) -> None:
    """A CA the servers' certificates do not chain to: one line naming the server, exit 78,
    no retry loop (a new certificate is a configuration change, not an outage to wait out)."""
    other = certs.issue(tmp_path / "other")
    for system in ("nats", "redis"):
        trust = {f"CAPIBUS_TLS__{system.upper()}_CA_FILE": str(other.ca)}
        process = tls_service("writer", **trust)
        assert process.proc is not None
        exited = process.proc

        async def status(proc: subprocess.Popen[bytes] = exited) -> int | None:
            return proc.poll()

        code = await eventually(
            status,
            lambda code: code is not None,
            timeout=60,
            what=f"the writer trusting another CA for {system} to exit",
        )
        assert code == EXIT_CREDENTIALS, process.log()[-3000:]
        lines = [line for line in process.log().splitlines() if "cannot start" in line]
        assert len(lines) == 1, process.log()[-3000:]
        assert f"{system} at " in lines[0]
        assert "127.0.0.1:" in lines[0]
        assert "not trusted over TLS" in lines[0]
