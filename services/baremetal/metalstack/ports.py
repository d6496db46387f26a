"""What the metal-stack reconcilers depend on: Protocols, the dependency bundle, a target.

The composition root (``bootstrap``) fills ``Deps`` with the real clients; unit tests fill it
with fakes and call the reconcilers through ``handlers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import KubeNotFound
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import ObjectRef
from shared.metalapi import MetalApi
from shared.ports import KubeReader, KubeWriter
from shared.status import StatusReporter

Json = dict[str, Any]


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


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    metal: MetalApi
    reporter: StatusReporter
    nodes: Nodes
    rechecks: Rechecks
    partitions: int
    locks: KeyedLocks


@dataclass(frozen=True)
class Target:
    kind: ResourceKind
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.kind.token}/{self.namespace}/{self.name}"


async def get_or_none(
    kube: KubeReader, kind: ResourceKind, namespace: str, name: str
) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None
