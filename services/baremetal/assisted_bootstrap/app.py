"""The bootstrap provider's one subscription: every event that can end a wait of its objects.

``changes``: its configs and the Agents it binds, and what they wait for (the CAPI Cluster
and Machine, the ClusterDeployment and AgentClusterInstall, the InfraEnv, the BareMetalHost).
No ``rechecks``: nothing here waits outside the Kubernetes API, so no timer is armed.
"""

from __future__ import annotations

from services.baremetal.assisted_bootstrap import handlers
from services.baremetal.assisted_bootstrap.ports import Deps
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
)
from shared.wiring import Routes, events

SERVICE = "assistedbootstrap"

ROUTES: Routes[Deps] = Routes(
    SERVICE,
    events(
        "changes",
        OPENSHIFT_ASSISTED_CONFIG,
        MACHINE,
        CAPI_CLUSTER,
        CLUSTER_DEPLOYMENT,
        AGENT_CLUSTER_INSTALL,
        INFRA_ENV,
        AGENT,
        BARE_METAL_HOST,
        handle=handlers.on_changes,
    ),
)
