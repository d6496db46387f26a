"""A trace through the real NATS, Redis and API server: two status patches published under
two traces, the writer's handler run in-process by a real consumer (leases in Redis, a durable
consumer of its own on the status stream), one write, and the journal entry it publishes
continuing the newest patch's trace; spans recorded by the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from services.writer import handlers
from services.writer.logic import StatusCache
from services.writer.rules import rules
from shared import subjects, tracing
from shared.bus import NATS_ERRORS, Bus
from shared.consumer import Consumer, ConsumerSettings, Subscription
from shared.coordination import PartitionLeases
from shared.kube import KubeClient
from shared.messages import ObjectRef, PatchStatus, StatusWritten
from shared.resources import CLUSTER
from shared.resp import Redis
from testenv.examples import cluster_manifest
from tests.integration.support import eventually, read_stream

pytestmark = pytest.mark.integration
PARTITIONS = 16


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.install(None)
    provider.shutdown()


def writer(
    bus: Bus, kube: KubeClient, redis: Redis, service: str, subject: str
) -> tuple[Consumer, Subscription[PatchStatus]]:
    """The writer's status handler behind a consumer that sees one object's subject only
    (its own service name: its durable consumer and leases are the test's alone)."""
    deps = handlers.Deps(
        kube=kube,
        journal=bus,
        cache=StatusCache(100),
        rules=rules(cluster_timeout_seconds=1800),
        writer="tracing-test",
        partitions=PARTITIONS,
    )

    async def handle(batch: object) -> None:
        await handlers.write_status(batch, deps)  # type: ignore[arg-type]

    sub: Subscription[PatchStatus] = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda _partition: [subject],
        model=PatchStatus,
        handle=handle,
        # Long enough that both patches, stored before the consumer starts, form one run.
        coalesce_seconds=1.0,
    )
    leases = PartitionLeases(redis, service=service, member="m1", partitions=1, ttl=2)
    consumer = Consumer(
        bus=bus,
        leases=leases,
        service=service,
        subscriptions=[sub],
        settings=ConsumerSettings(ack_wait=5, fetch_timeout=2),
    )
    return consumer, sub


async def journal_headers(bus: Bus, namespace: str, update_ids: set[str]) -> dict[str, str]:
    """The headers of the journal entry of the write that carried ``update_ids`` (``{}`` while
    there is none)."""
    entries = await read_stream(
        bus, subjects.JOURNAL.name, f"capibus.journal.statuswritten.cluster.{namespace}.*"
    )
    for sequence, entry in entries:
        if isinstance(entry, StatusWritten) and set(entry.update_ids) == update_ids:
            raw = await bus.js.get_msg(subjects.JOURNAL.name, sequence)
            return dict(raw.headers or {})
    return {}


async def test_a_write_continues_the_trace_of_the_patches_it_carried(
    kube: KubeClient, bus: Bus, redis_client: Redis, namespace: str, spans: InMemorySpanExporter
) -> None:
    created = await kube.create(CLUSTER, cluster_manifest(namespace, "traced"))
    ref = ObjectRef(
        api_version=CLUSTER.api_version,
        kind="Cluster",
        namespace=namespace,
        name="traced",
        uid=created["metadata"]["uid"],
    )
    subject = subjects.cluster_status(
        subjects.partition_of(ref.key, PARTITIONS), namespace, "traced"
    )
    tracer = tracing._TRACER.get
    publishers: list[SpanContext] = []
    patches: list[PatchStatus] = []
    for phase in ("Pending", "Provisioning"):
        patch = PatchStatus(
            source="monitor/t",
            correlation_id=f"cluster:{ref.key}",
            ref=ref,
            patch={"networkingPhase": phase},
        )
        with tracer.start_as_current_span("monitor.capi") as publisher:
            await bus.publish(subject, patch)
        publishers.append(publisher.get_span_context())
        patches.append(patch)

    service = f"tracing-{uuid.uuid4().hex[:6]}"
    consumer, _ = writer(bus, kube, redis_client, service, subject)
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    try:
        headers = await eventually(
            lambda: journal_headers(bus, namespace, {p.id for p in patches}),
            lambda found: "traceparent" in found,
            timeout=60,
            what="the write's journal entry",
        )
    finally:
        stop.set()
        await running
        with contextlib.suppress(*NATS_ERRORS):
            await bus.js.delete_consumer(subjects.STATUS.name, f"{service}-status-p0")

    (run,) = [s for s in spans.get_finished_spans() if s.name == f"{service}.status"]
    newest = publishers[-1]
    assert run.parent is not None
    assert (run.context.trace_id, run.parent.span_id) == (newest.trace_id, newest.span_id)
    assert {(link.context.trace_id, link.context.span_id) for link in run.links} == {
        (p.trace_id, p.span_id) for p in publishers
    }
    assert (run.attributes or {})["capibus.outcome"] == "ack"
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (newest.trace_id, run.context.span_id)
    patched = "PATCH /apis/azimuth.stackhpc.com/v1alpha1/namespaces/{namespace}/clusters/{name}"
    writes = [s for s in spans.get_finished_spans() if s.name.startswith(patched)]
    assert writes
    assert all(_child_of(s, run) for s in writes)


def _child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and span.parent.span_id == parent.context.span_id
