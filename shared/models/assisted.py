"""Models of the OpenShift Assisted Cluster API providers' kinds (CAPOA, baseline v0.2.0).

Three kinds, as upstream ``openshift-assisted/cluster-api-provider-openshift-assisted`` v0.2.0
declares them: the bootstrap provider's ``OpenshiftAssistedConfig`` (shortName ``oac``, status
subresource) and ``OpenshiftAssistedConfigTemplate`` in ``bootstrap.cluster.x-k8s.io``
(``bootstrap/api/v1alpha1/*_types.go``), and the control-plane provider's
``OpenshiftAssistedControlPlane`` in ``controlplane.cluster.x-k8s.io``
(``controlplane/api/v1alpha1/openshiftassistedcontrolplane_types.go``), with status and scale
subresources. All are served as ``v1alpha1``. They use the building blocks of
``shared.models.azimuth`` and the Cluster API condition of ``shared.models.metalstack``, so
``shared.crdgen`` generates their CRDs the same way. The kinds of assisted-service, hive and
metal3 these providers drive are not ours: their stand-in CRDs are in ``standins/crds``.

Decisions, upstream's unless noted:

* **Only v1alpha1 is served**, as the storage version: v0.2.0 serves nothing else (later
  releases add v1alpha2/v1alpha3 with conversion webhooks; capibus has none).
* **Wire names are upstream's JSON tags**, including ``isoDownloadURL``, ``apiVIPs``,
  ``ingressVIPs`` and ``additionalNTPSources``, which the camelCase generator alone would spell
  differently; those fields carry an explicit alias.
* **Required as upstream's CRD requires**: ``spec.version`` and ``spec.machineTemplate``
  (with its ``infrastructureRef``) on the control plane, ``config.baseDomain`` and
  ``config.releaseImage`` inside its config, ``template`` on the config template. ``spec.config``
  itself is required here too (upstream's CRD leaves it optional, but Go always serialises the
  struct, so an object upstream writes always has it, and one without a base domain cannot be
  installed).
* **``spec.version`` carries a SemVer pattern** (capibus addition; the same pattern as the
  Azimuth kinds' versions): upstream v0.2.0 accepts any string and its controller then fails
  on every reconcile. The minimum, 4.14.0, stays the controller's check (a condition), since
  a pattern cannot compare versions.
* **``config.apiVIPs`` / ``config.ingressVIPs`` hold at most two addresses** each (one per IP
  stack), as upstream's ``MaxItems=2``.
* **Go zero values become defaults**: missing booleans parse as false, counts as 0, lists and
  maps as empty, ``cpuArchitecture`` as ``x86_64`` (upstream's ``+kubebuilder:default``; the
  CRD carries no default, see ``shared.crdgen``). Pointers upstream (``dataSecretName``,
  ``status.version``, the control plane's ``failureReason``/``failureMessage``, the refs)
  are ``None`` when missing.
* **Conditions are Cluster API v1beta1's** (``CapiCondition``), keyed by ``type`` so
  server-side apply merges them per type. The condition types and reasons upstream uses are
  the enums below, for the providers to share.
* **The template has no status** in the schema (upstream's is an empty struct behind a status
  subresource that nothing writes).
* **Printer columns**: the control plane's are upstream's, ``Age`` before ``Version`` as
  upstream places it. The config has none upstream; the ones here show its cluster, readiness,
  data secret and the Agent it bound (capibus addition).
* **Every CRD carries the Cluster API contract label** ``cluster.x-k8s.io/v1beta1: v1alpha1``
  (upstream's ``config/crd/kustomization.yaml`` labels for the v1beta1 contract) and is in
  category ``cluster-api``, so ``kubectl get cluster-api`` lists them with the rest.
* Fields upstream added after v0.2.0 (``nodeRegistration``, pre/post-install commands,
  ``distributionVersion``, capabilities) are not modelled; the API server prunes them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from shared.models.azimuth import (
    SEMVER_VERSION_PATTERN,
    CustomResource,
    PrinterColumn,
    PrinterColumnType,
    ResourceInfo,
    ScaleSubresource,
    Schema,
    Scope,
)
from shared.models.metalstack import CapiCondition

BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
CONTROLPLANE_GROUP = "controlplane.cluster.x-k8s.io"
VERSION = "v1alpha1"
BOOTSTRAP_API_VERSION = f"{BOOTSTRAP_GROUP}/{VERSION}"
CONTROLPLANE_API_VERSION = f"{CONTROLPLANE_GROUP}/{VERSION}"
CATEGORIES = ("cluster-api",)
#: The label Cluster API core (contract v1beta1) reads on a CRD: the versions implementing it.
CONTRACT_LABEL = ("cluster.x-k8s.io/v1beta1", VERSION)
#: The lowest OpenShift version the control plane installs (a condition below it, not an error).
MIN_OPENSHIFT_VERSION = "4.14.0"
DEFAULT_CPU_ARCHITECTURE = "x86_64"

#: On InfraEnvs: the OpenshiftAssistedConfig the InfraEnv was made for.
OPENSHIFT_ASSISTED_CONFIG_LABEL = "bootstrap.cluster.x-k8s.io/openshiftAssistedConfig"
OPENSHIFT_ASSISTED_CONFIG_FINALIZER = (
    "openshiftassistedconfig.bootstrap.cluster.x-k8s.io/deprovision"
)
OPENSHIFT_ASSISTED_CONTROL_PLANE_FINALIZER = (
    "openshiftassistedcontrolplane.controlplane.cluster.x-k8s.io/deprovision"
)
#: On control-plane Machines, OACs, infra clones, the ClusterDeployment and the ACI.
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CONTROL_PLANE_NAME_LABEL = "cluster.x-k8s.io/control-plane-name"
#: On control-plane Machines, with value ``master``.
ROLE_ANNOTATION = "bmac.agent-install.openshift.io/role"

_CLUSTER_COLUMN = PrinterColumn(
    "Cluster", PrinterColumnType.STRING, ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
)


def _resource(
    kind: str,
    group: str,
    *,
    has_status: bool,
    columns: tuple[PrinterColumn, ...] = (),
    short_names: tuple[str, ...] = (),
    scale: ScaleSubresource | None = None,
) -> ResourceInfo:
    return ResourceInfo(
        kind=kind,
        scope=Scope.NAMESPACED,
        has_status=has_status,
        printer_columns=columns,
        group=group,
        version=VERSION,
        categories=CATEGORIES,
        labels=(CONTRACT_LABEL,),
        short_names=short_names,
        scale=scale,
    )


# --------------------------------------------------------------------------------------------
# Conditions: upstream's types and reasons
# --------------------------------------------------------------------------------------------


class ConfigConditionType(StrEnum):
    """The OpenshiftAssistedConfig's condition types (``Ready`` summarises the other)."""

    DATA_SECRET_AVAILABLE = "DataSecretAvailable"
    READY = "Ready"


