"""One way to wire a service: a table of routes, its dependencies bound once.

Every consuming service declares, in its ``app.py``, one ``Routes`` table at import time:
for each subscription, what it consumes (a stream, the subject filter of one partition, the
message model) and the handler that runs for a batch of one object's messages. A handler has
one shape everywhere::

    async def on_lease_event(batch: Batch[ResourceChanged], deps: Deps) -> None: ...

``deps`` is the service's own frozen bundle of Protocol-typed dependencies (clients, settings,
per-replica memory), built once by the composition root; ``Routes.bind(deps)`` closes every
handler over it and yields the consumer's subscriptions. So nothing relays keyword arguments,
a test calls a handler with a bundle of fakes, and where a handler needs only part of the
bundle, it passes that part on by name to the functions it calls.

Because the tables are plain data, known before anything connects, they also answer the
question "who consumes what" for the whole system: ``python -m services`` prints every
service's subscriptions (stream, subject filter, model), and can write them as an AsyncAPI
document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shared import subjects
from shared.consumer import Batch, Subscription
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged

M = TypeVar("M", bound=Message)
D = TypeVar("D")

#: A subject filter for one partition (or ``subjects.ANY_PARTITION`` to describe them all).
Filter = Callable[[subjects.Partition], str]
Handler = Callable[[Batch[M], D], Awaitable[None]]


@dataclass(frozen=True)
class Route(Generic[M, D]):
    """One subscription of a service: what it consumes, and the handler for it."""

    name: str
    stream: subjects.StreamSpec
    filters: tuple[Filter, ...]
    model: type[M]
    handle: Handler[M, D]
    #: let a burst for one object join one run (the service's ``coalesce_seconds``)
    coalesce: bool = True

    def subscription(self, deps: D, coalesce_seconds: float) -> Subscription[M]:
        handle, filters = self.handle, self.filters

        async def run(batch: Batch[M]) -> None:
            await handle(batch, deps)

        return Subscription(
            name=self.name,
            stream=self.stream,
            filters=lambda partition: [f(partition) for f in filters],
            model=self.model,
            handle=run,
            coalesce_seconds=coalesce_seconds if self.coalesce else 0.0,
        )


def events(
    name: str,
    *kinds: ResourceKind,
    handle: Handler[ResourceChanged, D],
    coalesce: bool = True,
) -> Route[ResourceChanged, D]:
    """The watcher's events of ``kinds`` in this replica's partitions."""
    return Route(
        name=name,
        stream=subjects.EVENTS,
        filters=tuple(_events_of(kind.token) for kind in kinds),
        model=ResourceChanged,
        handle=handle,
        coalesce=coalesce,
    )


def messages(
    name: str,
    model: type[M],
    stream: subjects.StreamSpec,
    *filters: Filter,
    handle: Handler[M, D],
    coalesce: bool = True,
) -> Route[M, D]:
    """Commands or events of ``model`` on ``stream``, by their per-partition ``filters``."""
    return Route(name, stream, filters, model, handle, coalesce)


def _events_of(token: str) -> Filter:
    return lambda partition: subjects.resource_events_in_partition(token, partition)


@dataclass(frozen=True)
class Consumed:
    """One line of the system's subscription map."""

    service: str
    subscription: str
    stream: str
    subject: str
    model: str


class Routes(Generic[D]):
    """A service's subscription table."""

    def __init__(self, service: str, *routes: Route[Any, D]) -> None:
        names = [route.name for route in routes]
        if len(set(names)) != len(names):
            raise ValueError(f"{service}: subscription names must be unique: {names}")
        self.service = service
        self.routes: tuple[Route[Any, D], ...] = routes

    def bind(self, deps: D, *, coalesce_seconds: float = 0.0) -> list[Subscription[Any]]:
        """The consumer's subscriptions, every handler closed over ``deps``."""
        return [route.subscription(deps, coalesce_seconds) for route in self.routes]

    def consumed(self) -> Iterator[Consumed]:
        """Every subject filter, for any partition, with the model it carries."""
        for route in self.routes:
            for make in route.filters:
                yield Consumed(
                    service=self.service,
                    subscription=route.name,
                    stream=route.stream.name,
                    subject=make(subjects.ANY_PARTITION),
                    model=route.model.__name__,
                )


def table(services: Sequence[Routes[Any]]) -> list[Consumed]:
    """The subscription map of ``services``, in a stable order."""
    rows = [row for routes in services for row in routes.consumed()]
    return sorted(rows, key=lambda r: (r.stream, r.subject, r.service, r.subscription))
