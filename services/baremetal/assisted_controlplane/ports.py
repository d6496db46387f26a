"""What the control-plane reconcilers depend on: Protocols, the dependency bundle, reporting.

The composition root (``bootstrap``) fills ``Deps`` with the real clients; unit tests fill it
with fakes and call the reconcilers through ``handlers``. ``names`` makes a replica's name
(``<acp>-<5 random chars>``); tests pass a deterministic one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.locks import KeyedLocks
from shared.ports import KubeReader, KubeWriter
from shared.seen import Seen
from shared.status import StatusReporter

Json = dict[str, Any]


class KubeApi(KubeReader, KubeWriter, Protocol):
    """Reads a cluster's objects; writes the ACP's finalizer and pull secret reference, the
    ClusterDeployment, ClusterImageSet, ACI, the replicas' objects and the kubeconfig."""


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    reporter: StatusReporter
    partitions: int
    locks: KeyedLocks
    names: Callable[[Json], str]
    seen: Seen = field(default_factory=Seen)
