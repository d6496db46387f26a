"""The metal-stack provider's subscriptions: every event that can end a wait of its objects.

- ``changes``: its own kinds, and what they wait for (the CAPI Cluster and Machine, the
  bootstrap and kubeconfig Secrets), in one subscription: one durable consumer per partition,
  and one queue per name, so a Cluster and its same-named MetalStackCluster and firewall are
  handled one run at a time;
- ``rechecks``: ``RecheckObject`` commands from the workload clusters' Node watches and from
  the firewall's timer.
"""

from __future__ import annotations

from services.baremetal.metalstack import handlers
from services.baremetal.metalstack.ports import Deps
from shared import subjects
from shared.messages import RecheckObject
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
)
from shared.wiring import Routes, events, messages

SERVICE = "metalstack"

ROUTES: Routes[Deps] = Routes(
    SERVICE,
    events(
        "changes",
        METALSTACK_CLUSTER,
        METALSTACK_MACHINE,
        METALSTACK_FIREWALL,
        CAPI_CLUSTER,
        MACHINE,
        SECRET,
        handle=handlers.on_changes,
    ),
    messages(
        "rechecks",
        RecheckObject,
        subjects.LIFECYCLE,
        lambda partition: subjects.rechecks_in_partition(SERVICE, partition),
        handle=handlers.on_recheck,
    ),
)
