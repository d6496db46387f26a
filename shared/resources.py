"""The resource kinds capibus reacts to, and which Azimuth cluster an object belongs to.

``cluster_key`` decides both the correlation id (whose story an event is part of) and the
partition (which replica handles it), so every object of one cluster meets its Cluster in the
same partition. The rules follow the labels and owners upstream relies on
(``docs/upstream.md`` §2): the openstack-cluster chart's
``capi.stackhpc.com/cluster``, Cluster API's ``cluster.x-k8s.io/cluster-name``, the addon
provider's ``addons.stackhpc.com/cluster``, and an ownerReference to an Azimuth ``Cluster``.
An object matching none is its own story.

A ``LadybugCluster`` is always its own story, keyed by its own name: all of them share one
namespace, and their labels (``ladybug.capibus.dev/namespace``, ``ladybug.capibus.dev/cluster``)
name the Tumblebug namespace and cluster, which are not a Kubernetes ``<namespace>/<name>``,
so they are deliberately not among ``CLUSTER_LABELS``.
"""

from __future__ import annotations

from typing import Any

from shared.kube import ResourceKind
from shared.messages import ObjectRef

AZIMUTH = "azimuth.stackhpc.com"

CLUSTER = ResourceKind("cluster", AZIMUTH, "v1alpha1", "Cluster", "clusters")
CLUSTER_TEMPLATE = ResourceKind(
    "clustertemplate", AZIMUTH, "v1alpha1", "ClusterTemplate", "clustertemplates", namespaced=False
)
APP_TEMPLATE = ResourceKind(
    "apptemplate", AZIMUTH, "v1alpha1", "AppTemplate", "apptemplates", namespaced=False
)

