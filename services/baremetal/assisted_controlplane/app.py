"""The control-plane provider's one subscription: every event that can end a wait of its
objects.

``changes`` carries the ACP, the CAPI Cluster (infrastructure readiness, the endpoint), its
Machines (their readiness counts), the ClusterDeployment and ACI it made (a deleted CD is made
again; the ACI's state is the control plane's), and Secrets (the admin kubeconfig that the
installation publishes). One subscription, so one durable consumer per partition and one run
at a time per name: an ACP, its ClusterDeployment and its ACI share their name. The
MachineDeployments are not watched: the ACI's worker count is fixed when it is created.
"""

from __future__ import annotations

from services.baremetal.assisted_controlplane import handlers
from services.baremetal.assisted_controlplane.ports import Deps
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    MACHINE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)
from shared.wiring import Routes, events

SERVICE = "assistedcontrolplane"

ROUTES: Routes[Deps] = Routes(
    SERVICE,
    events(
        "changes",
        OPENSHIFT_ASSISTED_CONTROL_PLANE,
        CAPI_CLUSTER,
        MACHINE,
        CLUSTER_DEPLOYMENT,
        AGENT_CLUSTER_INSTALL,
        SECRET,
        handle=handlers.on_changes,
    ),
)
