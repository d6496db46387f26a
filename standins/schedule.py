"""Stand-in for the azimuth-schedule-operator: Leases go Pending, then Active, then away.

What capibus can observe of the real operator (``docs/upstream.md`` §5),
without OpenStack or Blazar:

- **Adoption.** The first sight of a Lease adds the bare-group finalizer
  ``scheduling.azimuth.stackhpc.com`` and writes ``Pending``.
- **Activation.** Once ``spec.startsAt`` has passed (a requeue at that instant, not a poll):
  ``Active`` with ``sizeMap`` (flavor id → reserved id) and ``sizeNameMap`` (flavor name →
  reserved name) in one write. Flavor names come from a fixture table, and ids missing from it
  are dropped from ``sizeNameMap`` as Nova's list would drop them. With the Blazar knob each
  flavor gets a reservation whose flavor is named ``reservation:<id>``; ids derive from the
  lease uid, so a restart recomputes the same maps instead of rewriting them.
- **End of lease.** At ``endsAt - gracePeriod`` every owner is deleted with Foreground
  propagation: that is how an Azimuth Cluster is deleted when its lease runs out.
- **Deletion.** Nothing happens while another finalizer (capibus's ``azimuth.stackhpc.com``)
  is present: its removal is a MODIFIED event that brings the Lease back. Then ``Deleting``,
  the cloud credentials Secret is deleted (upstream revokes the app credential it holds), and
  the finalizer goes.

Finalizers change through merge patches preconditioned on the resourceVersion just read, so a
concurrent change by capibus is a conflict and a retry, never a lost finalizer.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import KINDS, LEASE, SECRET
from standins.base import (
    Controller,
    Json,
    Knobs,
    env_float,
    env_set,
    fresh,
    key_of,
    phase_of,
    selected,
    write_status,
)

log = logging.getLogger("standins.schedule")

FINALIZER = "scheduling.azimuth.stackhpc.com"
DEFAULT_FLAVORS = {"f-small": "m1.small", "f-medium": "m1.medium", "f-large": "m1.large"}
ERROR_MESSAGE = "Not enough hosts available"


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def env_flavors() -> dict[str, str]:
    raw = os.environ.get("STANDIN_SCHEDULE_FLAVORS")
    return {str(k): str(v) for k, v in json.loads(raw).items()} if raw else dict(DEFAULT_FLAVORS)


@dataclass
class ScheduleKnobs(Knobs):
    flavors: dict[str, str] = field(default_factory=env_flavors)
    blazar: bool = field(default_factory=lambda: env_flag("STANDIN_SCHEDULE_BLAZAR"))
    transitions: bool = field(default_factory=lambda: env_flag("STANDIN_SCHEDULE_TRANSITIONS"))
    error: set[str] = field(default_factory=lambda: env_set("STANDIN_SCHEDULE_ERROR"))
    grace_period: float = field(
        default_factory=lambda: env_float("STANDIN_SCHEDULE_GRACE_PERIOD", 600.0)
    )


def parse_time(value: object) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def reservation_id(lease: Json, size_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{lease['metadata']['uid']}/{size_id}"))


def size_maps(lease: Json, knobs: ScheduleKnobs) -> tuple[dict[str, str], dict[str, str]]:
    """``(sizeMap, sizeNameMap)`` for the machines the lease asks for."""
    machines = ((lease.get("spec") or {}).get("resources") or {}).get("machines") or []
    ids = [str(m["sizeId"]) for m in machines]
    if knobs.blazar:
        size_map = {i: reservation_id(lease, i) for i in ids}
        names = {i: f"reservation:{size_map[i]}" for i in ids}
    else:
        size_map = {i: i for i in ids}
        names = {i: knobs.flavors[i] for i in ids if i in knobs.flavors}
    name_map = {knobs.flavors[i]: names[i] for i in ids if i in knobs.flavors}
    return size_map, name_map


def replace_map(old: Mapping[str, str] | None, new: dict[str, str]) -> Json | None:
    """A merge-patch value turning map ``old`` into ``new`` (None: drop the empty map)."""
    if not new:
        return None
    return {**{k: None for k in (old or {}) if k not in new}, **new}


def active_status(lease: Json, knobs: ScheduleKnobs) -> Json | None:
    """The ``Active`` write, or None when the lease already says exactly that."""
    size_map, name_map = size_maps(lease, knobs)
    status = lease.get("status") or {}
    current = (status.get("sizeMap") or {}, status.get("sizeNameMap") or {})
    if phase_of(lease) == "Active" and current == (size_map, name_map):
        return None
    return {
        "phase": "Active",
        "errorMessage": None,
        "sizeMap": replace_map(status.get("sizeMap"), size_map),
        "sizeNameMap": replace_map(status.get("sizeNameMap"), name_map),
    }


def owner_kind(owner: Json) -> ResourceKind:
    """The kind an ownerReference names: a known one, else the usual lower-case plural."""
    for kind in KINDS.values():
        if kind.api_version == owner["apiVersion"] and kind.kind == owner["kind"]:
            return kind
    group, _, version = str(owner["apiVersion"]).rpartition("/")
    kind_name = str(owner["kind"])
    return ResourceKind(kind_name.lower(), group, version, kind_name, f"{kind_name.lower()}s")


class Schedule:
    def __init__(
        self, kube: KubeClient, *, knobs: ScheduleKnobs | None = None, namespace: str | None = None
    ) -> None:
        self.kube = kube
        self.knobs = knobs or ScheduleKnobs()
        self.controller = Controller(
            kube, LEASE, self.reconcile, namespace=namespace, name="schedule.leases"
        )
        self._wakeups: set[tuple[str, datetime]] = set()
        self._ended: set[str] = set()
        self._blocked: set[tuple[str, tuple[str, ...]]] = set()

    async def reconcile(self, seen: Json) -> None:
        lease = await fresh(self.kube, LEASE, seen)
        if lease["metadata"].get("deletionTimestamp"):
            await self._release(lease)
            return
        if FINALIZER not in (lease["metadata"].get("finalizers") or []):
            lease = await self._set_finalizers(
                lease, [*(lease["metadata"].get("finalizers") or []), FINALIZER]
            )
            log.info("lease %s: finalizer %s added", key_of(lease), FINALIZER)
        lease = await self._schedule(lease)
        await self._end_if_due(lease)

    async def _schedule(self, lease: Json) -> Json:
        key = key_of(lease)
        if phase_of(lease) == "Error":
            return lease  # stable: upstream only leaves Error when the lease is recreated
        if phase_of(lease) == "Unknown":
            lease = await self._enter(lease)
        if selected(self.knobs.error, lease):
            await self.knobs.step()
            error = {"phase": "Error", "errorMessage": ERROR_MESSAGE}
            lease = await write_status(self.kube, LEASE, lease, error)
            log.info("lease %s: Error, %s (STANDIN_SCHEDULE_ERROR)", key, ERROR_MESSAGE)
            return lease
        starts = parse_time((lease.get("spec") or {}).get("startsAt"))
        if starts is not None and starts > datetime.now(UTC):
            self._wake(lease, starts)
            return lease
        status = active_status(lease, self.knobs)
        if status is None:
            return lease
        if self.knobs.transitions and phase_of(lease) != "Active":
            await self.knobs.step()
            lease = await write_status(self.kube, LEASE, lease, {"phase": "Starting"})
            log.info("lease %s: Starting", key)
        await self.knobs.step()
        lease = await write_status(self.kube, LEASE, lease, status)
        log.info("lease %s: Active, sizeNameMap %s", key, status["sizeNameMap"] or {})
        return lease

    async def _enter(self, lease: Json) -> Json:
        phases = ["Creating", "Pending"] if self.knobs.transitions else ["Pending"]
        for index, phase in enumerate(phases):
            if index:
                await self.knobs.step()
            lease = await write_status(self.kube, LEASE, lease, {"phase": phase})
            log.info("lease %s: %s", key_of(lease), phase)
        return lease

    async def _end_if_due(self, lease: Json) -> None:
        spec = lease.get("spec") or {}
        ends = parse_time(spec.get("endsAt"))
        if ends is None or lease["metadata"]["uid"] in self._ended:
            return
        grace = spec.get("gracePeriod")
        due = ends - timedelta(seconds=self.knobs.grace_period if grace is None else grace)
        if datetime.now(UTC) <= due:
            self._wake(lease, due)
            return
        self._ended.add(lease["metadata"]["uid"])
        for owner in lease["metadata"].get("ownerReferences") or []:
            await self._delete_owner(lease, owner)

    async def _delete_owner(self, lease: Json, owner: Json) -> None:
        kind = owner_kind(owner)
        path = kind.path(lease["metadata"]["namespace"], owner["name"])
        try:
            await self.kube.request("DELETE", path, params={"propagationPolicy": "Foreground"})
        except KubeNotFound:
            return
        log.info(
            "lease %s: ended, deleted owner %s %s", key_of(lease), owner["kind"], owner["name"]
        )

    async def _release(self, lease: Json) -> None:
        finalizers = lease["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers:
            return
        others = tuple(f for f in finalizers if f != FINALIZER)
        key = key_of(lease)
        if others:
            if (key, others) not in self._blocked:
                self._blocked.add((key, others))
                log.info("lease %s: deletion waits for finalizers %s", key, ", ".join(others))
            return
        if phase_of(lease) != "Deleting":
            lease = await write_status(self.kube, LEASE, lease, {"phase": "Deleting"})
            log.info("lease %s: Deleting", key)
            await self.knobs.step()
        secret = (lease.get("spec") or {}).get("cloudCredentialsSecretName")
        if secret:
            try:
                await self.kube.delete(SECRET, lease["metadata"]["namespace"], secret)
                log.info("lease %s: deleted cloud credentials secret %s", key, secret)
            except KubeNotFound:
                pass
        await self._set_finalizers(lease, list(others))
        log.info("lease %s: finalizer %s removed", key, FINALIZER)

    async def _set_finalizers(self, lease: Json, finalizers: list[str]) -> Json:
        meta = lease["metadata"]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return await self.kube.patch_merge(LEASE, meta["namespace"], meta["name"], patch)

    def _wake(self, lease: Json, at: datetime) -> None:
        """Look at ``lease`` again at ``at``, once per instant however often we are asked."""
        if (lease["metadata"]["uid"], at) in self._wakeups:
            return
        self._wakeups.add((lease["metadata"]["uid"], at))
        delay = max((at - datetime.now(UTC)).total_seconds(), 0.0) + 0.05
        log.info("lease %s: next look at %s", key_of(lease), at.isoformat(timespec="seconds"))
        self.controller.requeue(lease, delay)


def controllers(kube: KubeClient, *, namespace: str | None = None) -> list[Controller]:
    """The Lease controller; knobs are read from the environment now."""
    return [Schedule(kube, namespace=namespace).controller]
