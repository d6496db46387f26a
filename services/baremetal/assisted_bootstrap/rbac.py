"""What the OpenShift Assisted bootstrap provider asks of the Kubernetes API: its
OpenshiftAssistedConfigs, the Cluster API, hive, assisted-service and metal3 objects it decides
from, the InfraEnv it applies per pool, the ISO URL written into the Metal3Machines and their
template, the Agents it binds (and deletes with their config) and the empty bootstrap Secret."""

from __future__ import annotations

from services.baremetal.assisted_bootstrap.ports import SERVICE_KIND
from shared.rbac import Rule
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    METAL3_MACHINE,
    METAL3_MACHINE_TEMPLATE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)

RULES = (
    Rule(
        OPENSHIFT_ASSISTED_CONFIG,
        "get list patch",
        why="its own kind: the finalizer as a guarded merge patch; a cluster's configs listed "
        "once, then kept from their events",
    ),
    Rule(
        [MACHINE, CAPI_CLUSTER, AGENT_CLUSTER_INSTALL],
        "get",
        why="a config's owner Machine, its Cluster's readiness, the installation's state",
    ),
    Rule(CLUSTER_DEPLOYMENT, "get list", why="the cluster's one ClusterDeployment"),
    Rule(
        [OPENSHIFT_ASSISTED_CONTROL_PLANE, MACHINE_SET, MACHINE_DEPLOYMENT],
        "get",
        why="where a Machine's Metal3MachineTemplate is named",
    ),
    Rule(
        INFRA_ENV,
        "get create patch",
        why="the pool's InfraEnv, server-side applied when it does not exist",
    ),
    Rule(
        [METAL3_MACHINE, METAL3_MACHINE_TEMPLATE],
        "get patch",
        why="the live ISO's URL into a host's Metal3Machine and its pool's template",
    ),
    Rule(
        AGENT,
        "get list patch delete",
        why="binds a booted Agent to its Machine (one guarded patch); deletes it with its config",
    ),
    Rule(BARE_METAL_HOST, "get list", why="the host an Agent booted on, by boot MAC"),
    Rule(
        SERVICE_KIND,
        "get",
        why="the image service's cluster address, only with internal image URLs",
    ),
    Rule(
        SECRET,
        "create",
        why="the empty bootstrap data Secret of a config (a host boots the ISO, not user data)",
    ),
)
