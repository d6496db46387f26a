"""The recorder ports of ``capibus replay`` (``services.replay``): the same Protocols as the
real adapters, reads passed through to the real world, every act recorded and answered as the
real system would answer it, never sent.

- ``RecordingKube``: ``get``, ``list`` and discovery go to the API server, through an overlay
  of this replay's own writes, so a later read sees them (a Secret "created" by one step
  exists for the next). ``create``, ``apply``, ``patch_merge``, ``patch_json`` and ``delete``
  are recorded and applied to the overlay only; existence and the ``uid``/``resourceVersion``
  preconditions are checked against that view and fail as the server would (``KubeConflict``,
  ``KubeNotFound``), since handlers act on those answers. Only the keys an object sets are
  recorded, never their values: a Secret's data is not printed.
- ``RecordingHelm``: ``ensure_release`` decides as ``shared.helm.Helm.ensure_release`` does
  (install when no revision is stored, nothing when the deployed revision has this chart and
  these values, else an upgrade; a stuck release repaired first) from helm's read-only
  commands (``get metadata``, ``get values``, ``show chart``); ``uninstall`` says whether a
  release is there; ``template`` renders locally as it always does.
- ``RecordingBus``: publishes recorded; ``last_message`` answers from this replay's own
  publishes first, then from the real streams (the prerequisite facts handlers read).
- ``RecordingRegistrar``: a Zenith reservation answered with the subdomain asked for.
- ``RecordingTimers``: armed and cancelled as the service would, never fired.

A ``Call`` is one recorded act; ``published`` marks the ones the streams would hold too (a
publish), which is what ``services.replay.compare`` lines up with the history.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from shared import jsonpatch, mergepatch
from shared.bus import Published
from shared.errors import KubeConflict, KubeNotFound
from shared.helm import (
    DEPLOYED,
    REINSTALL_FROM,
    ROLL_BACK_FROM,
    Chart,
    ChartRef,
    ReleaseOutcome,
    Revision,
    normalise,
)
from shared.kube import JsonPatch, ResourceKind
from shared.messages import Message, encode
from shared.ports import Discovery, KubeReader, StreamReader
from shared.timers import Armed, Timers

Json = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One thing a handler did through a port: ``port`` (kube, helm, bus, registrar, timer,
    consumer), ``verb``, what it acted on, and what it said. ``message`` is what a publish
    would have stored (``published``) or what a timer would publish at its moment."""

    port: str
    verb: str
    target: str
    text: str = ""
    message: Message | None = None
    published: bool = False


