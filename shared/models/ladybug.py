"""The ``LadybugCluster``: one CB-Ladybug cluster, group ``ladybug.capibus.dev``, ``v1alpha1``.

capibus serves CB-Ladybug's REST API (``src/rest-api/router/*.go`` of cloud-barista/cb-ladybug)
with the Kubernetes API server as its store: where upstream keeps a Cluster entity in cb-store
under ``/ns/{namespace}/clusters/{cluster}`` (``src/core/model/cluster.go``), capibus keeps one
``LadybugCluster``. The REST layer is a façade over it, the provisioner converges it, and the
watcher, the writer, partitions and ``kubectl`` handle it like every other kind.

Decisions:

* **One Kubernetes namespace for all of them** (setting ``CAPIBUS_LADYBUG__NAMESPACE``,
  ``ladybug`` by default), object name ``<tumblebug namespace>.<cluster name>``
  (``object_name``), labelled with both parts (``NAMESPACE_LABEL``, ``CLUSTER_LABEL``) so the
  REST layer lists a Tumblebug namespace's clusters with a label selector. Tumblebug
  namespaces are not Kubernetes namespaces and need not exist as such.
* **spec is the create request after defaults** (upstream's ``ClusterReq``,
  ``src/core/app/const.go``), plus what later requests append: add-node appends worker
  ``NodeSet``s and remove-node appends to ``removeNodes``, so every change a user asks for
  bumps ``metadata.generation`` and is a level the provisioner converges to. Every NodeSet has
  an ``id``: the Tumblebug subgroup base name (``c-1-xxxxx``, ``w-<i>-xxxxx``) chosen by the API
  when it accepted the request, so a restarted provisioner names VMs as the first run did.
  Worker NodeSets are one per VM (``count`` expanded by the API), as upstream gives every
  worker its own subgroup.
* **status is upstream's Cluster minus what the request already says**: ``phase``/``reason``/
  ``message`` (upstream's ``status``), ``mcis``, ``k8sVersion``, ``cpLeader``, ``cpGroup``,
  ``createdTime`` and the nodes, plus capibus's ``observedGeneration`` and ``conditions``. The
  nodes' ``subGroup``, ``bootstrapped`` and ``joined`` are capibus progress markers: the
  provisioner resumes from them and never re-runs a finished step.
* **No node credential anywhere in the resource.** Upstream returns each node's SSH private
  key in ``credential``; here it lives in a Secret per Tumblebug namespace and connection
  (``sshkey_secret_name``) and the admin kubeconfig in ``kubeconfig_secret_name``, neither of
  which reaches the bus (``shared.resources.scrub``) or a REST response.
* **Enums in the schema** for what the API has already validated with upstream's messages
  (``serviceType``, ``networkCni``, ``loadbalancer``, ``etcd``, ``phase``, node ``role``), so an
  object written by hand with a typo is refused by the API server rather than half-provisioned.
  ``reason`` stays a free string: upstream's reasons are ``LadybugReason``, and capibus may add
  its own.
* **Printer columns**: the Tumblebug namespace (``TB-Namespace``, so it does not read as a
  second Kubernetes namespace under ``kubectl get -A``), the cluster name, phase, reason,
  leader, age.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from shared.models.azimuth import (
    CustomResource,
    PrinterColumn,
    PrinterColumnType,
    ResourceInfo,
    Schema,
    Scope,
)
from shared.models.metalstack import Conditions

GROUP = "ladybug.capibus.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORIES = ("ladybug",)
KIND = "LadybugCluster"

#: Where every LadybugCluster lives unless ``CAPIBUS_LADYBUG__NAMESPACE`` says otherwise.
DEFAULT_NAMESPACE = "ladybug"
#: Held by the provisioner until the MCIS is terminated and deleted.
FINALIZER = "ladybug.capibus.dev/cleanup"
#: The Tumblebug namespace and the cluster name, on the LadybugCluster and on its Secrets.
NAMESPACE_LABEL = "ladybug.capibus.dev/namespace"
CLUSTER_LABEL = "ladybug.capibus.dev/cluster"
#: The keys of the Secrets: the sshKey's private key and login name, the admin kubeconfig.
PRIVATE_KEY_KEY = "privateKey"
USERNAME_KEY = "username"
KUBECONFIG_KEY = "value"


def object_name(namespace: str, cluster: str) -> str:
    """The LadybugCluster of Tumblebug namespace ``namespace`` and cluster ``cluster``."""
    return f"{namespace}.{cluster}"


def sshkey_secret_name(namespace: str, connection: str) -> str:
    """The Secret holding the private key of ``connection``'s sshKey in ``namespace``."""
    return f"ladybug-sshkey.{namespace}.{connection}"


