"""shared.metrics: instruments, rendering, and what the consumer records (fakes, no network)."""

from __future__ import annotations

import asyncio
import importlib
import re
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from services.exporter.app import Exporter
from services.exporter.logic import SPECS, Series
from shared import subjects
from shared.consumer import Batch, Consumer, ConsumerSettings, Subscription
from shared.coordination import Lease
from shared.errors import PermanentError, TemporaryError
from shared.messages import ObjectRef, PatchStatus, encode
from shared.metrics import REGISTRY, Family, counter, render, render_families
from shared.resources import APP_TEMPLATE, CLUSTER, CLUSTER_TEMPLATE, HELM_RELEASE
from tests.fakes import FakeBus, FakeMsg, delivered
from tests.unit import test_exporter_logic as exporter_fixtures

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- instruments and rendering ---------------------------------------------------------------


def test_tally_counts_per_label_values() -> None:
    name = f"capibus_test_{uuid.uuid4().hex[:8]}"
    tally = counter(name, "a test counter", ["outcome"])
    tally.inc("ok")
    tally.inc("ok", amount=2)
    tally.inc("failed")
    assert value(f"{name}_total", outcome="ok") == 3
    assert value(f"{name}_total", outcome="failed") == 1


def test_unlabelled_tally() -> None:
    name = f"capibus_test_{uuid.uuid4().hex[:8]}"
    counter(name, "a test counter").inc()
    assert value(f"{name}_total") == 1


FAMILIES = [
    Family("azimuth_kube_thing_phase", "Thing phase", [({"name": "a", "phase": "Ready"}, 1.0)]),
    Family("azimuth_kube_thing_info", "Thing info", [({"name": "a", "repo": 'x"y'}, 1.0)], "info"),
    Family("azimuth_kube_empty", "No samples", []),
]


def test_families_render_as_openmetrics_when_asked() -> None:
    body, content_type = render_families(FAMILIES, OPENMETRICS)
    text = body.decode()
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    parsed = {f.name: f for f in parse_om(text)}
    assert parsed["azimuth_kube_thing_phase"].type == "gauge"
    assert parsed["azimuth_kube_thing"].type == "info"
    (sample,) = parsed["azimuth_kube_thing"].samples
    assert sample.name == "azimuth_kube_thing_info"
    assert sample.labels == {"name": "a", "repo": 'x"y'}
    assert sample.value == 1


def test_families_render_as_prometheus_text_by_default() -> None:
    body, content_type = render_families(FAMILIES, None)
    assert content_type.startswith("text/plain")
    samples = {s.name: s for f in parse_text(body.decode()) for s in f.samples}
    assert samples["azimuth_kube_thing_phase"].labels == {"name": "a", "phase": "Ready"}
    assert samples["azimuth_kube_thing_info"].value == 1
    assert "# EOF" not in body.decode()


def test_process_registry_renders_in_both_formats() -> None:
    for accept in (None, OPENMETRICS):
        body, _ = render(accept)
        assert b"capibus_messages_handled" in body
        assert b"process_cpu_seconds_total" in body


# --- consumer instrumentation ------------------------------------------------------------------


def message(name: str, *, deliveries: int = 1, data: bytes | None = None) -> FakeMsg:
    ref = ObjectRef(api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", name=name)
    body = PatchStatus(source="t", correlation_id="c", ref=ref, patch={"a": 1})
    subject = subjects.cluster_status(0, "ns", name)
    return delivered(subject, encode(body) if data is None else data, deliveries=deliveries)


class Probe:
    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)

    async def handle(self, batch: Batch[PatchStatus]) -> None:
        if self.failures:
            raise self.failures.pop(0)


