"""The stack in containers: K3s, NATS (JetStream) and Redis through testcontainers.

``CAPIBUS_TESTENV=containers`` makes the test session run against these instead of the
programs ``build.sh`` builds, on a machine with a Docker engine (most developers' laptops):
nothing to build, and a real Kubernetes distribution rather than a bare API server. The local
programs stay the default, because the machines CI runs on have no Docker engine.

The containers are handed to the tests the way any running stack is: their endpoints become
``KUBECONFIG``, ``NATS_URL`` and ``REDIS_URL``, and ``LocalStack`` treats the session as an
external stack (``testenv.harness``). What only a stack of our own processes allows (stopping
and restarting a component, the second API server of a workload cluster, etcd compaction on
demand) is therefore unavailable, and the tests that need it skip, as they do on any
external stack.

The images are pinned to the versions ``versions.env`` pins for the local programs, so both
paths run the same Kubernetes minor, NATS and Redis releases. testcontainers is imported only
when this mode is chosen; when it cannot reach a Docker engine, ``unavailable`` says why in
one line and the session skips every test that needs the stack with that line.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the setting that chooses the stack of a test session: ``local`` (default) or ``containers``
SETTING = "CAPIBUS_TESTENV"
CONTAINERS = "containers"
VERSIONS = Path(__file__).with_name("versions.env")
#: Redis has no pin in versions.env (the local one is Debian's); the chart pins the same tag
REDIS_IMAGE = "redis:7.4.6-alpine"


def wanted(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    mode = env.get(SETTING, "local").strip().lower()
    if mode not in ("local", CONTAINERS):
        raise ValueError(f"{SETTING}={mode!r}: expected 'local' or '{CONTAINERS}'")
    return mode == CONTAINERS


def images(versions: Path = VERSIONS) -> dict[str, str]:
    """The image of each component, from the pins of the local programs."""
    pins = dict(
        line.split("=", 1)
        for line in versions.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    )
    return {
        "k3s": f"rancher/k3s:{pins['K8S_VERSION']}-k3s1",
        "nats": f"nats:{pins['NATS_VERSION'].removeprefix('v')}-alpine",
        "redis": REDIS_IMAGE,
    }


def unavailable(environ: dict[str, str] | None = None) -> str | None:
    """Why this mode cannot run here, in one line; None when it can.

    The engine is asked over its socket directly (``GET /_ping``): the Docker SDK leaves a
    socket open behind when no engine answers, which a test session with warnings as errors
    would report instead of the reason.
    """
    try:
        import testcontainers  # noqa: F401, PLC0415 (only in this mode)
    except ImportError:
        return "testcontainers is not installed (it comes with the dev dependencies: uv sync)"
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        return _ping(host)
    except OSError as exc:
        return f"no Docker engine reachable at {host} ({exc.strerror or exc})"


def _ping(host: str) -> str | None:
    scheme, _, where = host.partition("://")
    if scheme == "unix":
        family, address = socket.AF_UNIX, where
        request = b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n"
    elif scheme == "tcp":
        name, _, port = where.rpartition(":")
        family, address = socket.AF_INET, (name, int(port))  # type: ignore[assignment]
        request = b""  # may be TLS: that it answers at all is what is checked here
    else:
        return f"DOCKER_HOST={host} is neither unix:// nor tcp://"
    with socket.socket(family, socket.SOCK_STREAM) as conn:
        conn.settimeout(3.0)
        conn.connect(address)
        if not request:
            return None
        conn.sendall(request)
        reply = conn.recv(64)
    if b" 200 " not in reply.split(b"\r\n", 1)[0]:
        return f"the Docker engine at {host} answered {reply[:40]!r} to /_ping"
    return None


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[dict[str, str]]:
    """Start the three containers; yield the environment that names them; stop them after."""
    from testcontainers.community.k3s import K3SContainer  # noqa: PLC0415
    from testcontainers.community.nats import NatsContainer  # noqa: PLC0415
    from testcontainers.community.redis import RedisContainer  # noqa: PLC0415

    image = images()
    with contextlib.ExitStack() as started:
        k3s: Any = started.enter_context(K3SContainer(image["k3s"]))
        nats: Any = started.enter_context(NatsContainer(image["nats"], jetstream=True))
        redis: Any = started.enter_context(RedisContainer(image["redis"]))
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(k3s.config_yaml())
        kubeconfig.chmod(0o600)
        host, port = redis.get_container_host_ip(), redis.get_exposed_port(6379)
        yield {
            "KUBECONFIG": str(kubeconfig),
            "NATS_URL": nats.nats_uri(),
            "REDIS_URL": f"redis://{host}:{port}/0",
        }


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ`` for the duration (service processes inherit them)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