def kubeconfig_secret_name(name: str) -> str:
    """The Secret holding the admin kubeconfig of the LadybugCluster named ``name``."""
    return f"{name}.kubeconfig"


# --------------------------------------------------------------------------------------------
# spec
# --------------------------------------------------------------------------------------------


class ServiceType(StrEnum):
    """``multi``: nodes across clouds, joined over public IPs; ``single``: one connection."""

    MULTI = "multi"
    SINGLE = "single"


class NetworkCni(StrEnum):
    """canal and kilo for multi-cloud, calico and flannel for single-cloud clusters."""

    CANAL = "canal"
    KILO = "kilo"
    FLANNEL = "flannel"
    CALICO = "calico"


class LoadBalancer(StrEnum):
    HAPROXY = "haproxy"
    NLB = "nlb"


class Etcd(StrEnum):
    LOCAL = "local"
    EXTERNAL = "external"


class RootDisk(Schema):
    """The VM's root disk; ``default`` leaves the choice to the CSP."""

    type: str = Field(default="default", description="The CSP's root disk type.")
    size: str = Field(default="default", description="The root disk size in GB.")


class NodeSet(Schema):
    """One Tumblebug subgroup of VMs (upstream's ``NodeSetReq`` plus its subgroup ``id``)."""

    id: str = Field(
        min_length=1,
        description="The Tumblebug subgroup base name (c-1-xxxxx, w-<i>-xxxxx); VMs are <id>-<n>.",
    )
    connection: str = Field(min_length=1, description="The Tumblebug connection config.")
    count: int = Field(default=1, ge=1, description="How many VMs the subgroup has.")
    spec: str = Field(min_length=1, description="The CSP's machine specification name.")
    root_disk: RootDisk = Field(default_factory=RootDisk, description="The VMs' root disk.")
    role: str = Field(default="", description="The AWS IAM role, for single-cloud CCM only.")


class Nfs(Schema):
    server: str = Field(default="", description="The NFS server.")
    path: str = Field(default="", description="The exported path.")


class StorageClass(Schema):
    nfs: Nfs = Field(default_factory=Nfs, description="An NFS storage class, if server is set.")


class KubernetesConfig(Schema):
    """The Kubernetes settings of the cluster, defaults applied (upstream's defaults, plus
    ``etcd: local``, which upstream never sets)."""

    version: str = Field(default="1.23.13", description="The Kubernetes version.")
    network_cni: NetworkCni = Field(default=NetworkCni.KILO, description="The network CNI.")
    pod_cidr: str = Field(default="10.244.0.0/16", description="The pod network CIDR.")
    service_cidr: str = Field(default="10.96.0.0/12", description="The service network CIDR.")
    service_dns_domain: str = Field(default="cluster.local", description="The cluster domain.")
    storageclass: StorageClass = Field(
        default_factory=StorageClass, description="Optional storage classes."
    )
    loadbalancer: LoadBalancer = Field(
        default=LoadBalancer.HAPROXY,
        description="haproxy on the leader, or a Tumblebug NLB, in front of the API servers.",
    )
    etcd: Etcd = Field(default=Etcd.LOCAL, description="Stacked (local) or external etcd.")


