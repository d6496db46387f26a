"""Discovery's subscription: Cluster, Secret and addon events of a partition, to the tracker.

One subscription rather than one per kind: each partition then costs one durable consumer.
Objects of different kinds sharing a name share a queue; ``handlers.on_changes`` keeps the
latest event of each kind in a batch apart. The work no message carries, a watch per Cluster
of the partitions held, follows the claims (``watches.Watches``, ``Consumer(claims=...)``).
"""

from __future__ import annotations

from services.discovery import handlers
from services.discovery.handlers import Deps
from shared.wiring import Routes, events

ROUTES: Routes[Deps] = Routes(
    "discovery",
    events("changes", *handlers.WATCHED, handle=handlers.on_changes),
)
