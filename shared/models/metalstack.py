"""Models of metal-stack's Cluster API infrastructure kinds, ``infrastructure.cluster.x-k8s.io``
version ``v1alpha4``.

Four kinds, as upstream ``metal-stack/cluster-api-provider-metalstack`` declares them in
``api/v1alpha4/*_types.go`` (CRDs in ``config/resources/crd/bases/``): ``MetalStackCluster``
and ``MetalStackMachine`` (status subresource), ``MetalStackMachineTemplate`` (no status) and
``MetalStackFirewall`` (a status in the schema but **no** status subresource, so its status is
written on the object itself). They use the building blocks of ``shared.models.azimuth``, so
``shared.crdgen`` generates their CRDs the same way.

Decisions, upstream's unless noted:

* **Only v1alpha4 is served**, as the storage version. Upstream also serves v1alpha3 through a
  conversion webhook; capibus has no webhook for it and nothing that writes v1alpha3.
* **Wire names are upstream's JSON tags**, including the ``ID`` spellings (``projectID``,
  ``publicNetworkID``, ``providerID``, ``controlPlaneIPAllocated``) that the camelCase
  generator alone would get wrong; those fields carry an explicit alias.
* **Go zero values become defaults**: a missing ``controlPlaneEndpoint`` parses as host ``""``
  and port 0 (CAPI reads an empty host as "not known yet"), missing booleans as false, missing
  lists as empty. ``firewallSpec`` is the exception: upstream's zero value is a firewall with
  no machine type, which can never be allocated, so here a missing one is ``None`` and the
  controller can say so.
* **``status.controlPlaneIPAllocated`` is not required** in the schema (upstream requires it
  only because Go always serialises it): capibus writes status as merge patches, and the first
  one may carry nothing but a condition.
* **``status.conditions``** on the three kinds with a status is a capibus addition in Cluster
  API's shape (``type``, ``status``, ``severity``, ``reason``, ``message``,
  ``lastTransitionTime``), so a waiting or retrying step is visible to ``kubectl`` and
  ``clusterctl describe``. Keyed by ``type`` like the Azimuth kinds' conditions.
* **``status.instanceStatus`` is an enum** of upstream's ``MetalStackResourceStatus`` values
  (``api/v1alpha4/types.go``); upstream's CRD leaves it a free string.
* **Printer columns**: MetalStackMachine's are upstream's, except that State reads
  ``.status.instanceStatus`` (upstream points at ``.status.instanceState``, which no type
  declares). MetalStackCluster and MetalStackFirewall have none upstream; the ones here show
  the owning cluster, readiness and what the controller allocated.
* **Every CRD carries the Cluster API contract label** ``cluster.x-k8s.io/v1beta1: v1alpha4``:
  Cluster API core reads the label named after its own contract to learn which version of an
  infrastructure kind to use (upstream labels its CRDs ``cluster.x-k8s.io/v1alpha4`` in
  ``config/resources/crd/kustomization.yaml``, for the v1alpha4 core it was built against).
* All four kinds are in category ``cluster-api`` (upstream lists only the machine kinds), so
  ``kubectl get cluster-api`` shows every object of a workload cluster.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from shared.models.azimuth import (
    ConditionStatus,
    CustomResource,
    PrinterColumn,
    PrinterColumnType,
    ResourceInfo,
    Schema,
    Scope,
)

GROUP = "infrastructure.cluster.x-k8s.io"
VERSION = "v1alpha4"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORIES = ("cluster-api",)
#: The label Cluster API core (contract v1beta1) reads on a CRD: the versions implementing it.
CONTRACT_LABEL = ("cluster.x-k8s.io/v1beta1", VERSION)
#: Names the Cluster API ``Cluster`` an object belongs to (set by CAPI core and the provider).
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
#: ``spec.providerID`` is this prefix and the metal-api machine id.
PROVIDER_ID_PREFIX = "metalstack://"

METALSTACK_CLUSTER_FINALIZER = "metalstackcluster.infrastructure.cluster.x-k8s.io"
METALSTACK_MACHINE_FINALIZER = "metalstackmachine.infrastructure.cluster.x-k8s.io"
METALSTACK_FIREWALL_FINALIZER = "metalstackfirewall.infrastructure.cluster.x-k8s.io"

_CLUSTER_COLUMN = PrinterColumn(
    "Cluster", PrinterColumnType.STRING, r".metadata.labels.cluster\.x-k8s\.io/cluster-name"
)
_READY_COLUMN = PrinterColumn("Ready", PrinterColumnType.STRING, ".status.ready")
_INSTANCE_COLUMN = PrinterColumn("InstanceID", PrinterColumnType.STRING, ".spec.providerID")


def _resource(
    kind: str,
    *,
    has_status: bool,
    status_subresource: bool = True,
    columns: tuple[PrinterColumn, ...] = (),
) -> ResourceInfo:
    return ResourceInfo(
        kind=kind,
        scope=Scope.NAMESPACED,
        has_status=has_status,
        status_subresource=status_subresource,
        printer_columns=columns,
        group=GROUP,
        version=VERSION,
        categories=CATEGORIES,
        labels=(CONTRACT_LABEL,),
    )


# --------------------------------------------------------------------------------------------
# Shared by the kinds
# --------------------------------------------------------------------------------------------


class ConditionSeverity(StrEnum):
    """How bad a False condition is (Cluster API's ``ConditionSeverity``; empty when True)."""

    ERROR = "Error"
    WARNING = "Warning"
    INFO = "Info"
    NONE = ""


class CapiCondition(Schema):
    """One status condition in the shape of Cluster API's Condition."""

    type: str = Field(min_length=1, description="The type of the condition, in CamelCase.")
    status: ConditionStatus = Field(description="The status of the condition.")
    severity: ConditionSeverity = Field(
        default=ConditionSeverity.NONE,
        description="How bad the condition is when its status is False.",
    )
    reason: str = Field(
        default="", description="A programmatic, CamelCase reason for the last transition."
    )
    message: str = Field(
        default="", description="A human-readable message about the last transition."
    )
    last_transition_time: dt.datetime = Field(description="When the condition last changed status.")


# A map keyed by type lets server-side apply merge conditions per type.
Conditions = Annotated[
    list[CapiCondition],
    Field(
        description="capibus progress and error conditions; not in upstream's provider.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    ),
]


class ClusterStatusError(StrEnum):
    """Cluster API's ``ClusterStatusError`` values for ``failureReason``; upstream only ever
    sets ``InvalidConfiguration``."""

    INVALID_CONFIGURATION = "InvalidConfiguration"
    UNSUPPORTED_CHANGE = "UnsupportedChange"
    CREATE_ERROR = "CreateError"
    UPDATE_ERROR = "UpdateError"
    DELETE_ERROR = "DeleteError"


class MachineStatusError(StrEnum):
    """Cluster API's ``MachineStatusError`` values for ``failureReason``; upstream only ever
    sets ``CreateError``."""

    INVALID_CONFIGURATION = "InvalidConfiguration"
    UNSUPPORTED_CHANGE = "UnsupportedChange"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    CREATE_ERROR = "CreateError"
    UPDATE_ERROR = "UpdateError"
    DELETE_ERROR = "DeleteError"
    JOIN_CLUSTER_TIMEOUT = "JoinClusterTimeoutError"


# --------------------------------------------------------------------------------------------
# MetalStackFirewall (declared first: MetalStackCluster embeds its spec)
# --------------------------------------------------------------------------------------------


class MetalStackFirewallSpec(Schema):
    """The desired firewall machine of a cluster."""

    image: str = Field(default="", description="The OS image of the firewall.")
    machine_type: str = Field(description="The metal-stack size of the firewall machine.")
    provider_id: str | None = Field(
        default=None,
        alias="providerID",
        description="metalstack://<machine id>: the machine the firewall is (to be) deployed on.",
    )
    ssh_keys: list[str] = Field(
        default_factory=list, description="Public SSH keys for the firewall machine."
    )


class MetalStackFirewallStatus(Schema):
    """The observed state of the firewall."""

    ready: bool = Field(default=False, description="Whether the firewall is allocated.")
    conditions: Conditions = Field(default_factory=list)


class MetalStackFirewall(CustomResource):
    """The firewall of a metal-stack cluster: written without a status subresource."""

    resource: ClassVar[ResourceInfo] = _resource(
        "MetalStackFirewall",
        has_status=True,
        status_subresource=False,
        columns=(_CLUSTER_COLUMN, _READY_COLUMN, _INSTANCE_COLUMN),
    )

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha4"] = (
        "infrastructure.cluster.x-k8s.io/v1alpha4"
    )
    kind: Literal["MetalStackFirewall"] = "MetalStackFirewall"
    spec: MetalStackFirewallSpec
    status: MetalStackFirewallStatus = Field(default_factory=MetalStackFirewallStatus)


# --------------------------------------------------------------------------------------------
# MetalStackCluster
# --------------------------------------------------------------------------------------------


class APIEndpoint(Schema):
    """Where the control plane is reached (Cluster API's ``APIEndpoint``)."""

    host: str = Field(description="The hostname or IP address the API server listens on.")
    port: int = Field(description="The port the API server listens on.")


class MetalStackClusterSpec(Schema):
    """The desired state of a metal-stack cluster's infrastructure."""

    control_plane_endpoint: APIEndpoint = Field(
        default_factory=lambda: APIEndpoint(host="", port=0),
        description="The control plane endpoint; the controller sets the host it allocates.",
    )
    project_id: str = Field(
        default="",
        alias="projectID",
        description="The metal-stack project the cluster is deployed in.",
    )
    partition: str = Field(
        default="", description="The metal-stack partition (physical location) of the cluster."
    )
    public_network_id: str = Field(
        alias="publicNetworkID", description="The network that provides access to the internet."
    )
    private_network_id: str | None = Field(
        default=None,
        alias="privateNetworkID",
        description="The network connecting the machines; the controller allocates one if unset.",
    )
    firewall_spec: MetalStackFirewallSpec | None = Field(
        default=None, description="The spec of the cluster's MetalStackFirewall."
    )


class MetalStackClusterStatus(Schema):
    """The observed state of a metal-stack cluster's infrastructure."""

    ready: bool = Field(default=False, description="Whether the infrastructure is ready.")
    control_plane_ip_allocated: bool = Field(
        default=False,
        alias="controlPlaneIPAllocated",
        description="Whether the control plane IP was allocated.",
    )
    failure_reason: str | None = Field(
        default=None,
        description="A fatal problem reconciling the infrastructure, for programs.",
    )
    failure_message: str | None = Field(
        default=None,
        description="A fatal problem reconciling the infrastructure, for humans.",
    )
    conditions: Conditions = Field(default_factory=list)


class MetalStackCluster(CustomResource):
    """The infrastructure of a Cluster API cluster on metal-stack."""

    resource: ClassVar[ResourceInfo] = _resource(
        "MetalStackCluster",
        has_status=True,
        columns=(
            _CLUSTER_COLUMN,
            _READY_COLUMN,
            PrinterColumn("Network", PrinterColumnType.STRING, ".spec.privateNetworkID"),
            PrinterColumn("Endpoint", PrinterColumnType.STRING, ".spec.controlPlaneEndpoint.host"),
        ),
    )

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha4"] = (
        "infrastructure.cluster.x-k8s.io/v1alpha4"
    )
    kind: Literal["MetalStackCluster"] = "MetalStackCluster"
    spec: MetalStackClusterSpec
    status: MetalStackClusterStatus = Field(default_factory=MetalStackClusterStatus)