async def consume(probe: Probe, *msgs: FakeMsg) -> str:
    """Offer ``msgs`` to a consumer with ``probe`` as handler; returns the service name."""
    service = f"svc-{uuid.uuid4().hex[:6]}"
    sub = Subscription(
        name="status",
        stream=subjects.STATUS,
        filters=lambda p: [],
        model=PatchStatus,
        handle=probe.handle,
    )
    consumer = Consumer(
        bus=FakeBus(),  # type: ignore[arg-type]  # no pulling: messages are offered directly
        leases=None,  # type: ignore[arg-type]
        service=service,
        subscriptions=[sub],
        settings=ConsumerSettings(backoff_base=0.01),
    )
    lease = Lease(partition=0, token=1, value="v", deadline=time.monotonic() + 60, usable_from=0)
    for msg in msgs:
        consumer.offer(sub, lease, msg)  # type: ignore[arg-type]
    await asyncio.wait_for(asyncio.gather(*(m.settled.wait() for m in msgs)), 5)
    return service


def errors(service: str, kind: str) -> float:
    return value("capibus_handler_errors_total", service=service, subscription="status", kind=kind)


def handled(service: str, outcome: str) -> float:
    return value(
        "capibus_messages_handled_total", service=service, subscription="status", outcome=outcome
    )


async def test_success_counts_ok_and_observes_latency() -> None:
    service = await consume(Probe(), message("a"), message("b"))
    assert handled(service, "ok") == 2
    count = value("capibus_handler_duration_seconds_count", service=service, subscription="status")
    assert count == 2  # one run per object


def retries(service: str) -> float:
    return value("capibus_handler_retries_total", service=service, subscription="status")


async def test_temporary_error_counts_a_retry_and_its_kind_then_ok() -> None:
    service = await consume(Probe(TemporaryError("later")), message("a"))
    assert retries(service) == 1
    assert handled(service, "ok") == 1
    assert handled(service, "retry") == 0
    assert errors(service, "TemporaryError") == 1
    waiting = value("capibus_objects_waiting", service=service, subscription="status")
    assert waiting == 0


async def test_permanent_error_counts_dead_letter() -> None:
    service = await consume(Probe(PermanentError("no", reason="No")), message("a"))
    assert handled(service, "dead_letter") == 1
    assert errors(service, "PermanentError") == 1


async def test_unexpected_exception_counts_error_with_class_name() -> None:
    service = await consume(Probe(KeyError("x")), message("a"))
    assert handled(service, "error") == 1
    assert errors(service, "KeyError") == 1


async def test_temporary_errors_never_use_up_deliveries() -> None:
    failures = [TemporaryError("later") for _ in range(5)]
    service = await consume(Probe(*failures), message("a", deliveries=8))
    assert retries(service) == 5
    assert handled(service, "ok") == 1
    assert handled(service, "dead_letter") == 0


async def test_exhausted_deliveries_of_an_unexpected_error_count_as_dead_letter() -> None:
    service = await consume(Probe(KeyError("x")), message("a", deliveries=8))
    assert handled(service, "dead_letter") == 1
    assert handled(service, "error") == 0


async def test_undecodable_message_is_dead_lettered_and_counted() -> None:
    service = await consume(Probe(), message("a", data=b"{not json"))
    assert handled(service, "dead_letter") == 1
    assert errors(service, "BadMessage") == 1


async def test_redeliveries_are_counted() -> None:
    service = await consume(Probe(), message("a", deliveries=1), message("b", deliveries=3))
    assert value("capibus_redeliveries_total", service=service, subscription="status") == 1


# --- the shipped alert rules name only series and labels that exist ----------------------------

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yaml"
#: PromQL words that are not series names (functions are told apart by the "(" after them)
PROMQL_WORDS = frozenset(
    {"by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan"}
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_RANGES = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring)\s*\(([^)]*)\)")


def _selectors(text: str) -> list[tuple[str, str]]:
    """The ``(series name, matchers)`` in ``text``, whose strings, ranges, groupings are gone."""
    found = []
    for match in _SELECTOR.finditer(text):
        name, braces = match.group(1), match.group(2) or ""
        follows = text[match.end() :].lstrip()[:1]
        if name not in PROMQL_WORDS and (braces or follows != "("):
            found.append((name, braces))
    return found


def _closing(text: str, opening: int) -> int:
    depth = 0
    for index in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise AssertionError(f"unbalanced parentheses in {text!r}")