class ConfigReason(StrEnum):
    """Reasons of a False ``DataSecretAvailable``."""

    INFRA_ENV_FAILED = "InfraEnvFailed"
    PROPAGATING_LIVE_ISO_URL_FAILED = "PropagatingLiveISOURLFailed"
    CREATING_SECRET_FAILED = "CreatingSecretFailed"
    WAITING_FOR_LIVE_ISO_URL = "WaitingForLiveISOURL"
    WAITING_FOR_INSTALL_COMPLETE = "WaitingForInstallComplete"
    WAITING_FOR_ASSISTED_INSTALLER = "WaitingForAssistedInstaller"
    WAITING_FOR_CLUSTER_INFRASTRUCTURE = "WaitingForClusterInfrastructure"


class ControlPlaneConditionType(StrEnum):
    MACHINES_CREATED = "MachinesCreated"


class ControlPlaneReason(StrEnum):
    """Reasons of a False ``MachinesCreated``."""

    INFRASTRUCTURE_TEMPLATE_CLONING_FAILED = "InfrastructureTemplateCloningFailed"
    BOOTSTRAP_TEMPLATE_CLONING_FAILED = "BootstrapTemplateCloningFailed"
    MACHINE_GENERATION_FAILED = "MachineGenerationFailed"


# A map keyed by type lets server-side apply merge conditions per type.
Conditions = Annotated[
    list[CapiCondition],
    Field(
        description="The current state of the object, as Cluster API conditions.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    ),
]


# --------------------------------------------------------------------------------------------
# Building blocks (Kubernetes core and assisted-service types upstream embeds)
# --------------------------------------------------------------------------------------------

_ATOMIC = ConfigDict(json_schema_extra={"x-kubernetes-map-type": "atomic"})


class LocalObjectReference(Schema):
    """A reference to an object in the same namespace (``corev1.LocalObjectReference``)."""

    model_config = _ATOMIC

    name: str = Field(default="", description="The name of the referent.")


class ObjectReference(Schema):
    """A reference to any object (``corev1.ObjectReference``)."""

    model_config = _ATOMIC

    api_version: str | None = Field(default=None, description="The API version of the referent.")
    kind: str | None = Field(default=None, description="The kind of the referent.")
    name: str | None = Field(default=None, description="The name of the referent.")
    namespace: str | None = Field(default=None, description="The namespace of the referent.")
    uid: str | None = Field(default=None, description="The UID of the referent.")
    resource_version: str | None = Field(
        default=None, description="The resourceVersion of the referent this refers to."
    )
    field_path: str | None = Field(
        default=None, description="A piece of the referent, instead of the entire object."
    )


class TemplateMeta(Schema):
    """The labels and annotations of objects made from a template (Cluster API's
    ``ObjectMeta``)."""

    labels: dict[str, str] = Field(default_factory=dict, description="Labels to set.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations to set.")


class Proxy(Schema):
    """Proxy settings (assisted-service's ``Proxy``)."""

    http_proxy: str = Field(default="", description="The URL of the proxy for HTTP requests.")
    https_proxy: str = Field(default="", description="The URL of the proxy for HTTPS requests.")
    no_proxy: str = Field(
        default="",
        description="A comma-separated list of domains and CIDRs to reach without the proxy.",
    )


class KernelArgumentOperation(StrEnum):
    APPEND = "append"
    REPLACE = "replace"
    DELETE = "delete"


class KernelArgument(Schema):
    """One kernel argument of the discovery image (assisted-service's ``KernelArgument``)."""

    operation: KernelArgumentOperation | None = Field(
        default=None, description="What to do with the argument."
    )
    value: str = Field(
        default="",
        pattern=r'^(?:(?:[^ \t\n\r"]+)|(?:"[^"]*"))+$',
        description="The argument: <parameter> or <parameter>=<value>.",
    )


class LabelSelectorRequirement(Schema):
    """One requirement of a label selector."""

    key: str = Field(description="The label key the selector applies to.")
    operator: str = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(default_factory=list, description="The values to compare with.")


class LabelSelector(Schema):
    """A Kubernetes label selector (``metav1.LabelSelector``)."""

    model_config = _ATOMIC

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must all be present with these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Requirements that must all hold."
    )


