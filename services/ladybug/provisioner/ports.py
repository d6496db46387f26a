"""What the Ladybug provisioner depends on: the dependency bundle and per-replica memory.

The composition root (``bootstrap``) fills ``Deps`` with ``shared.tumblebug.TumblebugClient``,
``shared.spider.SpiderClient`` and a factory of ``shared.ssh.SshClient``; unit tests fill it
with in-memory fakes of the same Protocols (``Tumblebug``, ``Spider``, ``Ssh``). SSH clients
are made per run because host keys are remembered per cluster (``steps.ClusterHostKeys``): a VM
address that a deleted cluster used and a new one reuses is a new host, not a changed one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.locks import KeyedLocks
from shared.ports import KubeReader, KubeWriter
from shared.spider import Spider
from shared.ssh import HostKeys, Ssh
from shared.status import StatusReporter
from shared.tumblebug import Tumblebug

Json = dict[str, Any]


class KubeApi(KubeReader, KubeWriter, Protocol):
    """LadybugClusters (finalizer, owned spec fields) and their Secrets."""


@dataclass(frozen=True)
class Login:
    """How to log in to a node: the sshKey's user and private key (never logged)."""

    username: str
    private_key: str = field(repr=False)


#: An SSH client that remembers host keys in ``HostKeys`` (one cluster's, per run).
Connect = Callable[[HostKeys], Ssh]


class Settled:
    """What this replica already finished, by LadybugCluster uid: the generations it fully
    handled and the clusters it failed.

    A run queued behind the one that reported ``Provisioned`` (the progress reports are events
    too) reads the object before the writer has written that status; without this memory it
    would ask every node again whether it is bootstrapped and joined. After a restart the
    memory is empty and the status decides, which costs one round of questions at most.
    """

    def __init__(self) -> None:
        self._facts: dict[str, set[str]] = {}

    def note(self, uid: str, fact: str) -> None:
        self._facts.setdefault(uid, set()).add(fact)

    def knows(self, uid: str, fact: str) -> bool:
        return fact in self._facts.get(uid, ())

    def forget(self, uid: str) -> None:
        self._facts.pop(uid, None)


@dataclass(frozen=True)
class Tuning:
    """The settings the flows read (a subset of ``ProvisionerTuning``)."""

    namespace: str = "ladybug"
    ssh_port: int = 22
    ssh_attempts: int = 15
    ssh_retry_seconds: float = 2.0
    bootstrap_parallel: int = 10


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    tumblebug: Tumblebug
    #: CB-Spider's anycall, for single-cloud clusters' cloud controller manager
    spider: Spider
    connect: Connect
    reporter: StatusReporter
    locks: KeyedLocks
    #: the scripts copied to nodes, by file name
    scripts: Mapping[str, bytes]
    tuning: Tuning = Tuning()
    settled: Settled = field(default_factory=Settled)
    clock: Callable[[], dt.datetime] = utcnow
