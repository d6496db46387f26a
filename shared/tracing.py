"""Traces across the services: W3C trace context in NATS headers, spans through OpenTelemetry.

A trace follows one change from the watcher to the writer. The context travels as the W3C
``traceparent`` header (and ``tracestate`` when there is one) on each NATS message, next to
``Nats-Msg-Id``: the message bodies are frozen contracts (``shared.messages``) and stay as
they are, and a body that no longer fits is trimmed without touching its headers
(``shared.oversize``). Spans are made through OpenTelemetry's API only:

- **Publishing** (``shared.bus``, ``publishing``): a message published while a span is current
  (inside a handler) carries that span's context, so whoever handles it continues the trace.
  A message published outside any span (the watcher's changes, a timer, a claim's work)
  starts a trace of its own: one short producer span, ``<source>.publish``.
- **Handling** (``shared.consumer``, ``handling``): one span per handler run,
  ``<service>.<subscription>``, the child of the newest message's context, with the subject,
  object, message type and id, delivery count and how the run ended (``ack``, ``retry`` for a
  temporary error held and tried again, ``nak``, ``dead-letter``). A run that carries several
  messages (a coalesced burst: the writer's one write for many patches) links every message's
  context, so each merged trace leads to the write. A missing or malformed header is a new
  trace, never an error. Redeliveries carry the header they were stored with, so each run is
  another child of the same publisher. A dead-letter entry carries its original's header
  unchanged (``continuing``), whatever span is current when it is published.
- **External calls**: one span per HTTP request in the transport every HTTP client shares
  (``shared.transport``; Kubernetes requests are named by method and path template,
  ``shared.kube.path_template``; the Zenith registrar, chart repositories, metal-api,
  Tumblebug and Spider by method) and one per helm command (``shared.helm``).

**The current context** is OpenTelemetry's, kept in a ``contextvars.ContextVar``: each
per-object queue of the consumer is an asyncio task with its own copy, so a handler's span is
current in that task only (and in tasks it starts), never in another object's run, and the
many services of an all-in-one process (``services.allinone``) never see each other's spans.

**Off costs nearly nothing.** Without an SDK nothing is recorded and no span is made, not even
the API's no-op ones (``recording``): a handler run only makes the context it received current,
so what it publishes carries that on; a publish outside any run adds no header; an HTTP request
or a helm command costs one check. With the optional
extra ``capibus[otel]`` (the SDK and the OTLP/HTTP exporter) and ``OTEL_EXPORTER_OTLP_ENDPOINT``
set, ``configure`` (called by ``shared.runtime.configure_logging``, the first thing every
service's ``__main__`` does) installs a tracer provider that batches spans to that endpoint; the
SDK's other ``OTEL_*`` variables apply (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, …).

**Bounded headers.** A ``tracestate`` longer than ``TRACESTATE_LIMIT`` is not passed on (W3C
Trace Context lets a participant drop it): the headers then stay far below the room
``shared.oversize`` keeps for them, whatever an external publisher sent.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.errors import PermanentError, TemporaryError

if TYPE_CHECKING:
    from shared.messages import Message

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: longest ``tracestate`` passed on (W3C: at least 512 characters should be propagated)
TRACESTATE_LIMIT = 512
#: how a handler run ended, by what the consumer does with its messages
ACK, RETRY, NAK, DEAD_LETTER = "ack", "retry", "nak", "dead-letter"

_PROPAGATOR = TraceContextTextMapPropagator()
_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

Headers = Mapping[str, str]


class _Tracer:
    """The tracer spans are made with: the global provider's (a proxy until one is set, so
    ``configure`` may come after import), or the one ``install`` was given."""

    def __init__(self) -> None:
        self.get: trace.Tracer = trace.get_tracer("capibus")
        #: whether spans may be recorded: False while only the API's no-op tracer is there,
        #: and then nothing but contexts is handled (a no-op span still costs microseconds)
        self.recording = False

    def follow_global(self) -> None:
        """Spans through the global provider, recorded if one was set (``configure``, or an
        agent such as ``opentelemetry-instrument`` before the service started)."""
        self.get = trace.get_tracer("capibus")
        self.recording = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


_TRACER = _Tracer()
_TRACER.follow_global()


# --- set-up ---------------------------------------------------------------------------------


def install(provider: trace.TracerProvider | None) -> None:
    """Make spans with ``provider`` (None: the global one again); for tests, which must not
    set the process-wide provider (OpenTelemetry lets it be set once)."""
    if provider is None:
        _TRACER.follow_global()
    else:
        _TRACER.get, _TRACER.recording = provider.get_tracer("capibus"), True


def recording() -> bool:
    """Whether a span started now may be recorded (an SDK is set up)."""
    return _TRACER.recording


def configure(service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Export spans over OTLP if ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and ``capibus[otel]``
    is installed; True if it now does. ``service`` names the resource (``capibus-<service>``)
    unless ``OTEL_SERVICE_NAME`` does."""
    _TRACER.follow_global()
    if not any(environ.get(name) for name in _ENDPOINT_VARIABLES):
        return False
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    provider = exporting_provider(service, environ)
    if provider is None:
        return False
    trace.set_tracer_provider(provider)
    _TRACER.follow_global()
    log.info("exporting spans over OTLP as %s", provider.resource.attributes.get("service.name"))
    return True


