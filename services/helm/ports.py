"""What the helm service needs from the outside world, as Protocols.

The composition root passes the real adapters (``shared.kube``, ``shared.helm``,
``shared.zenith``, ``shared.bus``); unit tests pass fakes with the same shape.
"""

from __future__ import annotations

from typing import Any, Protocol

from shared.bus import Published
from shared.kube import ResourceKind
from shared.messages import Message

Json = dict[str, Any]


class Kube(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[Json], str]: ...

    async def create(self, kind: ResourceKind, obj: Json) -> Json: ...

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def apply(
        self,
        kind: ResourceKind,
        obj: Json,
        *,
        field_manager: str,
        force: bool = True,
        subresource: str | None = None,
    ) -> Json: ...

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json: ...


class ReleaseOutcome(Protocol):
    @property
    def revision(self) -> int: ...

    @property
    def action(self) -> str: ...


class Chart(Protocol):
    name: str


class HelmDriver(Protocol):
    async def ensure_release(
        self, name: str, namespace: str, chart: Any, values: Json
    ) -> ReleaseOutcome: ...

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


class Bus(Protocol):
    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published: ...

    async def last_message(self, stream: str, subject: str) -> bytes | None: ...
