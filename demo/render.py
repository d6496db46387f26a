"""One line per bus message: ``time  category  type  event  object  detail  correlation``.

The category is the stream the subject belongs to, so the colour alone says who is talking:
EVENT (the watcher's view of Kubernetes), STATUS (status and metadata commands for the
writer), LIFECYCLE (prerequisites settled and nudges between lifecycle services), JOURNAL
(what the writer did) and DEADLETTER (what a service gave up on).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from demo.style import BLUE, BOLD, CYAN, DIM, GREEN, MAGENTA, RED, STYLE, YELLOW
from shared import subjects
from shared.messages import (
    Condition,
    Message,
    MessageDeadLettered,
    MetadataChanged,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    PrerequisiteChanged,
    RecheckObject,
    ReconcileCluster,
    ResourceChanged,
    ResourcesListed,
    StatusWritten,
)
from shared.resources import CLUSTER

Json = dict[str, Any]

CATEGORIES = {
    "evt": ("EVENT", CYAN),
    "status": ("STATUS", YELLOW),
    "lifecycle": ("LIFECYCLE", MAGENTA),
    "journal": ("JOURNAL", GREEN),
    "dlq": ("DEADLETTER", RED),
}
EVENT_COLOURS = {
    "ADDED": GREEN,
    "MODIFIED": BLUE,
    "DELETED": RED,
    "READY": GREEN,
    "WAITING": YELLOW,
    "RELEASED": RED,
}
DETAIL_WIDTH = 60


def render(subject: str, message: Message, *, duplicate: bool = False) -> str:
    event, obj, detail = describe(message)
    line = _line(
        subject,
        type_name=type(message).__name__,
        event=event,
        obj=obj,
        detail=f"dup {detail}" if duplicate else detail,
        correlation=message.correlation_id,
    )
    # Painting over the columns' own colours would not dim them: strip to plain text first.
    return STYLE.paint(STYLE.plain(line), DIM) if duplicate else line


def render_undecodable(subject: str, error: str) -> str:
    obj = _where(subjects.object_key(subject)) if subject.count(".") >= 4 else subject
    # "<undecodable>" already says what decode_any's prefix would.
    detail = error.removeprefix("not a capibus message: ")
    return _line(subject, type_name="<undecodable>", event="BAD", obj=obj, detail=detail)


def _line(
    subject: str, *, type_name: str, event: str, obj: str, detail: str, correlation: str = ""
) -> str:
    label, colour = CATEGORIES.get(subject.split(".")[1], ("?", MAGENTA))
    if len(detail) > DETAIL_WIDTH:
        detail = detail[: DETAIL_WIDTH - 1] + "…"
    return " ".join(
        (
            STYLE.paint(datetime.now().strftime("%H:%M:%S.%f")[:-3], DIM),
            STYLE.pad(label, 10, colour, BOLD),
            STYLE.pad(type_name, 20, colour),
            STYLE.pad(event, 9, EVENT_COLOURS.get(event, MAGENTA)),
            STYLE.pad(obj, 34),
            STYLE.pad(detail, DETAIL_WIDTH, RED if type_name == "<undecodable>" else ""),
            STYLE.paint(correlation, DIM),
        )
    ).rstrip()


def describe(message: Message) -> tuple[str, str, str]:
    """(event, object, detail) columns for one message."""
    if isinstance(message, ResourceChanged):
        obj = f"{_kind_label(message.ref)} {_where(message.ref.key)}"
        return message.event, obj, _change_detail(message)
    if isinstance(message, ResourcesListed):
        # The group tells Azimuth's Cluster from Cluster API's.
        group = message.api_version.rpartition("/")[0].split(".")[0] or "core"
        return "LISTED", f"{message.kind} [{group}]", f"count={message.count}"
    if isinstance(message, MessageDeadLettered):
        obj = subjects.object_key(message.original_subject)
        return message.reason, obj, f"by {message.service}: {message.error}"
    if isinstance(message, ReconcileCluster):
        return "NUDGE", message.ref.key, message.reason
    if isinstance(message, RecheckObject):
        return "RECHECK", _object(message.ref), f"{message.reason} attempt={message.attempt}"
    return _about_cluster(message)


def _about_cluster(message: Message) -> tuple[str, str, str]:
    """Commands, facts and journal entries: each names one object (see ``_object``)."""
    if isinstance(message, PatchStatus):
        parts = [summarise_patch(message.patch), *map(condition_text, message.conditions)]
        return "PATCH", _object(message.ref), " ".join(p for p in parts if p)
    if isinstance(message, PatchMetadata | MetadataChanged):
        if isinstance(message, MetadataChanged):
            return "APPLIED", _object(message.ref), _metadata_detail(message.command)
        return "META", _object(message.ref), _metadata_detail(message.model_dump())
    if isinstance(message, PrerequisiteChanged):
        return _prerequisite(message)
    if isinstance(message, StatusWritten):
        return _written(message)
    return "?", "?", ""


def _object(ref: ObjectRef) -> str:
    """An Azimuth Cluster by its key alone, as the story is about it; any other kind (the
    metal-stack scene's) with its kind, since a MetalStackCluster and its firewall share a
    name."""
    if (ref.api_version, ref.kind) == (CLUSTER.api_version, CLUSTER.kind):
        return ref.key
    return f"{_kind_label(ref)} {_where(ref.key)}"


def _kind_label(ref: ObjectRef) -> str:
    """The kind, with ``CAPI`` before Cluster API's Cluster: it shares a name with Azimuth's."""
    return f"CAPI {ref.kind}" if ref.api_version.startswith("cluster.x-k8s.io/") else ref.kind


def _change_detail(message: ResourceChanged) -> str:
    status = message.object.get("status") or {}
    detail = f"rv={message.resource_version}"
    if status.get("phase"):
        detail += f" phase={status['phase']}"
    if message.ref.api_version == CLUSTER.api_version and message.ref.kind == CLUSTER.kind:
        reconciled = condition_of(message.object, "Reconciled")
        detail += f" Reconciled={reconciled.get('reason')}" if reconciled else ""
    if message.ref.kind == "Secret":
        # The watcher strips data before publishing; say so, since that is the point.
        detail += " (data stripped)"
    return detail


def _prerequisite(message: PrerequisiteChanged) -> tuple[str, str, str]:
    event = "RELEASED" if message.released else "READY" if message.ready else "WAITING"
    detail = f"{message.step} gen={message.generation} {message.reason}"
    if message.outputs:
        detail += f" outputs{{{','.join(message.outputs)}}}"
    elif message.detail:
        detail += f": {message.detail}"
    return event, _object(message.ref), detail


def _metadata_detail(command: Json) -> str:
    parts = [f"+{f}" for f in command.get("add_finalizers") or ()]
    parts += [f"-{f}" for f in command.get("remove_finalizers") or ()]
    for field in ("labels", "annotations"):
        keys = [k.rpartition("/")[2] for k in command.get(field) or {}]
        parts += [f"{field}{{{','.join(keys)}}}"] if keys else []
    if command.get("if_generation") is not None:
        parts.append(f"if gen={command['if_generation']}")
    return " ".join(parts)


def _written(message: StatusWritten) -> tuple[str, str, str]:
    ids = [short(i) for i in message.update_ids]
    shown = " ".join(ids[:2]) + (f" +{len(ids) - 2}" if len(ids) > 2 else "")
    where = "no-op" if message.skipped else f"rv={message.resource_version}"
    count = f"{len(ids)} update{'s' if len(ids) != 1 else ''}"
    return (
        ("SKIPPED" if message.skipped else "WRITTEN"),
        _object(message.ref),
        f"{where} ← {count} [{shown}]",
    )


def summarise_patch(patch: Json) -> str:
    """``phase=Ready nodes{a,b} addresses[3]``: scalars with their value, objects with their
    keys, lists with their length."""
    parts = []
    for key, value in patch.items():
        if value is None:
            parts.append(f"-{key}")
        elif isinstance(value, dict):
            parts.append(f"{key}{{{','.join(value)}}}")
        elif isinstance(value, list):
            parts.append(f"{key}[{len(value)}]")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def condition_text(condition: Condition) -> str:
    return f"{condition.type}={condition.status}/{condition.reason}"


def condition_of(obj: Json, kind: str) -> Json:
    """The condition of type ``kind`` in ``obj``'s status, or ``{}``."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def _where(key: str) -> str:
    """``namespace/name``, or just ``name`` for a cluster-scoped object (key ``/name``)."""
    return key.removeprefix("/")


def short(message_id: str) -> str:
    return message_id[:8]
