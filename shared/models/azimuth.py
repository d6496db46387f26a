"""Models of the ``azimuth.stackhpc.com/v1alpha1`` custom resources capibus owns.

These pydantic models are the single source of truth for three kinds: ``Cluster``
(namespaced, status subresource), ``ClusterTemplate`` (cluster-scoped, no status) and
``AppTemplate`` (cluster-scoped, status subresource). Services parse objects with them
(``Cluster.model_validate(obj)``) and ``shared.crdgen`` turns them into the
CustomResourceDefinitions, so a field added here reaches both without a second edit.

Design decisions, each mirroring the upstream azimuth-capi-operator unless noted:

* **Wire names are camelCase** (``alias_generator=to_camel``) while Python uses snake_case;
  ``populate_by_name`` accepts either on input and ``serialize_by_alias`` makes a plain
  ``model_dump()`` produce the API form, as upstream's ``dict()`` override did.
* **Defaults live here, not in the API server.** The CRD schema carries no ``default``: a
  server-side default rewrites stored objects on every read-modify-write and makes a later
  change of default a silent data migration. Parsing applies them instead, and status writers
  dump with ``exclude_defaults=True``, so readers must treat a missing key as its default.
* **Status models keep unknown keys** (``extra="allow"``) so a newer writer's fields survive
  a round trip through an older reader; the CRD marks them preserve-unknown to match.
* **Cross-field rules are declared once.** Upstream's node-group validators become CEL rules
  (``x-kubernetes-validations``) in the schema the API server enforces, and the pydantic
  validators raise the very same messages, so a user sees one wording from either side.
* **Patterns stay OpenAPI ``pattern``** (the API server enforces them and names the field),
  except the AppTemplate chart name, whose rule is CEL with a readable message. The SemVer
  range regex cannot move to CEL: ``matches()`` with it over an unbounded string exceeds the
  API server's static cost budget, and inventing a ``maxLength`` upstream lacks would reject
  objects upstream accepts.
* **Enums are ``StrEnum``** with upstream's exact values: they compare equal to the strings
  other controllers write, and an unknown phase fails loudly at parse time.
* ``Cluster.status.conditions`` is a capibus addition (standard Kubernetes condition shape)
  for reporting progress and errors; the Azimuth portal ignores it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

from shared import names

GROUP = "azimuth.stackhpc.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORIES = ("azimuth",)

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

# Chart names as upstream restricts them; checked by CEL in the CRD for a readable message.
CHART_NAME_PATTERN = r"^[a-z0-9-]+$"
# SemVer patterns from upstream (azimuth_capi/semver.py). They only use RE2-compatible syntax
# because the API server evaluates them with Go's regexp.
_SEMVER_ANY = r"v?\d+\.\d+\.\d+(?:-[a-zA-Z0-9.-]+)?(?:\+[a-zA-Z0-9.-]+)?"
_SEMVER_CONSTRAINT = r"(?:==|!=|>=?|<=?)" + _SEMVER_ANY
SEMVER_VERSION_PATTERN = rf"^{_SEMVER_ANY}$"
SEMVER_RANGE_PATTERN = rf"^{_SEMVER_CONSTRAINT}(?:,{_SEMVER_CONSTRAINT})*$"
#: The longest AppTemplate syncFrequency the CRD accepts: a year, in seconds.
SYNC_FREQUENCY_MAX = 366 * 86400

# The Kubernetes metav1.Condition patterns, so conditions written here pass any consumer.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


# --------------------------------------------------------------------------------------------
# Building blocks shared by every kind
# --------------------------------------------------------------------------------------------


class CelReason(StrEnum):
    """The ``reason`` values the API server accepts for a CEL rule."""

    REQUIRED = "FieldValueRequired"
    INVALID = "FieldValueInvalid"
    FORBIDDEN = "FieldValueForbidden"
    DUPLICATE = "FieldValueDuplicate"


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry, evaluated by the API server on every write.

    ``message_expression`` is CEL building the message (``message`` is the fallback when it
    fails); ``optional_old_self`` makes a transition rule run on create too, with ``oldSelf``
    an optional that has no value there.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: CelReason | None = None
    message_expression: str | None = None
    optional_old_self: bool = False

    def as_schema(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.message_expression is not None:
            entry["messageExpression"] = self.message_expression
        # fieldPath makes the error name the offending field, not the enclosing object.
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        if self.reason is not None:
            entry["reason"] = self.reason.value
        if self.optional_old_self:
            entry["optionalOldSelf"] = True
        return entry


def cel_schema(*rules: CelRule) -> dict[str, Any]:
    """JSON-schema extra carrying CEL rules, for ``ConfigDict(json_schema_extra=...)``."""
    return {"x-kubernetes-validations": [rule.as_schema() for rule in rules]}


def _pattern_as_cel(rule: CelRule) -> Callable[[dict[str, Any]], None]:
    """A field ``json_schema_extra`` that swaps the ``pattern`` keyword for a CEL rule.

    Pydantic still enforces the pattern; the CRD gets only the rule, so a bad value yields
    one error with a human message instead of two (regex dump plus message).
    """

    def apply(schema: dict[str, Any]) -> None:
        schema.pop("pattern", None)
        schema["x-kubernetes-validations"] = [rule.as_schema()]

    return apply


class Schema(BaseModel):
    """Base of every model: camelCase on the wire, validated on assignment too."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        # Services mutate status in memory before writing it; catch bad values there.
        validate_assignment=True,
    )


