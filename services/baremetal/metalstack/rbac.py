"""What the metal-stack provider asks of the Kubernetes API of the management cluster. The
workload cluster's Nodes it watches and patches (``nodes``) are reached with the credentials of
the cluster's kubeconfig Secret, not with these rules."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
)

RULES = (
    Rule(
        [METALSTACK_CLUSTER, METALSTACK_MACHINE],
        "get list patch",
        why="its own kinds: the finalizer and the `spec` fields it fills in "
        "(`privateNetworkID`, `controlPlaneEndpoint`, `providerID`) as guarded merge patches",
    ),
    Rule(
        METALSTACK_FIREWALL,
        "get list create patch delete",
        why="creates the cluster's firewall, owns its finalizer and `providerID`, deletes it "
        "with the cluster",
    ),
    Rule(CAPI_CLUSTER, "get", why="the owning Cluster API cluster (paused, infrastructure ref)"),
    Rule(
        MACHINE,
        "get list delete",
        why="a MetalStackMachine's Machine; deleting a cluster deletes its Machines (upstream)",
    ),
    Rule(
        SECRET,
        "get",
        why="a machine's bootstrap data Secret and the cluster's `<cluster>-kubeconfig`",
    ),
)
