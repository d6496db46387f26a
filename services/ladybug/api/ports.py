"""What the Ladybug REST API depends on: Protocols, the dependency bundle.

The composition root (``bootstrap``) fills ``Deps`` with the real Kubernetes client and
Tumblebug adapter; unit tests fill it with fakes and drive the same FastAPI app.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.ports import KubeReader, KubeWatcher, KubeWriter

Json = dict[str, Any]


class KubeApi(KubeReader, KubeWriter, KubeWatcher, Protocol):
    """LadybugClusters (read, create, patch the spec, delete, watch) and their Secrets."""


class Tumblebug(Protocol):
    """The few CB-Tumblebug reads the API makes itself: a narrow view of
    ``shared.tumblebug.Tumblebug``, which ``TumblebugClient`` satisfies.

    Errors are ``shared.errors`` types: a ``TemporaryError`` when Tumblebug cannot be
    reached, a ``PermanentError`` carrying Tumblebug's message when it refuses."""

    async def get_namespace(self, namespace: str) -> Json | None:
        """The namespace, None if Tumblebug does not know it (v0.7's "200 without id" too)."""
        ...

    async def get_connection_config(self, name: str) -> Json | None:
        """The connection config (``ProviderName``, ``RegionName``, ...), None if unknown."""
        ...

    async def lookup_specs(self, connection: str) -> list[Json]:
        """``lookupSpecs``' ``vmspec`` items (``name``, ``mem`` MiB, ``vcpu``)."""
        ...


@dataclass(frozen=True)
class Credentials:
    """Who may call the API: a bearer token, a basic-auth pair, or both."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def configured(self) -> bool:
        return bool(self.token or (self.username and self.password))


class KnownNamespaces:
    """Tumblebug namespaces seen to exist, each for ``seconds`` after it was seen.

    Upstream asks Tumblebug on every call (``verifyNamespace``); a client polling a cluster's
    status then loads Tumblebug at its poll rate (the benchmark's GET loop: one namespace check
    per GET). Only "exists" is remembered: a namespace just made is seen at once, and one just
    deleted is still answered from the LadybugClusters for up to ``seconds``; the provisioner
    checks again before it makes anything.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._until: dict[str, float] = {}

    def known(self, namespace: str) -> bool:
        return self._until.get(namespace, 0.0) > self.clock()

    def seen(self, namespace: str) -> None:
        if self.seconds > 0:
            self._until[namespace] = self.clock() + self.seconds


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    tumblebug: Tumblebug
    credentials: Credentials
    #: the Kubernetes namespace every LadybugCluster lives in
    namespace: str
    #: every route's prefix, upstream's ``/ladybug``
    base_path: str = "/ladybug"
    wait_timeout: float = 1800.0
    #: picks the 5 characters of new subgroup names; seeded in tests
    rng: random.Random = field(default_factory=random.SystemRandom)
    namespaces: KnownNamespaces = field(default_factory=lambda: KnownNamespaces(0.0))
