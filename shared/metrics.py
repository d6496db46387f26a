"""The Prometheus adapter: one registry per process, cheap instruments, and ``/metrics``.

Services never import ``prometheus_client`` or ``aiohttp``; they use what this module offers:

- ``counter(name, documentation, labels)``: a ``Tally`` whose labelled children are cached
  by label values, so counting on a hot path is one dict lookup and one increment.
- ``ConsumerMetrics``: what ``shared.consumer`` records for every service (messages handled
  by outcome, handler latency, errors by kind, redeliveries, lag, partitions owned). Its
  children are created once per subscription, never per message.
- ``StreamMetrics``: how full each stream was when ``shared.bus`` last checked before
  publishing, and whether its publishes are being held back at the limit.
- ``Family`` and ``register_families``: series computed by the service itself at scrape time
  from state it already holds (the exporter), with no instrument objects per series.
- ``MetricsServer``: ``/metrics`` (OpenMetrics when the ``Accept`` header asks for it,
  Prometheus text otherwise), ``/healthz`` (the process answers) and ``/readyz`` (the
  service's own readiness check), on the asyncio loop. A thread-based server would read
  service state while the loop mutates it; on the loop a scrape sees one consistent moment.

The endpoint is configured like every setting: ``CAPIBUS_METRICS_PORT`` (8080; ``0`` turns it
off, which is what the integration harness does for the many services it runs on one host)
and ``CAPIBUS_METRICS_HOST``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import prometheus_client
from aiohttp import web
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.errors import CapibusError

log = logging.getLogger(__name__)

# ``_created`` doubles the series of every counter and no dashboard of ours reads it.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: Everything this process exports. Service processes are single-purpose, so one registry per
#: process is one registry per service replica.
REGISTRY = CollectorRegistry(auto_describe=True)
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_standard)

#: Handler runs last from a millisecond (a cached status write) to minutes (a Helm upgrade).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class MetricsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAPIBUS_METRICS_", extra="ignore")

    port: int = Field(8080, ge=0, le=65535, description="Port of /metrics and /healthz; 0: off")
    host: str = Field("0.0.0.0", description="Address the metrics endpoint listens on")


class MetricsUnavailable(CapibusError):
    """The metrics endpoint could not listen (the port is taken or not ours to bind)."""


# --- instruments for service code ----------------------------------------------------------


class Tally:
    """A counter family; ``inc("a", "b")`` counts for the label values ``("a", "b")``."""

    def __init__(self, family: Counter, *, labelled: bool) -> None:
        self._family = family
        self._children: dict[tuple[str, ...], Any] = {}
        if not labelled:
            self._children[()] = family  # an unlabelled counter is its own only child

    def inc(self, *values: str, amount: float = 1.0) -> None:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._family.labels(*values)
        child.inc(amount)


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Tally:
    """A counter in the process registry; exported as ``<name>_total``."""
    family = Counter(name, documentation, list(labels), registry=REGISTRY)
    return Tally(family, labelled=bool(labels))


_HANDLED = Counter(
    "capibus_messages_handled",
    "Messages a consumer settled, by subscription and outcome "
    "(ok, retry, dead_letter, error, dropped)",
    ["service", "subscription", "outcome"],
    registry=REGISTRY,
)
_LATENCY = Histogram(
    "capibus_handler_duration_seconds",
    "Duration of one handler run (one batch of one object), whatever its outcome",
    ["service", "subscription"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
_ERRORS = Counter(
    "capibus_handler_errors",
    "Handler runs and decodes that raised, by exception class",
    ["service", "subscription", "kind"],
    registry=REGISTRY,
)
_REDELIVERIES = Counter(
    "capibus_redeliveries",
    "Messages received again after an earlier delivery (num_delivered > 1)",
    ["service", "subscription"],
    registry=REGISTRY,
)
_LATE = Counter(
    "capibus_late_messages",
    "Redelivered messages older than one of their object that already ran here; each runs "
    "again with the newer ones behind it",
    ["service", "subscription"],
    registry=REGISTRY,
)
_RETRIES = Counter(
    "capibus_handler_retries",
    "Handler runs that met a TemporaryError and will be tried again (the messages are held)",
    ["service", "subscription"],
    registry=REGISTRY,
)
_WAITING = Gauge(
    "capibus_objects_waiting",
    "Objects whose handler is waiting out a TemporaryError (an outage of what it depends on)",
    ["service", "subscription"],
    registry=REGISTRY,
)
_LAG = Gauge(
    "capibus_consumer_lag",
    "Messages still waiting in a partition's consumer after the last fetched one",
    ["service", "subscription", "partition"],
    registry=REGISTRY,
)
_OWNED = Gauge(
    "capibus_partitions_owned",
    "Partitions this replica currently holds a lease on",
    ["service"],
    registry=REGISTRY,
)


_STREAM_FILL = Gauge(
    "capibus_stream_fill_ratio",
    "Share of a stream's max_bytes or max_msgs (the fuller) in use, as this process last read "
    "it before publishing (shared.bus)",
    ["stream"],
    registry=REGISTRY,
)
_STREAM_HELD = Gauge(
    "capibus_stream_held_back",
    "1 while this process's publishes to a stream are refused (StreamFull): it is near its "
    "limit and a durable consumer still needs its oldest messages",
    ["stream"],
    registry=REGISTRY,
)


class StreamMetrics:
    """What ``shared.bus``'s guard saw of each stream at its last check."""

    def checked(self, stream: str, ratio: float, *, held: bool) -> None:
        _STREAM_FILL.labels(stream).set(ratio)
        _STREAM_HELD.labels(stream).set(1 if held else 0)


