"""Trace context across the bus (``shared.tracing``): spans recorded by the OpenTelemetry SDK's
in-memory exporter, messages published through the real ``Bus`` over a JetStream stand-in that
keeps what it was given (headers included), and consumed by the real ``Consumer``."""

from __future__ import annotations

import asyncio
import importlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from shared import subjects, tracing
from shared.bus import Bus
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import Lease
from shared.errors import KubeNotFound, PermanentError, TemporaryError
from shared.helm import Completed, Helm
from shared.kube import KubeClient, KubeConfig, ResourceKind, path_template
from shared.messages import (
    Message,
    MessageDeadLettered,
    ObjectRef,
    PatchStatus,
    ResourceChanged,
    decode_any,
    encode,
)
from shared.oversize import fit
from shared.resources import CLUSTER, HELM_RELEASE
from shared.timers import Timers
from tests.fakes import FakeMsg, delivered

Json = dict[str, Any]
Headers = dict[str, str]


# --- the parts -------------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans of this test, recorded by the SDK (the process-wide provider stays untouched)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.install(None)
    provider.shutdown()


@pytest.fixture
def tracer(spans: InMemorySpanExporter) -> trace.Tracer:
    """A tracer of the same provider, playing the publisher's service."""
    return tracing._TRACER.get


class JetStream:
    """Stores what is published, headers included, and acknowledges it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, Headers]] = []

    async def publish(self, subject: str, payload: bytes, *, headers: Headers) -> Any:
        self.sent.append((subject, payload, dict(headers)))
        return SimpleNamespace(seq=len(self.sent), duplicate=False)

    async def publish_async(
        self, subject: str, payload: bytes, *, headers: Headers, wait_stall: float
    ) -> Awaitable[Any]:
        future = asyncio.get_running_loop().create_future()
        future.set_result(await self.publish(subject, payload, headers=headers))
        return future

    async def stream_info(self, name: str) -> Any:
        """A stream without limits, so the publisher's guard (``shared.bus``) lets all pass."""
        state = SimpleNamespace(messages=len(self.sent), bytes=0, first_seq=1, consumer_count=0)
        return SimpleNamespace(state=state, config=SimpleNamespace(max_msgs=-1, max_bytes=-1))

    def headers(self, index: int = -1) -> Headers:
        return self.sent[index][2]

    def messages(self) -> list[tuple[Message, Headers]]:
        return [(decode_any(payload), headers) for _, payload, headers in self.sent]


def real_bus() -> tuple[Bus, JetStream]:
    js = JetStream()
    return Bus(SimpleNamespace(max_payload=1 << 20), js), js  # type: ignore[arg-type]


def patch(name: str = "c", source: str = "helm/r1") -> tuple[str, PatchStatus]:
    ref = ObjectRef(api_version=CLUSTER.api_version, kind="Cluster", namespace="ns", name=name)
    message = PatchStatus(source=source, correlation_id=f"cluster:ns/{name}", ref=ref)
    return subjects.cluster_status(0, "ns", name), message


def received(js: JetStream, index: int = -1, *, deliveries: int = 1) -> FakeMsg:
    """What a consumer is delivered for the ``index``-th message published."""
    subject, payload, headers = js.sent[index]
    msg = delivered(subject, payload, deliveries=deliveries)
    msg.headers = dict(headers)
    return msg


def arriving(subject: str, body: Message | bytes, headers: Headers) -> FakeMsg:
    """A message as another publisher stored it, with exactly ``headers``."""
    msg = delivered(subject, body if isinstance(body, bytes) else encode(body))
    msg.headers = dict(headers)
    return msg


Handle = Callable[[Batch[Any]], Awaitable[None]]


async def consume(
    handle: Handle,
    *msgs: FakeMsg,
    bus: Bus | None = None,
    service: str = "writer",
    coalesce: float = 0.0,
    objects: Any = None,
    model: type[Message] = PatchStatus,
) -> None:
    """Offer ``msgs`` to a real consumer running ``handle``; return when all are settled."""
    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=model,
        handle=handle,
        coalesce_seconds=coalesce,
    )
    consumer = Consumer(
        bus=bus or real_bus()[0],  # type: ignore[arg-type]
        leases=None,  # type: ignore[arg-type]
        service=service,
        subscriptions=[sub],
        settings=ConsumerSettings(backoff_base=0.01, max_deliver=3),
        objects=objects,
    )
    lease = Lease(partition=0, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)
    for msg in msgs:
        consumer.offer(sub, lease, msg)  # type: ignore[arg-type]
    await asyncio.wait_for(asyncio.gather(*(m.settled.wait() for m in msgs)), 5)


