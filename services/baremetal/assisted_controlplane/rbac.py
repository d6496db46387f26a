"""What the OpenShift Assisted control-plane provider asks of the Kubernetes API: its
OpenshiftAssistedControlPlanes, the ClusterDeployment, ClusterImageSet and AgentClusterInstall
it makes, the control-plane Machines with their bootstrap configs and Metal3Machine clones
(rolled back when a creation fails), the registry ConfigMap, the pull secret placeholder and
the workload kubeconfig Secret.

The infrastructure template a control plane names may in principle be of any provider; the
rules cover metal3's (``Metal3MachineTemplate`` cloned into ``Metal3Machine``), the one
OpenShift Assisted installs use (``docs/assisted.md``)."""

from __future__ import annotations

from services.baremetal.assisted_controlplane.logic import REGISTRY_CONFIG_MAP
from shared.rbac import Rule
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    CLUSTER_IMAGE_SET,
    CONFIG_MAP,
    MACHINE,
    MACHINE_DEPLOYMENT,
    METAL3_MACHINE,
    METAL3_MACHINE_TEMPLATE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)

RULES = (
    Rule(
        OPENSHIFT_ASSISTED_CONTROL_PLANE,
        "get patch",
        why="its own kind: the finalizer and the spec references it fills in, guarded",
    ),
    Rule(CAPI_CLUSTER, "get", why="the owning Cluster API cluster"),
    Rule(
        CLUSTER_DEPLOYMENT,
        "get create patch delete",
        why="server-side applies the ClusterDeployment, refers it to its install, deletes it "
        "with the control plane",
    ),
    Rule(
        CLUSTER_IMAGE_SET,
        "create patch",
        why="server-side applies the release's ClusterImageSet (cluster-scoped)",
    ),
    Rule(AGENT_CLUSTER_INSTALL, "get create", why="creates the one AgentClusterInstall"),
    Rule(
        MACHINE,
        "get list create",
        why="the control plane's Machines: listed, created one by one",
    ),
    Rule(
        [OPENSHIFT_ASSISTED_CONFIG, METAL3_MACHINE],
        "list create delete",
        why="each Machine's bootstrap config and infrastructure clone; a failed creation "
        "rolls both back",
    ),
    Rule(METAL3_MACHINE_TEMPLATE, "get", why="the infrastructure template a clone is made from"),
    Rule(MACHINE_DEPLOYMENT, "list", why="how many workers the install is for"),
    Rule(
        CONFIG_MAP,
        "get create",
        why="reads the `imageRegistryRef` ConfigMap; creates `additional-registry-config`",
    ),
    Rule(
        CONFIG_MAP,
        "patch",
        names=(REGISTRY_CONFIG_MAP,),
        why="server-side applies `additional-registry-config` (its fixed name)",
    ),
    Rule(
        SECRET,
        "get create patch",
        why="the pull secret placeholder, the installer's admin kubeconfig (labelled) and the "
        "workload `<cluster>-kubeconfig`",
    ),
)
