"""A service's /metrics over HTTP: the writer, run as a real process, counts what it handled."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from shared.resources import CLUSTER
from testenv.harness import free_port
from tests.integration.support import eventually
from tests.integration.test_writer import make_cluster, patch_for

pytestmark = pytest.mark.integration
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def metrics_env(port: int) -> dict[str, str]:
    return {"CAPIBUS_METRICS_PORT": str(port), "CAPIBUS_METRICS_HOST": "127.0.0.1"}


Samples = list[tuple[str, dict[str, str], float]]


async def scrape(port: int, accept: str | None = None) -> Samples:
    """Every sample the endpoint serves; empty while it is not up yet."""
    headers = {"Accept": accept} if accept else {}
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"http://127.0.0.1:{port}/metrics", headers=headers)
    except httpx.TransportError:
        return []
    text = response.text
    if accept:
        assert response.headers["content-type"].startswith("application/openmetrics-text")
        assert text.endswith("# EOF\n")
        families: Any = parse_om(text)
    else:
        assert response.headers["content-type"].startswith("text/plain")
        families = parse_text(text)
    return [(s.name, s.labels, s.value) for f in families for s in f.samples]


def value(samples: Samples, name: str, **labels: str) -> float | None:
    for sample, have, number in samples:
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            return number
    return None


async def test_writer_serves_its_consumer_metrics(kube, bus, namespace, service) -> None:
    port = free_port()
    service("writer", **metrics_env(port))
    ref = await make_cluster(kube, namespace, "m")
    for n in range(3):
        subject, message = patch_for(ref, {"probe": n})
        await bus.publish(subject, message)

    await eventually(
        lambda: kube.get(CLUSTER, namespace, "m"),
        lambda c: (c.get("status") or {}).get("probe") == 2,
        timeout=60,
        what="the last patch written",
    )

    def counted(samples: Samples) -> bool:
        handled = value(
            samples,
            "capibus_messages_handled_total",
            service="writer",
            subscription="status",
            outcome="ok",
        )
        return (handled or 0) >= 1

    samples = await eventually(lambda: scrape(port), counted, timeout=30, what="handled counted")
    assert (value(samples, "capibus_status_writes_total", outcome="written") or 0) >= 1
    assert value(samples, "capibus_partitions_owned", service="writer") == 16
    durations = value(
        samples, "capibus_handler_duration_seconds_count", service="writer", subscription="status"
    )
    assert (durations or 0) >= 1
    assert value(samples, "capibus_consumer_lag", service="writer", subscription="status") == 0

    openmetrics = await scrape(port, OPENMETRICS)
    assert value(openmetrics, "capibus_messages_handled_total", service="writer") is not None
    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
        assert (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
