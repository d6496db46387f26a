"""What every service's ``__main__`` shares: logging, connections, signals.

``Infrastructure`` holds the three real clients a composition root needs; tests build their
own (fakes, or clients pointed at the local stack) and hand them to the same roots. Connecting
also starts the process's ``/metrics`` endpoint (``shared.metrics``), so every service exports
its consumer metrics without a line of its own.

One process may run one service or several (``services.allinone``): every composition root's
``run`` takes an optional ``infra``. Given one, the root uses it and leaves closing it to whoever
connected it; without, ``provided`` connects the service's own and closes it at the end. The
clients hold no per-service state (the bus, Redis and the API server are addressed by each
call), which is why one set can serve every service of a process.

Credentials (``ServiceSettings.credentials``, ``shared.access``): each service logs in to NATS
and Redis as its own user. A server that refuses them is a configuration error, not an
outage: ``run_until_signalled`` logs one line naming the user and the server and exits with
``EXIT_CREDENTIALS`` (78), a status an operator can tell from a crash; the orchestrator's
restart back-off (kubelet's doubles up to five minutes) keeps that from becoming a tight loop.

``configure_logging``, the first call of every ``__main__``, also sets up span export when
``OTEL_EXPORTER_OTLP_ENDPOINT`` asks for it (``shared.tracing``).

Imports are lazy where a path is optional: nats-py, aiohttp and prometheus_client are not
needed by the admission webhook, which imports this module only for logging and signals. The
Redis client is made on first use: the watcher and the exporter hold no leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from shared import tracing
from shared.access import EXIT_CREDENTIALS, CredentialsRejected, with_login
from shared.kube import KubeClient, KubeConfig
from shared.resp import Redis
from shared.settings import ServiceSettings

if TYPE_CHECKING:
    from shared.bus import Bus
    from shared.consumer import Consumer
    from shared.coordination import PartitionLeases
    from shared.metrics import MetricsServer

T = TypeVar("T")

#: The clients a process running several services shares, for a composition root that does
#: not take ``infra`` (yet): ``run_consumer`` uses them instead of connecting its own. Set
#: only by ``services.allinone``, in the task of the root concerned.


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


def configure_logging(
    settings: ServiceSettings, service: str, *, name_loggers: bool = False
) -> None:
    """Log lines to stderr, prefixed with ``service``; ``name_loggers`` adds each line's logger
    (``services.lease.handlers``), which says which service wrote it when several share a
    process. JSON lines always carry it. Spans are exported from here on if the environment
    asks for it (``shared.tracing.configure``)."""
    handler = logging.StreamHandler(sys.stderr)
    logger = " %(name)s" if name_loggers else ""
    if settings.log_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {service}{logger} %(levelname)s %(message)s")
        )
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    # httpx logs every request at INFO; that is noise on a hot path.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # The other half of what a process tells its operator; here because every __main__ (and
    # the all-in-one process, once for all its services) starts with this call.
    tracing.configure(service)


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
    kube: KubeClient
    redis_url: str
    tls: ssl.SSLContext | None = None
    metrics: MetricsServer | None = None
    _redis: Redis | None = field(default=None, repr=False)

    @classmethod
    async def connect(cls, settings: ServiceSettings, *, service: str) -> Infrastructure:
        from shared.bus import Bus  # noqa: PLC0415 (lazy: module docstring)
        from shared.metrics import serve_metrics  # noqa: PLC0415 (lazy: module docstring)

        bus = await Bus.connect(
            settings.nats_url,
            name=f"{service}/{settings.replica}",
            login=settings.credentials.login(service, "nats"),
            tls=settings.tls.context(settings.nats_url),
        )
        await bus.ensure_streams(settings.retention.build())
        kube = kube_client(settings, service=service)
        redis_url = with_login(settings.redis_url, settings.credentials.login(service, "redis"))
        tls = settings.tls.context(settings.redis_url)
        infra = cls(bus=bus, kube=kube, redis_url=redis_url, tls=tls)
        try:
            infra.metrics = await serve_metrics()
        except BaseException:
            await infra.aclose()
            raise
        return infra

    def for_service(self, settings: ServiceSettings) -> Infrastructure:
        """These clients as one service of an all-in-one process sees them: the same
        connections, with a Kubernetes request budget of the service's own (its ``kube_qps``
        and ``kube_burst``), as a process of its own would have. The service does not close
        them; the process closes them once, through the original."""
        kube = self.kube.with_budget(qps=settings.kube_qps, burst=settings.kube_burst)
        # The Redis client is made here if not yet, so that every service shares this one.
        return dataclasses.replace(self, kube=kube, _redis=self.redis)

    @property
    def redis(self) -> Redis:
        """The Redis client, created on first use (it connects on its first command)."""
        if self._redis is None:
            self._redis = Redis.from_url(self.redis_url, timeout=5, tls=self.tls)
        return self._redis

    def leases(self, settings: ServiceSettings, *, service: str) -> PartitionLeases:
        from shared.coordination import PartitionLeases  # noqa: PLC0415 (lazy: module docstring)

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
        if self._redis is not None:
            await self._redis.aclose()


@contextlib.asynccontextmanager
async def provided(
    infra: Infrastructure | None, settings: ServiceSettings, *, service: str
) -> AsyncIterator[Infrastructure]:
    """``infra`` if a caller shares one (it stays open), else the service's own, closed after."""
    if infra is not None:
        yield infra
        return
    own = await Infrastructure.connect(settings, service=service)
    try:
        yield own
    finally:
        await own.aclose()


async def run_consumer(
    settings: ServiceSettings,
    stop: asyncio.Event,
    *,
    service: str,
    build: Callable[[Infrastructure], Consumer],
    infra: Infrastructure | None = None,
) -> None:
    """Connect (unless ``infra`` is shared), build the service's consumer from the real
    clients, run it until ``stop``.

    Connecting retries for as long as NATS or Redis is away, so it is raced against ``stop``:
    a service told to stop while it waits for them stops, rather than outliving its SIGTERM.
    """
    if infra is not None:
        await build(infra).run(stop)
        return
    own = await unless_stopped(Infrastructure.connect(settings, service=service), stop)
    if own is None:
        logging.getLogger(__name__).info("%s stopped before it connected", service)
        return
    try:
        await build(own).run(stop)
    finally:
        await own.aclose()


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

    try:
        asyncio.run(runner())
    except (CredentialsRejected, BaseExceptionGroup) as exc:
        rejected = _rejected(exc)
        if rejected is None:
            raise
        logging.getLogger(__name__).critical("cannot start: %s", rejected)
        sys.exit(EXIT_CREDENTIALS)


def _rejected(exc: BaseException) -> CredentialsRejected | None:
    """The refused login behind ``exc``, also from inside a task group's exceptions."""
    if isinstance(exc, CredentialsRejected):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found: BaseException | None = exc.subgroup(CredentialsRejected)
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        return found if isinstance(found, CredentialsRejected) else None
    return None