# --------------------------------------------------------------------------------------------
# MetalStackMachine and MetalStackMachineTemplate
# --------------------------------------------------------------------------------------------


class InstanceStatus(StrEnum):
    """The state of a metal-stack machine (upstream's ``MetalStackResourceStatus``)."""

    NEW = "new"
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    ERRORED = "errored"
    OFF = "off"


class AddressType(StrEnum):
    """The Kubernetes ``NodeAddressType`` values."""

    HOSTNAME = "Hostname"
    EXTERNAL_IP = "ExternalIP"
    INTERNAL_IP = "InternalIP"
    EXTERNAL_DNS = "ExternalDNS"
    INTERNAL_DNS = "InternalDNS"


class MachineAddress(Schema):
    """One address of a machine (the shape of the Kubernetes NodeAddress)."""

    type: str = Field(description="The kind of address: Hostname, ExternalIP, InternalIP, ...")
    address: str = Field(description="The address.")


class MetalStackMachineSpec(Schema):
    """The desired state of one metal-stack machine."""

    image: str = Field(description="The OS image of the machine.")
    machine_type: str = Field(description="The metal-stack size of the machine.")
    provider_id: str | None = Field(
        default=None,
        alias="providerID",
        description="metalstack://<machine id>; set before creation, it pins that machine.",
    )
    ssh_keys: list[str] = Field(
        default_factory=list, description="Public SSH keys for the machine."
    )
    tags: list[str] = Field(
        default_factory=list, description="Extra tags for the metal-stack machine."
    )


