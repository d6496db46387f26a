"""What the helm service needs from the outside world, as Protocols.

The composition root passes the real adapters (``shared.kube``, ``shared.helm``,
``shared.zenith``, ``shared.bus``); unit tests pass fakes with the same shape. What the API and
the bus offer is ``shared.ports``'s to say; here only what the helm service picks of them.
"""

from __future__ import annotations

from typing import Any, Protocol

from shared import ports

Json = dict[str, Any]


class Kube(ports.KubeReader, ports.KubeWriter, ports.Discovery, Protocol): ...


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


class Bus(ports.Publisher, ports.StreamReader, Protocol): ...
