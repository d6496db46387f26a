"""Replay: one object's stored messages fed to a service's handlers, every side effect recorded.

``capibus replay <ns>/<name> --service <svc>`` (``cli/replay.py``) reads the object's messages
from the streams and hands them here. This module builds the service's ``Deps`` with its own
composition root (``bootstrap.dependencies``) on the recorder ports of
``services.replay_ports`` in place of every port that acts on the world, feeds the messages
its ``ROUTES`` consume to the handlers in order, and says what each led to; ``compare`` then
lines that up with what the streams say the service did.

**Reads are real, acts are recorded.** The API server, the bus's last messages and helm's
read-only commands are read for real; API writes, helm installs and uninstalls, publishes,
the Zenith registrar and timers are recorded and answered as the real system would answer
them, never sent (``services.replay_ports`` says how). So a replay can run against a live
installation while its services run: it writes nothing to the API server and publishes
nothing.

**Decisions made now.** Handlers are level-triggered: the message is the trigger, the API
server's current state is what they decide on. A replay therefore shows what the service
would decide *now* for each stored trigger, with the code and settings of the command's
environment (the service's own ``CAPIBUS_*`` variables). One ``Deps`` serves the whole replay,
as one replica that saw every message would, so its memory (a release already converged, a
condition already reported) carries from one step to the next. Each message runs alone,
where the consumer may have run several of an object's messages as one batch; ``compare`` is
built to tolerate that. A handler's failure is a step's ending: a ``PermanentError`` is the
dead letter the consumer would write, a ``TemporaryError`` a retry, anything else a crash.

**Comparison** (``compare``, pure). What the streams record of the service's decisions are the
messages it published with a replayed message as their cause (``causation_id``; a dead letter
names its original's id). Both sides become ``gist``s: a message's decision without what
legitimately differs between two runs (ids, times, the replica name, timestamps inside
values). The replay's sequence of gists is aligned with the recorded one (``difflib``), so a
decision the consumer made for a batch under its last message still matches the same decision
made here under an earlier one. Each decision is marked: ``=`` on the streams too, ``+``
decided now only, ``-`` on the streams only; side effects the streams do not record (API
writes, helm, timers, retries) are ``·``, shown, not compared.

Only what ``--service`` consumes of the object's own messages is replayed (``cli.story``
finds them by the object's subjects): events of related objects under other names (a Lease
``kube-<name>``, Machines, Secrets) are not part of that story. Supported: helm, identity,
lease, monitor, writer; the other services' ports (bare-metal APIs, SSH, chart repositories)
have no recorders yet.

Why this lives in ``services`` and not in ``cli``: it imports the services' composition roots
and routes, which ``cli`` may not (import-linter, pyproject.toml); ``cli.replay`` may import
this module, and only it (the one exception to that contract). Like ``services.allinone``, it
imports a service only when asked for it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.replay_ports import (
    Call,
    HelmSource,
    KubeSource,
    Recorder,
    RecordingBus,
    RecordingHelm,
    RecordingKube,
    RecordingRegistrar,
    RecordingTimers,
    matches,
)
from shared import subjects
from shared.consumer import Batch
from shared.errors import KubeUnavailable, PermanentError, TemporaryError
from shared.kube import KubeClient, KubeConfig
from shared.messages import (
    Message,
    MessageDeadLettered,
    MetadataChanged,
    PatchMetadata,
    PatchStatus,
    PrerequisiteChanged,
    RecheckObject,
    ReconcileCluster,
    StatusWritten,
)
from shared.oversize import complete_all
from shared.ports import StreamReader
from shared.settings import ServiceSettings
from shared.wiring import Route, Routes

SUPPORTED = ("helm", "identity", "lease", "monitor", "writer")


class Unsupported(ValueError):
    """A service replay has no recorders for (yet), or no such service."""


class NoApiServer(ValueError):
    """No kubeconfig to read the API server with (none given, none in the environment, not
    in a pod), or one that cannot be read."""


class ApiServerUnreachable(Exception):
    """The API server did not answer the version request a session starts with."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"{server}: {reason}")
        self.server = server
        self.reason = reason


