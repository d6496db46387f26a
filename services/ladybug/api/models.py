"""The REST API's request and response models: upstream's JSON shapes, and the source of the
OpenAPI document.

FastAPI reads the handlers' parameter and return types, so these models are at once what a
request is parsed into, what a response is serialised from, and the schemas of the OpenAPI
document (upstream's Swagger page, generated there from Go comments that could drift from the
code; here it cannot). Shapes follow ``src/core/app/const.go`` and ``src/core/model/types.go``
of cloud-barista/cb-ladybug, field order included, with one deliberate difference: ``Node``
has no ``credential`` (upstream returns each node's SSH private key).

Requests are lenient as Go's JSON decoding is: unknown keys are ignored, a missing key or
``null`` is the zero value, so every rule and its message is upstream's validation
(``services.ladybug.logic``), not a schema error. A value of the wrong type (``"count": "x"``)
is a 400 ``Status``, as Echo's ``Bind`` answers it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    """camelCase on the wire; ``null`` members dropped so they take their defaults."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="ignore",
    )

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_zero(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


# --- requests ---------------------------------------------------------------------------------


class RootDiskReq(Wire):
    type: str = Field("", examples=["default"], description="Default: default")
    size: str = Field("", examples=["default"], description="GB; default: default")


class NodeSetReq(Wire):
    connection: str = Field("", examples=["config-aws-ap-northeast-2"])
    count: int = Field(0, examples=[3])
    spec: str = Field("", examples=["t2.medium"])
    root_disk: RootDiskReq = Field(default_factory=RootDiskReq)
    role: str = Field("", description="The AWS IAM role (single-cloud CCM only)")


class NfsReq(Wire):
    server: str = Field("", examples=["163.154.154.89"])
    path: str = Field("", examples=["/nfs/data"])


class StorageClassReq(Wire):
    nfs: NfsReq = Field(default_factory=NfsReq)


class ClusterConfigKubernetesReq(Wire):
    version: str = Field("", examples=["1.23.13"], description="Default: 1.23.13")
    network_cni: str = Field(
        "", examples=["kilo"], description="canal, kilo (multi); flannel, calico (single)"
    )
    pod_cidr: str = Field("", examples=["10.244.0.0/16"])
    service_cidr: str = Field("", examples=["10.96.0.0/12"])
    service_dns_domain: str = Field("", examples=["cluster.local"])
    storageclass: StorageClassReq = Field(default_factory=StorageClassReq)
    loadbalancer: str = Field("", examples=["haproxy"], description="haproxy (default) or nlb")
    etcd: str = Field("", examples=["local"], description="local (default) or external")


class ClusterConfigReq(Wire):
    install_mon_agent: str = Field("", examples=["no"], description="Default: no")
    kubernetes: ClusterConfigKubernetesReq = Field(default_factory=ClusterConfigKubernetesReq)


class ClusterReq(Wire):
    name: str = Field("", examples=["cluster-01"])
    control_plane: list[NodeSetReq] = Field(default_factory=list)
    worker: list[NodeSetReq] = Field(default_factory=list)
    service_type: str = Field("", examples=["multi"], description="multi (default) or single")
    config: ClusterConfigReq = Field(default_factory=ClusterConfigReq)
    label: str = ""
    description: str = ""


class NodeReq(Wire):
    control_plane: list[NodeSetReq] = Field(
        default_factory=list, description="Not supported: must be empty"
    )
    worker: list[NodeSetReq] = Field(default_factory=list)


# --- responses --------------------------------------------------------------------------------


class Status(Wire):
    kind: Literal["Status"] = "Status"
    code: int
    message: str = Field(examples=["Any message"])


class ClusterStatus(Wire):
    phase: str = Field(description="Pending, Provisioning, Provisioned, Failed, Deleting")
    reason: str = ""
    message: str = ""


class Node(Wire):
    """A VM of the cluster. Unlike upstream, never its SSH private key (``credential``)."""

    name: str
    kind: Literal["Node"] = "Node"
    public_ip: str = ""
    private_ip: str = ""
    role: str = Field("", description="control-plane or worker")
    spec: str = ""
    csp: str = ""
    created_time: str = Field("", examples=["2022-01-02T12:00:00Z"])
    csp_label: str = ""
    region_label: str = ""
    zone_label: str = ""


class Cluster(Wire):
    name: str
    kind: Literal["Cluster"] = "Cluster"
    status: ClusterStatus
    mcis: str = ""
    namespace: str = ""
    k8s_version: str = Field("", alias="k8sVersion", examples=["1.23.13-00"])
    cluster_config: str = Field("", description="The admin kubeconfig, once provisioned")
    cp_leader: str = ""
    cp_group: str = ""
    network_cni: str = ""
    label: str = ""
    install_mon_agent: str = ""
    loadbalancer: str = ""
    etcd: str = ""
    description: str = ""
    created_time: str = Field("", examples=["2022-01-02T12:00:00Z"])
    service_type: str = ""
    nodes: list[Node] = Field(default_factory=list)


class ClusterList(Wire):
    kind: Literal["ClusterList"] = "ClusterList"
    items: list[Cluster] = Field(default_factory=list)


class NodeList(Wire):
    kind: Literal["NodeList"] = "NodeList"
    items: list[Node] = Field(default_factory=list)


class SpecCpu(Wire):
    count: str
    clock: str = Field("", description="GHz")


class Spec(Wire):
    name: str
    memory: str = Field(description="GiB")
    cpu: SpecCpu


class SpecList(Wire):
    kind: Literal["specList"] = "specList"
    connection_name: str
    items: list[Spec] = Field(default_factory=list)