#: what became of a handled message: acked; handed back after a ``TemporaryError``; given up
#: on; handed back after an unexpected exception; given up on when even its dead letter could
#: not be stored (an error log line names it)
Outcome = Literal["ok", "retry", "dead_letter", "error", "dropped"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "retry", "dead_letter", "error", "dropped")


class SubscriptionMetrics:
    """The children of one subscription, created once so the consumer only increments."""

    __slots__ = (
        "_handled",
        "_lag",
        "_retries",
        "late",
        "latency",
        "redelivered",
        "service",
        "subscription",
        "waiting",
    )

    def __init__(self, service: str, subscription: str) -> None:
        self.service = service
        self.subscription = subscription
        self._handled = {o: _HANDLED.labels(service, subscription, o) for o in OUTCOMES}
        self.latency = _LATENCY.labels(service, subscription)
        self.redelivered = _REDELIVERIES.labels(service, subscription)
        self.late = _LATE.labels(service, subscription)
        self._retries = _RETRIES.labels(service, subscription)
        self.waiting = _WAITING.labels(service, subscription)
        self._lag: dict[int, Any] = {}

    def settled(self, outcome: Outcome, count: int = 1) -> None:
        self._handled[outcome].inc(count)

    def retried(self) -> None:
        self._retries.inc()

    def error(self, exc: BaseException) -> None:
        _ERRORS.labels(self.service, self.subscription, type(exc).__name__).inc()

    def lag(self, partition: int, pending: int) -> None:
        gauge = self._lag.get(partition)
        if gauge is None:
            gauge = self._lag[partition] = _LAG.labels(
                self.service, self.subscription, str(partition)
            )
        gauge.set(pending)

    def forget(self, partition: int) -> None:
        """Drop the lag series of a partition this replica no longer pulls from."""
        if self._lag.pop(partition, None) is not None:
            _LAG.remove(self.service, self.subscription, str(partition))


class ConsumerMetrics:
    """Every series ``shared.consumer`` records for one service."""

    def __init__(self, service: str, subscriptions: Iterable[str]) -> None:
        self.owned = _OWNED.labels(service)
        self.of = {name: SubscriptionMetrics(service, name) for name in subscriptions}


class Stopwatch:
    """``with Stopwatch(histogram_child): ...`` observes the block's duration."""

    __slots__ = ("_began", "_child")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._began = 0.0

    def __enter__(self) -> None:
        self._began = time.perf_counter()

    def __exit__(self, *_: object) -> None:
        self._child.observe(time.perf_counter() - self._began)


# --- series a service computes itself --------------------------------------------------------

Labels = Mapping[str, str]


@dataclass(frozen=True)
class Family:
    """One metric family: a gauge, or an info family (whose name must end in ``_info``)."""

    name: str
    documentation: str
    samples: Sequence[tuple[Labels, float]]
    type: Literal["gauge", "info"] = "gauge"


def _as_metric(family: Family) -> Metric:
    if family.type == "info":
        # OpenMetrics names an info family without the suffix its samples carry.
        metric = Metric(family.name.removesuffix("_info"), family.documentation, "info")
    else:
        metric = Metric(family.name, family.documentation, "gauge")
    for labels, value in family.samples:
        metric.add_sample(family.name, dict(labels), value)
    return metric


class _FamilySource:
    """A collector over a callable; ``describe`` is empty so registering never collects."""

    def __init__(self, produce: Callable[[], Iterable[Family]]) -> None:
        self._produce = produce

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for family in self._produce():
            yield _as_metric(family)


def register_families(
    produce: Callable[[], Iterable[Family]], registry: CollectorRegistry = REGISTRY
) -> Callable[[], None]:
    """Export what ``produce()`` returns at every scrape; returns the unregister function."""
    source = _FamilySource(produce)
    registry.register(source)
    return lambda: registry.unregister(source)


def render(accept: str | None, registry: CollectorRegistry = REGISTRY) -> tuple[bytes, str]:
    """(body, content type): OpenMetrics if ``accept`` asks for it, Prometheus text otherwise."""
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type


def render_families(families: Iterable[Family], accept: str | None = None) -> tuple[bytes, str]:
    """Render ``families`` alone, as a scrape would (tests and tools)."""
    registry = CollectorRegistry(auto_describe=True)
    snapshot = list(families)
    register_families(lambda: snapshot, registry)
    return render(accept, registry)


# --- the endpoint ---------------------------------------------------------------------------


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on the running loop; port 0 picks a free one."""

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        registry: CollectorRegistry = REGISTRY,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.ready = ready
        self._runner: web.AppRunner | None = None

    async def start(self) -> MetricsServer:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise MetricsUnavailable(f"cannot listen on {self.host}:{self.port}: {exc}") from exc
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("metrics on http://%s:%s/metrics", self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = render(request.headers.get("Accept"), self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if self.ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")


async def serve_metrics(
    settings: MetricsSettings | None = None, *, ready: Callable[[], bool] = lambda: True
) -> MetricsServer | None:
    """Start the endpoint the settings ask for, or None when they turn it off (port 0)."""
    settings = settings or MetricsSettings()
    if settings.port == 0:
        return None
    return await MetricsServer(host=settings.host, port=settings.port, ready=ready).start()