# --- what the engine is given and what it gives back ------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One message as it is stored: where, and what it says."""

    stream: str
    sequence: int
    subject: str
    message: Message
    msg_id: str | None = None

    @property
    def ids(self) -> set[str]:
        """Every id a message it caused may name it by (a dead letter names the header id)."""
        return {self.message.id} | ({self.msg_id} if self.msg_id else set())


@dataclass(frozen=True)
class Step:
    """One stored message fed to one subscription's handler, and what it led to."""

    input: Stored
    subscription: str
    calls: tuple[Call, ...]


# --- the services replay knows -----------------------------------------------------------------


@dataclass(frozen=True)
class Sources:
    """The real world, read only: what the recorder ports read through."""

    kube: KubeSource
    bus: StreamReader
    helm: HelmSource | None = None


@dataclass(frozen=True)
class Target:
    """A service ready to replay: its routes, and its Deps built on recorder ports."""

    service: str
    routes: Routes[Any]
    deps: Any
    #: reads back trimmed events' objects before a handler runs, as the consumer does
    kube: RecordingKube


@dataclass(frozen=True)
class Ports:
    """The recorder ports every service's Deps are built on (helm adds its own)."""

    record: Recorder
    kube: RecordingKube
    bus: RecordingBus


Builder = Callable[[Sources, Ports, Any], Target]


def target(service: str, sources: Sources, settings: Any = None) -> tuple[Target, Recorder]:
    """``service`` with its ``Deps`` on recorder ports over ``sources``; its settings from the
    environment unless given (``Unsupported`` for a service replay has no recorders for)."""
    build = _BUILDERS.get(service)
    if build is None:
        raise _unsupported(service)
    record = Recorder()
    ports = Ports(record, RecordingKube(sources.kube, record), RecordingBus(sources.bus, record))
    return build(sources, ports, settings), record


def _unsupported(service: str) -> Unsupported:
    known = ", ".join(SUPPORTED)
    return Unsupported(f"replay not supported for {service} yet (supported: {known})")


def _helm(sources: Sources, ports: Ports, settings: Any) -> Target:
    from services.helm.app import ROUTES  # noqa: PLC0415 (imported when asked: module docstring)
    from services.helm.bootstrap import dependencies  # noqa: PLC0415
    from services.helm.settings import HelmSettings  # noqa: PLC0415

    if sources.helm is None:
        raise Unsupported("replay of helm needs helm's read commands (a helm binary)")
    chosen = settings or HelmSettings()
    registrar = RecordingRegistrar(ports.record, chosen.helm.zenith.base_domain)
    deps = dependencies(
        chosen,
        kube=ports.kube,
        helm=RecordingHelm(sources.helm, ports.record),
        bus=ports.bus,
        registrar=registrar,
    )
    deps = dataclasses.replace(deps, timers=RecordingTimers(ports.record))
    return Target("helm", ROUTES, deps, ports.kube)


def _identity(sources: Sources, ports: Ports, settings: Any) -> Target:
    from services.identity.app import ROUTES  # noqa: PLC0415 (module docstring)
    from services.identity.bootstrap import dependencies  # noqa: PLC0415
    from services.identity.settings import IdentitySettings  # noqa: PLC0415

    chosen = settings or IdentitySettings()
    deps = dependencies(chosen, bus=ports.bus, kube=ports.kube)
    return Target("identity", ROUTES, deps, ports.kube)


def _lease(sources: Sources, ports: Ports, settings: Any) -> Target:
    from services.lease.app import ROUTES  # noqa: PLC0415 (module docstring)
    from services.lease.bootstrap import dependencies  # noqa: PLC0415
    from services.lease.settings import LeaseSettings  # noqa: PLC0415

    chosen = settings or LeaseSettings()
    deps = dependencies(chosen, bus=ports.bus, kube=ports.kube)
    return Target("lease", ROUTES, deps, ports.kube)


def _monitor(sources: Sources, ports: Ports, settings: Any) -> Target:
    from services.monitor.app import ROUTES  # noqa: PLC0415 (module docstring)
    from services.monitor.bootstrap import dependencies  # noqa: PLC0415
    from services.monitor.settings import MonitorSettings  # noqa: PLC0415

    chosen = settings or MonitorSettings()
    deps = dependencies(chosen, bus=ports.bus, kube=ports.kube)
    return Target("monitor", ROUTES, deps, ports.kube)


