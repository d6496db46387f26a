"""What every service's ``__main__`` shares: logging, connections, signals.

``Infrastructure`` holds the three real clients a composition root needs; tests build their
own (fakes, or clients pointed at the local stack) and hand them to the same roots. Connecting
also starts the process's ``/metrics`` endpoint (``shared.metrics``), so every service exports
its consumer metrics without a line of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio as aioredis

from shared.bus import Bus
from shared.consumer import Consumer
from shared.coordination import PartitionLeases
from shared.kube import KubeClient, KubeConfig
from shared.metrics import MetricsServer, serve_metrics
from shared.settings import ServiceSettings

T = TypeVar("T")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: ServiceSettings, service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(message)s"))
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    # httpx logs every request at INFO; that is noise on a hot path.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def kube_client(settings: ServiceSettings, *, service: str) -> KubeClient:
    """The Kubernetes client the settings describe, named after ``service``."""
    return KubeClient.from_config(
        KubeConfig.load(settings.kubeconfig),
        qps=settings.kube_qps,
        burst=settings.kube_burst,
        max_in_flight=settings.kube_max_in_flight,
        user_agent=f"capibus-{service}",
    )


@dataclass
class Infrastructure:
    bus: Bus
    redis: aioredis.Redis
    kube: KubeClient
    metrics: MetricsServer | None = None

    @classmethod
    async def connect(cls, settings: ServiceSettings, *, service: str) -> Infrastructure:
        bus = await Bus.connect(settings.nats_url, name=f"{service}/{settings.replica}")
        await bus.ensure_streams(settings.retention.build())
        kube = kube_client(settings, service=service)
        redis = aioredis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        infra = cls(bus=bus, redis=redis, kube=kube)
        try:
            infra.metrics = await serve_metrics()
        except BaseException:
            await infra.aclose()
            raise
        return infra

    def leases(self, settings: ServiceSettings, *, service: str) -> PartitionLeases:
        return PartitionLeases(
            self.redis,
            service=service,
            member=settings.replica,
            partitions=settings.partitions,
            ttl=settings.lease_ttl,
        )

    async def aclose(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        await self.bus.close()
        await self.kube.aclose()
        await self.redis.aclose()


async def run_consumer(
    settings: ServiceSettings,
    stop: asyncio.Event,
    *,
    service: str,
    build: Callable[[Infrastructure], Consumer],
) -> None:
    """Connect, build the service's consumer from the real clients, run it until ``stop``.

    Connecting retries for as long as NATS or Redis is away, so it is raced against ``stop``:
    a service told to stop while it waits for them stops, rather than outliving its SIGTERM.
    """
    infra = await unless_stopped(Infrastructure.connect(settings, service=service), stop)
    if infra is None:
        logging.getLogger(__name__).info("%s stopped before it connected", service)
        return
    try:
        await build(infra).run(stop)
    finally:
        await infra.aclose()


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None (``work`` cancelled) if ``stop`` is set first."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)``; SIGTERM or SIGINT sets ``stop`` so it can shut down gracefully."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
