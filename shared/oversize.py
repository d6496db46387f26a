"""Objects too large for one message: the rule every kind follows, on both ends of the bus.

The API server stores objects of up to about 1.5 MiB; NATS refuses a message over its
``max_payload`` (1 MiB by default). A ClusterTemplate with large ``values``, a HelmRelease
with a big values document or an AppTemplate with large schemas can therefore be valid in
Kubernetes and still not fit in a ``ResourceChanged``. If the watcher insisted on publishing
it whole, it would retry forever and every later event of the kind would queue behind it, so
consumers would act on a stale world without knowing (a Cluster shown Ready with addons
missing). The rule instead:

* **Publish what fits, say what is missing.** ``fit`` leaves out the largest top-level fields
  of the object (never ``apiVersion``, ``kind`` or ``metadata``), biggest first, until the
  event fits; if it still does not, ``metadata.annotations`` goes too (the API server caps
  them at 256 KiB; labels, owners and the name, which decide partitions and ownership, always
  stay). The event carries ``trimmed``: the fields left out, the size the whole event would
  have had, and the resource's plural, so any consumer can read the object back.
* **Consumers never see a trimmed object unawares.** ``complete`` replaces a trimmed object
  with the object read from the API server (the truth anyway: handlers are level-triggered),
  scrubbed as the watcher scrubs it. The consumption helper does this before a handler runs;
  readers outside it (the exporter) call it themselves. An object already gone, or replaced
  by a new incarnation under the same name, stays trimmed: its own events follow.
* **Visible.** The watcher counts every trimmed event by kind and logs it with its size.

The limit is the connected server's ``max_payload`` less ``HEADROOM`` for the headers and the
subject the bus adds, so a server configured with a larger limit trims later or never.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from shared.errors import KubeNotFound, MessageTooLarge
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged, Trimmed, encode
from shared.ports import KubeGetter
from shared.resources import scrub

Json = dict[str, Any]

#: bytes kept free below ``max_payload`` for headers (``Nats-Msg-Id``) and the subject
HEADROOM = 8 * 1024
#: top-level fields that identify the object and are never left out
_KEPT = frozenset({"apiVersion", "kind", "metadata"})
#: metadata left out only once every other field is gone, in this order
_METADATA_LAST = ("annotations",)


def limit_for(max_payload: int) -> int:
    """How large an encoded message may be on a server with this ``max_payload``."""
    return max_payload - HEADROOM


def fit(message: ResourceChanged, *, plural: str, limit: int) -> ResourceChanged:
    """``message`` unchanged when it fits in ``limit`` bytes, else trimmed as described above.

    Raises ``MessageTooLarge`` when even the object's identity does not fit (a limit set far
    below any real server's).
    """
    size = len(encode(message))
    if size <= limit:
        return message
    obj = dict(message.object)
    meta = dict(obj.get("metadata") or {})
    left_out: list[str] = []
    for field in _by_size(obj):
        del obj[field]
        left_out.append(field)
        candidate = _trimmed(message, obj | {"metadata": meta}, left_out, size, plural)
        if len(encode(candidate)) <= limit:
            return candidate
    for field in _METADATA_LAST:
        if meta.pop(field, None) is not None:
            left_out.append(f"metadata.{field}")
    candidate = _trimmed(message, obj | {"metadata": meta}, left_out, size, plural)
    if len(encode(candidate)) > limit:
        raise MessageTooLarge(
            f"{message.ref.kind} {message.ref.key}: even its metadata exceeds {limit} bytes"
        )
    return candidate


def _by_size(obj: Json) -> list[str]:
    fields = [name for name in obj if name not in _KEPT]
    return sorted(fields, key=lambda name: len(json.dumps(obj[name])), reverse=True)


def _trimmed(
    message: ResourceChanged, obj: Json, left_out: list[str], size: int, plural: str
) -> ResourceChanged:
    trimmed = Trimmed(fields=tuple(left_out), size=size, plural=plural)
    return message.model_copy(update={"object": obj, "trimmed": trimmed})


async def complete(message: ResourceChanged, *, objects: KubeGetter) -> ResourceChanged:
    """``message`` with its whole object, read from the API server, if it was trimmed."""
    if message.trimmed is None or message.event == "DELETED":
        return message
    kind = kind_of(message)
    ref = message.ref
    try:
        current = await objects.get(kind, ref.namespace, ref.name)
    except KubeNotFound:
        return message
    if (current.get("metadata") or {}).get("uid") != ref.uid:
        return message
    return message.model_copy(update={"object": scrub(kind, current), "trimmed": None})


def any_trimmed(messages: Iterable[Message]) -> bool:
    return any(isinstance(m, ResourceChanged) and m.trimmed for m in messages)


async def complete_all(
    messages: tuple[Message, ...], *, objects: KubeGetter
) -> tuple[Message, ...]:
    """Every trimmed ``ResourceChanged`` among ``messages`` completed, each object read once
    however many of its events the batch holds; other messages as they are."""
    read: dict[tuple[str, str, str | None, str, str | None], ResourceChanged] = {}
    completed: list[Message] = []
    for message in messages:
        if isinstance(message, ResourceChanged) and message.trimmed and message.event != "DELETED":
            ref = message.ref
            key = (ref.api_version, ref.kind, ref.namespace, ref.name, ref.uid)
            whole = read.get(key) or await complete(message, objects=objects)
            read[key] = whole
            update = {"object": whole.object, "trimmed": whole.trimmed}
            completed.append(message.model_copy(update=update))
        else:
            completed.append(message)
    return tuple(completed)


def kind_of(message: ResourceChanged) -> ResourceKind:
    """The resource a trimmed event names, enough to read it (the token is not needed)."""
    assert message.trimmed is not None
    ref = message.ref
    group, _, version = ref.api_version.rpartition("/")
    return ResourceKind(
        token=message.trimmed.plural,
        group=group,
        version=version,
        kind=ref.kind,
        plural=message.trimmed.plural,
        namespaced=ref.namespace is not None,
    )