def _writer(sources: Sources, ports: Ports, settings: Any) -> Target:
    from services.writer.app import ROUTES  # noqa: PLC0415 (module docstring)
    from services.writer.deadlines import DeadlineTimers  # noqa: PLC0415
    from services.writer.handlers import Deps  # noqa: PLC0415
    from services.writer.logic import StatusCache  # noqa: PLC0415
    from services.writer.rules import rules  # noqa: PLC0415
    from services.writer.settings import WriterSettings  # noqa: PLC0415
    from shared.status import StatusReporter  # noqa: PLC0415

    chosen = settings or WriterSettings()
    tuning = chosen.writer
    source = f"writer/{chosen.replica}"
    reporter = StatusReporter(ports.bus, partitions=chosen.partitions, source=source)
    deps = Deps(
        kube=ports.kube,
        journal=ports.bus,
        cache=StatusCache(tuning.cache_size),
        rules=rules(cluster_timeout_seconds=tuning.cluster_timeout_seconds),
        writer=chosen.replica,
        deadlines=DeadlineTimers(timers=RecordingTimers(ports.record), reporter=reporter),
        conflict_retries=tuning.conflict_retries,
        partitions=chosen.partitions,
    )
    return Target("writer", ROUTES, deps, ports.kube)


_BUILDERS: dict[str, Builder] = {
    "helm": _helm,
    "identity": _identity,
    "lease": _lease,
    "monitor": _monitor,
    "writer": _writer,
}


# --- feeding the handlers ------------------------------------------------------------------------


def routed(
    routes: Routes[Any], stored: Iterable[Stored]
) -> Iterator[tuple[Route[Any, Any], Stored]]:
    """Each stored message with every route that consumes it, in the given order: a message
    two subscriptions consume runs twice, as it does in the service."""
    for item in stored:
        for route in routes.routes:
            if _consumes(route, item):
                yield route, item


def _consumes(route: Route[Any, Any], item: Stored) -> bool:
    if route.stream.name != item.stream or not isinstance(item.message, route.model):
        return False
    return any(matches(f(subjects.ANY_PARTITION), item.subject) for f in route.filters)


async def replay(target: Target, record: Recorder, stored: Sequence[Stored]) -> list[Step]:
    """Run the handler of every route that consumes each of ``stored``, one message at a time,
    in order; each step carries the calls it made, and how it ended when not as a success."""
    steps = []
    for route, item in routed(target.routes, stored):
        ending = await _run(route, item, target)
        steps.append(Step(item, route.name, (*record.take(), *ending)))
    return steps


async def _run(route: Route[Any, Any], item: Stored, target: Target) -> tuple[Call, ...]:
    tokens = item.subject.split(".")
    batch = Batch(
        key=subjects.object_key(item.subject),
        partition=int(tokens[-3]) if len(tokens) > 3 and tokens[-3].isdigit() else 0,
        messages=(item.message,),
    )
    try:
        whole = await complete_all(batch.messages, objects=target.kube)
        await route.handle(dataclasses.replace(batch, messages=whole), target.deps)
    except PermanentError as exc:
        return (Call("consumer", "dead letter", exc.reason, f"{type(exc).__name__}: {exc}"),)
    except TemporaryError as exc:
        text = f"{type(exc).__name__}: {exc}: the consumer would retry until it heals"
        return (Call("consumer", "retry", type(exc).__name__, text),)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}: the consumer would hand it back (nak)"
        return (Call("consumer", "crash", type(exc).__name__, text),)
    return ()


# --- comparing with the streams (pure) ----------------------------------------------------


_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
#: what every message carries besides its decision
_ENVELOPE = frozenset(
    ("id", "source", "subject", "time", "correlation_id", "causation_id", "schema_version", "type")
)


def _masked(value: Any) -> str:
    """Canonical JSON with timestamps masked: two runs deciding alike say it alike."""
    return _TIME.sub(
        "<time>", json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    )


def gist(message: Message) -> str:
    """What a published message decided, without what differs between two runs alike."""
    for model, say in _GISTS:
        if isinstance(message, model):
            return str(say(message))
    payload = message.model_dump(mode="json", exclude=set(_ENVELOPE))
    return f"{type(message).__name__} {_masked(payload)}"