class Recorder:
    """A handler that keeps its batches and the span current while each ran, and may publish
    (as a service reporting to the writer does) or fail."""

    def __init__(self, bus: Bus | None = None, *failures: BaseException) -> None:
        self.bus = bus
        self.failures = list(failures)
        self.batches: list[Batch[Any]] = []
        self.current: list[trace.SpanContext] = []

    async def __call__(self, batch: Batch[Any]) -> None:
        self.batches.append(batch)
        self.current.append(trace.get_current_span().get_span_context())
        if self.bus is not None:
            await self.bus.publish(*patch(batch.latest.ref.name, source="writer/r1"))
        if self.failures:
            raise self.failures.pop(0)


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def traceparent(span_context: trace.SpanContext) -> str:
    ids = f"{span_context.trace_id:032x}-{span_context.span_id:016x}"
    return f"00-{ids}-{span_context.trace_flags:02x}"


def trace_id(headers: Headers) -> str:
    return headers["traceparent"].split("-")[1]


def span_id(headers: Headers) -> str:
    return headers["traceparent"].split("-")[2]


# --- a message's way: publisher, handler, what the handler publishes --------------------------


async def test_the_handler_span_is_the_child_of_the_publishers_span(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    bus, js = real_bus()
    subject, message = patch("one")
    with tracer.start_as_current_span("helm.events") as publisher:
        await bus.publish(subject, message)
    assert js.headers()["traceparent"] == traceparent(publisher.get_span_context())

    await consume(Recorder(), received(js))

    (span,) = named(spans, "writer.status")
    assert span.parent is not None
    assert span.parent.span_id == publisher.get_span_context().span_id
    assert span.context.trace_id == publisher.get_span_context().trace_id
    assert span.kind is SpanKind.CONSUMER
    assert dict(span.attributes or {}) == {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.message.id": message.id,
        "messaging.operation.type": "process",
        "messaging.batch.message_count": 1,
        "capibus.message.type": "PatchStatus",
        "capibus.object": "ns/one",
        "capibus.deliveries": 1,
        "capibus.outcome": "ack",
    }


async def test_a_publish_inside_a_handler_carries_the_same_trace_as_a_child(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    bus, js = real_bus()
    with tracer.start_as_current_span("helm.events") as publisher:
        await bus.publish(*patch())
    handler = Recorder(bus)

    await consume(handler, received(js, 0), bus=bus)

    (span,) = named(spans, "writer.status")
    journal = js.headers(1)
    assert trace_id(journal) == f"{publisher.get_span_context().trace_id:032x}"
    assert span_id(journal) == f"{span.context.span_id:016x}"
    assert handler.current == [span.context]


async def test_a_redelivered_message_is_another_child_of_the_same_publisher(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    bus, js = real_bus()
    with tracer.start_as_current_span("helm.events") as publisher:
        await bus.publish(*patch())

    await consume(Recorder(), received(js, deliveries=1))
    await consume(Recorder(), received(js, deliveries=2))

    first, second = named(spans, "writer.status")
    parent = publisher.get_span_context().span_id
    assert first.parent is not None
    assert second.parent is not None
    assert (first.parent.span_id, second.parent.span_id) == (parent, parent)
    assert (second.attributes or {})["capibus.deliveries"] == 2


async def test_a_coalesced_run_links_every_merged_trace(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    """The writer's one write for a burst of patches from three stories."""
    bus, js = real_bus()
    publishers = []
    for _ in range(3):
        with tracer.start_as_current_span("monitor.capi") as publisher:
            await bus.publish(*patch("burst"))
        publishers.append(publisher.get_span_context())
    handler = Recorder(bus)

    await consume(handler, *(received(js, i) for i in range(3)), bus=bus, coalesce=0.02)

    (batch,) = handler.batches
    assert len(batch.messages) == 3
    (span,) = named(spans, "writer.status")
    assert {(link.context.trace_id, link.context.span_id) for link in span.links} == {
        (p.trace_id, p.span_id) for p in publishers
    }
    assert span.parent is not None
    assert span.parent.span_id == publishers[-1].span_id  # the newest, which the run acts on
    assert (span.attributes or {})["messaging.batch.message_count"] == 3
    assert trace_id(js.headers(3)) == f"{publishers[-1].trace_id:032x}"


async def test_a_message_without_a_header_starts_a_new_trace(
    spans: InMemorySpanExporter,
) -> None:
    bus, js = real_bus()
    subject, message = patch()
    await consume(Recorder(bus), arriving(subject, message, {"Nats-Msg-Id": message.id}), bus=bus)

    (span,) = named(spans, "writer.status")
    assert span.parent is None
    assert span.context.trace_id != 0
    assert trace_id(js.headers()) == f"{span.context.trace_id:032x}"


MALFORMED = [
    {"traceparent": "not a traceparent"},
    {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},  # the invalid trace id
    {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01"},  # invalid span
    {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},  # version ff
    {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"},
    {"traceparent": "00-" + "a" * 600},
    {"traceparent": ""},
]


@pytest.mark.parametrize("headers", MALFORMED)
async def test_a_malformed_header_starts_a_new_trace_and_the_message_is_handled(
    spans: InMemorySpanExporter, headers: Headers
) -> None:
    bus, js = real_bus()
    subject, message = patch()
    msg = arriving(subject, message, headers)
    handler = Recorder(bus)

    await consume(handler, msg, bus=bus)

    assert msg.how == "ack"
    (span,) = named(spans, "writer.status")
    assert span.parent is None
    assert trace_id(js.headers()) == f"{span.context.trace_id:032x}"
    assert trace_id(js.headers()) != "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_a_capitalised_header_from_another_publisher_is_still_read(
    spans: InMemorySpanExporter,
) -> None:
    subject, message = patch()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await consume(Recorder(), arriving(subject, message, {"Traceparent": parent}))
    (span,) = named(spans, "writer.status")
    assert span.parent is not None
    assert f"{span.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_tracestate_is_passed_on_unless_it_is_too_long(spans: InMemorySpanExporter) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for state, kept in (("vendor=abc", True), ("v=" + "x" * 600, False)):
        bus, js = real_bus()
        subject, message = patch()
        headers = {"traceparent": parent, "tracestate": state}
        await consume(Recorder(bus), arriving(subject, message, headers), bus=bus)
        assert ("tracestate" in js.headers()) is kept
        if kept:
            assert js.headers()["tracestate"] == state


# --- how runs end -----------------------------------------------------------------------------


async def test_each_ending_is_the_runs_outcome(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    bus, js = real_bus()
    with tracer.start_as_current_span("helm.events"):
        await bus.publish(*patch())
    retried = Recorder(None, TemporaryError("API server away"))
    await consume(retried, received(js))
    await consume(Recorder(None, RuntimeError("bug")), received(js))
    await consume(Recorder(None, RuntimeError("bug")), received(js, deliveries=3))

    outcomes = [(s.attributes or {})["capibus.outcome"] for s in named(spans, "writer.status")]
    assert outcomes == ["retry", "ack", "nak", "dead-letter"]
    failed = named(spans, "writer.status")[2]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]


async def test_an_undecodable_messages_dead_letter_keeps_its_header(
    spans: InMemorySpanExporter,
) -> None:
    bus, js = real_bus()
    original = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    bad = arriving(subjects.cluster_status(0, "ns", "junk"), b"{not json", original)

    await consume(Recorder(), bad, bus=bus)

    (letter,) = [(m, h) for m, h in js.messages() if isinstance(m, MessageDeadLettered)]
    assert letter[0].reason == "BadMessage"
    assert letter[1]["traceparent"] == original["traceparent"]


async def test_a_dead_letter_keeps_its_originals_header_not_the_runs(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    bus, js = real_bus()
    with tracer.start_as_current_span("helm.events"):
        await bus.publish(*patch())
    original = js.headers(0)

    await consume(Recorder(None, PermanentError("invalid")), received(js, 0), bus=bus)

    (letter,) = [(m, h) for m, h in js.messages() if isinstance(m, MessageDeadLettered)]
    assert letter[1]["traceparent"] == original["traceparent"]
    (span,) = named(spans, "writer.status")
    assert (span.attributes or {})["capibus.outcome"] == "dead-letter"


# --- where traces start, and without an SDK ---------------------------------------------------


async def test_the_watcher_starts_a_trace_per_change(spans: InMemorySpanExporter) -> None:
    bus, js = real_bus()
    changes = [patch(name, source="watcher/w1") for name in ("a", "b")]
    await bus.publish_many([(subject, message, None) for subject, message in changes])

    first, second = named(spans, "watcher.publish")
    assert first.kind is SpanKind.PRODUCER
    assert (first.parent, second.parent) == (None, None)
    assert first.context.trace_id != second.context.trace_id
    assert [span_id(js.headers(i)) for i in (0, 1)] == [
        f"{first.context.span_id:016x}",
        f"{second.context.span_id:016x}",
    ]
    assert (first.attributes or {})["capibus.object"] == "ns/a"


async def test_a_timer_continues_the_trace_of_the_run_that_armed_it(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    bus, js = real_bus()
    timers = Timers(bus)
    now = datetime.now(UTC)
    with tracer.start_as_current_span("writer.status") as run:
        timers.at("deadline", now, *patch("armed-in-a-run", source="writer/r1"))
    timers.at("claimed", now, *patch("armed-by-a-claim", source="writer/r1"))
    await asyncio.sleep(0.05)

    by_name = {m.ref.name: h for m, h in js.messages() if isinstance(m, PatchStatus)}
    assert span_id(by_name["armed-in-a-run"]) == f"{run.get_span_context().span_id:016x}"
    (claimed,) = named(spans, "writer.publish")
    assert span_id(by_name["armed-by-a-claim"]) == f"{claimed.context.span_id:016x}"
    assert claimed.context.trace_id != run.get_span_context().trace_id


async def test_without_an_sdk_a_handler_passes_the_context_on_unchanged() -> None:
    """The API's no-op tracer records nothing, yet the trace goes on through the service."""
    tracing.install(None)
    bus, js = real_bus()
    subject, message = patch()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await consume(Recorder(bus), arriving(subject, message, {"traceparent": parent}), bus=bus)
    assert js.headers()["traceparent"] == parent

    await bus.publish(*patch())  # outside a handler, without an SDK: no trace to start
    assert "traceparent" not in js.headers()


async def test_services_sharing_one_process_each_continue_their_own_traces(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    """The all-in-one process: two services' consumers on one loop and one bus, their runs
    interleaved, each publish carries the trace of the run it came from."""
    bus, js = real_bus()
    sent: dict[str, str] = {}
    msgs: dict[str, list[FakeMsg]] = {"alpha": [], "beta": []}
    for i in range(8):
        with tracer.start_as_current_span("watcher.publish") as publisher:
            await bus.publish(*patch(f"o{i}"))
        sent[f"o{i}"] = f"{publisher.get_span_context().trace_id:032x}"
        msgs["alpha" if i % 2 else "beta"].append(received(js))
    js.sent.clear()

    async def slow(batch: Batch[Any]) -> None:
        await asyncio.sleep(random.uniform(0, 0.02))
        await bus.publish(*patch(batch.latest.ref.name, source="writer/r1"))

    await asyncio.gather(
        *(consume(slow, *batch, bus=bus, service=service) for service, batch in msgs.items())
    )

    published = {m.ref.name: trace_id(h) for m, h in js.messages() if isinstance(m, PatchStatus)}
    assert published == sent
    assert {s.name for s in spans.get_finished_spans()} >= {"alpha.status", "beta.status"}


async def test_a_trimmed_event_is_completed_inside_the_handlers_span(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    obj = {
        "apiVersion": HELM_RELEASE.api_version,
        "kind": "HelmRelease",
        "metadata": {"name": "r", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {"values": {"blob": "v" * 50_000}},
    }
    ref = ObjectRef(
        api_version=HELM_RELEASE.api_version, kind="HelmRelease", namespace="ns", name="r", uid="u"
    )
    change = ResourceChanged(
        source="watcher/w1",
        correlation_id="c",
        event="ADDED",
        ref=ref,
        resource_version="5",
        object=obj,
    )
    small = fit(change, plural="helmreleases", limit=10_000)
    bus, js = real_bus()
    subject = subjects.resource_event("helmrelease", 0, "ns", "r")
    await bus.publish(subject, small)
    reads: list[trace.SpanContext] = []

    class Reader:
        async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
            reads.append(trace.get_current_span().get_span_context())
            return obj

    handler = Recorder()
    await consume(handler, received(js), objects=Reader(), model=ResourceChanged)

    (root,) = named(spans, "watcher.publish")
    (span,) = named(spans, "writer.status")
    assert handler.batches[0].latest.trimmed is None
    assert span.parent is not None
    assert span.parent.span_id == root.context.span_id
    assert reads == [span.context]


# --- external calls ---------------------------------------------------------------------------


@pytest.fixture
async def api_server() -> AsyncIterator[str]:
    """Answers 200 with a small object, or 404 for a name ``missing``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                found = b"/missing" not in line
                body = b'{"kind":"Cluster"}' if found else b'{"kind":"Status","code":404}'
                status = b"200 OK" if found else b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    listener.close()
    await listener.wait_closed()


async def test_a_kubernetes_request_is_a_client_span_named_by_its_path_template(
    spans: InMemorySpanExporter, tracer: trace.Tracer, api_server: str
) -> None:
    kube = KubeClient.from_config(KubeConfig(server=api_server), qps=None)
    try:
        with tracer.start_as_current_span("writer.status") as handler:
            await kube.get(CLUSTER, "ns", "one")
            with pytest.raises(KubeNotFound):
                await kube.get(CLUSTER, "ns", "missing")
    finally:
        await kube.aclose()

    name = "GET /apis/azimuth.stackhpc.com/v1alpha1/namespaces/{namespace}/clusters/{name}"
    found, missing = named(spans, name)
    for span in (found, missing):
        assert span.kind is SpanKind.CLIENT
        assert span.parent is not None
        assert span.parent.span_id == handler.get_span_context().span_id
    assert (found.attributes or {})["http.response.status_code"] == 200
    assert (found.attributes or {})["url.path"].endswith("/namespaces/ns/clusters/one")
    assert found.status.status_code is StatusCode.UNSET
    assert missing.status.status_code is StatusCode.ERROR


async def test_a_request_of_another_http_client_is_named_by_its_method(
    spans: InMemorySpanExporter, api_server: str
) -> None:
    from shared.transport import http_transport  # noqa: PLC0415 (the transport under test)

    async with httpx.AsyncClient(transport=http_transport(), base_url=api_server) as http:
        await http.get("/admin/v1/reservations/x")
    (span,) = named(spans, "GET")
    assert (span.attributes or {})["url.path"] == "/admin/v1/reservations/x"
    assert span.end_time is not None


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/api/v1/namespaces/ns/secrets/s", "/api/v1/namespaces/{namespace}/secrets/{name}"),
        ("/api/v1/namespaces/ns/secrets", "/api/v1/namespaces/{namespace}/secrets"),
        ("/api/v1/namespaces/ns", "/api/v1/namespaces/{name}"),
        (
            "/apis/azimuth.stackhpc.com/v1alpha1/namespaces/ns/clusters/c/status",
            "/apis/azimuth.stackhpc.com/v1alpha1/namespaces/{namespace}/clusters/{name}/status",
        ),
        ("/apis/g/v1/clusterthings/x", "/apis/g/v1/clusterthings/{name}"),
        ("/apis/g/v1", "/apis/g/v1"),
        ("/apis", "/apis"),
        ("/version", "/version"),
        ("/prefix/api/v1/namespaces/a/pods/b", "/prefix/api/v1/namespaces/{namespace}/pods/{name}"),
    ],
)
def test_path_templates(path: str, template: str) -> None:
    assert path_template(path) == template


async def test_a_helm_command_is_a_client_span_of_its_command(
    spans: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    metadata = '{"revision": 1, "status": "deployed", "chart": "c", "version": "1.0.0"}'
    answers = [Completed(0, metadata, ""), None]

    async def run(argv: Any, stdin: bytes | None, deadline: float) -> Completed:
        answer = answers.pop(0)
        return answer or Completed(1, "", "Error: something unclassified")

    helm = Helm(executor=run, home="/tmp/capibus-unit-helm")
    with tracer.start_as_current_span("helm.events") as handler:
        await helm.status("r", "ns")
        with pytest.raises(TemporaryError):
            await helm.history("r", "ns")

    (status,) = named(spans, "helm get metadata")
    (history,) = named(spans, "helm history")
    assert status.parent is not None
    assert status.parent.span_id == handler.get_span_context().span_id
    assert (status.attributes or {})["process.exit.code"] == 0
    assert (history.attributes or {})["process.exit.code"] == 1
    assert history.status.status_code is StatusCode.ERROR


# --- set-up -----------------------------------------------------------------------------------


def test_nothing_is_exported_unless_an_endpoint_is_set() -> None:
    assert tracing.configure("writer", environ={}) is False
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    assert tracing.configure("writer", environ=disabled) is False


def test_with_an_endpoint_the_provider_batches_to_otlp_if_the_extra_is_installed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    provider = tracing.exporting_provider("writer", environ)
    if provider is None:  # the default install: the extra is not there
        assert "install capibus[otel]" in caplog.text
        with pytest.raises(ImportError):
            importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        return
    try:
        assert provider.resource.attributes["service.name"] == "capibus-writer"
    finally:
        provider.shutdown()
