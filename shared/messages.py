"""Every message capibus puts on the bus, as frozen pydantic models, in one place.

Naming follows intent: commands are imperative (``PatchStatus``: exactly one service,
the writer, carries it out) and events are past tense (``ResourceChanged``: any number of
services may react). Every message carries the same envelope so a cluster's story can be
listed and traced cause to effect:

- ``id``: unique per message. Messages that describe the same fact get the same id (the
  watcher derives it from uid, resourceVersion and event type), so two producers of one fact
  are deduplicated by JetStream and by consumers alike.
- ``correlation_id``: the story the message belongs to, ``cluster:<namespace>/<name>`` for
  everything about an Azimuth cluster.
- ``causation_id``: the id of the message whose handling produced this one.
- ``schema_version``: bumped on incompatible change; decoders reject versions they do not
  know instead of guessing.

No message may carry a credential (principle 7): the watcher strips Secret data before
publishing, and ``ResourceChanged`` refuses a Secret that still has any.

A non-finite number (``inf``, ``nan``) has no JSON form. Pydantic would write it as ``null``,
which in a ``PatchStatus`` means "remove this key": a bug upstream of the bus would silently
delete status. ``encode`` refuses such a message instead (``BadMessage``, permanent, naming
the field), so the producer's handler fails where the number was made. The check costs a
scan of the body for the two words, and a parse only when one of them appears.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from shared.errors import BadMessage

#: how much of a dead-lettered body its entry keeps (far below any server's maximum payload)
DEAD_LETTER_PAYLOAD_LIMIT = 64 * 1024
#: how much of an error's text a dead-letter entry keeps
DEAD_LETTER_ERROR_LIMIT = 4 * 1024

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


def _now() -> datetime:
    return datetime.now(UTC)


def _new_id() -> str:
    return str(uuid.uuid4())


def stable_id(*parts: str) -> str:
    """A message id that every producer of the same fact computes alike."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "capibus:" + ":".join(parts)))


class Frozen(BaseModel):
    # "constants" writes Infinity/NaN, which ``encode`` then finds (never a silent null).
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class ObjectRef(Frozen):
    """Names one Kubernetes object; ``uid`` pins one incarnation of that name."""

    api_version: str
    kind: str
    namespace: str | None = None
    name: str
    uid: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace or ''}/{self.name}"


class Message(Frozen):
    """The envelope; subclasses add their payload and a literal ``type``."""

    #: Each message of this type changes part of its object, so every one counts, in order:
    #: one that arrives late runs again under every newer one of its object
    #: (``shared.consumer``: lost deliveries). Otherwise the newest describes the object.
    partial: ClassVar[bool] = False

    id: str = Field(default_factory=_new_id)
    source: str
    subject: str = ""
    time: datetime = Field(default_factory=_now)
    correlation_id: str
    causation_id: str | None = None
    schema_version: Literal[1] = 1

    def caused(self) -> dict[str, str]:
        """Envelope fields for a message produced while handling this one."""
        return {"correlation_id": self.correlation_id, "causation_id": self.id}


class Trimmed(Frozen):
    """Why an event's ``object`` is not the whole object: the whole did not fit in one message.

    ``fields`` are the dotted paths left out (``spec``, ``metadata.annotations``), ``size`` the
    bytes the whole event would have taken, ``plural`` the resource's plural, so a consumer can
    read the object from the API server (``shared.oversize``).
    """

    fields: tuple[str, ...]
    size: int
    plural: str


class ResourceChanged(Message):
    """The watcher saw an object appear, change or disappear.

    ``trimmed`` is set when ``object`` lacks fields that did not fit (``shared.oversize``);
    consumers receive the whole object, read back from the API server.
    """

    type: Literal["ResourceChanged"] = "ResourceChanged"
    event: EventType
    ref: ObjectRef
    resource_version: str
    object: dict[str, Any]
    trimmed: Trimmed | None = None

    @model_validator(mode="after")
    def _no_secret_payload(self) -> ResourceChanged:
        if self.ref.kind == "Secret" and ({"data", "stringData"} & self.object.keys()):
            raise ValueError("Secret data must never travel on the bus")
        return self