class ClusterConfig(Schema):
    install_mon_agent: str = Field(
        default="no", description="Whether Tumblebug installs its monitoring agent (yes/no)."
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig, description="The Kubernetes settings."
    )


class LadybugClusterSpec(Schema):
    """The cluster as requested: the create request after defaults, plus later node changes."""

    namespace: str = Field(min_length=1, description="The Tumblebug namespace.")
    name: str = Field(min_length=1, description="The cluster name (and its MCIS's).")
    control_plane: list[NodeSet] = Field(
        default_factory=list, description="The control-plane subgroup (exactly one)."
    )
    worker: list[NodeSet] = Field(
        default_factory=list, description="One subgroup per worker VM; add-node appends here."
    )
    remove_nodes: list[str] = Field(
        default_factory=list, description="Nodes (VM names) to remove; remove-node appends here."
    )
    service_type: ServiceType = Field(
        default=ServiceType.MULTI, description="multi-cloud or single-cloud."
    )
    config: ClusterConfig = Field(
        default_factory=ClusterConfig, description="Cluster configuration."
    )
    label: str = Field(default="", description="A free label, copied to responses.")
    description: str = Field(default="", description="A free description.")


# --------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------


class LadybugPhase(StrEnum):
    """Upstream's phases (``src/core/model/cluster.go``)."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    FAILED = "Failed"
    DELETING = "Deleting"


class LadybugReason(StrEnum):
    """Upstream's ``status.reason`` values, spelling included (``SetupBoostrapFailedReason``)."""

    GET_MCIS_FAILED = "GetMCISFailedReason"
    ALREADY_EXIST_MCIS_FAILED = "AlreadyExistMCISFailedReason"
    INVALID_MCIR = "InvalidMCIRReason"
    CREATE_MCIS_FAILED = "CreateMCISFailedReason"
    GET_CONTROL_PLANE_CONNECTION_INFO_FAILED = "GetControlPlaneConnectionInfoFailedReason"
    GET_WORKER_CONNECTION_INFO_FAILED = "GetWorkerConnectionInfoFailedReason"
    CREATE_VPC_FAILED = "CreateVpcFailedReason"
    CREATE_SECURITY_GROUP_FAILED = "CreateSecurityGroupFailedReason"
    CREATE_SSH_KEY_FAILED = "CreateSSHKeyFailedReason"
    CREATE_VM_IMAGE_FAILED = "CreateVmImageFailedReason"
    CREATE_VM_SPEC_FAILED = "CreateVmSpecFailedReason"
    CREATE_NLB_FAILED = "CreateNLBFailedReason"
    ADD_NODE_ENTITY_FAILED = "AddNodeEntityFailedReason"
    SETUP_BOOTSTRAP_FAILED = "SetupBoostrapFailedReason"
    SETUP_HAPROXY_FAILED = "SetupHaproxyFailedReason"
    INIT_CONTROL_PLANE_FAILED = "InitControlPlaneFailedReason"
    INIT_EXTERNAL_ETCD_FAILED = "InitExternalEtcdFailedReason"
    SETUP_NETWORK_CNI_FAILED = "SetupNetworkCNIFailedReason"
    SETUP_STORAGE_CLASS_FAILED = "SetupStorageClassFailedReason"
    JOIN_CONTROL_PLANE_FAILED = "JoinControlPlaneFailedReason"
    JOIN_WORKER_FAILED = "JoinWorkerFailedReason"
    SETUP_CCM_FAILED = "SetupCCMFailedReason"


class NodeRole(StrEnum):
    CONTROL_PLANE = "control-plane"
    WORKER = "worker"


