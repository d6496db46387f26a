"""All-in-one mode: several services (by default all of them) in one process.

``python -m services run --all`` (or ``--only writer,lease``), or ``python -m services.allinone``
with ``CAPIBUS_SERVICES`` (``all``, or names separated by commas, ``all`` counting as the
default set: ``all,exporter``). It is meant for small installs, and the demo runs it: an
interpreter with a service's imports is 60-90 MiB of RSS, so the twelve default services take
820 MiB as processes and 102 MiB as one (``bench/RESULTS.md``, f2 and f3).

**Same code, same guarantees.** Each service is started by its own composition root
(``bootstrap.run``) with its own settings class, so its ``CAPIBUS_<SERVICE>__…`` variables keep
working; only the clients are shared: one ``Infrastructure`` (one NATS connection, one Redis
client, one Kubernetes client, one ``/metrics`` endpoint); each service's Kubernetes requests
still pass a token bucket of its own (``CAPIBUS_KUBE_QPS``/``_BURST``), as in a process of its
own, since one shared bucket made a burst of 100 Clusters wait for the API budget of one
service (``bench/ANALYSIS.md``, "e4 all in one"). Each service keeps its service name,
hence its durable consumers (``<service>-<subscription>-p<n>``) and its partition leases
(``<service>`` key space in Redis): switching between modes moves nothing, and a process
running all services is simply one member of every service's replica set. Exclusivity comes
from the leases, which name (service, partition) and this process as member, not from the
connection they travel on; acks go per message on the consumer that delivered it.

**One failing service stops the process.** A root that raises, or returns before it was told
to stop, sets ``stop`` for the others, which then release their leases and stop as on SIGTERM
(for at most ``CAPIBUS_STOP_GRACE_SECONDS``); the process then exits non-zero, so the
orchestrator restarts the whole set rather than leaving a half-running one. Nothing is lost:
what was in flight was not acked, and is redelivered to whoever holds the partition next.

Only this module and ``services.__main__`` import every service (``.importlinter``); each
service is imported when it is chosen, so ``--only`` pays for what it runs.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field

from shared.runtime import (
    Infrastructure,
    configure_logging,
    run_until_signalled,
    unless_stopped,
)
from shared.settings import ServiceSettings

log = logging.getLogger(__name__)

#: the process's name on the bus and towards the API server (``capibus-all``)
PROCESS = "all"


class Root(Protocol):
    """A composition root's ``run``: the service until ``stop``, on ``infra``'s clients."""

    def __call__(
        self, settings: Any, stop: asyncio.Event, *, infra: Infrastructure | None = None
    ) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Component:
    """A service as this runner knows it: where its root and its settings class live."""

    name: str
    settings: str
    default: bool = True

    @property
    def package(self) -> str:
        return f"services.{self.name}"

    def load(self) -> tuple[Root, ServiceSettings]:
        """The service's root and its settings, read from the environment as it would be."""
        settings_class = getattr(importlib.import_module(f"{self.package}.settings"), self.settings)
        return _root(self), settings_class()


def _root(component: Component) -> Root:
    root: Root = importlib.import_module(f"{component.package}.bootstrap").run
    return root


#: every service a process can run, in start order (the watcher first: it feeds the others)
COMPONENTS = (
    Component("watcher", "WatcherSettings"),
    Component("writer", "WriterSettings"),
    Component("identity", "IdentitySettings"),
    Component("lease", "LeaseSettings"),
    Component("helm", "HelmSettings"),
    Component("monitor", "MonitorSettings"),
    Component("discovery", "DiscoverySettings"),
    Component("catalog", "CatalogSettings"),
    Component("baremetal.metalstack", "MetalStackSettings"),
    Component("baremetal.assisted_bootstrap", "AssistedBootstrapSettings"),
    Component("baremetal.assisted_controlplane", "AssistedControlPlaneSettings"),
    Component("ladybug.provisioner", "ProvisionerSettings"),
    # Not by default: admission needs a serving certificate and a webhook registration, and
    # the exporter is for installs that scrape upstream's metrics.
    Component("admission", "AdmissionSettings", default=False),
    Component("exporter", "ExporterSettings", default=False),
)
BY_NAME = {component.name: component for component in COMPONENTS}


class AllInOneSettings(ServiceSettings):
    services: str = Field(
        "all", description="Services to run: 'all' (the default set) and/or names, comma-separated"
    )
    stop_grace_seconds: float = Field(
        30.0, gt=0, description="How long the others may take to stop after one service failed"
    )


class UnknownService(ValueError):
    """A name no component has."""


class ServiceFailed(RuntimeError):
    """A service's root raised, or returned while it had not been told to stop."""


def choose(names: Iterable[str]) -> list[Component]:
    """The components ``names`` asks for (``all``: every default one), in start order."""
    wanted: set[str] = set()
    for name in (n.strip() for n in names):
        if name == "all":
            wanted.update(c.name for c in COMPONENTS if c.default)
        elif name in BY_NAME:
            wanted.add(name)
        elif name:
            raise UnknownService(f"unknown service {name!r}; known: all, {', '.join(BY_NAME)}")
    if not wanted:
        raise UnknownService("no service chosen")
    return [c for c in COMPONENTS if c.name in wanted]


async def supervise(
    work: Mapping[str, Awaitable[None]], stop: asyncio.Event, *, grace: float
) -> None:
    """Run every ``work`` until ``stop``; the first that ends on its own stops the rest.

    Raises ``ServiceFailed`` naming every service that raised or ended unasked, after the
    others had ``grace`` seconds to stop (then they are cancelled).
    """
    tasks = {asyncio.ensure_future(w): name for name, w in work.items()}
    first, running = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    unasked = set() if stop.is_set() else first
    stop.set()
    done = set(first)
    if running:
        finished, late = await asyncio.wait(running, timeout=grace)
        done |= finished
        for task in late:
            log.error("%s did not stop within %.0f s; cancelling it", tasks[task], grace)
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    failed = sorted(tasks[task] for task in done if _failed(task, tasks[task], task in unasked))
    if failed:
        raise ServiceFailed(f"service(s) failed: {', '.join(failed)}")


def _failed(task: asyncio.Future[None], name: str, unasked: bool) -> bool:
    """Whether ``task`` raised, or returned although nothing asked it to stop (logged)."""
    error = None if task.cancelled() else task.exception()
    if error is not None:
        log.error("%s failed", name, exc_info=error)
        return True
    if unasked:
        log.error("%s stopped although nothing asked it to", name)
    return unasked


async def run(settings: AllInOneSettings, components: list[Component], stop: asyncio.Event) -> None:
    """Connect once, then run every component's root on the shared clients until ``stop``."""
    loaded = {c.name: c.load() for c in components}
    infra = await unless_stopped(Infrastructure.connect(settings, service=PROCESS), stop)
    if infra is None:
        return
    try:
        work = {
            name: root(service_settings, stop, infra=infra.for_service(service_settings))
            for name, (root, service_settings) in loaded.items()
        }
        await supervise(work, stop, grace=settings.stop_grace_seconds)
    finally:
        await infra.aclose()


def main(names: Iterable[str] | None = None) -> int:
    """Run ``names`` (default: the ``CAPIBUS_SERVICES`` setting) until SIGTERM; 1 on failure."""
    settings = AllInOneSettings()
    components = choose(settings.services.split(",") if names is None else names)
    configure_logging(settings, PROCESS, name_loggers=True)
    log.info("running %s in one process", ", ".join(c.name for c in components))
    try:
        run_until_signalled(lambda stop: run(settings, components, stop))
    except ServiceFailed as exc:
        log.error("%s; stopping the process", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