class ResourcesListed(Message):
    """A full list of one kind completed: consumers may prune what it did not contain."""

    type: Literal["ResourcesListed"] = "ResourcesListed"
    api_version: str
    kind: str
    resource_version: str
    count: int


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Frozen):
    """One entry of ``status.conditions``, in the Kubernetes shape (``metav1.Condition``).

    Publishers say what they know; the writer keeps ``lastTransitionTime`` (it changes only
    when ``status`` does) and merges conditions by ``type``, so services never overwrite each
    other's conditions.
    """

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


class PatchStatus(Message):
    """Merge ``patch`` into the status of one object capibus owns (RFC 7386: ``None`` removes
    a key): an Azimuth Cluster, an AppTemplate, any kind registered in ``shared.status``.

    ``ref`` names the object by kind, namespace, name and uid; ``conditions`` are set by type
    (see ``Condition``), never replaced as a list. Only the writer carries it out.
    """

    partial: ClassVar[bool] = True

    type: Literal["PatchStatus"] = "PatchStatus"
    ref: ObjectRef
    patch: dict[str, Any] = Field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()


class PatchMetadata(Message):
    """Change an object's metadata: finalizers, labels, annotations (any kind registered in
    ``shared.status``).

    Only the writer carries it out, computed against the object as it is now.
    ``if_generation`` makes the change conditional on the spec it was decided for: a
    ``last-handled-configuration`` for generation 3 must not land once generation 4 exists.
    Labels and annotations set to ``None`` are removed.
    """

    partial: ClassVar[bool] = True

    type: Literal["PatchMetadata"] = "PatchMetadata"
    ref: ObjectRef
    add_finalizers: tuple[str, ...] = ()
    remove_finalizers: tuple[str, ...] = ()
    labels: dict[str, str | None] = Field(default_factory=dict)
    annotations: dict[str, str | None] = Field(default_factory=dict)
    if_generation: int | None = None


PrerequisiteStep = Literal["identity", "lease"]


class PrerequisiteChanged(Message):
    """A service's part that must be done before a Cluster's Helm release changed state.

    ``ref`` is the Azimuth Cluster (uid pinned) and ``generation`` the spec generation the
    result was computed for, so the helm service never acts on an answer to an older spec.
    ``outputs`` are what the Helm values need from the step (identity: ``realmName``,
    ``issuerUrl``, ``clientId``, ``rootGroup``, ``platformUsersGroup``; lease:
    ``sizeNameMap``); never a credential. ``released`` reports
    the deletion side: the step let go of everything it held for this Cluster.
    """

    type: Literal["PrerequisiteChanged"] = "PrerequisiteChanged"
    ref: ObjectRef
    step: PrerequisiteStep
    generation: int
    ready: bool
    reason: str
    detail: str = ""
    outputs: dict[str, Any] = Field(default_factory=dict)
    released: bool = False


class ReconcileCluster(Message):
    """Look at this Cluster again: something it waits for changed outside its partition.

    Cluster-scoped templates, namespace-wide Realms and cloud-credential Secrets hash to other
    partitions than the Clusters that use them; the service that sees them change sends this
    command into each affected Cluster's partition instead of anyone polling.
    """

    type: Literal["ReconcileCluster"] = "ReconcileCluster"
    ref: ObjectRef
    reason: str


class StatusWritten(Message):
    """The writer applied (or found already applied) a set of status patches in one write."""

    type: Literal["StatusWritten"] = "StatusWritten"
    ref: ObjectRef
    update_ids: list[str]
    resource_version: str | None
    writer: str
    skipped: bool = False
    started: datetime
    finished: datetime


class MetadataChanged(Message):
    """The writer carried out a ``PatchMetadata`` (or found it already done)."""

    type: Literal["MetadataChanged"] = "MetadataChanged"
    ref: ObjectRef
    command: dict[str, Any]