class LadybugNode(Schema):
    """One VM of the cluster: upstream's Node without its SSH private key."""

    name: str = Field(min_length=1, description="The VM name in Tumblebug (<subgroup>-<n>).")
    public_ip: str = Field(default="", description="The VM's public IP.")
    private_ip: str = Field(default="", description="The VM's private IP.")
    role: NodeRole = Field(description="control-plane or worker.")
    spec: str = Field(default="", description="The CSP's machine specification name.")
    csp: str = Field(default="", description="The cloud provider (lower case).")
    created_time: dt.datetime | None = Field(default=None, description="When it was bound.")
    csp_label: str = Field(
        default="", description="topology.cloud-barista.github.io/csp=<csp>, set on the node."
    )
    region_label: str = Field(
        default="", description="topology.kubernetes.io/region=<region>, set on the node."
    )
    zone_label: str = Field(
        default="", description="topology.kubernetes.io/zone=<zone>, set on the node."
    )
    sub_group: str = Field(default="", description="The Tumblebug subgroup (NodeSet id).")
    bootstrapped: bool = Field(default=False, description="bootstrap.sh ran successfully.")
    joined: bool = Field(default=False, description="The node is in the cluster (init or join).")
    hostname: str = Field(
        default="",
        description="Its Node name in Kubernetes when not the VM name: the cloud hostname of a "
        "single-cloud cluster's VM.",
    )
    cloud_prepared: bool = Field(
        default=False,
        description="Single-cloud on AWS: the VM has its IAM instance profile and cluster tags.",
    )


Nodes = Annotated[
    list[LadybugNode],
    Field(
        description="The cluster's VMs, control plane first.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    ),
]


class LadybugClusterStatus(Schema):
    """The observed cluster: upstream's Cluster fields that are not in the request."""

    phase: LadybugPhase | None = Field(default=None, description="Where provisioning is.")
    reason: str = Field(default="", description="Why the cluster Failed (upstream's reasons).")
    message: str = Field(default="", description="What failed, for humans.")
    mcis: str = Field(default="", description="The Tumblebug MCIS (named like the cluster).")
    k8s_version: str = Field(
        default="",
        alias="k8sVersion",  # the camelCase generator would say k8SVersion
        description="The installed version, e.g. 1.23.13-00.",
    )
    cp_leader: str = Field(default="", description="The control-plane VM that ran kubeadm init.")
    cp_group: str = Field(default="", description="The control-plane subgroup id.")
    created_time: dt.datetime | None = Field(default=None, description="When it was Provisioned.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status describes."
    )
    nodes: Nodes = Field(default_factory=list)
    conditions: Conditions = Field(default_factory=list)


class LadybugCluster(CustomResource):
    """A CB-Ladybug cluster: Kubernetes on Tumblebug VMs, bootstrapped over SSH."""

    resource: ClassVar[ResourceInfo] = ResourceInfo(
        kind=KIND,
        scope=Scope.NAMESPACED,
        has_status=True,
        printer_columns=(
            PrinterColumn("TB-Namespace", PrinterColumnType.STRING, ".spec.namespace"),
            PrinterColumn("Cluster", PrinterColumnType.STRING, ".spec.name"),
            PrinterColumn("Phase", PrinterColumnType.STRING, ".status.phase"),
            PrinterColumn("Reason", PrinterColumnType.STRING, ".status.reason"),
            PrinterColumn("Leader", PrinterColumnType.STRING, ".status.cpLeader"),
            PrinterColumn("Age", PrinterColumnType.DATE, ".metadata.creationTimestamp"),
        ),
        group=GROUP,
        version=VERSION,
        categories=CATEGORIES,
        short_names=("lbc",),
    )

    api_version: Literal["ladybug.capibus.dev/v1alpha1"] = "ladybug.capibus.dev/v1alpha1"
    kind: Literal["LadybugCluster"] = "LadybugCluster"
    spec: LadybugClusterSpec
    status: LadybugClusterStatus = Field(default_factory=LadybugClusterStatus)


RESOURCES: tuple[type[CustomResource], ...] = (LadybugCluster,)