class DiskEncryptionTarget(StrEnum):
    NONE = "none"
    ALL = "all"
    MASTERS = "masters"
    WORKERS = "workers"


class DiskEncryptionMode(StrEnum):
    TPMV2 = "tpmv2"
    TANG = "tang"


class DiskEncryption(Schema):
    """Disk encryption of the cluster's nodes (assisted-service's ``DiskEncryption``)."""

    enable_on: DiskEncryptionTarget = Field(
        default=DiskEncryptionTarget.NONE, description="Which nodes encrypt their disks."
    )
    mode: DiskEncryptionMode | None = Field(default=None, description="How the key is held.")
    tang_servers: str = Field(default="", description="JSON of the tang servers' configuration.")


class ManifestsConfigMapReference(Schema):
    """A ConfigMap of extra install manifests."""

    name: str = Field(description="The name of the ConfigMap.")


# --------------------------------------------------------------------------------------------
# OpenshiftAssistedConfig and OpenshiftAssistedConfigTemplate
# --------------------------------------------------------------------------------------------


class OpenshiftAssistedConfigSpec(Schema):
    """What the InfraEnv of a machine is made from (a subset of assisted-service's
    ``InfraEnvSpec``)."""

    proxy: Proxy | None = Field(
        default=None, description="Proxy settings for the agents and the cluster."
    )
    pull_secret_ref: LocalObjectReference | None = Field(
        default=None, description="The Secret with the pull secret for the images."
    )
    additional_ntp_sources: list[str] = Field(
        default_factory=list,
        alias="additionalNTPSources",
        description="NTP sources (hostname or IP) to add to every host.",
    )
    ssh_authorized_key: str = Field(
        default="", description="An SSH public key added to every agent, for debugging."
    )
    nm_state_config_label_selector: LabelSelector = Field(
        default_factory=LabelSelector,
        description="Selects the NMStateConfigs of the hosts of this InfraEnv.",
    )
    cpu_architecture: str = Field(
        default=DEFAULT_CPU_ARCHITECTURE, description="The CPU architecture; x86_64 if unset."
    )
    kernel_arguments: list[KernelArgument] = Field(
        default_factory=list, description="Extra kernel arguments of the discovery image."
    )
    additional_trust_bundle: str = Field(
        default="", description="PEM-encoded certificates the hosts and the cluster trust."
    )
    os_image_version: str = Field(
        default="", description="The version of the OS image of the discovery image."
    )


