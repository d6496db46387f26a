"""What the helm service asks of the Kubernetes API, itself and through the ``helm`` binary it
runs with the same credentials.

**Its own calls** read the Cluster, its ClusterTemplate and credentials, make the etcd key and
the Zenith reservation Secret, and server-side apply the per-cluster zenith-operator the
``zenith-operator`` chart renders (a Deployment, a Secret and a ServiceAccount: an apply that
creates needs ``create`` as well as ``patch``).

**The helm binary** installs whatever the openstack-cluster chart renders, so its rules follow
the chart, not capibus's code. The kinds are those of azimuth-cloud/capi-helm-charts
``charts/openstack-cluster`` 0.27 with its ``cluster-addons`` subchart, as ``docs/upstream.md``
section 3 lists them (the stand-in chart, ``standins/charts/openstack-cluster``, renders the
same ones); the verbs are what Helm v4 does with them: ``get`` to find an object it would take
over (and for the chart's ``lookup`` of the etcd key), ``create`` and ``patch`` for a
server-side apply that may create, ``delete`` for an object an upgrade drops and for
``helm uninstall``. The release's revisions live in Secrets of the Cluster's namespace
(``owner=helm``), which helm lists, reads, creates, updates (a superseded revision) and deletes
(beyond ``--history-max``). Beyond the kinds every release renders:

* **the cluster autoscaler**, when a node group autoscales: a Deployment, a ServiceAccount, a
  Role and a RoleBinding (``charts/openstack-cluster/templates/autoscaler``). The API server
  lets a client create a Role or bind one only with permissions it holds itself (RBAC's
  escalation check), so the helm service also holds what that Role grants: reading and
  updating Machines, MachineSets, MachineDeployments and MachinePools, and their ``scale``.
  That is the price of upstream's chart creating RBAC objects; ``escalate`` and ``bind`` stay
  denied.
* **hook Jobs**: cluster-addons' pre-upgrade hooks (``templates/monitoring/_hooks.tpl``, the
  monitoring addon's volumes) and the stand-in's ``standin.preUpgradeHookSeconds``. Helm applies
  a hook, watches it until it ends and deletes it by its delete policy (it neither gets nor
  lists it).

A chart version that renders another kind fails its install with a 403, which the helm adapter
reports as permanent (``HelmForbidden``): the kind is added here, with why.
"""

from __future__ import annotations

from shared.kube import ResourceKind
from shared.rbac import Rule
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CLUSTER_TEMPLATE,
    CONTROL_PLANE,
    HELM_RELEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    MANIFESTS,
    OPENSTACK_CLUSTER,
    SECRET,
)

# Kinds no capibus code names: only the charts the helm service installs render them.
MACHINE_HEALTH_CHECK = ResourceKind(
    "machinehealthcheck", "cluster.x-k8s.io", "v1beta1", "MachineHealthCheck", "machinehealthchecks"
)
MACHINE_POOL = ResourceKind(
    "machinepool", "cluster.x-k8s.io", "v1beta1", "MachinePool", "machinepools"
)
OPENSTACK_MACHINE_TEMPLATE = ResourceKind(
    "openstackmachinetemplate",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackMachineTemplate",
    "openstackmachinetemplates",
)
KUBEADM_CONFIG_TEMPLATE = ResourceKind(
    "kubeadmconfigtemplate",
    "bootstrap.cluster.x-k8s.io",
    "v1beta1",
    "KubeadmConfigTemplate",
    "kubeadmconfigtemplates",
)
DEPLOYMENT = ResourceKind("deployment", "apps", "v1", "Deployment", "deployments")
SERVICE_ACCOUNT = ResourceKind("serviceaccount", "", "v1", "ServiceAccount", "serviceaccounts")
JOB = ResourceKind("job", "batch", "v1", "Job", "jobs")
RBAC_GROUP = "rbac.authorization.k8s.io"
ROLE = ResourceKind("role", RBAC_GROUP, "v1", "Role", "roles")
ROLE_BINDING = ResourceKind("rolebinding", RBAC_GROUP, "v1", "RoleBinding", "rolebindings")

#: what every openstack-cluster release renders (helm applies, takes over and deletes them)
CHART_KINDS = (
    CAPI_CLUSTER,
    OPENSTACK_CLUSTER,
    CONTROL_PLANE,
    OPENSTACK_MACHINE_TEMPLATE,
    MACHINE_DEPLOYMENT,
    KUBEADM_CONFIG_TEMPLATE,
    MACHINE_HEALTH_CHECK,
    HELM_RELEASE,
    MANIFESTS,
)
#: the autoscaler's objects, rendered when a node group autoscales
AUTOSCALER_KINDS = (DEPLOYMENT, SERVICE_ACCOUNT, ROLE, ROLE_BINDING)

RULES = (
    Rule(
        CLUSTER,
        "get list",
        why="the Cluster to converge; the Clusters a template or Secret wakes, and those of a "
        "claimed partition (deletion deadlines)",
    ),
    Rule(CLUSTER_TEMPLATE, "get", why="the Cluster's template (its values)"),
    Rule(
        SECRET,
        "get list create update patch delete",
        why="itself: the credentials, the etcd key (made, deleted), the Zenith reservation "
        "Secret (made, annotated, deleted on a conflict) and the zenith-operator's Secret "
        "(applied); helm: the release's revisions (listed, read, made, updated when "
        "superseded, deleted beyond `--history-max`), the chart's Secrets (cloud credentials, "
        "addon configs: applied) and the etcd key's `lookup`",
    ),
    Rule(
        CAPI_CLUSTER,
        "get",
        why="itself: a deleting Cluster waits for the Cluster API cluster to go",
    ),
    Rule(
        CHART_KINDS,
        "get create patch delete",
        why="helm: the openstack-cluster chart's objects, server-side applied, taken over, "
        "deleted by an upgrade that drops them and by the uninstall",
    ),
    Rule(
        AUTOSCALER_KINDS,
        "get create patch delete",
        why="helm: the cluster autoscaler of a node group that autoscales; itself: the "
        "per-cluster zenith-operator's Deployment and ServiceAccount",
    ),
    Rule(
        [MACHINE_DEPLOYMENT, MACHINE, MACHINE_SET, MACHINE_POOL],
        "get list watch update",
        why="held so that helm may create the autoscaler's Role, which grants them (RBAC "
        "escalation check)",
    ),
    Rule(
        MACHINE_DEPLOYMENT,
        "get update patch",
        subresource="scale",
        why="the same, for the Role's `machinedeployments/scale`",
    ),
    Rule(
        JOB,
        "watch create patch delete",
        why="helm: hook Jobs, server-side applied, watched until they end, deleted by their "
        "delete policy",
    ),
)
