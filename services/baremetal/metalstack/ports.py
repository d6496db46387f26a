"""What the metal-stack reconcilers depend on: Protocols, the dependency bundle, a target.

The composition root (``bootstrap``) fills ``Deps`` with the real clients; unit tests fill it
with fakes and call the reconcilers through ``handlers``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from shared import subjects
from shared.errors import KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import Condition, Message, ObjectRef
from shared.metalapi import MetalApi, MetalApiError, MetalApiNotFound
from shared.ports import KubeReader, KubeWriter
from shared.reconcile import report
from shared.resources import SECRET, cluster_key
from shared.status import StatusReporter

Json = dict[str, Any]
T = TypeVar("T")


class KubeApi(KubeReader, KubeWriter, Protocol):
    """Reads everything of a cluster; writes finalizers, owned spec fields, the firewall."""


class Nodes(Protocol):
    """The workload clusters' Nodes, and the machines waiting for theirs."""

    async def node_for(self, cluster: Workload, machine: str) -> Json | None: ...

    async def set_provider_id(self, cluster: Workload, node: Json, provider_id: str) -> None: ...

    def wait_for(self, cluster: Workload, machine: str, ref: ObjectRef, partition: int) -> None: ...

    def forget(self, machine: str) -> None: ...


class Rechecks(Protocol):
    """Looking at an object again later, when nothing will send an event."""

    def later(self, ref: ObjectRef, *, partition: int, attempt: int, reason: str) -> None: ...

    def cancel(self, ref: ObjectRef) -> None: ...


@dataclass(frozen=True)
class Workload:
    """A workload cluster, as its ``<cluster>-kubeconfig`` Secret names it."""

    namespace: str
    name: str
    #: the Secret's resourceVersion: a rotated kubeconfig is another workload connection
    version: str
    kubeconfig: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Settled:
    """What this replica already reported to the writer, by object uid and fact.

    A run queued behind the one that reported (say) a machine's addresses reads the object
    before the writer has written them; without this memory it would ask metal-api again for
    what it just told. After a restart the memory is empty and the object's status decides,
    which costs one read of metal-api at most.
    """

    def __init__(self) -> None:
        self._facts: dict[str, set[str]] = {}

    def note(self, uid: str, fact: str) -> None:
        self._facts.setdefault(uid, set()).add(fact)

    def knows(self, uid: str, fact: str) -> bool:
        return fact in self._facts.get(uid, ())

    def forget(self, uid: str) -> None:
        self._facts.pop(uid, None)


class Kubeconfigs:
    """The workload clusters' kubeconfigs this replica has read, by cluster key.

    Every machine and firewall of a cluster needs the same ``<cluster>-kubeconfig`` Secret,
    and in a burst each GET of it waits its turn at the client's rate limit: with one read per
    machine, that wait was most of a machine's way from its Node to ready (``bench/ANALYSIS.md``,
    m3). The Secret carries the cluster's label, so its events come to the replica holding the
    cluster's partition, this one: any event of it forgets the copy (``forget``), and so does
    losing a partition (``drop``: events may be missed until it comes back). A read that began
    before either is not kept (``keep`` checks the epoch it started in), so a copy is never
    older than the last event of its Secret this replica has seen. One epoch for all keys: both
    are rare, and a read they overtake only costs its cluster one more read later.
    """

    def __init__(self) -> None:
        self._known: dict[str, Workload] = {}
        self.epoch = 0

    def get(self, key: str) -> Workload | None:
        return self._known.get(key)

    def keep(self, workload: Workload, epoch: int) -> None:
        if epoch == self.epoch:
            self._known[workload.key] = workload

    def forget(self, key: str) -> None:
        self.epoch += 1
        self._known.pop(key, None)

    def drop(self) -> None:
        """Forget every copy (a partition was lost; which clusters it held does not matter:
        each costs one read to know again)."""
        self.epoch += 1
        self._known.clear()


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    metal: MetalApi
    reporter: StatusReporter
    nodes: Nodes
    rechecks: Rechecks
    partitions: int
    locks: KeyedLocks
    settled: Settled = field(default_factory=Settled)
    kubeconfigs: Kubeconfigs = field(default_factory=Kubeconfigs)


async def workload_of(deps: Deps, namespace: str, cluster: str) -> Workload | None:
    """The workload cluster behind ``<cluster>-kubeconfig`` (None until the Secret exists),
    read once and then known until an event of the Secret (``Kubeconfigs``)."""
    key = f"{namespace}/{cluster}"
    known = deps.kubeconfigs.get(key)
    if known is not None:
        return known
    epoch = deps.kubeconfigs.epoch
    found = await secret_value(deps.kube, namespace, f"{cluster}-kubeconfig", what="kubeconfig")
    if found is None:
        return None
    workload = Workload(namespace, cluster, version=found["version"], kubeconfig=found["value"])
    deps.kubeconfigs.keep(workload, epoch)
    return workload


def partition(deps: Deps, kind: ResourceKind, obj: Json) -> int:
    """The partition of ``obj``'s events: its owning cluster's."""
    return subjects.partition_of(cluster_key(kind, obj), deps.partitions)


async def free_machines(metal: MetalApi, machines: Iterable[str]) -> None:
    """Free each machine (firewalls are machines too); one already gone is fine."""
    for machine in sorted(machines):
        with contextlib.suppress(MetalApiNotFound):
            await metal.free_machine(machine)


#: the condition that says whether metal-api answered this object's last requests
METAL_API = "MetalAPIAvailable"


async def minding_metal_api(
    deps: Deps, kind: ResourceKind, obj: Json, cause: Message, work: Awaitable[T]
) -> T:
    """``work``'s result; a metal-api failure is shown on ``obj`` (condition ``METAL_API``,
    with metal-api's words) before it propagates, and cleared by the first run that gets
    through. A temporary failure is retried by the consumer meanwhile, so the condition is
    what an operator sees while metal-api is down or refuses our signature."""
    try:
        result = await work
    except MetalApiError as exc:
        trouble = Condition(
            type=METAL_API, status="False", reason=type(exc).__name__, message=exc.message
        )
        await report(deps, kind, obj, cause, conditions=[trouble])
        raise
    if _failed_before(obj):
        healed = Condition(type=METAL_API, status="True", reason="Answered")
        await report(deps, kind, obj, cause, conditions=[healed])
    return result


def _failed_before(obj: Json) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == METAL_API and c.get("status") == "False" for c in conditions)


async def secret_value(kube: KubeReader, namespace: str, name: str, *, what: str) -> Json | None:
    """The Secret's ``value`` key decoded, with the Secret's resourceVersion, as
    ``{"value", "version"}``; None while the Secret does not exist (its event will wake the
    waiter). A Secret without the key is a ``PermanentError`` naming ``what`` it holds, in
    upstream's words ("Key 'value' is missing in bootstrap secret")."""
    try:
        secret = await kube.get(SECRET, namespace, name)
    except KubeNotFound:
        return None
    value = (secret.get("data") or {}).get("value")
    if value is None:
        raise PermanentError(
            f"Key 'value' is missing in {what} secret {namespace}/{name}",
            reason="SecretKeyMissing",
        )
    return {
        "value": base64.b64decode(value).decode(),
        "version": secret["metadata"]["resourceVersion"],
    }