class OpenshiftAssistedConfigStatus(Schema):
    """What the bootstrap provider observed and made for one machine."""

    infra_env_ref: ObjectReference | None = Field(
        default=None, description="The InfraEnv that generates the machine's discovery ISO."
    )
    agent_ref: LocalObjectReference | None = Field(
        default=None, description="The Agent the machine booted as."
    )
    iso_download_url: str = Field(
        default="",
        alias="isoDownloadURL",
        description="Where the discovery ISO is downloaded from.",
    )
    ready: bool = Field(default=False, description="Whether the bootstrap data is ready.")
    data_secret_name: str | None = Field(
        default=None, description="The Secret that holds the bootstrap data."
    )
    failure_reason: str = Field(default="", description="A non-retryable error, for programs.")
    failure_message: str = Field(default="", description="A non-retryable error, for humans.")
    observed_generation: int = Field(
        default=0, description="The metadata.generation last reconciled successfully."
    )
    conditions: Conditions = Field(default_factory=list)


class OpenshiftAssistedConfig(CustomResource):
    """The bootstrap configuration of one machine of an OpenShift cluster installed by the
    assisted installer."""

    resource: ClassVar[ResourceInfo] = _resource(
        "OpenshiftAssistedConfig",
        BOOTSTRAP_GROUP,
        has_status=True,
        short_names=("oac",),
        columns=(
            _CLUSTER_COLUMN,
            PrinterColumn("Ready", PrinterColumnType.BOOLEAN, ".status.ready"),
            PrinterColumn("DataSecret", PrinterColumnType.STRING, ".status.dataSecretName"),
            PrinterColumn("Agent", PrinterColumnType.STRING, ".status.agentRef.name"),
        ),
    )

    api_version: Literal["bootstrap.cluster.x-k8s.io/v1alpha1"] = (
        "bootstrap.cluster.x-k8s.io/v1alpha1"
    )
    kind: Literal["OpenshiftAssistedConfig"] = "OpenshiftAssistedConfig"
    spec: OpenshiftAssistedConfigSpec = Field(default_factory=OpenshiftAssistedConfigSpec)
    status: OpenshiftAssistedConfigStatus = Field(default_factory=OpenshiftAssistedConfigStatus)


class OpenshiftAssistedConfigTemplateResource(Schema):
    """What an OpenshiftAssistedConfig made from the template is created with."""

    metadata: TemplateMeta = Field(
        default_factory=TemplateMeta, description="Labels and annotations of the configs."
    )
    spec: OpenshiftAssistedConfigSpec = Field(
        default_factory=OpenshiftAssistedConfigSpec, description="The spec of the configs."
    )