class MessageDeadLettered(Message):
    """A message was given up on.

    ``payload`` is the original body decoded as UTF-8, cut to its first
    ``DEAD_LETTER_PAYLOAD_LIMIT`` bytes when longer (``payload_truncated``), so an entry always
    fits on the bus whatever it records; ``payload_size`` and ``payload_sha256`` describe the
    whole body, and ``stream``/``stream_sequence`` address the original while the stream's
    retention keeps it.
    """

    type: Literal["MessageDeadLettered"] = "MessageDeadLettered"
    service: str
    original_subject: str
    original_id: str | None
    error: str
    reason: str
    deliveries: int
    payload: str
    payload_size: int = 0
    payload_sha256: str = ""
    payload_truncated: bool = False
    stream: str | None = None
    stream_sequence: int | None = None


class SyncAppTemplate(Message):
    """Synchronise one AppTemplate's versions with its chart repository now.

    A command for the catalog service, published by its own timer when a template's
    ``syncFrequency`` runs out (or at once when a partition is claimed and one is overdue).
    The id is derived from the template's uid, generation and ``due`` time, so replicas and
    retries that schedule the same sync store one command; the handler re-reads the template
    and does nothing if a sync concluded in the meantime.
    """

    type: Literal["SyncAppTemplate"] = "SyncAppTemplate"
    ref: ObjectRef
    due: datetime
    reason: str = "Scheduled"


class RecheckObject(Message):
    """Look at this object again: something outside the Kubernetes API changed for it.

    A provider whose object waits on an outside system (a workload cluster's Node appearing,
    a metal-api machine phoning home) sends this command into the object's partition, from a
    watch of that system or from a timer, so the check runs in the object's queue like any
    other event instead of in a polling loop. The id is derived from what happened (the Node's
    uid, the timer's moment), so replicas and retries that see the same thing store one
    command.
    """

    type: Literal["RecheckObject"] = "RecheckObject"
    ref: ObjectRef
    reason: str
    #: how many looks in a row found the wait not over yet (a timer's backoff grows with it)
    attempt: int = 0


AnyMessage = Annotated[
    ResourceChanged
    | ResourcesListed
    | PatchStatus
    | PatchMetadata
    | PrerequisiteChanged
    | ReconcileCluster
    | StatusWritten
    | MetadataChanged
    | MessageDeadLettered
    | SyncAppTemplate
    | RecheckObject,
    Field(discriminator="type"),
]
_any = TypeAdapter[AnyMessage](AnyMessage)

M = TypeVar("M", bound=Message)


def encode(message: Message) -> bytes:
    body = message.model_dump_json(exclude_none=False).encode()
    if b"NaN" in body or b"Infinity" in body:
        _refuse_non_finite(message, body)
    return body


def _refuse_non_finite(message: Message, body: bytes) -> None:
    """Raise ``BadMessage`` if ``body`` holds a NaN/Infinity *number* (not merely the word)."""
    found: list[str] = []

    def constant(token: str) -> None:
        found.append(token)

    json.loads(body, parse_constant=constant)
    if found:
        path = _non_finite_path(message.model_dump(), ())
        raise BadMessage(
            f"{type(message).__name__}: {found[0]} at {'.'.join(path) or '?'} has no JSON form"
        )


def _non_finite_path(value: Any, path: tuple[str, ...]) -> tuple[str, ...]:
    """The first path to a non-finite float in a dumped model (empty if none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        children = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        children = [(str(i), v) for i, v in enumerate(value)]
    else:
        return ()
    for key, child in children:
        if found := _non_finite_path(child, (*path, key)):
            return found
    return ()


def decode(data: bytes, model: type[M]) -> M:
    """Parse ``data`` as ``model``; anything else is a ``BadMessage`` naming the problem."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise BadMessage(f"not a valid {model.__name__}: {_summarise(exc)}") from exc


def decode_any(data: bytes) -> Message:
    try:
        return _any.validate_json(data)
    except ValidationError as exc:
        raise BadMessage(f"not a capibus message: {_summarise(exc)}") from exc


def _summarise(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)[:3]
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in errors)