def _status(msg: PatchStatus) -> str:
    conditions = sorted(msg.conditions, key=lambda c: c.type)
    said = [f"{c.type}={c.status}({c.reason}): {c.message}" for c in conditions]
    if msg.patch:
        said.append(_masked(msg.patch))
    return "status " + _TIME.sub("<time>", "; ".join(said) or "(nudge)")


def _metadata(msg: PatchMetadata) -> str:
    parts = [f"+finalizer {f}" for f in msg.add_finalizers]
    parts += [f"-finalizer {f}" for f in msg.remove_finalizers]
    parts += [f"label {k}={v}" for k, v in sorted(msg.labels.items())]
    parts += [f"annotation {k}={_masked(v)}" for k, v in sorted(msg.annotations.items())]
    return "metadata " + "; ".join(parts)


def _prerequisite(msg: PrerequisiteChanged) -> str:
    state = "released" if msg.released else ("ready" if msg.ready else "not ready")
    outputs = f" {_masked(msg.outputs)}" if msg.outputs else ""
    return (
        f"prerequisite {msg.step} {state} gen={msg.generation} {msg.reason}: {msg.detail}{outputs}"
    )


def _metadata_changed(msg: MetadataChanged) -> str:
    command = {k: v for k, v in msg.command.items() if k not in _ENVELOPE}
    return f"journal metadata {_masked(command)}"


_GISTS: list[tuple[type[Any], Callable[[Any], str]]] = [
    (PatchStatus, _status),
    (PatchMetadata, _metadata),
    (PrerequisiteChanged, _prerequisite),
    (ReconcileCluster, lambda m: f"nudge {m.reason}"),
    (RecheckObject, lambda m: f"recheck {m.reason}"),
    (StatusWritten, lambda m: "journal status " + ("skipped" if m.skipped else "written")),
    (MetadataChanged, _metadata_changed),
    (MessageDeadLettered, lambda m: f"dead letter {m.reason}"),
]


class Mark(enum.StrEnum):
    """How a decision compares with the streams (module docstring)."""

    SAME = "="
    NOW_ONLY = "+"
    THEN_ONLY = "-"
    UNRECORDED = "·"


@dataclass(frozen=True)
class Decision:
    """One line of the comparison: a call made now, or a message only the streams have."""

    mark: Mark
    port: str
    verb: str
    target: str
    text: str
    #: the message on the streams this decision is (``=``) or stands for (``-``)
    stored: Stored | None = None


@dataclass(frozen=True)
class StepReport:
    """One replayed message and its decisions, marked."""

    input: Stored
    subscription: str
    decisions: tuple[Decision, ...]


@dataclass(frozen=True)
class Report:
    """A whole replay, compared; ``decisions`` counts those made now."""

    service: str
    steps: tuple[StepReport, ...]

    @property
    def differences(self) -> int:
        marks = (Mark.NOW_ONLY, Mark.THEN_ONLY)
        return sum(d.mark in marks for s in self.steps for d in s.decisions)

    @property
    def decisions(self) -> int:
        return sum(d.mark is not Mark.THEN_ONLY for s in self.steps for d in s.decisions)


def gist_of(call: Call) -> str | None:
    """How the streams would record ``call``: a publish as its message, a permanent failure
    as the consumer's dead letter; None for what they do not record."""
    if call.published and call.message is not None:
        return gist(call.message)
    if (call.port, call.verb) == ("consumer", "dead letter"):
        return f"dead letter {call.target}"
    return None


def by_service(service: str, message: Message) -> bool:
    """Whether ``service`` published ``message`` (a dead letter: gave it up)."""
    if isinstance(message, MessageDeadLettered):
        return message.service == service
    return message.source.split("/", 1)[0] == service


def recorded(
    service: str, steps: Sequence[Step], history: Iterable[Stored]
) -> list[tuple[int, Stored]]:
    """What the streams say ``service`` did because of a replayed message: (the step of the
    cause, the message), in the order given."""
    cause_of: dict[str, int] = {}
    for index, step in enumerate(steps):
        for i in step.input.ids:
            cause_of.setdefault(i, index)
    return [
        (cause_of[item.message.causation_id], item)
        for item in history
        if item.message.causation_id in cause_of and by_service(service, item.message)
    ]


