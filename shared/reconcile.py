"""Controllers on the bus: from events to the objects they concern, one reconcile at a time.

A Cluster API provider upstream is a set of controllers, each woken by its own kind and by
mappings from others (a ``Machine`` to its infrastructure machine, an ``Agent`` to the config
it binds). capibus keeps that shape with three parts a provider service fills in:

* **targets**: a mapper per event kind names the provider objects an event concerns;
* **reconcilers**: one per provider kind converges one object and names the objects that
  should look again after it (a cluster that changed wakes its machines);
* ``run``: reconciles each target once per batch, under a per-object lock (two events of
  different objects may concern one target at once), and follows the follow-ups.

Everything here is level-triggered: a reconciler reads what exists, and the message that woke
it is only the cause it reports under.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from shared.errors import KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import Condition, Message, ResourceChanged
from shared.ports import KubeReader
from shared.resources import ref_to
from shared.status import StatusReporter

log = logging.getLogger(__name__)

Json = dict[str, Any]
D = TypeVar("D")


@dataclass(frozen=True)
class Target:
    """One provider object to reconcile."""

    kind: ResourceKind
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.kind.token}/{self.namespace}/{self.name}"

    def named_by(self, message: Message) -> bool:
        """Whether ``message`` is an event of, or a command about, this very object."""
        ref = getattr(message, "ref", None)
        return bool(ref and (ref.kind, ref.name) == (self.kind.kind, self.name))


#: Converges one target; returns the targets that should look again after it.
Reconciler = Callable[[Target, Message, D], Awaitable[list[Target]]]
#: Names the targets an event concerns (it may read the cluster to find them).
Mapper = Callable[[ResourceChanged, KubeReader], Awaitable[list[Target]]]


async def targets_of(
    message: ResourceChanged, kube: KubeReader, mappers: Mapping[ResourceKind, Mapper]
) -> list[Target]:
    ref = message.ref
    for kind, mapper in mappers.items():
        if (ref.api_version, ref.kind) == (kind.api_version, kind.kind):
            return await mapper(message, kube)
    return []


async def gather(
    messages: Iterable[ResourceChanged], kube: KubeReader, mappers: Mapping[ResourceKind, Mapper]
) -> dict[Target, Message]:
    """Every target the events concern, each with the event that counts as its cause: the
    object's own event when there is one (objects of several kinds may share a name, and so a
    queue and a batch)."""
    targets: dict[Target, Message] = {}
    for message in latest_per_kind(messages):
        for target in await targets_of(message, kube, mappers):
            if target not in targets or target.named_by(message):
                targets[target] = message
    return targets


async def run(
    targets: Mapping[Target, Message],
    deps: D,
    *,
    reconcilers: Mapping[ResourceKind, Reconciler[D]],
    locks: KeyedLocks,
) -> None:
    """Reconcile ``targets`` and whatever they name as next, each target at most once.

    A follow-up (a machine woken by its cluster) that fails for good is logged and left to
    its own events, which meet the same error and dead-letter it there, under its name; the
    message at hand did nothing wrong. A temporary failure propagates: the consumer retries
    the batch, and every step on the way is idempotent.
    """
    done: set[Target] = set()
    queue = [(target, cause, False) for target, cause in targets.items()]
    while queue:
        target, cause, follow_up = queue.pop(0)
        if target in done:
            continue
        done.add(target)
        try:
            async with locks(target.key):
                follow = await reconcilers[target.kind](target, cause, deps)
        except PermanentError as exc:
            if not follow_up:
                raise
            log.error("%s woken by %s: %s", target.key, cause.id, exc)
            continue
        queue.extend((t, cause, True) for t in follow if t not in done)


def latest_per_kind(messages: Iterable[ResourceChanged]) -> list[ResourceChanged]:
    """Each kind's newest event: one queue may carry objects of several kinds that share a
    name (a Cluster and its infrastructure cluster)."""
    latest: dict[tuple[str, str], ResourceChanged] = {}
    for message in messages:
        latest[(message.ref.api_version, message.ref.kind)] = message
    return list(latest.values())


def reconciled_kind(kinds: Iterable[ResourceKind], kind: str) -> ResourceKind | None:
    """The reconciled kind called ``kind`` (as a ``RecheckObject`` names it), if any."""
    return next((k for k in kinds if k.kind == kind), None)


async def get_or_none(
    kube: KubeReader, kind: ResourceKind, namespace: str | None, name: str
) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


class Reporting(Protocol):
    """A provider's dependencies, as far as reporting status goes."""

    @property
    def reporter(self) -> StatusReporter: ...


async def report(
    deps: Reporting,
    kind: ResourceKind,
    obj: Json,
    cause: Message,
    *,
    conditions: Iterable[Condition] = (),
    **fields: Any,
) -> None:
    """Ask the writer to merge ``fields`` into ``obj``'s status and set ``conditions``."""
    await deps.reporter.report(ref_to(kind, obj), patch=fields, conditions=conditions, cause=cause)
