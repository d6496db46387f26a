"""What both measurements share: clients, CRDs, namespaces, Clusters, a worker pool, statistics.

The benchmark's own Kubernetes client is built with ``qps=None`` (no client-side rate limit),
so the bare baselines are limited only by the API server, the network stack and Python.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared.bus import Bus
from shared.kube import KubeClient, KubeConfig
from shared.resources import CLUSTER, NAMESPACE
from shared.settings import ServiceSettings
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack

Json = dict[str, Any]

#: The services' default partition count; the services under test run with it.
PARTITIONS = int(ServiceSettings.model_fields["partitions"].default)
#: Concurrent requests of the benchmark's own request loops (drivers and baselines).
CONCURRENCY = 16


@dataclass
class Clients:
    """The benchmark's own connections to the stack."""

    kube: KubeClient
    bus: Bus

    @classmethod
    async def connect(cls, stack: LocalStack) -> Clients:
        config = KubeConfig.load(stack.endpoints.kubeconfig)
        kube = KubeClient.from_config(config, qps=None, user_agent="capibus-bench")
        bus = await Bus.connect(
            stack.endpoints.nats_url, name="bench", tls=stack.endpoints.bus_tls()
        )
        await bus.ensure_streams()
        return cls(kube=kube, bus=bus)

    async def aclose(self) -> None:
        await self.bus.close()
        await self.kube.aclose()


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it ended, re-raising what it failed with.

    Unlike ``suppress(CancelledError)`` around ``await task``, this never swallows a
    cancellation of the *caller* (Ctrl-C cancels the main task), so the benchmark stops.
    """
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and (error := task.exception()) is not None:
        raise error


async def run_pool(
    count: int, work: Callable[[int], Awaitable[None]], *, concurrency: int = CONCURRENCY
) -> None:
    """Call ``work(i)`` for i in 0..count-1, ``concurrency`` at a time, in index order."""
    counter = iter(range(count))

    async def worker() -> None:
        for index in counter:
            await work(index)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))


async def new_namespace(kube: KubeClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACE, {"metadata": {"name": name}})
    return name


async def create_clusters(kube: KubeClient, namespace: str, names: Sequence[str]) -> dict[str, str]:
    """Create the Clusters; returns name -> uid."""
    uids: dict[str, str] = {}

    async def create(index: int) -> None:
        created = await kube.create(CLUSTER, cluster_manifest(namespace, names[index]))
        uids[names[index]] = str(created["metadata"]["uid"])

    await run_pool(len(names), create)
    return uids


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def p50_p99(values: Sequence[float]) -> str:
    return f"p50 {ms(percentile(values, 50))} / p99 {ms(percentile(values, 99))}"
