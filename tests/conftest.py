"""Shared fixtures.

The real stack is expensive (seconds to start, tens of minutes to build cold), so it is
session-scoped and started only when a test asks for ``stack``: unit-only runs never pay for
it. The binaries are built (or found cached) once, right after collection and only when a
collected test needs the stack: doing it there keeps a cold build outside the per-test timeout
and lets its progress reach the terminal. With ``KUBECONFIG``, ``NATS_URL`` and ``REDIS_URL``
all set, the tests use that running stack and nothing is built or started. With
``CAPIBUS_TESTENV=containers`` the stack is K3s, NATS and Redis in containers
(``testenv.containers``), where a Docker engine is available.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv import containers
from testenv.harness import LocalStack, ensure_binaries, external_stack_configured

_BIN_DIR = pytest.StashKey[Path]()


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    wanted = any("stack" in getattr(item, "fixturenames", ()) for item in session.items)
    if not wanted or config.option.collectonly or external_stack_configured():
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        config.stash[_BIN_DIR] = ensure_binaries()


@pytest.fixture(scope="session")
def tools_bin(pytestconfig: pytest.Config) -> Path | None:
    """Directory of the pinned binaries; None when an external stack is used."""
    if external_stack_configured():
        return None
    # Only a test that reaches the stack indirectly (getfixturevalue) builds here.
    return pytestconfig.stash.get(_BIN_DIR, None) or ensure_binaries()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, tools_bin: Path | None) -> Iterator[LocalStack]:
    """The running local stack; stale watches of Azimuth Clusters get 410 Gone within seconds.

    Azimuth Clusters bypass the watch cache (size 0), so their watches are served by etcd,
    whose history a 5s compaction interval keeps short: a watcher that falls behind meets a
    real "resource version too old" from the real API server, as in production after an
    outage longer than the watch cache window.
    """
    workdir = tmp_path_factory.mktemp("stack")
    if containers.wanted():
        yield from _in_containers(workdir, tools_bin)
        return
    with LocalStack(
        workdir,
        etcd_compaction_interval="5s",
        bin_dir=tools_bin,
        apiserver_args=["--watch-cache-sizes=clusters.azimuth.stackhpc.com#0"],
    ) as local_stack:
        yield local_stack


def _in_containers(workdir: Path, tools_bin: Path | None) -> Iterator[LocalStack]:
    """``CAPIBUS_TESTENV=containers``: K3s, NATS and Redis from testcontainers, used as an
    external stack (``testenv.containers``); skipped, saying why, without a Docker engine."""
    reason = containers.unavailable()
    if reason:
        pytest.skip(
            f"{containers.SETTING}=containers: {reason}; unset it to run on the locally "
            "built programs"
        )
    with (
        containers.running(workdir) as env,
        containers.environment(env),
        LocalStack(workdir, bin_dir=tools_bin) as external,
    ):
        yield external
