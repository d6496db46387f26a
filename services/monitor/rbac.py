"""What the monitor asks of the Kubernetes API: reads only. The Cluster whose status it
reports, the Cluster API, addon and Flux objects behind that status (listed per Cluster when
it resyncs a claimed partition), each Machine's OpenStackMachine (its flavor) and whether the
kubeconfig Secret exists."""

from __future__ import annotations

from services.monitor.logic import WATCHED
from services.monitor.resync import BACKING
from shared.rbac import Rule
from shared.resources import CLUSTER, OPENSTACK_MACHINE, SECRET

RULES = (
    Rule(CLUSTER, "get list", why="the Cluster whose status it reports; all Clusters on a claim"),
    Rule(
        sorted({*BACKING, *WATCHED} - {SECRET}, key=lambda kind: kind.token),
        "get list",
        why="the objects behind the status: a trimmed event read back, the resync's lists",
    ),
    Rule(
        OPENSTACK_MACHINE,
        "get",
        why="a Machine's infrastructure machine, for the node's size (`spec.flavor`)",
    ),
    Rule(SECRET, "get", why="whether the kubeconfig Secret the status names exists"),
)