class OpenshiftAssistedConfigTemplateSpec(Schema):
    """The desired state of a config template."""

    template: OpenshiftAssistedConfigTemplateResource = Field(description="The config template.")


class OpenshiftAssistedConfigTemplate(CustomResource):
    """A template Cluster API copies into each OpenshiftAssistedConfig of a machine set."""

    resource: ClassVar[ResourceInfo] = _resource(
        "OpenshiftAssistedConfigTemplate", BOOTSTRAP_GROUP, has_status=False
    )

    api_version: Literal["bootstrap.cluster.x-k8s.io/v1alpha1"] = (
        "bootstrap.cluster.x-k8s.io/v1alpha1"
    )
    kind: Literal["OpenshiftAssistedConfigTemplate"] = "OpenshiftAssistedConfigTemplate"
    spec: OpenshiftAssistedConfigTemplateSpec


# --------------------------------------------------------------------------------------------
# OpenshiftAssistedControlPlane
# --------------------------------------------------------------------------------------------


class OpenshiftAssistedControlPlaneMachineTemplate(Schema):
    """What the control-plane Machines are made from."""

    metadata: TemplateMeta = Field(
        default_factory=TemplateMeta, description="Labels and annotations of the Machines."
    )
    infrastructure_ref: ObjectReference = Field(
        description="The infrastructure machine template cloned for each Machine."
    )
    node_drain_timeout: str | None = Field(
        default=None, description="How long draining a control-plane node may take (0: forever)."
    )
    node_volume_detach_timeout: str | None = Field(
        default=None, description="How long waiting for volumes to detach may take (0: forever)."
    )
    node_deletion_timeout: str | None = Field(
        default=None, description="How long deleting the Node of a deleted Machine is tried."
    )


class OpenshiftAssistedControlPlaneConfigSpec(Schema):
    """The configuration of the installed cluster: what the ClusterDeployment, the
    AgentClusterInstall and the ClusterImageSet are made from."""

    api_vips: list[str] = Field(
        default_factory=list,
        alias="apiVIPs",
        max_length=2,
        description="The virtual IPs of the API: one per IP stack used.",
    )
    ingress_vips: list[str] = Field(
        default_factory=list,
        alias="ingressVIPs",
        max_length=2,
        description="The virtual IPs of the ingress: one per IP stack used.",
    )
    manifests_config_map_refs: list[ManifestsConfigMapReference] = Field(
        default_factory=list, description="ConfigMaps of manifests to add to the install."
    )
    disk_encryption: DiskEncryption | None = Field(
        default=None, description="Disk encryption of the cluster's nodes."
    )
    proxy: Proxy | None = Field(default=None, description="Proxy settings of the install config.")
    masters_schedulable: bool = Field(
        default=False, description="Whether workloads may run on control-plane nodes."
    )
    ssh_authorized_key: str = Field(
        default="", description="An SSH public key for the nodes, after installation."
    )
    cluster_name: str = Field(
        default="", description="The cluster's friendly name; the CAPI Cluster's name if unset."
    )
    base_domain: str = Field(description="The base domain of the cluster.")
    pull_secret_ref: LocalObjectReference | None = Field(
        default=None, description="The Secret with the pull secret for the installation."
    )
    release_image: str = Field(description="The OpenShift release image to install.")
    image_registry_ref: LocalObjectReference | None = Field(
        default=None,
        description="A ConfigMap of additional image registries and their certificates.",
    )


class OpenshiftAssistedControlPlaneSpec(Schema):
    """The desired state of an OpenShift control plane installed by the assisted installer."""

    config: OpenshiftAssistedControlPlaneConfigSpec = Field(
        description="The configuration of the installed cluster."
    )
    machine_template: OpenshiftAssistedControlPlaneMachineTemplate = Field(
        description="What the control-plane Machines are made from."
    )
    openshift_assisted_config_spec: OpenshiftAssistedConfigSpec = Field(
        default_factory=OpenshiftAssistedConfigSpec,
        description="The spec of each control-plane Machine's OpenshiftAssistedConfig.",
    )
    replicas: int = Field(default=0, ge=0, description="The number of control-plane Machines.")
    version: str = Field(
        pattern=SEMVER_VERSION_PATTERN,
        description=f"The OpenShift version to install (SemVer, {MIN_OPENSHIFT_VERSION} or later).",
    )