class MetalStackMachineStatus(Schema):
    """The observed state of one metal-stack machine."""

    addresses: list[MachineAddress] = Field(
        default_factory=list, description="The addresses of the machine."
    )
    error_reason: str | None = Field(
        default=None, description="Kept for upstream compatibility; never set."
    )
    error_message: str | None = Field(
        default=None, description="Kept for upstream compatibility; never set."
    )
    failure_reason: str | None = Field(
        default=None, description="A terminal problem reconciling the machine, for programs."
    )
    failure_message: str | None = Field(
        default=None, description="A terminal problem reconciling the machine, for humans."
    )
    instance_status: InstanceStatus | None = Field(
        default=None, description="The state of the metal-stack machine."
    )
    lldp: bool = Field(default=False, description="Kept for upstream compatibility.")
    ready: bool = Field(default=False, description="Whether the machine is ready.")
    conditions: Conditions = Field(default_factory=list)


class MetalStackMachine(CustomResource):
    """One machine of a Cluster API cluster on metal-stack."""

    resource: ClassVar[ResourceInfo] = _resource(
        "MetalStackMachine",
        has_status=True,
        columns=(
            _CLUSTER_COLUMN,
            PrinterColumn("State", PrinterColumnType.STRING, ".status.instanceStatus"),
            _READY_COLUMN,
            _INSTANCE_COLUMN,
            PrinterColumn(
                "Machine",
                PrinterColumnType.STRING,
                '.metadata.ownerReferences[?(@.kind=="Machine")].name',
            ),
        ),
    )

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha4"] = (
        "infrastructure.cluster.x-k8s.io/v1alpha4"
    )
    kind: Literal["MetalStackMachine"] = "MetalStackMachine"
    spec: MetalStackMachineSpec
    status: MetalStackMachineStatus = Field(default_factory=MetalStackMachineStatus)


class MetalStackMachineTemplateResource(Schema):
    """What a MetalStackMachine made from the template is created with."""

    spec: MetalStackMachineSpec = Field(description="The spec of the machines.")


class MetalStackMachineTemplateSpec(Schema):
    """The desired state of a machine template."""

    template: MetalStackMachineTemplateResource = Field(description="The machine template.")


class MetalStackMachineTemplate(CustomResource):
    """A template Cluster API copies into each MetalStackMachine of a machine set."""

    resource: ClassVar[ResourceInfo] = _resource("MetalStackMachineTemplate", has_status=False)

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha4"] = (
        "infrastructure.cluster.x-k8s.io/v1alpha4"
    )
    kind: Literal["MetalStackMachineTemplate"] = "MetalStackMachineTemplate"
    spec: MetalStackMachineTemplateSpec


#: The metal-stack kinds, in the order CRDs are generated and applied.
RESOURCES: tuple[type[CustomResource], ...] = (
    MetalStackCluster,
    MetalStackMachine,
    MetalStackMachineTemplate,
    MetalStackFirewall,
)