LEASE = ResourceKind("lease", "scheduling.azimuth.stackhpc.com", "v1alpha1", "Lease", "leases")
REALM = ResourceKind("realm", "identity.azimuth.stackhpc.com", "v1alpha1", "Realm", "realms")
OIDC_CLIENT = ResourceKind(
    "oidcclient", "identity.azimuth.stackhpc.com", "v1alpha1", "OIDCClient", "oidcclients"
)
PLATFORM = ResourceKind(
    "platform", "identity.azimuth.stackhpc.com", "v1alpha1", "Platform", "platforms"
)
CAPI_CLUSTER = ResourceKind("capicluster", "cluster.x-k8s.io", "v1beta1", "Cluster", "clusters")
MACHINE = ResourceKind("machine", "cluster.x-k8s.io", "v1beta1", "Machine", "machines")
CONTROL_PLANE = ResourceKind(
    "kubeadmcontrolplane",
    "controlplane.cluster.x-k8s.io",
    "v1beta1",
    "KubeadmControlPlane",
    "kubeadmcontrolplanes",
)
OPENSTACK_MACHINE = ResourceKind(
    "openstackmachine",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackMachine",
    "openstackmachines",
)
HELM_RELEASE = ResourceKind(
    "helmrelease", "addons.stackhpc.com", "v1alpha1", "HelmRelease", "helmreleases"
)
MANIFESTS = ResourceKind("manifests", "addons.stackhpc.com", "v1alpha1", "Manifests", "manifests")
KUSTOMIZATION = ResourceKind(
    "kustomization", "kustomize.toolkit.fluxcd.io", "v1", "Kustomization", "kustomizations"
)
RESERVATION = ResourceKind(
    "reservation", "zenith.stackhpc.com", "v1alpha1", "Reservation", "reservations"
)
OPENSTACK_CLUSTER = ResourceKind(
    "openstackcluster",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackCluster",
    "openstackclusters",
)
MACHINE_DEPLOYMENT = ResourceKind(
    "machinedeployment", "cluster.x-k8s.io", "v1beta1", "MachineDeployment", "machinedeployments"
)
INFRASTRUCTURE = "infrastructure.cluster.x-k8s.io"
#: metal-stack's Cluster API provider (``docs/metalstack.md``), storage version v1alpha4
METALSTACK_CLUSTER = ResourceKind(
    "metalstackcluster", INFRASTRUCTURE, "v1alpha4", "MetalStackCluster", "metalstackclusters"
)
METALSTACK_MACHINE = ResourceKind(
    "metalstackmachine", INFRASTRUCTURE, "v1alpha4", "MetalStackMachine", "metalstackmachines"
)
METALSTACK_MACHINE_TEMPLATE = ResourceKind(
    "metalstackmachinetemplate",
    INFRASTRUCTURE,
    "v1alpha4",
    "MetalStackMachineTemplate",
    "metalstackmachinetemplates",
)
#: upstream serves it without a status subresource: its status is written on the object
METALSTACK_FIREWALL = ResourceKind(
    "metalstackfirewall",
    INFRASTRUCTURE,
    "v1alpha4",
    "MetalStackFirewall",
    "metalstackfirewalls",
    status_subresource=False,
)
#: The OpenShift Assisted providers (``docs/assisted.md``): their own kinds at v1alpha1 ...
BOOTSTRAP = "bootstrap.cluster.x-k8s.io"
OPENSHIFT_ASSISTED_CONFIG = ResourceKind(
    "openshiftassistedconfig",
    BOOTSTRAP,
    "v1alpha1",
    "OpenshiftAssistedConfig",
    "openshiftassistedconfigs",
)
OPENSHIFT_ASSISTED_CONFIG_TEMPLATE = ResourceKind(
    "openshiftassistedconfigtemplate",
    BOOTSTRAP,
    "v1alpha1",
    "OpenshiftAssistedConfigTemplate",
    "openshiftassistedconfigtemplates",
)
OPENSHIFT_ASSISTED_CONTROL_PLANE = ResourceKind(
    "openshiftassistedcontrolplane",
    "controlplane.cluster.x-k8s.io",
    "v1alpha1",
    "OpenshiftAssistedControlPlane",
    "openshiftassistedcontrolplanes",
)
#: ... and the kinds of assisted-service, hive and metal3 they drive (peers, not ours)
INFRA_ENV = ResourceKind(
    "infraenv", "agent-install.openshift.io", "v1beta1", "InfraEnv", "infraenvs"
)
AGENT = ResourceKind("agent", "agent-install.openshift.io", "v1beta1", "Agent", "agents")
CLUSTER_DEPLOYMENT = ResourceKind(
    "clusterdeployment", "hive.openshift.io", "v1", "ClusterDeployment", "clusterdeployments"
)
CLUSTER_IMAGE_SET = ResourceKind(
    "clusterimageset",
    "hive.openshift.io",
    "v1",
    "ClusterImageSet",
    "clusterimagesets",
    namespaced=False,
)
AGENT_CLUSTER_INSTALL = ResourceKind(
    "agentclusterinstall",
    "extensions.hive.openshift.io",
    "v1beta1",
    "AgentClusterInstall",
    "agentclusterinstalls",
)
METAL3_CLUSTER = ResourceKind(
    "metal3cluster", INFRASTRUCTURE, "v1beta1", "Metal3Cluster", "metal3clusters"
)
METAL3_MACHINE = ResourceKind(
    "metal3machine", INFRASTRUCTURE, "v1beta1", "Metal3Machine", "metal3machines"
)
METAL3_MACHINE_TEMPLATE = ResourceKind(
    "metal3machinetemplate",
    INFRASTRUCTURE,
    "v1beta1",
    "Metal3MachineTemplate",
    "metal3machinetemplates",
)
BARE_METAL_HOST = ResourceKind(
    "baremetalhost", "metal3.io", "v1alpha1", "BareMetalHost", "baremetalhosts"
)
MACHINE_SET = ResourceKind("machineset", "cluster.x-k8s.io", "v1beta1", "MachineSet", "machinesets")
#: CB-Ladybug clusters (``docs/ladybug.md``), all in one namespace, each its own story
LADYBUG_CLUSTER = ResourceKind(
    "ladybugcluster", "ladybug.capibus.dev", "v1alpha1", "LadybugCluster", "ladybugclusters"
)
SECRET = ResourceKind("secret", "", "v1", "Secret", "secrets")
NODE = ResourceKind("node", "", "v1", "Node", "nodes", namespaced=False)
CONFIG_MAP = ResourceKind("configmap", "", "v1", "ConfigMap", "configmaps")
NAMESPACE = ResourceKind("namespace", "", "v1", "Namespace", "namespaces", namespaced=False)

KINDS: dict[str, ResourceKind] = {
    k.token: k
    for k in (
        CLUSTER,
        CLUSTER_TEMPLATE,
        APP_TEMPLATE,
        LEASE,
        REALM,
        OIDC_CLIENT,
        PLATFORM,
        CAPI_CLUSTER,
        MACHINE,
        CONTROL_PLANE,
        OPENSTACK_MACHINE,
        HELM_RELEASE,
        MANIFESTS,
        KUSTOMIZATION,
        SECRET,
        METALSTACK_CLUSTER,
        METALSTACK_MACHINE,
        METALSTACK_FIREWALL,
        OPENSHIFT_ASSISTED_CONFIG,
        OPENSHIFT_ASSISTED_CONTROL_PLANE,
        INFRA_ENV,
        AGENT,
        CLUSTER_DEPLOYMENT,
        AGENT_CLUSTER_INSTALL,
        BARE_METAL_HOST,
        LADYBUG_CLUSTER,
    )
}

