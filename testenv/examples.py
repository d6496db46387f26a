"""Example objects that tests and the benchmark create on the local stack."""

from __future__ import annotations

from typing import Any

from shared.kube import ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    MACHINE_DEPLOYMENT,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE_TEMPLATE,
)


def cluster_manifest(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """A minimal valid Azimuth ``Cluster``; keyword arguments override or extend its spec."""
    return {
        "apiVersion": CLUSTER.api_version,
        "kind": CLUSTER.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "label": name,
            "templateName": "kube-1-34",
            "cloudCredentialsSecretName": "creds",
            "controlPlaneMachineSize": "small",
            "nodeGroups": [{"name": "md-0", "machineSize": "small", "count": 1}],
            **spec,
        },
    }


#: the names of metal-stack's vagrant lab, as the examples of upstream
#: cluster-api-provider-metalstack (``docs/resources/*.md``) use them
METALSTACK_PROJECT = "00000000-0000-0000-0000-000000000000"
METALSTACK_PARTITION = "vagrant"
METALSTACK_PUBLIC_NETWORK = "internet-vagrant-lab"
METALSTACK_IMAGE = "ubuntu-cloud-init-20.04"
METALSTACK_FIREWALL_IMAGE = "firewall-ubuntu-2.0"
METALSTACK_SIZE = "v1-small-x86"
KUBERNETES_VERSION = "v1.31.2"

_METALSTACK_KINDS = {
    kind.kind: kind
    for kind in (
        CAPI_CLUSTER,
        CONTROL_PLANE,
        MACHINE_DEPLOYMENT,
        METALSTACK_CLUSTER,
        METALSTACK_MACHINE_TEMPLATE,
    )
}


def metalstack_cluster(
    namespace: str,
    name: str,
    *,
    control_planes: int = 1,
    workers: int = 1,
    image: str = METALSTACK_IMAGE,
    size: str = METALSTACK_SIZE,
    firewall_image: str = METALSTACK_FIREWALL_IMAGE,
    firewall_size: str = METALSTACK_SIZE,
    project_id: str = METALSTACK_PROJECT,
    partition: str = METALSTACK_PARTITION,
    public_network_id: str = METALSTACK_PUBLIC_NETWORK,
    version: str = KUBERNETES_VERSION,
) -> list[dict[str, Any]]:
    """The objects of a Cluster API cluster on metal-stack, in creation order: what a
    cluster template renders (``docs/metalstack.md``), shaped as the upstream examples.

    The CAPI ``Cluster`` ``name``, its ``MetalStackCluster`` ``name`` (no label, no owner:
    CAPI core adds both), a KubeadmControlPlane ``<name>-control-plane`` and a
    MachineDeployment ``<name>-md-0`` with ``control_planes`` and ``workers`` replicas, each
    cloning its own MetalStackMachineTemplate (``<name>-control-plane``, ``<name>-md-0``).
    The endpoint's host is left empty for the provider to allocate; its port is 6443, as the
    upstream template sets it. ``metalstack_kind`` gives each manifest's kind.
    """
    label = {"cluster.x-k8s.io/cluster-name": name}

    def obj(kind: ResourceKind, obj_name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
        metadata = {"name": obj_name, "namespace": namespace, **meta}
        return {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": metadata,
            "spec": spec,
        }

    def ref(kind: ResourceKind, ref_name: str) -> dict[str, str]:
        return {"apiVersion": kind.api_version, "kind": kind.kind, "name": ref_name}

    def template(template_name: str) -> dict[str, Any]:
        spec = {"template": {"spec": {"image": image, "machineType": size}}}
        return obj(METALSTACK_MACHINE_TEMPLATE, template_name, spec, labels=label)

    cp, md = f"{name}-control-plane", f"{name}-md-0"
    infra_spec = {
        "projectID": project_id,
        "partition": partition,
        "publicNetworkID": public_network_id,
        "controlPlaneEndpoint": {"host": "", "port": 6443},
        "firewallSpec": {"image": firewall_image, "machineType": firewall_size},
    }
    kcp_spec = {
        "version": version,
        "replicas": control_planes,
        "machineTemplate": {"infrastructureRef": ref(METALSTACK_MACHINE_TEMPLATE, cp)},
        "kubeadmConfigSpec": {},
    }
    md_spec = {
        "clusterName": name,
        "replicas": workers,
        "template": {
            "spec": {
                "clusterName": name,
                "version": version,
                "infrastructureRef": ref(METALSTACK_MACHINE_TEMPLATE, md),
            }
        },
    }
    cluster_spec = {
        "clusterNetwork": {"pods": {"cidrBlocks": ["10.240.0.0/12"]}},
        "controlPlaneRef": ref(CONTROL_PLANE, cp),
        "infrastructureRef": ref(METALSTACK_CLUSTER, name),
    }
    return [
        template(cp),
        template(md),
        obj(METALSTACK_CLUSTER, name, infra_spec),
        obj(CONTROL_PLANE, cp, kcp_spec, labels=label),
        obj(MACHINE_DEPLOYMENT, md, md_spec, labels=label),
        obj(CAPI_CLUSTER, name, cluster_spec),
    ]


def metalstack_kind(manifest: dict[str, Any]) -> ResourceKind:
    """The kind of one of ``metalstack_cluster``'s manifests, for ``KubeClient.create``."""
    return _METALSTACK_KINDS[manifest["kind"]]