def exporting_provider(service: str, environ: Mapping[str, str]) -> Any:
    """An SDK tracer provider batching to the OTLP/HTTP exporter, or None (logged) when the
    extra is not installed. The exporter and the resource read their own ``OTEL_*`` variables
    (endpoint, headers, resource attributes) from the process's environment."""
    # By name: the extra is optional, so nothing (the type checker included) may need it.
    try:
        sdk_trace = importlib.import_module("opentelemetry.sdk.trace")
        sdk_export = importlib.import_module("opentelemetry.sdk.trace.export")
        resources = importlib.import_module("opentelemetry.sdk.resources")
        otlp = importlib.import_module(_EXPORTER_MODULE)
    except ImportError as exc:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but spans cannot be exported: %s "
            "(install capibus[otel])",
            exc,
        )
        return None
    named = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": f"capibus-{service}"}
    provider = sdk_trace.TracerProvider(resource=resources.Resource.create(named))
    provider.add_span_processor(sdk_export.BatchSpanProcessor(otlp.OTLPSpanExporter()))
    return provider


# --- headers --------------------------------------------------------------------------------


class _HeaderGetter(Getter[Headers]):
    """NATS headers are case-sensitive; a publisher may have capitalised the W3C names."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            value = next((v for k, v in carrier.items() if k.lower() == key), None)
        return None if value is None else [value]

    def keys(self, carrier: Headers) -> list[str]:
        return list(carrier)


class _HeaderSetter(Setter[MutableMapping[str, str]]):
    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        if key == TRACESTATE and len(value) > TRACESTATE_LIMIT:
            return
        carrier[key] = value


_GETTER = _HeaderGetter()
_SETTER = _HeaderSetter()


def extract(headers: Headers | None) -> Context:
    """The context ``headers`` carry; an empty one when there is none or it is malformed."""
    if not headers or not _has_traceparent(headers):
        return Context()
    return _PROPAGATOR.extract(headers, context=Context(), getter=_GETTER)


def _has_traceparent(headers: Headers) -> bool:
    return TRACEPARENT in headers or any(key.lower() == TRACEPARENT for key in headers)


def carries_trace(ctx: Context) -> bool:
    return trace.get_current_span(ctx).get_span_context().is_valid


def trace_id_of(headers: Headers | None) -> str | None:
    """The trace id ``headers`` carry, as the 32 hex digits tracing backends search by."""
    span = trace.get_current_span(extract(headers)).get_span_context()
    return format(span.trace_id, "032x") if span.is_valid else None


def inject(headers: MutableMapping[str, str], ctx: Context | None = None) -> None:
    """Add ``ctx``'s span (default: the current one) to ``headers``, if there is one."""
    _PROPAGATOR.inject(headers, context=ctx, setter=_SETTER)


def publishing(headers: MutableMapping[str, str], subject: str, message: Message) -> None:
    """Add the trace context ``message`` leaves with: the current span's, or a new trace's."""
    if trace.get_current_span().get_span_context().is_valid:
        inject(headers)
        return
    if not _TRACER.recording:
        return
    service = message.source.partition("/")[0]
    span = _TRACER.get.start_span(f"{service}.publish", Context(), kind=SpanKind.PRODUCER)
    if not span.is_recording():
        return
    span.set_attributes(_message_attributes(subject, message))
    span.set_attribute("messaging.operation.type", "send")
    inject(headers, trace.set_span_in_context(span))
    span.end()


