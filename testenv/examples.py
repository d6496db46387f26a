"""Example objects that tests and the benchmark create on the local stack."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from typing import Any

from shared.kube import ResourceKind
from shared.resources import (
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    LEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    METAL3_CLUSTER,
    METAL3_MACHINE_TEMPLATE,
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE_TEMPLATE,
    OIDC_CLIENT,
    OPENSHIFT_ASSISTED_CONFIG_TEMPLATE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    PLATFORM,
    SECRET,
)

DEPLOYMENT = ResourceKind("deployment", "apps", "v1", "Deployment", "deployments")
OSM_TEMPLATE = ResourceKind(
    "openstackmachinetemplate",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackMachineTemplate",
    "openstackmachinetemplates",
)
#: every kind an Azimuth Cluster's life creates in its namespace (the chart's objects, the
#: addons, identity's, the Lease, the stand-ins' Deployments): none may be left after delete
CLUSTER_LIFE_KINDS = (
    CLUSTER,
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    OPENSTACK_CLUSTER,
    OPENSTACK_MACHINE,
    OSM_TEMPLATE,
    HELM_RELEASE,
    MANIFESTS,
    OIDC_CLIENT,
    PLATFORM,
    LEASE,
    DEPLOYMENT,
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


# --- OpenShift Assisted on metal3 (docs/assisted.md) ----------------------------------------

#: as in the upstream examples of cluster-api-provider-openshift-assisted
#: (``examples/``): an OpenShift release and a domain nobody owns
ASSISTED_VERSION = "4.16.0"
ASSISTED_BASE_DOMAIN = "example.test"
ASSISTED_RELEASE_IMAGE = "quay.io/openshift-release-dev/ocp-release:4.16.0-x86_64"
#: boot MACs of seeded hosts are locally administered ``02:…``; the host stand-in's
#: ``mac-mismatch`` fault reports ``06:…``, which no seeded host has
BMH_MAC_PREFIX = "02"

_ASSISTED_KINDS = {
    kind.kind: kind
    for kind in (
        CAPI_CLUSTER,
        MACHINE_DEPLOYMENT,
        METAL3_CLUSTER,
        METAL3_MACHINE_TEMPLATE,
        OPENSHIFT_ASSISTED_CONFIG_TEMPLATE,
        OPENSHIFT_ASSISTED_CONTROL_PLANE,
        BARE_METAL_HOST,
        SECRET,
    )
}


def _manifest(
    kind: ResourceKind, namespace: str, name: str, spec: dict[str, Any], **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": spec,
    }


def _ref(kind: ResourceKind, name: str) -> dict[str, str]:
    return {"apiVersion": kind.api_version, "kind": kind.kind, "name": name}


def pull_secret(namespace: str, name: str) -> dict[str, Any]:
    """A pull secret of the shape console.redhat.com hands out (``.dockerconfigjson`` with
    ``auths``), with a made-up credential."""
    auth = base64.b64encode(b"capibus:not-a-real-token").decode()
    config = {"auths": {"cloud.openshift.com": {"auth": auth, "email": "capibus@example.test"}}}
    value = base64.b64encode(json.dumps(config).encode()).decode()
    return {
        "apiVersion": SECRET.api_version,
        "kind": SECRET.kind,
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": name, "namespace": namespace},
        "data": {".dockerconfigjson": value},
    }


def assisted_cluster(
    namespace: str,
    name: str,
    control_planes: int = 3,
    workers: int = 2,
    version: str = ASSISTED_VERSION,
    *,
    ssh_authorized_key: str | None = None,
    endpoint: str | None = None,
) -> list[dict[str, Any]]:
    """The objects of an OpenShift cluster installed by OpenShift Assisted on metal3, in
    creation order, shaped as the upstream examples (``examples/`` of
    cluster-api-provider-openshift-assisted v0.2.0).

    The pull secret ``<name>-pull-secret``; Metal3MachineTemplates ``<name>-control-plane``
    and ``<name>-workers`` (no image: the bootstrap provider writes the ISO URL into them); the
    ``Metal3Cluster`` ``name`` with its endpoint (the API VIP: ``endpoint``, default
    ``api.<name>.example.test``, port 6443); the worker OpenshiftAssistedConfigTemplate
    ``<name>-workers``; the OpenshiftAssistedControlPlane ``<name>-control-plane`` (no
    ``config.pullSecretRef``: the provider makes its placeholder); the MachineDeployment
    ``<name>-md-0``; and the CAPI ``Cluster`` ``name`` with OpenShift's default networks.
    Both config specs name the pull secret, which their InfraEnvs need. ``bare_metal_hosts``
    seeds the hosts; ``assisted_kind`` gives each manifest's kind.
    """
    label = {"cluster.x-k8s.io/cluster-name": name}
    cp, workers_name, md = f"{name}-control-plane", f"{name}-workers", f"{name}-md-0"
    secret = f"{name}-pull-secret"
    config_spec: dict[str, Any] = {"cpuArchitecture": "x86_64", "pullSecretRef": {"name": secret}}
    if ssh_authorized_key:
        config_spec["sshAuthorizedKey"] = ssh_authorized_key

    def template(template_name: str) -> dict[str, Any]:
        spec = {"template": {"spec": {"automatedCleaningMode": "disabled"}}}
        return _manifest(METAL3_MACHINE_TEMPLATE, namespace, template_name, spec, labels=label)

    m3c_spec = {
        "controlPlaneEndpoint": {
            "host": endpoint or f"api.{name}.{ASSISTED_BASE_DOMAIN}",
            "port": 6443,
        },
        "noCloudProvider": True,
    }
    acp_spec = {
        "replicas": control_planes,
        "version": version,
        "config": {"baseDomain": ASSISTED_BASE_DOMAIN, "releaseImage": ASSISTED_RELEASE_IMAGE},
        "openshiftAssistedConfigSpec": dict(config_spec),
        "machineTemplate": {"infrastructureRef": _ref(METAL3_MACHINE_TEMPLATE, cp)},
    }
    md_spec = {
        "clusterName": name,
        "replicas": workers,
        "template": {
            "spec": {
                "clusterName": name,
                "version": version,
                "bootstrap": {"configRef": _ref(OPENSHIFT_ASSISTED_CONFIG_TEMPLATE, workers_name)},
                "infrastructureRef": _ref(METAL3_MACHINE_TEMPLATE, workers_name),
            }
        },
    }
    cluster_spec = {
        "clusterNetwork": {
            "pods": {"cidrBlocks": ["10.128.0.0/14"]},
            "services": {"cidrBlocks": ["172.30.0.0/16"]},
        },
        "controlPlaneRef": _ref(OPENSHIFT_ASSISTED_CONTROL_PLANE, cp),
        "infrastructureRef": _ref(METAL3_CLUSTER, name),
    }
    oact_spec = {"template": {"spec": dict(config_spec)}}
    return [
        pull_secret(namespace, secret),
        template(cp),
        template(workers_name),
        _manifest(METAL3_CLUSTER, namespace, name, m3c_spec),
        _manifest(
            OPENSHIFT_ASSISTED_CONFIG_TEMPLATE, namespace, workers_name, oact_spec, labels=label
        ),
        _manifest(OPENSHIFT_ASSISTED_CONTROL_PLANE, namespace, cp, acp_spec, labels=label),
        _manifest(MACHINE_DEPLOYMENT, namespace, md, md_spec, labels=label),
        _manifest(CAPI_CLUSTER, namespace, name, cluster_spec),
    ]


def bare_metal_mac(namespace: str, index: int, prefix: str = "host") -> str:
    """A boot MAC unique to host ``<prefix>-<index>`` of ``namespace`` (up to 65536 per
    prefix; namespaces and prefixes differ in 24 bits of a digest), locally administered."""
    digest = hashlib.sha256(f"{namespace}/{prefix}".encode()).digest()
    octets = [BMH_MAC_PREFIX, *(f"{b:02x}" for b in digest[:3]), f"{index >> 8 & 0xFF:02x}"]
    return ":".join([*octets, f"{index & 0xFF:02x}"])


def bare_metal_hosts(namespace: str, count: int, prefix: str = "host") -> list[dict[str, Any]]:
    """``count`` BareMetalHosts ``<prefix>-0``… with unique boot MACs, online, shaped as
    metal3-dev-env's (Redfish virtual media, which boots an ISO), after the BMC credentials
    Secret ``<prefix>-bmc-credentials`` they name. Status is the host stand-in's to write."""
    credentials = f"{prefix}-bmc-credentials"
    secret = {
        "apiVersion": SECRET.api_version,
        "kind": SECRET.kind,
        "metadata": {"name": credentials, "namespace": namespace},
        "stringData": {"username": "admin", "password": "password"},
    }
    hosts = []
    for index in range(count):
        name = f"{prefix}-{index}"
        system = uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.{namespace}.bmc.example.test")
        spec = {
            "online": True,
            "bootMode": "UEFI",
            "bootMACAddress": bare_metal_mac(namespace, index, prefix),
            "bmc": {
                "address": f"redfish-virtualmedia+http://192.168.111.1:8000/redfish/v1/Systems/{system}",
                "credentialsName": credentials,
                "disableCertificateVerification": True,
            },
        }
        hosts.append(_manifest(BARE_METAL_HOST, namespace, name, spec))
    return [secret, *hosts]


def assisted_kind(manifest: dict[str, Any]) -> ResourceKind:
    """The kind of one of ``assisted_cluster``'s or ``bare_metal_hosts``' manifests."""
    return _ASSISTED_KINDS[manifest["kind"]]