class PrinterColumnType(StrEnum):
    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    DATE = "date"


@dataclass(frozen=True)
class PrinterColumn:
    """An ``additionalPrinterColumns`` entry shown by ``kubectl get``."""

    name: str
    type: PrinterColumnType
    json_path: str
    priority: int = 0


class Scope(StrEnum):
    NAMESPACED = "Namespaced"
    CLUSTER = "Cluster"


@dataclass(frozen=True)
class ScaleSubresource:
    """The ``scale`` subresource: where ``kubectl scale`` and autoscalers read and write."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


@dataclass(frozen=True)
class ResourceInfo:
    """What a CRD needs beyond the schema: names, scope, subresources and columns."""

    kind: str
    scope: Scope
    has_status: bool
    printer_columns: tuple[PrinterColumn, ...] = ()
    #: CEL rules on the whole object (the only place ``self.metadata.name`` can be read)
    validations: tuple[CelRule, ...] = ()
    group: str = GROUP
    version: str = VERSION
    categories: tuple[str, ...] = CATEGORIES
    #: False: a ``status`` in the schema written on the object itself, without the subresource
    status_subresource: bool = True
    #: (key, value) labels on the CRD itself, such as Cluster API's contract label
    labels: tuple[tuple[str, str], ...] = ()
    #: ``kubectl`` abbreviations of the kind
    short_names: tuple[str, ...] = ()
    #: the scale subresource, for kinds that have replicas
    scale: ScaleSubresource | None = None

    # Upstream's naming rule: lower-case kind, plural with a trailing "s".
    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def plural(self) -> str:
        return f"{self.singular}s"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"


class ObjectMeta(Schema, extra="allow"):
    """Loose ``metadata``: the fields services use are typed, everything else is kept."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: dt.datetime | None = None
    deletion_timestamp: dt.datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[dict[str, Any]] = Field(default_factory=list)


class CustomResource(Schema):
    """A whole object (apiVersion, kind, metadata, spec and, for some kinds, status)."""

    resource: ClassVar[ResourceInfo]

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


# --------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------

COUNT_REQUIRED = "count is required when autoscale is false"
MIN_COUNT_REQUIRED = "minCount is required when autoscale is true"
MAX_COUNT_REQUIRED = "maxCount is required when autoscale is true"
MAX_COUNT_BELOW_MIN = "maxCount must be greater than or equal to minCount"