class OpenshiftAssistedControlPlaneStatus(Schema):
    """The observed state of the control plane."""

    cluster_deployment_ref: ObjectReference | None = Field(
        default=None, description="The ClusterDeployment that installs the cluster."
    )
    selector: str = Field(
        default="", description="The label selector of the control-plane Machines, as a string."
    )
    replicas: int = Field(default=0, description="Non-terminated control-plane Machines.")
    version: str | None = Field(
        default=None, description="The lowest version of the control-plane Machines."
    )
    updated_replicas: int = Field(
        default=0, description="Non-terminated Machines that have the desired template."
    )
    ready_replicas: int = Field(default=0, description="Running and ready control-plane Machines.")
    unavailable_replicas: int = Field(
        default=0, description="Machines still needed for full availability."
    )
    initialized: bool = Field(
        default=False, description="Whether the cluster's kubeconfig is available."
    )
    ready: bool = Field(
        default=False, description="Whether the API server became ready during provisioning."
    )
    failure_reason: str | None = Field(
        default=None, description="A terminal problem reconciling the control plane, for programs."
    )
    failure_message: str | None = Field(
        default=None, description="A terminal problem reconciling the control plane, for humans."
    )
    observed_generation: int = Field(
        default=0,
        description="The metadata.generation last reconciled (upstream's deferred patch sets it; "
        "its v0.2.0 schema lacks the field, so the API server dropped it).",
    )
    conditions: Conditions = Field(default_factory=list)


class OpenshiftAssistedControlPlane(CustomResource):
    """The control plane of an OpenShift cluster installed by the assisted installer."""

    resource: ClassVar[ResourceInfo] = _resource(
        "OpenshiftAssistedControlPlane",
        CONTROLPLANE_GROUP,
        has_status=True,
        scale=ScaleSubresource(
            spec_replicas_path=".spec.replicas",
            status_replicas_path=".status.replicas",
            label_selector_path=".status.selector",
        ),
        columns=(
            _CLUSTER_COLUMN,
            PrinterColumn("Initialized", PrinterColumnType.BOOLEAN, ".status.initialized"),
            PrinterColumn("API Server Available", PrinterColumnType.BOOLEAN, ".status.ready"),
            PrinterColumn("Desired", PrinterColumnType.INTEGER, ".spec.replicas", 10),
            PrinterColumn("Replicas", PrinterColumnType.INTEGER, ".status.replicas"),
            PrinterColumn("Ready", PrinterColumnType.INTEGER, ".status.readyReplicas"),
            PrinterColumn("Updated", PrinterColumnType.INTEGER, ".status.updatedReplicas"),
            PrinterColumn("Unavailable", PrinterColumnType.INTEGER, ".status.unavailableReplicas"),
            PrinterColumn("Age", PrinterColumnType.DATE, ".metadata.creationTimestamp"),
            PrinterColumn("Version", PrinterColumnType.STRING, ".spec.version"),
        ),
    )

    api_version: Literal["controlplane.cluster.x-k8s.io/v1alpha1"] = (
        "controlplane.cluster.x-k8s.io/v1alpha1"
    )
    kind: Literal["OpenshiftAssistedControlPlane"] = "OpenshiftAssistedControlPlane"
    spec: OpenshiftAssistedControlPlaneSpec
    status: OpenshiftAssistedControlPlaneStatus = Field(
        default_factory=OpenshiftAssistedControlPlaneStatus
    )


#: The OpenShift Assisted kinds, in the order CRDs are generated and applied.
RESOURCES: tuple[type[CustomResource], ...] = (
    OpenshiftAssistedConfig,
    OpenshiftAssistedConfigTemplate,
    OpenshiftAssistedControlPlane,
)
