"""Start the system the way a small deployment runs it: the services a Cluster's story needs
(seven: all but admission, catalog and exporter, see ``demo.__main__``) in one all-in-one
process (``python -m services run --only ...``, README "Everything in one process"), and the
stand-ins.

The services are configured as the Helm chart would configure them (``CAPIBUS_*``), with OIDC
and Zenith switched on, and the helm service pointed at the stand-in charts in
``standins/charts`` and the real ``helm`` binary the harness built. The stand-ins play every
peer capibus talks to: the identity and schedule operators, Zenith (with its registrar's admin
API on a free port) and Cluster API. They step slowly enough (``STANDIN_STEP_DELAY``) for a
human to follow the feed, and the schedule stand-in reserves flavors as Blazar would, so the
flavor remapping is visible.

The caller's ``CAPIBUS_*`` and ``STANDIN_*`` settings are dropped so the demo behaves the same
in any shell; the partition count is pinned because the demo addresses a status subject itself.

The metal-stack scene (``demo.metalsystem``) starts other processes the same way and shares
the rest: ``bus_env``, the readiness wait (``until_ready``) and the lease TTL wait (``settle``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from demo.feed import DemoTimeout
from demo.processes import ROOT, Service
from demo.scene import Scene
from demo.style import note
from shared.kube import ResourceKind
from shared.messages import Message, ResourcesListed
from shared.resources import KINDS

SERVICES = ("watcher", "writer", "identity", "lease", "helm", "monitor", "discovery")
CHARTS = ROOT / "standins" / "charts"
BASE_DOMAIN = "apps.example.test"
STEP_DELAY = "0.3"
LEASE_TTL_SECONDS = 3
PARTITIONS = 16
READY_TIMEOUT = 30.0


async def start(scene: Scene) -> None:
    """Start everything and wait until each process is ready to work."""
    port = _free_port()
    base = {**scene.env, "PYTHONUNBUFFERED": "1"}
    standins = scene.services.start(
        Service("standins", {**base, **_standin_env(port)}, scene.workdir, module="standins")
    )
    env = {**base, **deployment_env(scene, registrar=f"http://127.0.0.1:{port}")}
    capibus = scene.services.start(
        Service(
            "capibus",
            {**env, "CAPIBUS_REPLICA": "capibus-1"},
            scene.workdir,
            module="services",
            args=("run", "--only", ",".join(SERVICES)),
        )
    )
    # One process, six consumers: each logs its own claims, prefixed with its name.
    claimed = [(capibus, f"{name}: owns partition {PARTITIONS - 1} (") for name in SERVICES[1:]]
    await until_ready(
        scene, logs=[(standins, "stand-ins running"), *claimed], consumers=[], kinds=KINDS.values()
    )
    list_processes([standins, capibus])
    note(f"registrar (Zenith stand-in) on 127.0.0.1:{port}; helm: {scene.bin_dir / 'helm'}")
    await settle()


async def until_ready(
    scene: Scene,
    *,
    logs: Sequence[tuple[Service, str]],
    consumers: Sequence[Service],
    kinds: Iterable[ResourceKind],
) -> None:
    """Until each of ``logs`` has its line, each consumer owns every partition and the
    watcher has listed every one of ``kinds``."""
    # A lone replica claims every partition in ascending order: the last one means all.
    claims = [s.wait_for_log(f"owns partition {PARTITIONS - 1} (") for s in consumers]
    wanted = {(k.api_version, k.kind) for k in kinds}
    try:
        await scene.guarded(
            asyncio.gather(
                *(service.wait_for_log(line) for service, line in logs),
                *claims,
                # "listed at" is logged per kind; the feed tells when every kind is listed.
                scene.feed.wait_until(lambda seen: _listed(seen) >= wanted or None),
            ),
            "the services becoming ready",
            seconds=READY_TIMEOUT,
        )
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; see {scene.logs()}") from None


def list_processes(started: Sequence[Service]) -> None:
    width = max(9, *(len(service.name) for service in started))
    for service in started:
        note(f"{service.name:<{width}} pid {service.pid:<7} log {service.log_path.name}")


async def settle() -> None:
    """Wait out the lease TTL, saying why."""
    note(
        f"each consumer owns all {PARTITIONS} partitions, but on a fresh Redis waits one lease "
        f"TTL ({LEASE_TTL_SECONDS}s) before consuming: it cannot prove no earlier owner is "
        "still at work. So does the demo, so that the story starts with everyone listening."
    )
    await asyncio.sleep(LEASE_TTL_SECONDS)


def bus_env() -> dict[str, str]:
    """``CAPIBUS_*`` every story's services share: partitions, lease, writer, metrics."""
    return {
        "CAPIBUS_WRITER__COALESCE_SECONDS": "0.05",
        "CAPIBUS_LEASE_TTL": str(LEASE_TTL_SECONDS),
        "CAPIBUS_PARTITIONS": str(PARTITIONS),
        # Every service on one host: they cannot all serve /metrics on the default 8080.
        "CAPIBUS_METRICS_PORT": "0",
    }


def deployment_env(scene: Scene, *, registrar: str) -> dict[str, str]:
    """``CAPIBUS_*`` as a deployment with OIDC and Zenith would set it."""
    zenith: dict[str, Any] = {
        "apiserver_chart": {"name": str(CHARTS / "zenith-apiserver")},
        "operator_chart": {"name": str(CHARTS / "zenith-operator")},
        "registrar_admin_url": registrar,
        "sshd_host": "sshd.example.test",
        "base_domain": BASE_DOMAIN,
    }
    return {
        "CAPIBUS_AZIMUTH__OIDC_ENABLED": "true",
        "CAPIBUS_AZIMUTH__ZENITH_ENABLED": "true",
        "CAPIBUS_HELM__EXECUTABLE": str(scene.bin_dir / "helm"),
        "CAPIBUS_HELM__CHART": json.dumps({"name": str(CHARTS / "openstack-cluster")}),
        "CAPIBUS_HELM__ZENITH": json.dumps(zenith),
        "CAPIBUS_HELM__TIMEOUT": "30s",
        **bus_env(),
    }


def _standin_env(port: int) -> dict[str, str]:
    return {
        "STANDIN_STEP_DELAY": STEP_DELAY,
        "STANDIN_SCHEDULE_BLAZAR": "1",
        "STANDIN_ZENITH_REGISTRAR_PORT": str(port),
        "STANDIN_ZENITH_BASE_DOMAIN": BASE_DOMAIN,
    }


def inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CAPIBUS_", "STANDIN_"))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listed(seen: list[Message]) -> set[tuple[str, str]]:
    return {(m.api_version, m.kind) for m in seen if isinstance(m, ResourcesListed)}