def _aggregations(text: str) -> list[tuple[set[str], str]]:
    """Each ``by``/``without`` label set with the expression it aggregates.

    ``max(x) by (l)`` aggregates the parenthesis before the clause, ``max by (l) (x)`` the one
    after it.
    """
    found = []
    for match in _GROUPING.finditer(text):
        if match.group(1) not in ("by", "without"):
            continue
        labels = {label.strip() for label in match.group(2).split(",")} - {""}
        before = text[: match.start()].rstrip()
        if before.endswith(")"):
            mirrored = before[::-1].translate(str.maketrans("()", ")("))
            span = before[len(before) - 1 - _closing(mirrored, 0) :]
        else:
            opening = text.index("(", match.end())
            span = text[opening : _closing(text, opening) + 1]
        found.append((labels, _GROUPING.sub("", span)))
    return found


def exported_series() -> dict[str, set[str]]:
    """Every series name a capibus process or the exporter can serve, with its label names."""
    # The services' own counters are registered when their modules load.
    importlib.import_module("services.catalog.handlers")
    importlib.import_module("services.exporter.handlers")
    importlib.import_module("services.watcher.handlers")
    importlib.import_module("services.writer.handlers")
    found: dict[str, set[str]] = {}
    # Private, but the only place the label names of a family without children live.
    for collector in list(REGISTRY._collector_to_names):
        name, kind = getattr(collector, "_name", None), getattr(collector, "_type", None)
        if name is None:
            continue
        labels = set(getattr(collector, "_labelnames", ()))
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        for suffix in suffixes.get(kind, [""]):
            found[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    series = Series()
    for kind, obj in (
        (CLUSTER_TEMPLATE, exporter_fixtures.CLUSTER_TEMPLATE_OBJ),
        (APP_TEMPLATE, exporter_fixtures.APP_TEMPLATE_OBJ),
        (CLUSTER, exporter_fixtures.CLUSTER_OBJ),
        (HELM_RELEASE, exporter_fixtures.APP_OBJ),
    ):
        series.apply(exporter_fixtures.event(kind, obj))
    exporter = Exporter(feed=None, lister=None)  # type: ignore[arg-type]
    for family in [*series.families(), *exporter.own_families()]:
        found[family.name] = {label for labels, _ in family.samples for label in labels}
    assert {s.name for s in SPECS} <= found.keys()
    return found


def unknown_names(expr: str, series: dict[str, set[str]]) -> list[str]:
    """What ``expr`` names that nothing exports: series, matcher labels, grouping labels."""
    text = _RANGES.sub("", _STRINGS.sub('""', expr))
    problems: list[str] = []
    for name, braces in _selectors(_GROUPING.sub("", text)):
        if name not in series:
            problems.append(f"series {name}")
            continue
        labels = _MATCHER.findall(braces)
        problems += [f"label {label} of {name}" for label in labels if label not in series[name]]
    for labels, span in _aggregations(text):
        for name, _ in _selectors(span):
            missing = sorted(labels - series.get(name, labels))
            problems += [f"label {label} of {name}" for label in missing]
    return problems


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    assert document["kind"] == "PrometheusRule"
    return [rule for group in document["spec"]["groups"] for rule in group["rules"]]


def test_every_alert_names_only_exported_series_and_labels() -> None:
    series = exported_series()
    rules = alert_rules()
    assert len(rules) >= 7
    for rule in rules:
        assert {"alert", "expr", "annotations", "labels"} <= rule.keys(), rule
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert unknown_names(rule["expr"], series) == [], rule["alert"]


def test_the_alert_check_finds_what_does_not_exist() -> None:
    series = exported_series()
    expr = (
        'max(azimuth_kube_cluster_phas{phase!="Ready"}) by (cluster_name) > 0 or '
        'sum(increase(capibus_messages_handled_total{result="x"}[5m])) by (service, pod) > 0'
    )
    assert unknown_names(expr, series) == [
        "series azimuth_kube_cluster_phas",
        "label result of capibus_messages_handled_total",
        "label pod of capibus_messages_handled_total",
    ]
    prefix = "max by (phase, nope) (azimuth_kube_cluster_phase) > 0"
    assert unknown_names(prefix, series) == ["label nope of azimuth_kube_cluster_phase"]
    assert unknown_names("capibus_exporter_caught_up == 0", series) == []