class Recorder:
    """Every call the recorder ports took, in order; ``take`` hands over a step's share."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __call__(self, call: Call) -> None:
        self.calls.append(call)

    def take(self) -> tuple[Call, ...]:
        taken, self.calls = tuple(self.calls), []
        return taken


# --- the Kubernetes port ------------------------------------------------------------------------


class KubeSource(KubeReader, Discovery, Protocol):
    """The real API server, read only."""


Key = tuple[str, str, str, str]


def _key(kind: ResourceKind, namespace: str | None, name: str) -> Key:
    return (kind.group, kind.kind, namespace or "", name)


def _target(kind: ResourceKind, namespace: str | None, name: str) -> str:
    return f"{kind.kind} {namespace}/{name}" if namespace else f"{kind.kind} {name}"


class RecordingKube:
    """Reads go to the API server through an overlay of this replay's own writes; writes are
    recorded and applied to the overlay only (module docstring)."""

    def __init__(self, source: KubeSource, record: Recorder) -> None:
        self.source = source
        self.record = record
        #: objects as this replay's writes left them; None: deleted by it
        self.overlay: dict[Key, Json | None] = {}
        self._versions = itertools.count(1)

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        key = _key(kind, namespace, name)
        if key not in self.overlay:
            return await self.source.get(kind, namespace, name)
        obj = self.overlay[key]
        if obj is None:
            raise KubeNotFound(f"{kind.plural} {name!r} not found (deleted in this replay)")
        return copy.deepcopy(obj)

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        limit: int | None = None,
    ) -> tuple[list[Json], str]:
        items, version = await self.source.list(
            kind, namespace=namespace, label_selector=label_selector, limit=limit
        )
        found = {
            _key(kind, i["metadata"].get("namespace"), i["metadata"]["name"]): i for i in items
        }
        for key, obj in self.overlay.items():
            if key[:2] != (kind.group, kind.kind) or (namespace and key[2] != namespace):
                continue
            found.pop(key, None)
            if obj is not None and selected(obj, label_selector):
                found[key] = copy.deepcopy(obj)
        listed = list(found.values())
        return (listed[:limit] if limit else listed), version

    async def resolve(self, group: str, kind: str, *, version: str | None = None) -> ResourceKind:
        return await self.source.resolve(group, kind, version=version)

    # -- writes, recorded ------------------------------------------------------------------------

    async def create(self, kind: ResourceKind, obj: Json) -> Json:
        meta = obj["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        target = _target(kind, namespace, name)
        if await self._current(kind, namespace, name) is not None:
            self.record(Call("kube", "create", target, "refused: it already exists (409)"))
            raise KubeConflict(f"{kind.plural} {name!r} already exists")
        self.record(Call("kube", "create", target, _fields(obj)))
        return self._store(kind, _created(kind, obj, next(self._versions)))

    async def apply(
        self,
        kind: ResourceKind,
        obj: Json,
        *,
        field_manager: str,
        force: bool = True,
        subresource: str | None = None,
    ) -> Json:
        meta = obj["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        current = await self._current(kind, namespace, name)
        how = "creates it" if current is None else "changes it"
        text = f"server-side apply as {field_manager} ({how}): {_fields(obj)}"
        self.record(Call("kube", "apply", _target(kind, namespace, name), text))
        if current is None:
            return self._store(kind, _created(kind, obj, next(self._versions)))
        merged = mergepatch.apply(current, _without_identity(obj))
        return self._store(kind, merged)

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        target = _target(kind, namespace, name) + (f" /{subresource}" if subresource else "")
        current = await self._existing(kind, namespace, name, "patch", target)
        self._check_preconditions(current, patch.get("metadata") or {}, target)
        said = _compact(_redacted(kind, _without_preconditions(patch)))
        self.record(Call("kube", "patch", target, said))
        if subresource == "status":
            body = {"status": patch.get("status")}
        else:
            body = {k: v for k, v in _without_preconditions(patch).items() if k != "status"}
        return self._store(kind, mergepatch.apply(current, body))

    async def patch_json(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        ops: JsonPatch,
        *,
        subresource: str | None = None,
    ) -> Json:
        target = _target(kind, namespace, name)
        current = copy.deepcopy(await self._existing(kind, namespace, name, "patch", target))
        listed = list(ops)
        try:
            for op in listed:
                jsonpatch.apply_op(current, op)
        except KubeConflict as exc:
            self.record(Call("kube", "patch", target, f"refused: {exc} (409)"))
            raise
        shown = [_redacted(kind, op) for op in listed]
        self.record(Call("kube", "patch", target, "JSON patch " + _compact(shown)))
        return self._store(kind, current)

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        target = _target(kind, namespace, name)
        current = await self._existing(kind, namespace, name, "delete", target)
        self.record(Call("kube", "delete", target, ""))
        self.overlay[_key(kind, namespace, name)] = None
        return current

    # -- inside ----------------------------------------------------------------------------------

    async def _current(self, kind: ResourceKind, namespace: str | None, name: str) -> Json | None:
        try:
            return await self.get(kind, namespace, name)
        except KubeNotFound:
            return None

    async def _existing(
        self, kind: ResourceKind, namespace: str | None, name: str, verb: str, target: str
    ) -> Json:
        current = await self._current(kind, namespace, name)
        if current is None:
            self.record(Call("kube", verb, target, "refused: not found (404)"))
            raise KubeNotFound(f"{kind.plural} {name!r} not found")
        return current

    def _check_preconditions(self, current: Json, wanted: Json, target: str) -> None:
        meta = current.get("metadata") or {}
        for name in ("uid", "resourceVersion"):
            if wanted.get(name) and wanted[name] != meta.get(name):
                refused = f"precondition failed: {name} {wanted[name]} != {meta.get(name)}"
                self.record(Call("kube", "patch", target, f"refused: {refused} (409)"))
                raise KubeConflict(refused)

    def _store(self, kind: ResourceKind, obj: Json) -> Json:
        """Keep ``obj`` as this replay's version of it, with a resourceVersion of its own."""
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = f"{meta.get('resourceVersion', '0')}+replay{next(self._versions)}"
        self.overlay[_key(kind, meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)


def _redacted(kind: ResourceKind, body: Json) -> Json:
    """``body`` as it may be shown: a Secret's data by its keys only, a JSON patch operation
    on a Secret without its value."""
    if (kind.group, kind.kind) != ("", "Secret"):
        return body
    shown = {k: v for k, v in body.items() if k not in ("data", "stringData", "value")}
    for field_name in ("data", "stringData"):
        if isinstance(body.get(field_name), dict):
            shown[field_name] = sorted(body[field_name])
    return shown


def _created(kind: ResourceKind, obj: Json, n: int) -> Json:
    made = copy.deepcopy(obj)
    made.pop("stringData", None)
    made.setdefault("apiVersion", kind.api_version)
    made.setdefault("kind", kind.kind)
    meta = made["metadata"]
    meta.setdefault("uid", f"replay-{n}")
    meta.setdefault("generation", 1)
    meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return made


def _without_identity(obj: Json) -> Json:
    """An applied object's content, without the identity the server keeps."""
    meta = {
        k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("uid", "resourceVersion")
    }
    return {**obj, "metadata": meta}


def _without_preconditions(patch: Json) -> Json:
    meta = {
        k: v
        for k, v in (patch.get("metadata") or {}).items()
        if k not in ("uid", "resourceVersion")
    }
    body = {k: v for k, v in patch.items() if k != "metadata"}
    return {**body, "metadata": meta} if meta else body


def selected(obj: Json, selector: str | None) -> bool:
    """Equality (``k=v``) and existence (``k``) terms of a label selector."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in (selector or "").split(","):
        key, _, value = term.partition("=")
        if term and (key not in labels or (value and labels[key] != value)):
            return False
    return True


# --- the bus, helm, the registrar, timers ------------------------------------------------------


class RecordingBus:
    """Publishes are recorded, never sent; ``last_message`` answers from this replay's own
    publishes first, then from the real streams."""

    def __init__(self, source: StreamReader, record: Recorder) -> None:
        self.source = source
        self.record = record
        self.published: dict[str, bytes] = {}

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        self.record(Call("bus", "publish", subject, message=message, published=True))
        self.published.pop(subject, None)  # the latest publish last, for wildcard reads
        self.published[subject] = encode(message)
        return Published(sequence=0, duplicate=False)

    async def last_message(self, stream: str, subject: str) -> bytes | None:
        mine = [body for s, body in self.published.items() if matches(subject, s)]
        return mine[-1] if mine else await self.source.last_message(stream, subject)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


class HelmSource(Protocol):
    """Helm's read-only commands (``shared.helm.Helm`` has them)."""

    async def status(self, name: str, namespace: str) -> Revision | None: ...

    async def show_chart(self, chart: ChartRef) -> Chart: ...

    async def values(self, name: str, namespace: str, revision: int) -> Json: ...

    async def template(
        self, chart: ChartRef, release: str, namespace: str, values: Mapping[str, Any]
    ) -> list[Json]: ...


class RecordingHelm:
    """``ensure_release`` and ``uninstall`` decided as the adapter decides them, from helm's
    read commands, and recorded; ``template`` renders locally, as it always does."""

    def __init__(self, source: HelmSource, record: Recorder) -> None:
        self.source = source
        self.record = record

    async def ensure_release(
        self, name: str, namespace: str, chart: Any, values: Json, *, absent: bool = False
    ) -> ReleaseOutcome:
        outcome, why = await self._outcome(name, namespace, chart, normalise(values), absent)
        text = f"{_chart_name(chart)}: {why}"
        self.record(Call("helm", "install", f"release {namespace}/{name}", text))
        return outcome

    async def _outcome(
        self, name: str, namespace: str, chart: ChartRef, wanted: Json, absent: bool
    ) -> tuple[ReleaseOutcome, str]:
        current = None if absent else await self.source.status(name, namespace)
        if current is None:
            return ReleaseOutcome(1, DEPLOYED, "installed"), "would install revision 1"
        if current.status in REINSTALL_FROM:
            why = f"revision {current.revision} is {current.status}: would uninstall, install 1"
            return ReleaseOutcome(1, DEPLOYED, "recovered+installed"), why
        if current.status in ROLL_BACK_FROM:
            why = f"revision {current.revision} is {current.status}: would roll back, upgrade"
            return ReleaseOutcome(current.revision + 2, DEPLOYED, "recovered+upgraded"), why
        if current.status == DEPLOYED and await self._unchanged(
            current, name, namespace, chart, wanted
        ):
            why = f"revision {current.revision} is deployed with this chart and values: no change"
            return ReleaseOutcome(current.revision, DEPLOYED, "unchanged"), why
        after = current.revision + 1
        why = f"would upgrade revision {current.revision} ({current.status}) to {after}"
        return ReleaseOutcome(after, DEPLOYED, "upgraded"), why

    async def _unchanged(
        self, current: Revision, name: str, namespace: str, chart: ChartRef, wanted: Json
    ) -> bool:
        target = await self.source.show_chart(chart)
        same_chart = (current.chart_name, current.chart_version) == (target.name, target.version)
        return same_chart and await self.source.values(name, namespace, current.revision) == wanted

    async def uninstall(self, name: str, namespace: str) -> bool:
        there = await self.source.status(name, namespace) is not None
        text = "would uninstall it" if there else "nothing installed: nothing to do"
        self.record(Call("helm", "uninstall", f"release {namespace}/{name}", text))
        return there

    async def template(self, chart: Any, release: str, namespace: str, values: Json) -> list[Json]:
        return await self.source.template(chart, release, namespace, values)


def _chart_name(chart: Any) -> str:
    name = getattr(chart, "name", str(chart))
    version = getattr(chart, "version", None)
    return f"{name} {version}" if version else str(name)


@dataclass(frozen=True)
class Reserved:
    subdomain: str
    fqdn: str


class RecordingRegistrar:
    """A Zenith reservation, recorded and answered with the subdomain asked for."""

    def __init__(self, record: Recorder, base_domain: str | None) -> None:
        self.record = record
        self.base_domain = base_domain or "zenith.invalid"

    async def reserve(self, public_key: str, subdomain: str | None = None) -> Reserved:
        chosen = subdomain or "replay"
        self.record(Call("registrar", "reserve", chosen, f"for key {public_key[:24]}…"))
        return Reserved(chosen, f"{chosen}.{self.base_domain}")


class RecordingTimers(Timers):
    """Timers armed and cancelled as the service would, recorded and never fired."""

    def __init__(self, record: Recorder) -> None:
        super().__init__(_NoBus())
        self.record = record
        self._held: dict[str, Armed] = {}

    def at(
        self,
        key: str,
        when: datetime,
        subject: str,
        message: Message,
        *,
        partition: int | None = None,
    ) -> None:
        armed = Armed(when, subject, message, partition)
        if self._held.get(key) == armed:
            return
        self._held[key] = armed
        text = f"at {when.isoformat(timespec='seconds')}"
        self.record(Call("timer", "arm", subject, text, message=message))

    def cancel(self, key: str) -> None:
        self._held.pop(key, None)

    def drop(self, partitions: Iterable[int]) -> None:
        wanted = set(partitions)
        for key, armed in list(self._held.items()):
            if armed.partition in wanted:
                self.cancel(key)

    def pending(self) -> dict[str, Armed]:
        return dict(self._held)

    def cancel_all(self) -> None:
        self._held.clear()


class _NoBus:
    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        raise AssertionError("a recording timer never fires")


def _fields(obj: Json) -> str:
    """What an object sets, shortly: its top-level keys beyond the identity."""
    keys = [k for k in obj if k not in ("apiVersion", "kind", "metadata")]
    return ", ".join(keys) or "metadata"


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