def continuing(headers: Headers | None) -> AbstractContextManager[object]:
    """Make the context ``headers`` carry current, so what is published meanwhile carries the
    same header (a dead letter keeps its original's); nothing changes when they carry none."""
    if not headers or not _has_traceparent(headers):
        return _NOTHING
    ctx = extract(headers)
    return _attached(ctx) if carries_trace(ctx) else _NOTHING


#: what a block that changes no context is run in (reusable, as ``nullcontext`` is)
_NOTHING = contextlib.nullcontext(trace.INVALID_SPAN)


@contextlib.contextmanager
def _attached(ctx: Context) -> Iterator[object]:
    token = otel_context.attach(ctx)
    try:
        yield trace.get_current_span(ctx)
    finally:
        otel_context.detach(token)


# --- spans ----------------------------------------------------------------------------------


def handling(
    service: str,
    subscription: str,
    key: str,
    messages: Sequence[Message],
    headers: Sequence[Headers | None],
    *,
    deliveries: int,
    exhausted: bool,
) -> AbstractContextManager[object]:
    """The span of one handler run over ``messages`` (delivered with ``headers``, oldest
    first), current while it runs; its outcome is set from how the run ended. ``exhausted``:
    an unexpected exception dead-letters (some of) the messages instead of handing them back.

    Without an SDK the newest message's context is only made current, so what the handler
    publishes carries it on."""
    if not _TRACER.recording:
        return continuing(headers[-1] if headers else None)
    return _handled(
        f"{service}.{subscription}", key, messages, headers, deliveries, exhausted=exhausted
    )


@contextlib.contextmanager
def _handled(
    name: str,
    key: str,
    messages: Sequence[Message],
    headers: Sequence[Headers | None],
    deliveries: int,
    *,
    exhausted: bool,
) -> Iterator[Span]:
    contexts = [extract(h) for h in headers]
    parent = contexts[-1] if contexts else Context()
    links = _links(contexts) if len(contexts) > 1 else None
    tracer = _TRACER.get
    with tracer.start_as_current_span(name, parent, SpanKind.CONSUMER, links=links) as span:
        if span.is_recording():
            latest = messages[-1]
            span.set_attributes(_message_attributes(latest.subject, latest))
            span.set_attributes(
                {
                    "messaging.operation.type": "process",
                    "messaging.batch.message_count": len(messages),
                    "capibus.object": key,
                    "capibus.deliveries": deliveries,
                }
            )
        try:
            yield span
        except TemporaryError:
            _outcome(span, RETRY)
            raise
        except PermanentError:
            _outcome(span, DEAD_LETTER)
            raise
        except Exception:
            _outcome(span, DEAD_LETTER if exhausted else NAK)
            raise
        _outcome(span, ACK)


def _links(contexts: Sequence[Context]) -> list[Link]:
    seen: dict[tuple[int, int], Link] = {}
    for ctx in contexts:
        span_context = trace.get_current_span(ctx).get_span_context()
        if span_context.is_valid:
            seen.setdefault((span_context.trace_id, span_context.span_id), Link(span_context))
    return list(seen.values())


def _outcome(span: Span, outcome: str) -> None:
    span.set_attribute("capibus.outcome", outcome)


def _message_attributes(subject: str, message: Message) -> dict[str, str]:
    attributes = {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.message.id": message.id,
        "capibus.message.type": type(message).__name__,
    }
    ref = getattr(message, "ref", None)
    if ref is not None:
        attributes["capibus.object"] = ref.key
    return attributes


def start_call(name: str) -> Span:
    """A client span for one external call, a child of the current span; not made current
    (nothing below it makes spans) and ended by the caller, who may end it later than the
    call returns (an HTTP body still being read)."""
    if not _TRACER.recording:
        return trace.INVALID_SPAN
    return _TRACER.get.start_span(name, kind=SpanKind.CLIENT)


def failed(span: Span, exc: BaseException) -> None:
    """Record on ``span`` that its call raised ``exc``; a cancellation is no error."""
    if isinstance(exc, Exception):
        span.record_exception(exc)
        unsuccessful(span, f"{type(exc).__name__}: {exc}")


def unsuccessful(span: Span, description: str) -> None:
    """Mark ``span``'s call as failed (an HTTP error status, a non-zero exit)."""
    span.set_status(Status(StatusCode.ERROR, description))


@contextlib.contextmanager
def call(name: str) -> Iterator[Span]:
    """``start_call``'s span around a block, ended with it, an exception recorded."""
    span = start_call(name)
    try:
        yield span
    except BaseException as exc:
        failed(span, exc)
        raise
    finally:
        span.end()