def compare(service: str, steps: Sequence[Step], history: Iterable[Stored]) -> Report:
    """Every step's calls marked against what the streams recorded (module docstring)."""
    then = recorded(service, steps, history)
    now = [
        (i, n, said)
        for i, step in enumerate(steps)
        for n, call in enumerate(step.calls)
        if (said := gist_of(call)) is not None
    ]
    matcher = difflib.SequenceMatcher(
        a=[gist(item.message) for _, item in then],
        b=[said for _, _, said in now],
        autojunk=False,
    )
    marks: dict[tuple[int, int], tuple[Mark, Stored | None]] = {}
    gone: dict[int, list[Stored]] = {}
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        for offset, (i, n, _) in enumerate(now[b0:b1]):
            same = op == "equal"
            marks[(i, n)] = (Mark.SAME, then[a0 + offset][1]) if same else (Mark.NOW_ONLY, None)
        if op != "equal":
            for step, item in then[a0:a1]:
                gone.setdefault(step, []).append(item)
    return Report(
        service,
        tuple(_step_report(i, step, marks, gone.get(i, [])) for i, step in enumerate(steps)),
    )


def _step_report(
    index: int,
    step: Step,
    marks: Mapping[tuple[int, int], tuple[Mark, Stored | None]],
    gone: Sequence[Stored],
) -> StepReport:
    decisions = []
    for n, call in enumerate(step.calls):
        mark, stored = marks.get((index, n), (Mark.UNRECORDED, None))
        text = " ".join(filter(None, [call.text, gist(call.message) if call.message else ""]))
        decisions.append(Decision(mark, call.port, call.verb, call.target, text, stored))
    for item in gone:
        text = gist(item.message)
        decisions.append(Decision(Mark.THEN_ONLY, "bus", "publish", item.subject, text, item))
    return StepReport(step.input, step.subscription, tuple(decisions))


# --- a replay against the real world --------------------------------------------------------


@dataclass(frozen=True)
class Session:
    """A service ready to replay over a real API server; ``close`` when done."""

    built: Target
    record: Recorder
    #: the API server's URL, for messages
    server: str
    client: KubeClient

    async def feed(self, stored: Sequence[Stored]) -> list[Step]:
        return await replay(self.built, self.record, stored)

    async def close(self) -> None:
        await self.client.aclose()


async def open_session(
    service: str, *, bus: StreamReader, kubeconfig: str | None = None
) -> Session:
    """``service`` on recorder ports over the API server of ``kubeconfig`` (else the
    settings' ``KUBECONFIG``), ``bus`` and, for helm, the settings' helm binary. The API server
    is asked for its version first, so an unreachable one is said before anything runs
    (``KubeUnavailable``)."""
    if service not in _BUILDERS:
        raise _unsupported(service)
    base = ServiceSettings()
    path = kubeconfig or base.kubeconfig
    config = _kubeconfig(path)
    client = KubeClient.from_config(
        config, qps=base.kube_qps, burst=base.kube_burst, user_agent="capibus-replay"
    )
    try:
        await _reachable(client, config.server)
        helm = _helm_source(path) if service == "helm" else None
        built, record = target(service, Sources(kube=client, bus=bus, helm=helm))
    except BaseException:
        await client.aclose()
        raise
    return Session(built, record, config.server, client)


def _kubeconfig(path: str | None) -> KubeConfig:
    if not path and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise NoApiServer("no API server to read: set KUBECONFIG or pass --kubeconfig")
    try:
        return KubeConfig.load(path)
    except (OSError, ValueError, KeyError) as exc:
        raise NoApiServer(f"cannot read the kubeconfig {path}: {exc}") from exc


async def _reachable(client: KubeClient, server: str) -> None:
    try:
        await client.request("GET", "/version")
    except KubeUnavailable as exc:
        cause = exc.__cause__
        raise ApiServerUnreachable(
            server, str(cause) if cause and str(cause) else str(exc)
        ) from exc


def _helm_source(kubeconfig: str | None) -> HelmSource:
    from services.helm.bootstrap import helm_driver  # noqa: PLC0415 (module docstring)
    from services.helm.settings import HelmSettings  # noqa: PLC0415

    settings = HelmSettings()
    if kubeconfig:
        settings = settings.model_copy(update={"kubeconfig": kubeconfig})
    return helm_driver(settings)