#: an ownerReference to a ``Cluster`` of these groups names the cluster an object belongs to:
#: Azimuth's, and Cluster API's (which owns an infrastructure cluster such as a
#: MetalStackCluster before any label says so)
OWNING_GROUPS = (f"{AZIMUTH}/", "cluster.x-k8s.io/")

CLUSTER_LABELS = (
    "capi.stackhpc.com/cluster",
    "cluster.x-k8s.io/cluster-name",
    "addons.stackhpc.com/cluster",
)


def cluster_key(kind: ResourceKind, obj: dict[str, Any]) -> str:
    """``<namespace>/<name>`` of the Azimuth cluster ``obj`` belongs to (or of ``obj``)."""
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace") or ""
    if kind in (CLUSTER, LADYBUG_CLUSTER):
        return f"{namespace}/{meta['name']}"
    labels = meta.get("labels") or {}
    for label in CLUSTER_LABELS:
        if labels.get(label):
            return f"{namespace}/{labels[label]}"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "Cluster" and owner.get("apiVersion", "").startswith(OWNING_GROUPS):
            return f"{namespace}/{owner['name']}"
    return f"{namespace}/{meta['name']}"


def ref_to(kind: ResourceKind, obj: dict[str, Any]) -> ObjectRef:
    """The ``ObjectRef`` naming this incarnation of ``obj`` (a ``kind``) on the bus.

    ``kind`` is given, not read from ``obj``: items of a LIST carry no ``apiVersion``/``kind``.
    """
    meta = obj["metadata"]
    return ObjectRef(
        api_version=kind.api_version,
        kind=kind.kind,
        namespace=meta.get("namespace"),
        name=meta["name"],
        uid=meta.get("uid"),
    )


def cluster_ref(namespace: str, name: str, uid: str | None) -> ObjectRef:
    """The ``ObjectRef`` of the Azimuth Cluster ``namespace/name`` (the incarnation ``uid``)."""
    return ObjectRef(
        api_version=CLUSTER.api_version, kind=CLUSTER.kind, namespace=namespace, name=name, uid=uid
    )


def owner_reference(kind: ResourceKind, obj: dict[str, Any], *, controller: bool) -> dict[str, Any]:
    """An ownerReference to ``obj`` (a ``kind``) that blocks its deletion while the dependent
    exists.

    ``controller``: ``obj`` is the dependent's one controller (what a service creates for a
    Cluster). Without it the key is left out, which the API server reads as false: a reference
    to what the dependent merely belongs to, written the way the portal refers a Lease to its
    Cluster.
    """
    meta = obj["metadata"]
    reference: dict[str, Any] = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "name": meta["name"],
        "uid": meta["uid"],
    }
    if controller:
        reference["controller"] = True
    reference["blockOwnerDeletion"] = True
    return reference


def correlation_id(kind: ResourceKind, obj: dict[str, Any]) -> str:
    key = cluster_key(kind, obj)
    meta = obj["metadata"]
    own = f"{meta.get('namespace') or ''}/{meta['name']}"
    return f"cluster:{key}" if kind == CLUSTER or key != own else f"{kind.token}:{key}"


def scrub(kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
    """What of ``obj`` may travel on the bus: never Secret data, never managedFields."""
    # By group and kind, not by the ResourceKind constant: a kind built from a message's
    # reference (``shared.oversize``) is the same resource under another token.
    secret = (kind.group, kind.kind) == (SECRET.group, SECRET.kind)
    clean = {k: v for k, v in obj.items() if k not in ("data", "stringData") or not secret}
    meta = dict(clean.get("metadata", {}))
    meta.pop("managedFields", None)
    if secret and meta.get("annotations"):
        # kubectl apply keeps a full copy of the object, data included, in this annotation.
        annotations = dict(meta["annotations"])
        annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
        meta["annotations"] = annotations
    clean["metadata"] = meta
    return clean


CUSTOM_RESOURCE_DEFINITION = ResourceKind(
    "crd",
    "apiextensions.k8s.io",
    "v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    namespaced=False,
)
