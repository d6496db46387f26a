"""The Ladybug provisioner's subscription: the events of its one kind.

``changes``: every LadybugCluster event in this replica's partitions. A LadybugCluster is its
own story (``shared.resources.cluster_key``), so each one is handled by one replica, one run
at a time; two replicas never provision one cluster.
"""

from __future__ import annotations

from services.ladybug.provisioner import handlers
from services.ladybug.provisioner.ports import Deps
from shared.resources import LADYBUG_CLUSTER
from shared.wiring import Routes, events

SERVICE = "ladybug"

ROUTES: Routes[Deps] = Routes(
    SERVICE,
    events("changes", LADYBUG_CLUSTER, handle=handlers.on_changes),
)
