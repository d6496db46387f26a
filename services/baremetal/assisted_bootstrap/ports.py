"""What the bootstrap provider's reconcilers depend on: Protocols, the dependency bundle.

The composition root (``bootstrap``) fills ``Deps`` with the real clients; unit tests fill it
with fakes through the same ``bootstrap.dependencies``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from services.baremetal.assisted_bootstrap.seen import Seen
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.ports import KubeReader, KubeWriter
from shared.status import StatusReporter

Json = dict[str, Any]

#: the image service's Service, read only when ISO URLs are rewritten to its cluster address
SERVICE_KIND = ResourceKind("service", "", "v1", "Service", "services")


class KubeApi(KubeReader, KubeWriter, Protocol):
    """Reads a cluster's objects; writes the finalizer, InfraEnvs, images, Secrets, Agents."""


@dataclass(frozen=True)
class ImageService:
    """Where ISO URLs are sent when they are rewritten (upstream's ``USE_INTERNAL_IMAGE_URL``)."""

    internal: bool = False
    name: str = ""
    namespace: str = ""


class Settled:
    """What this replica already decided and reported, by object.

    A run queued behind the one that reported a config ready (or bound an Agent) reads the
    object before the writer (or the API server's watch) shows it; without this memory it
    would walk every gate again for nothing. After a restart the memory is empty and the
    objects decide, which costs one walk per object.
    """

    def __init__(self) -> None:
        self._facts: dict[str, str] = {}

    def note(self, key: str, fact: str) -> None:
        self._facts[key] = fact

    def knows(self, key: str, fact: str) -> bool:
        return self._facts.get(key) == fact

    def forget(self, key: str) -> None:
        self._facts.pop(key, None)


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    reporter: StatusReporter
    locks: KeyedLocks
    images: ImageService = ImageService()
    settled: Settled = field(default_factory=Settled)
    seen: Seen = field(default_factory=Seen)
