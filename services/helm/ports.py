"""What the helm service's handlers work with: the outside world as Protocols, and ``Deps``.

``Deps`` is built once by the composition root (``bootstrap.dependencies``) and handed to every
handler run; unit tests build it with fakes. It lives here, not in ``handlers``, so that
``zenith`` (called by the handlers) and the handlers both depend on it and not on each other.

It holds three sorts of things, kept apart because they change for different reasons:

* the clients: the API server, helm, the bus (only read here: the last prerequisite facts),
  the Zenith registrar, and the two ways of publishing (``StatusReporter`` for everything the
  writer applies and for nudges, ``Timers`` for the deletion deadlines);
* the settings the handlers read (``tuning``, the chart, the partition count, OIDC on or off);
* ``Memory``: what this replica remembers between runs. None of it is needed for correctness
  (a restart forgets it and the next run recomputes), it only spares work: a helm run for
  values already installed, a condition already reported, a Zenith layer already rendered.
  It follows the Clusters this replica holds: a Cluster's entries go when a run finds it gone,
  a partition's when the partition is lost.

What the API and the bus offer is ``shared.ports``'s to say; here only what the helm service
picks of them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.helm.settings import HelmTuning
from shared import ports, subjects
from shared.helm import ChartRef
from shared.locks import KeyedLocks
from shared.messages import Condition
from shared.status import StatusReporter
from shared.timers import Timers

Json = dict[str, Any]


class Kube(ports.KubeReader, ports.KubeWriter, ports.Discovery, Protocol): ...


class ReleaseOutcome(Protocol):
    @property
    def revision(self) -> int: ...

    @property
    def action(self) -> str: ...


class HelmDriver(Protocol):
    async def ensure_release(
        self, name: str, namespace: str, chart: Any, values: Json, *, absent: bool = False
    ) -> ReleaseOutcome:
        """``absent``: no revision is stored, so helm's own checks are skipped."""
        ...

    async def uninstall(self, name: str, namespace: str) -> bool: ...

    async def template(
        self, chart: Any, release: str, namespace: str, values: Json
    ) -> list[Json]: ...


class Reservation(Protocol):
    @property
    def subdomain(self) -> str: ...

    @property
    def fqdn(self) -> str: ...


class Registrar(Protocol):
    async def reserve(self, public_key: str, subdomain: str | None = None) -> Reservation: ...


class Bus(ports.Publisher, ports.StreamReader, Protocol):
    """The bus as the composition root passes it: published to by the reporter and the
    timers, read by the handlers."""


@dataclass
class Memory:
    """Per-replica memory, by Cluster key (``namespace/name``); every entry names the uid of
    the Cluster it was learned for, so a Cluster recreated under the same name starts afresh."""

    locks: KeyedLocks = field(default_factory=KeyedLocks)
    #: (uid, digest of chart and values) of the release last converged
    releases: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: (uid, condition) last reported, so a repeated wait is not re-sent
    reported: dict[str, tuple[str, Condition]] = field(default_factory=dict)
    #: (uid, generation) fully converged; the Cluster's own status changes need no run
    converged: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: ((uid, Secret resourceVersion), the Zenith values rendered from that Secret)
    zenith_layers: dict[str, tuple[tuple[str, str], Json]] = field(default_factory=dict)
    #: the uid of the Cluster whose release is already uninstalled
    uninstalled: dict[str, str] = field(default_factory=dict)

    def forget(self, key: str) -> None:
        """Forget everything about the Cluster ``key``: it is gone."""
        for memory in self._by_key():
            memory.pop(key, None)

    def drop(self, partitions: Collection[int], count: int) -> None:
        """Forget the Clusters of ``partitions`` (lost: their next owner learns them again).

        Bounded memory: a replica keeps only what it learned of the Clusters it holds, not of
        every Cluster that passed through it, and none of one deleted elsewhere meanwhile.
        """
        for memory in self._by_key():
            for key in [k for k in memory if subjects.partition_of(k, count) in partitions]:
                del memory[key]

    def __len__(self) -> int:
        """How many Clusters anything is remembered for."""
        return len({key for memory in self._by_key() for key in memory})

    def _by_key(self) -> tuple[dict[str, Any], ...]:
        return (self.releases, self.reported, self.converged, self.zenith_layers, self.uninstalled)


@dataclass(frozen=True)
class Deps:
    kube: Kube
    helm: HelmDriver
    #: read only: the last prerequisite fact per Cluster (publishing is the reporter's)
    bus: ports.StreamReader
    reporter: StatusReporter
    #: deletion deadlines, one per Cluster being deleted in a held partition
    timers: Timers
    tuning: HelmTuning
    chart: ChartRef
    partitions: int
    oidc_enabled: bool
    #: None when Zenith is off
    registrar: Registrar | None = None
    memory: Memory = field(default_factory=Memory)

    @property
    def zenith_enabled(self) -> bool:
        return self.registrar is not None and self.tuning.zenith.configured