# has() is false for absent and for null fields alike, so optional fields need no null checks.
_AUTOSCALING = "(has(self.autoscale) && self.autoscale)"
NODE_GROUP_RULES = (
    CelRule(f"{_AUTOSCALING} || has(self.count)", COUNT_REQUIRED, ".count", CelReason.REQUIRED),
    CelRule(
        f"!{_AUTOSCALING} || has(self.minCount)",
        MIN_COUNT_REQUIRED,
        ".minCount",
        CelReason.REQUIRED,
    ),
    CelRule(
        f"!{_AUTOSCALING} || has(self.maxCount)",
        MAX_COUNT_REQUIRED,
        ".maxCount",
        CelReason.REQUIRED,
    ),
    # Upstream only compares the bounds of an autoscaling group; keep that exact semantics.
    CelRule(
        f"!{_AUTOSCALING} || !has(self.minCount) || !has(self.maxCount)"
        " || self.maxCount >= self.minCount",
        MAX_COUNT_BELOW_MIN,
        ".maxCount",
        CelReason.INVALID,
    ),
)


class NodeGroupSpec(Schema):
    """A group of identically sized worker nodes."""

    model_config = ConfigDict(json_schema_extra=cel_schema(*NODE_GROUP_RULES))

    name: NonEmptyStr = Field(description="The name of the node group.")
    machine_size: NonEmptyStr = Field(
        description="The name of the size (flavor) to use for the machines in the group."
    )
    # Declared before the counts: their validators read it from the already-validated data.
    autoscale: bool = Field(default=False, description="Whether the node group autoscales.")
    count: int | None = Field(
        default=None,
        ge=0,
        validate_default=True,
        description="The fixed number of nodes when not autoscaling.",
    )
    min_count: int | None = Field(
        default=None,
        ge=1,
        validate_default=True,
        description="The minimum number of nodes when autoscaling.",
    )
    max_count: int | None = Field(
        default=None,
        ge=1,
        validate_default=True,
        description="The maximum number of nodes when autoscaling.",
    )

    @field_validator("count")
    @classmethod
    def _count_unless_autoscaling(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None and not info.data.get("autoscale", False):
            raise ValueError(COUNT_REQUIRED)
        return value

    @field_validator("min_count")
    @classmethod
    def _min_count_if_autoscaling(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None and info.data.get("autoscale", False):
            raise ValueError(MIN_COUNT_REQUIRED)
        return value

    @field_validator("max_count")
    @classmethod
    def _max_count_if_autoscaling(cls, value: int | None, info: ValidationInfo) -> int | None:
        if not info.data.get("autoscale", False):
            return value
        if value is None:
            raise ValueError(MAX_COUNT_REQUIRED)
        min_count = info.data.get("min_count")
        if min_count is not None and value < min_count:
            raise ValueError(MAX_COUNT_BELOW_MIN)
        return value


class AddonsSpec(Schema):
    """Optional addons for the cluster."""

    dashboard: bool = Field(
        default=False,
        description="Retired and ignored; kept so that older Azimuth versions validate.",
    )
    ingress: bool = Field(default=False, description="Whether ingress is enabled.")
    ingress_controller_load_balancer_ip: ipaddress.IPv4Address | None = Field(
        default=None,
        description="The IP address to use for the ingress controller load balancer.",
    )
    monitoring: bool = Field(default=False, description="Whether monitoring is enabled.")
    monitoring_alertmanager_volume_size: int = Field(
        default=10, gt=0, description="The size of the Alertmanager volume, in GB."
    )
    monitoring_prometheus_volume_size: int = Field(
        default=10, gt=0, description="The size of the Prometheus volume, in GB."
    )
    monitoring_loki_volume_size: int = Field(
        default=10, gt=0, description="The size of the Loki volume, in GB."
    )


class ClusterSpec(Schema):
    """The desired state of an Azimuth Kubernetes cluster."""

    label: NonEmptyStr = Field(description="The human-readable name of the cluster.")
    template_name: NonEmptyStr = Field(
        description="The name of the (cluster-scoped) ClusterTemplate to use."
    )
    cloud_credentials_secret_name: NonEmptyStr = Field(
        description="The Secret in the same namespace holding the cloud credentials."
    )
    zenith_identity_realm_name: NonEmptyStr | None = Field(
        default=None,
        description=(
            "The identity Realm to use for Zenith services. "
            "If not given, the first Realm found in the namespace is used."
        ),
    )
    lease_name: NonEmptyStr | None = Field(
        default=None, description="The scheduling Lease to use for the cluster, if any."
    )
    paused: bool = Field(default=False, description="Whether reconciliation is paused.")
    autohealing: bool = Field(default=True, description="Whether auto-healing is enabled.")
    control_plane_machine_size: NonEmptyStr = Field(
        description="The name of the size (flavor) to use for control plane machines."
    )
    node_groups: list[NodeGroupSpec] = Field(
        default_factory=list, description="The worker node groups of the cluster."
    )
    addons: AddonsSpec = Field(
        default_factory=AddonsSpec, description="The optional addons of the cluster."
    )
    created_by_username: str | None = Field(
        default=None, description="Username of the user that created the cluster."
    )
    created_by_user_id: str | None = Field(
        default=None, description="User id of the user that created the cluster."
    )
    updated_by_username: str | None = Field(
        default=None, description="Username of the user that last updated the cluster."
    )
    updated_by_user_id: str | None = Field(
        default=None, description="User id of the user that last updated the cluster."
    )


class ClusterPhase(StrEnum):
    """The overall phase of the cluster."""

    PENDING = "Pending"
    RECONCILING = "Reconciling"
    UPGRADING = "Upgrading"
    READY = "Ready"
    DELETING = "Deleting"
    UNHEALTHY = "Unhealthy"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class LeasePhase(StrEnum):
    """The phase of the scheduling Lease of the cluster."""

    CREATING = "Creating"
    PENDING = "Pending"
    STARTING = "Starting"
    ACTIVE = "Active"
    UPDATING = "Updating"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    DELETING = "Deleting"
    ERROR = "Error"
    UNKNOWN = "Unknown"


class NetworkingPhase(StrEnum):
    """The phase of the cluster networking (the Cluster API Cluster phase)."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    DELETING = "Deleting"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class ControlPlanePhase(StrEnum):
    """The phase of the control plane."""

    PENDING = "Pending"
    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"
    UPGRADING = "Upgrading"
    READY = "Ready"
    DELETING = "Deleting"
    UNHEALTHY = "Unhealthy"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class NodePhase(StrEnum):
    """The phase of a node."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DELETING = "Deleting"
    DELETED = "Deleted"
    UNHEALTHY = "Unhealthy"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class AddonPhase(StrEnum):
    """The phase of an addon."""

    UNKNOWN = "Unknown"
    PENDING = "Pending"
    PREPARING = "Preparing"
    DEPLOYED = "Deployed"
    FAILED = "Failed"
    INSTALLING = "Installing"
    UPGRADING = "Upgrading"
    UNINSTALLING = "Uninstalling"


class NodeRole(StrEnum):
    """The role of a node."""

    CONTROL_PLANE = "control-plane"
    WORKER = "worker"
    UNKNOWN = "Unknown"


class ConditionStatus(StrEnum):
    """The status of a Kubernetes condition."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class NodeStatus(Schema):
    """The observed state of one node (one Cluster API Machine)."""

    role: NodeRole = Field(default=NodeRole.UNKNOWN, description="The role of the node.")
    phase: NodePhase = Field(default=NodePhase.UNKNOWN, description="The phase of the node.")
    size: NonEmptyStr | None = Field(
        default=None, description="The name of the size (flavor) of the machine."
    )
    ip: str | None = Field(default=None, description="The first internal IP of the node.")
    ips: list[str] = Field(default_factory=list, description="The internal IPs of the node.")
    kubelet_version: str | None = Field(
        default=None, description="The kubelet version of the node."
    )
    node_group: str | None = Field(
        default=None, description="The node group of the node; only set for workers."
    )
    created: dt.datetime | None = Field(default=None, description="When the node was created.")


class AddonStatus(Schema):
    """The observed state of one addon."""

    phase: AddonPhase = Field(default=AddonPhase.UNKNOWN, description="The phase of the addon.")
    revision: int = Field(default=0, ge=0, description="The revision of the addon release.")


class ServiceStatus(Schema):
    """A Zenith service exposed by one of the cluster's addons."""

    subdomain: NonEmptyStr = Field(description="The Zenith subdomain of the service.")
    fqdn: NonEmptyStr = Field(description="The FQDN of the service.")
    label: NonEmptyStr = Field(description="A human-readable label for the service.")
    icon_url: AnyHttpUrl | None = Field(
        default=None, description="A URL of an icon for the service."
    )
    description: str | None = Field(default=None, description="A brief description of the service.")


class Condition(Schema):
    """A standard Kubernetes condition (the shape of metav1.Condition)."""

    type: str = Field(
        min_length=1,
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description="The type of the condition, in CamelCase.",
    )
    status: ConditionStatus = Field(description="The status of the condition.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="A programmatic, CamelCase reason for the last transition.",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="A human-readable message about the last transition.",
    )
    last_transition_time: dt.datetime = Field(description="When the condition last changed status.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was set for."
    )


class ClusterStatus(Schema, extra="allow"):
    """The observed state of the cluster."""

    kubernetes_version: str | None = Field(
        default=None, description="The Kubernetes version of the cluster, if known."
    )
    kubeconfig_secret_name: str | None = Field(
        default=None, description="The Secret holding the kubeconfig, if known."
    )
    phase: ClusterPhase = Field(
        default=ClusterPhase.UNKNOWN, description="The overall phase of the cluster."
    )
    lease_phase: LeasePhase = Field(
        default=LeasePhase.UNKNOWN, description="The phase of the Lease of the cluster."
    )
    networking_phase: NetworkingPhase = Field(
        default=NetworkingPhase.UNKNOWN, description="The phase of the networking."
    )
    control_plane_phase: ControlPlanePhase = Field(
        default=ControlPlanePhase.UNKNOWN, description="The phase of the control plane."
    )
    node_count: int = Field(default=0, description="The number of nodes in the cluster.")
    nodes: dict[str, NodeStatus] = Field(
        default_factory=dict, description="The nodes of the cluster, by node name."
    )
    addon_count: int = Field(default=0, description="The number of addons of the cluster.")
    addons: dict[str, AddonStatus] = Field(
        default_factory=dict, description="The addons of the cluster, by component name."
    )
    services: dict[str, ServiceStatus] = Field(
        default_factory=dict, description="The Zenith services of the cluster, by name."
    )
    last_updated: dt.datetime | None = Field(
        default=None,
        description="Start of the current non-terminal period; drives the timeout.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="capibus progress and error conditions; ignored by the Azimuth portal.",
        # A map keyed by type lets server-side apply merge conditions per type.
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


def _cluster_name_rule() -> CelRule:
    """A new Cluster's name fits every name derived from it (``shared.names``), in the same
    words as the admission webhook.

    Only on create: a rule on the root runs on every update too (finalizer removal, status
    writes), and a Cluster created before the rule existed must still be deletable. With
    ``optionalOldSelf`` the rule also runs on create, where ``oldSelf`` has no value; on any
    update it has one and the rule holds. Needs Kubernetes 1.30 or later.
    """
    # format(), not string(size(...)) + ...: the API server cannot bound the size of an int
    # turned into a string, and refuses the concatenation as over its cost budget.
    template = json.dumps(names.length_problem("%d"))
    return CelRule(
        rule=f"oldSelf.hasValue() || size(self.metadata.name) <= {names.MAX_LENGTH}",
        message=names.length_problem(f"more than {names.MAX_LENGTH}"),
        message_expression=f"{template}.format([size(self.metadata.name)])",
        reason=CelReason.INVALID,
        optional_old_self=True,
    )


class Cluster(CustomResource):
    """An Azimuth Kubernetes cluster."""

    resource: ClassVar[ResourceInfo] = ResourceInfo(
        kind="Cluster",
        scope=Scope.NAMESPACED,
        has_status=True,
        validations=(_cluster_name_rule(),),
        printer_columns=(
            PrinterColumn("Label", PrinterColumnType.STRING, ".spec.label"),
            PrinterColumn("Template", PrinterColumnType.STRING, ".spec.templateName"),
            PrinterColumn(
                "Kubernetes Version", PrinterColumnType.STRING, ".status.kubernetesVersion"
            ),
            PrinterColumn("Paused", PrinterColumnType.BOOLEAN, ".spec.paused"),
            PrinterColumn("Phase", PrinterColumnType.STRING, ".status.phase"),
            PrinterColumn(
                "Control Plane", PrinterColumnType.STRING, ".status.controlPlanePhase", 1
            ),
            PrinterColumn("Node Count", PrinterColumnType.INTEGER, ".status.nodeCount"),
            PrinterColumn("Addon Count", PrinterColumnType.INTEGER, ".status.addonCount", 1),
        ),
    )

    api_version: Literal["azimuth.stackhpc.com/v1alpha1"] = "azimuth.stackhpc.com/v1alpha1"
    kind: Literal["Cluster"] = "Cluster"
    spec: ClusterSpec
    status: ClusterStatus = Field(default_factory=ClusterStatus)


# --------------------------------------------------------------------------------------------
# ClusterTemplate
# --------------------------------------------------------------------------------------------


class ClusterTemplateValues(Schema, extra="allow"):
    """Helm values for the cluster chart; keys beyond these pass straight through."""

    kubernetes_version: NonEmptyStr = Field(
        description="The Kubernetes version that will be deployed."
    )
    machine_image_id: NonEmptyStr = Field(
        description="The ID of the image to use for cluster machines."
    )


class ClusterTemplateSpec(Schema):
    """The definition of a cluster template: its presentation and its Helm values."""

    label: NonEmptyStr = Field(description="The human-readable name of the template.")
    deprecated: bool = Field(default=False, description="Whether the template is deprecated.")
    description: NonEmptyStr = Field(
        description="A brief description of clusters deployed with the template."
    )
    tags: list[NonEmptyStr] = Field(
        default_factory=list, description="Tags for clusters deployed with the template."
    )
    values: ClusterTemplateValues = Field(
        description="The values to use when deploying the Helm chart."
    )


class ClusterTemplate(CustomResource):
    """An Azimuth cluster template."""

    resource: ClassVar[ResourceInfo] = ResourceInfo(
        kind="ClusterTemplate",
        scope=Scope.CLUSTER,
        has_status=False,
        printer_columns=(
            PrinterColumn("Label", PrinterColumnType.STRING, ".spec.label"),
            PrinterColumn(
                "Kubernetes Version",
                PrinterColumnType.STRING,
                ".spec.values.kubernetesVersion",
            ),
            PrinterColumn("Deprecated", PrinterColumnType.BOOLEAN, ".spec.deprecated"),
        ),
    )

    api_version: Literal["azimuth.stackhpc.com/v1alpha1"] = "azimuth.stackhpc.com/v1alpha1"
    kind: Literal["ClusterTemplate"] = "ClusterTemplate"
    spec: ClusterTemplateSpec


# --------------------------------------------------------------------------------------------
# AppTemplate
# --------------------------------------------------------------------------------------------

CHART_NAME_INVALID = "chart name must consist only of lower-case letters, digits and '-'"


class AppTemplateChartSpec(Schema):
    """The Helm chart behind an app template."""

    repo: AnyHttpUrl = Field(description="The Helm repository that holds the chart.")
    name: str = Field(
        pattern=CHART_NAME_PATTERN,
        description="The name of the chart.",
        json_schema_extra=_pattern_as_cel(
            CelRule(f"self.matches('{CHART_NAME_PATTERN}')", CHART_NAME_INVALID)
        ),
    )


class AppTemplateSpec(Schema):
    """The desired state of an app template: which chart, which versions, how often."""

    chart: AppTemplateChartSpec = Field(description="The chart to use for the app.")
    label: str = Field(default="", description="The human-readable label; defaults to the chart's.")
    logo: str = Field(default="", description="The URL of the logo; defaults to the chart's.")
    description: str = Field(
        default="", description="A short description; defaults to the chart's."
    )
    # Kept as an OpenAPI pattern: as CEL, matches() with this long regex over an unbounded
    # string exceeds the API server's static cost budget and the CRD would be rejected.
    version_range: str = Field(
        default=">=0.0.0",
        pattern=SEMVER_RANGE_PATTERN,
        description=(
            "The range of versions to make available: comma-separated constraints, each an "
            "operator (==, !=, >, >=, <, <=) followed by a version."
        ),
    )
    keep_versions: int = Field(default=5, gt=0, description="The number of versions to keep.")
    # The maximum is in the CRD only: a value stored before it existed must still parse, and
    # the catalog clamps it (a larger one would overflow its date arithmetic).
    sync_frequency: int = Field(
        default=86400,
        gt=0,
        description="Seconds between synchronisations of the versions (at most a year).",
        json_schema_extra={"maximum": SYNC_FREQUENCY_MAX},
    )
    default_values: dict[str, Any] = Field(
        default_factory=dict,
        description="Default values for deployments of the app, on top of the chart's.",
    )


class AppTemplateVersion(Schema):
    """One available version of an app template."""

    name: str = Field(pattern=SEMVER_VERSION_PATTERN, description="The SemVer version.")
    values_schema: dict[str, Any] = Field(
        default_factory=dict, description="The JSON schema for the chart values."
    )
    ui_schema: dict[str, Any] = Field(
        default_factory=dict, description="The schema for rendering the user interface."
    )


class AppTemplateStatus(Schema, extra="allow"):
    """The observed state of an app template."""

    label: NonEmptyStr | None = Field(default=None, description="The effective label.")
    logo: NonEmptyStr | None = Field(default=None, description="The effective logo URL.")
    description: NonEmptyStr | None = Field(default=None, description="The effective description.")
    versions: list[AppTemplateVersion] = Field(
        default_factory=list, description="The available versions, newest first."
    )
    last_sync: dt.datetime | None = Field(
        default=None, description="When the versions were last synchronised successfully."
    )
    # capibus additions: the catalog service schedules the next sync from these and reports
    # failures here instead of leaving an unchanged status behind; the portal ignores them.
    last_attempt: dt.datetime | None = Field(
        default=None,
        description=(
            "When a synchronisation last concluded, successfully or not; the next one is due "
            "syncFrequency seconds later. A repository that could not be reached is retried "
            "sooner and does not move it."
        ),
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the last attempt was for."
    )
    chart: AppTemplateChartSpec | None = Field(
        default=None,
        description=(
            "The chart the versions were read from; they are reused only while spec.chart "
            "names the same one."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="capibus conditions (Synced); ignored by the Azimuth portal.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


class AppTemplate(CustomResource):
    """An Azimuth Kubernetes app template."""

    resource: ClassVar[ResourceInfo] = ResourceInfo(
        kind="AppTemplate",
        scope=Scope.CLUSTER,
        has_status=True,
        printer_columns=(
            PrinterColumn("Chart name", PrinterColumnType.STRING, ".spec.chart.name"),
            PrinterColumn("Version range", PrinterColumnType.STRING, ".spec.versionRange"),
            PrinterColumn("Keep versions", PrinterColumnType.INTEGER, ".spec.keepVersions", 1),
            PrinterColumn("Sync freq.", PrinterColumnType.INTEGER, ".spec.syncFrequency", 1),
            PrinterColumn("Label", PrinterColumnType.STRING, ".status.label"),
            PrinterColumn("Last sync", PrinterColumnType.DATE, ".status.lastSync"),
        ),
    )

    api_version: Literal["azimuth.stackhpc.com/v1alpha1"] = "azimuth.stackhpc.com/v1alpha1"
    kind: Literal["AppTemplate"] = "AppTemplate"
    spec: AppTemplateSpec
    status: AppTemplateStatus = Field(default_factory=AppTemplateStatus)


#: Every kind capibus owns, in the order CRDs are generated and applied.
RESOURCES: tuple[type[CustomResource], ...] = (Cluster, ClusterTemplate, AppTemplate)
