"""Pure decisions of the OpenShift Assisted control-plane provider: names, shapes, status.

Everything here is a function of objects already read; nothing talks to an API. The shapes are
upstream's (openshift-assisted/cluster-api-provider-openshift-assisted v0.2.0:
``controlplane/internal/controller/openshiftassistedcontrolplane_controller.go``,
``clusterdeployment_controller.go``, ``agentclusterinstall_controller.go`` and
``controlplane/internal/imageregistry/image_registry.go``), with these decisions of ours:

- **Owner references.** Upstream sets plain (non-controller) references from the ACP on the
  ClusterDeployment, the placeholder pull secret, the OAC and the infrastructure clone, so
  that Cluster API's Machine controller can become the controller of the last two; so do we.
  The Machine is *controlled* by the ACP (Cluster API's convention for control-plane
  Machines), the ACI and the ``<cluster>-kubeconfig`` Secret are controlled by it, as upstream.
- **One name per replica.** The clone, the OAC and the Machine of one replica share the name
  ``<acp>-<5 random chars>``; ``pending_names`` finds a name whose Machine a crashed run never
  created, so the next run completes that name instead of making a new one.
- **Status is derived, not accumulated.** ``replicas`` counts the Machines that exist after
  this run's creations (upstream v0.2.0 counted before them: quirk 5), ``updatedReplicas``
  counts every Machine (there is no rollout: every Machine is at the one version), and
  ``MachinesCreated`` is True once every replica's Machine exists (v0.4's behaviour).
- **Version.** ``spec.version`` must be semver (a leading ``v`` is tolerated); below 4.14.0
  the ACP stops with upstream's condition and message.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import tomllib
from collections.abc import Iterable
from typing import Any

from shared.errors import PermanentError
from shared.messages import Condition
from shared.resources import (
    AGENT_CLUSTER_INSTALL,
    CLUSTER_DEPLOYMENT,
    CLUSTER_IMAGE_SET,
    CONFIG_MAP,
    MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
    owner_reference,
)

Json = dict[str, Any]

ACP = OPENSHIFT_ASSISTED_CONTROL_PLANE
FIELD_MANAGER = "capibus-assistedcontrolplane"
ACP_FINALIZER = "openshiftassistedcontrolplane.controlplane.cluster.x-k8s.io/deprovision"

CAPI_GROUP = "cluster.x-k8s.io"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CONTROL_PLANE_NAME_LABEL = "cluster.x-k8s.io/control-plane-name"
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
CLONED_FROM_NAME = "cluster.x-k8s.io/cloned-from-name"
CLONED_FROM_GROUPKIND = "cluster.x-k8s.io/cloned-from-groupkind"
ROLE_ANNOTATION = "bmac.agent-install.openshift.io/role"
INSTALL_CONFIG_OVERRIDES = "agent-install.openshift.io/install-config-overrides"
CD_NAME_LABEL = "hive.openshift.io/cluster-deployment-name"
SECRET_TYPE_LABEL = "hive.openshift.io/secret-type"

PLACEHOLDER_PULL_SECRET = "placeholder-pull-secret"
PLACEHOLDER_DOCKERCONFIG = '{"auths":{"fake-pull-secret":{"auth":"cGxhY2Vob2xkZXI6c2VjcmV0Cg=="}}}'
REGISTRY_CONFIG_MAP = "additional-registry-config"
KUBECONFIG_SECRET_TYPE = "cluster.x-k8s.io/secret"
MIN_VERSION = "4.14.0"
#: the public release repository (later upstream's ``release.OCPRepository``)
OCP_RELEASE = "quay.io/openshift-release-dev/ocp-release"
ADDING_HOSTS = "adding-hosts"
INSTALL_ERROR = "error"

# conditions and reasons (upstream's names)
MACHINES_CREATED = "MachinesCreated"
CONTROL_PLANE_READY = "ControlPlaneReady"
KUBECONFIG_AVAILABLE = "KubeconfigAvailable"
INFRA_CLONING_FAILED = "InfrastructureTemplateCloningFailed"
BOOTSTRAP_CLONING_FAILED = "BootstrapTemplateCloningFailed"
MACHINE_GENERATION_FAILED = "MachineGenerationFailed"

_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's names.SimpleNameGenerator


# --- reading objects ------------------------------------------------------------------------


def meta(obj: Json) -> Json:
    return obj.get("metadata") or {}


def spec(obj: Json) -> Json:
    return obj.get("spec") or {}


def status(obj: Json) -> Json:
    return obj.get("status") or {}


def config(acp: Json) -> Json:
    return spec(acp).get("config") or {}


def name_of(obj: Json) -> str:
    return str(meta(obj)["name"])


def deleting(obj: Json) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def has_finalizer(obj: Json, finalizer: str) -> bool:
    return finalizer in (meta(obj).get("finalizers") or [])


def object_key(obj: Json) -> str:
    return f"{meta(obj).get('namespace')}/{meta(obj).get('name')}"


def labels(obj: Json) -> dict[str, str]:
    return dict(meta(obj).get("labels") or {})


def owner_name(
    obj: Json, kind: str, group: str = CAPI_GROUP, *, controller: bool = False
) -> str | None:
    """The name of ``obj``'s owner of ``kind`` in ``group`` (any version), if any;
    ``controller``: only its controller."""
    for owner in meta(obj).get("ownerReferences") or []:
        if owner.get("kind") != kind or not str(owner.get("apiVersion", "")).startswith(
            f"{group}/"
        ):
            continue
        if controller and not owner.get("controller"):
            continue
        return str(owner["name"])
    return None


def acp_owner(obj: Json, *, controller: bool = False) -> str | None:
    """The ACP that owns ``obj`` (its controller only, with ``controller``)."""
    return owner_name(obj, ACP.kind, ACP.group, controller=controller)


def owned_by(obj: Json, owner: Json) -> bool:
    uid = meta(owner).get("uid")
    return any(o.get("uid") == uid for o in meta(obj).get("ownerReferences") or [])


def paused(*objects: Json) -> bool:
    """A Cluster with ``spec.paused``, or any object annotated paused (Cluster API's rule)."""
    for obj in objects:
        if PAUSED_ANNOTATION in (meta(obj).get("annotations") or {}):
            return True
    return any(obj.get("kind") == "Cluster" and spec(obj).get("paused") for obj in objects)


def control_plane_ref(cluster: Json) -> str | None:
    """The ACP a CAPI Cluster names as its control plane, if it names one."""
    ref = spec(cluster).get("controlPlaneRef") or {}
    group = str(ref.get("apiVersion", "")).split("/")[0]
    if ref.get("kind") == ACP.kind and group == ACP.group and ref.get("name"):
        return str(ref["name"])
    return None


def cluster_name_of(acp: Json) -> str | None:
    """The CAPI Cluster of an ACP: its owner (set by Cluster API), else its label."""
    return owner_name(acp, "Cluster") or labels(acp).get(CLUSTER_NAME_LABEL) or None


# --- gates ----------------------------------------------------------------------------------


_SEMVER = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


def parse_version(version: str) -> tuple[int, int, int, int]:
    """``version`` as an ordered key (a pre-release sorts before its release);
    ``PermanentError`` when it is not semver."""
    found = _SEMVER.match(version or "")
    if found is None:
        raise PermanentError(
            f"spec.version {version!r} is not a semantic version (like {MIN_VERSION})",
            reason="InvalidVersion",
        )
    major, minor, patch, pre = found.groups()
    return int(major), int(minor), int(patch), 0 if pre else 1


def unsupported_version(version: str) -> str | None:
    """Upstream's message when ``version`` is below the minimum, else None."""
    if parse_version(version) < parse_version(MIN_VERSION):
        return f"version {version} is not supported, the minimum supported version is {MIN_VERSION}"
    return None


def endpoint_valid(cluster: Json) -> bool:
    endpoint = spec(cluster).get("controlPlaneEndpoint") or {}
    return bool(endpoint.get("host")) and bool(endpoint.get("port"))


def infrastructure_ready(cluster: Json) -> bool:
    return bool(status(cluster).get("infrastructureReady")) and endpoint_valid(cluster)


# --- shapes the ACP writes ------------------------------------------------------------------


def control_plane_labels(acp: Json, cluster: str) -> dict[str, str]:
    """Upstream's ``ControlPlaneMachineLabelsForCluster``: the template's labels, then ours."""
    template = (spec(acp).get("machineTemplate") or {}).get("metadata") or {}
    return {
        **(template.get("labels") or {}),
        CLUSTER_NAME_LABEL: cluster,
        CONTROL_PLANE_LABEL: "",
        CONTROL_PLANE_NAME_LABEL: name_of(acp),
    }


def template_annotations(acp: Json) -> dict[str, str]:
    template = (spec(acp).get("machineTemplate") or {}).get("metadata") or {}
    return dict(template.get("annotations") or {})


def placeholder_pull_secret(acp: Json) -> Json:
    """Upstream's fake pull secret (``auth.GenerateFakePullSecret``), owned by the ACP."""
    return {
        "apiVersion": SECRET.api_version,
        "kind": SECRET.kind,
        "metadata": {
            "name": PLACEHOLDER_PULL_SECRET,
            "namespace": meta(acp)["namespace"],
            "ownerReferences": [owner_reference(ACP, acp, controller=False)],
        },
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": b64(PLACEHOLDER_DOCKERCONFIG)},
    }


def cluster_deployment(acp: Json, cluster: str) -> Json:
    """The ClusterDeployment named like the ACP (``GetClusterDeploymentFromConfig``)."""
    cfg = config(acp)
    cd_spec: Json = {
        "clusterName": cfg.get("clusterName") or cluster,
        "baseDomain": cfg.get("baseDomain") or "",
        "platform": {"agentBareMetal": {"agentSelector": {}}},
    }
    if cfg.get("pullSecretRef"):
        cd_spec["pullSecretRef"] = {"name": cfg["pullSecretRef"]["name"]}
    return {
        "apiVersion": CLUSTER_DEPLOYMENT.api_version,
        "kind": CLUSTER_DEPLOYMENT.kind,
        "metadata": {
            "name": name_of(acp),
            "namespace": meta(acp)["namespace"],
            "labels": control_plane_labels(acp, cluster),
            "ownerReferences": [owner_reference(ACP, acp, controller=False)],
        },
        "spec": cd_spec,
    }


def cluster_deployment_ref(cd: Json) -> Json:
    return {
        "apiVersion": CLUSTER_DEPLOYMENT.api_version,
        "kind": CLUSTER_DEPLOYMENT.kind,
        "name": name_of(cd),
        "namespace": meta(cd)["namespace"],
    }


def holds(current: Any, desired: Any) -> bool:
    """Whether ``current`` already carries everything ``desired`` says (an apply would change
    nothing): maps by key, lists item by item, ownerReferences by uid among others."""
    if isinstance(desired, dict):
        if not isinstance(current, dict):
            return False
        for key, value in desired.items():
            if key == "ownerReferences":
                uids = {o.get("uid") for o in current.get(key) or []}
                if not all(o.get("uid") in uids for o in value):
                    return False
            elif not holds(current.get(key), value):
                return False
        return True
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(holds(c, d) for c, d in zip(current, desired, strict=True))
        )
    return bool(current == desired)


def new_name(acp: Json) -> str:
    suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
    return f"{name_of(acp)}-{suffix}"


def infra_clone(acp: Json, template: Json, name: str, cluster: str) -> Json:
    """Cluster API's ``external.CreateFromTemplate`` for one replica's infrastructure machine."""
    inner = spec(template).get("template") or {}
    inner_meta = inner.get("metadata") or {}
    api_version = str(template.get("apiVersion") or "")
    template_kind = str(template.get("kind") or "")
    group = api_version.split("/", maxsplit=1)[0] if "/" in api_version else ""
    return {
        "apiVersion": api_version,
        "kind": template_kind.removesuffix("Template"),
        "metadata": {
            "name": name,
            "namespace": meta(acp)["namespace"],
            "labels": {**(inner_meta.get("labels") or {}), **control_plane_labels(acp, cluster)},
            "annotations": {
                **(inner_meta.get("annotations") or {}),
                **template_annotations(acp),
                CLONED_FROM_NAME: name_of(template),
                CLONED_FROM_GROUPKIND: f"{template_kind}.{group}",
            },
            "ownerReferences": [owner_reference(ACP, acp, controller=False)],
        },
        "spec": inner.get("spec") or {},
    }


def bootstrap_config(acp: Json, name: str, cluster: str) -> Json:
    """The replica's OpenshiftAssistedConfig: a copy of ``spec.openshiftAssistedConfigSpec``."""
    return {
        "apiVersion": OPENSHIFT_ASSISTED_CONFIG.api_version,
        "kind": OPENSHIFT_ASSISTED_CONFIG.kind,
        "metadata": {
            "name": name,
            "namespace": meta(acp)["namespace"],
            "labels": control_plane_labels(acp, cluster),
            "annotations": template_annotations(acp),
            "ownerReferences": [owner_reference(ACP, acp, controller=False)],
        },
        "spec": dict(spec(acp).get("openshiftAssistedConfigSpec") or {}),
    }


def machine(acp: Json, name: str, cluster: str, infra: Json) -> Json:
    """The replica's Machine (upstream's ``computeDesiredMachine`` + ``getMachineSpec``)."""
    namespace = meta(acp)["namespace"]
    template = spec(acp).get("machineTemplate") or {}
    machine_spec: Json = {
        "clusterName": cluster,
        "version": spec(acp).get("version"),
        "bootstrap": {
            "configRef": {
                "apiVersion": OPENSHIFT_ASSISTED_CONFIG.api_version,
                "kind": OPENSHIFT_ASSISTED_CONFIG.kind,
                "name": name,
                "namespace": namespace,
            }
        },
        "infrastructureRef": {
            "apiVersion": infra["apiVersion"],
            "kind": infra["kind"],
            "name": name,
            "namespace": namespace,
        },
    }
    for timeout in ("nodeDrainTimeout", "nodeVolumeDetachTimeout", "nodeDeletionTimeout"):
        if template.get(timeout) is not None:
            machine_spec[timeout] = template[timeout]
    return {
        "apiVersion": MACHINE.api_version,
        "kind": MACHINE.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": control_plane_labels(acp, cluster),
            "annotations": {**template_annotations(acp), ROLE_ANNOTATION: "master"},
            "ownerReferences": [owner_reference(ACP, acp, controller=True)],
        },
        "spec": machine_spec,
    }


def pending_names(machines: Iterable[Json], parts: Iterable[Json]) -> tuple[list[str], list[str]]:
    """Names a crashed run left without their Machine, split into those to complete and those
    to roll back.

    ``parts`` are the ACP's OACs and infrastructure clones. One without a Machine of its name
    is a run's unfinished replica, which the next run completes, unless Cluster API adopted it
    (a Machine owner) or it is going: its Machine was deleted, so it is rolled back, never
    reused.
    """
    have = {name_of(m) for m in machines}
    complete: set[str] = set()
    stale: set[str] = set()
    for part in parts:
        name = name_of(part)
        if name in have:
            continue
        adopted = owner_name(part, "Machine") is not None
        if adopted or deleting(part):
            stale.add(name)
        else:
            complete.add(name)
    return sorted(complete - stale), sorted(stale)


# --- status ---------------------------------------------------------------------------------


def condition(kind: str, ok: bool, reason: str, message: str = "") -> Condition:
    return Condition(type=kind, status="True" if ok else "False", reason=reason, message=message)


def machine_ready(m: Json) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status(m).get("conditions") or []
    )


def replica_status(acp: Json, cluster: str, machines: list[Json]) -> Json:
    desired = int(spec(acp).get("replicas") or 0)
    ready = sum(1 for m in machines if machine_ready(m))
    return {
        "selector": f"{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}",
        "replicas": len(machines),
        "updatedReplicas": len(machines),
        "readyReplicas": ready,
        "unavailableReplicas": max(0, desired - ready),
        "version": spec(acp).get("version"),
    }


def machines_created(acp: Json, machines: list[Json]) -> Condition:
    desired = int(spec(acp).get("replicas") or 0)
    if len(machines) >= desired:
        return condition(MACHINES_CREATED, True, "MachinesCreated")
    return condition(
        MACHINES_CREATED,
        False,
        "WaitingForMachines",
        f"{len(machines)} of {desired} control-plane Machines created",
    )


def aci_state(aci: Json) -> str:
    return str((status(aci).get("debugInfo") or {}).get("state") or "")


def control_plane_ready(aci: Json) -> Condition:
    state = aci_state(aci)
    if state == ADDING_HOSTS:
        return condition(CONTROL_PLANE_READY, True, "ControlPlaneReady")
    if state == INSTALL_ERROR:
        info = str((status(aci).get("debugInfo") or {}).get("stateInfo") or "installation failed")
        return condition(CONTROL_PLANE_READY, False, "InstallationFailed", info)
    return condition(
        CONTROL_PLANE_READY,
        False,
        "ControlPlaneInstalling",
        f"Controlplane installing, status: {state}",
    )


def kubeconfig_available(available: bool) -> Condition:
    if available:
        return condition(KUBECONFIG_AVAILABLE, True, "KubeconfigAvailable")
    return condition(
        KUBECONFIG_AVAILABLE,
        False,
        "KubeconfigUnavailable",
        "waiting for the installation to publish the admin kubeconfig",
    )


def admin_kubeconfig_name(aci: Json) -> str | None:
    metadata = spec(aci).get("clusterMetadata") or {}
    name = (metadata.get("adminKubeconfigSecretRef") or {}).get("name")
    return str(name) if name else None


def status_changes(
    current: Json, fields: Json, conditions: Iterable[Condition]
) -> tuple[Json, list[Condition]]:
    """The part of ``fields`` and ``conditions`` that ``current`` (a status) does not hold yet:
    a run that finds nothing new reports nothing."""
    patch = {k: v for k, v in fields.items() if current.get(k) != v}
    have = {c.get("type"): c for c in current.get("conditions") or []}
    changed = [
        c
        for c in conditions
        if not have.get(c.type)
        or (have[c.type].get("status"), have[c.type].get("reason"), have[c.type].get("message", ""))
        != (c.status, c.reason, c.message)
    ]
    return patch, changed


# --- the ClusterDeployment's objects --------------------------------------------------------


def release_image(acp: Json) -> str:
    """``config.releaseImage``; unset, the public release of ``spec.version`` (what later
    upstream's ``release.GetReleaseImage`` computes for one architecture)."""
    image = config(acp).get("releaseImage")
    if image:
        return str(image)
    arch = (spec(acp).get("openshiftAssistedConfigSpec") or {}).get("cpuArchitecture") or "x86_64"
    return f"{OCP_RELEASE}:{str(spec(acp).get('version') or '').removeprefix('v')}-{arch}"


def cluster_image_set(cd_name: str, image: str) -> Json:
    return {
        "apiVersion": CLUSTER_IMAGE_SET.api_version,
        "kind": CLUSTER_IMAGE_SET.kind,
        "metadata": {"name": cd_name},
        "spec": {"releaseImage": image},
    }


def worker_count(machine_deployments: Iterable[Json]) -> int:
    """Σ ``spec.replicas`` (Cluster API defaults an unset count to 1)."""
    total = 0
    for md in machine_deployments:
        replicas = spec(md).get("replicas")
        total += 1 if replicas is None else int(replicas)
    return total


CAPABILITIES = {
    "capabilities": {
        "baselineCapabilitySet": "None",
        "additionalEnabledCapabilities": [
            "baremetal",
            "Console",
            "Insights",
            "OperatorLifecycleManager",
            "Ingress",
        ],
    }
}


def agent_cluster_install(
    cd: Json, acp: Json, cluster: Json, *, workers: int, registry: bool
) -> Json:
    """The ACI (upstream's ``computeAgentClusterInstall``), created once, never updated."""
    cfg = config(acp)
    cd_name = name_of(cd)
    vips = bool(cfg.get("apiVIPs")) and bool(cfg.get("ingressVIPs"))
    aci_spec: Json = {
        "clusterDeploymentRef": {"name": cd_name},
        "platformType": "BareMetal" if vips else "None",
        "provisionRequirements": {
            "controlPlaneAgents": int(spec(acp).get("replicas") or 0),
            "workerAgents": workers,
        },
        "imageSetRef": {"name": cd_name},
    }
    optional = {
        "diskEncryption": cfg.get("diskEncryption"),
        "mastersSchedulable": cfg.get("mastersSchedulable"),
        "proxy": cfg.get("proxy"),
        "sshPublicKey": cfg.get("sshAuthorizedKey"),
        "apiVIPs": cfg.get("apiVIPs") if vips else None,
        "ingressVIPs": cfg.get("ingressVIPs") if vips else None,
    }
    aci_spec |= {k: v for k, v in optional.items() if v not in (None, "", [], {})}
    networking = cluster_networking(cluster)
    if networking:
        aci_spec["networking"] = networking
    manifests = [{"name": r["name"]} for r in cfg.get("manifestsConfigMapRefs") or []]
    if registry:
        manifests.append({"name": REGISTRY_CONFIG_MAP})
    if manifests:
        aci_spec["manifestsConfigMapRefs"] = manifests
    metadata: Json = {
        "name": cd_name,
        "namespace": meta(cd)["namespace"],
        "labels": control_plane_labels(acp, name_of(cluster)),
        "ownerReferences": [owner_reference(ACP, acp, controller=True)],
    }
    if vips:
        metadata["annotations"] = {INSTALL_CONFIG_OVERRIDES: json.dumps(CAPABILITIES)}
    return {
        "apiVersion": AGENT_CLUSTER_INSTALL.api_version,
        "kind": AGENT_CLUSTER_INSTALL.kind,
        "metadata": metadata,
        "spec": aci_spec,
    }


def cluster_networking(cluster: Json) -> Json:
    network = spec(cluster).get("clusterNetwork") or {}
    pods = (network.get("pods") or {}).get("cidrBlocks") or []
    services = (network.get("services") or {}).get("cidrBlocks") or []
    found: Json = {}
    if pods:
        found["clusterNetwork"] = [{"cidr": cidr, "hostPrefix": 23} for cidr in pods]
    if services:
        found["serviceNetwork"] = list(services)
    return found


def cluster_install_ref(cd_name: str) -> Json:
    return {
        "group": AGENT_CLUSTER_INSTALL.group,
        "version": AGENT_CLUSTER_INSTALL.version,
        "kind": AGENT_CLUSTER_INSTALL.kind,
        "name": cd_name,
    }


# --- the additional registry configuration --------------------------------------------------

REGISTRY_NAME = "additional-registry"
REGISTRY_CERT_CONFIG_MAP = "additional-registry-certificate"


def registry_config_map(source: Json, namespace: str) -> Json:
    """``additional-registry-config`` from the ``imageRegistryRef`` ConfigMap, as upstream's
    ``GenerateImageRegistryConfigmap``: ``registries.conf`` (TOML ``[[registry]]`` with
    ``[[registry.mirror]]``) becomes an ImageDigestMirrorSet and/or ImageTagMirrorSet
    (``pull-from-mirror = "tag-only"``), ``ca-bundle.crt`` a ConfigMap in ``openshift-config``,
    and either (or insecure mirrors) an ``image.config.openshift.io`` ``cluster``. A faithful but
    simple rendering: JSON manifests, no defaulting beyond upstream's."""
    data = source.get("data") or {}
    where = f"configmap {object_key(source)}"
    if "registries.conf" not in data:
        raise PermanentError(
            f"failed to find registry key [registries.conf] in {where} for image registry "
            "configuration",
            reason="InvalidImageRegistry",
        )
    digest, tag, insecure = _mirrors(str(data["registries.conf"]), where)
    out: dict[str, str] = {}
    if digest:
        out["image-digest-mirror-set.json"] = _mirror_set("ImageDigestMirrorSet", digest)
    if tag:
        out["image-tag-mirror-set.json"] = _mirror_set("ImageTagMirrorSet", tag)
    cert = data.get("ca-bundle.crt")
    if cert is not None:
        out["additional-registry-certificate.json"] = _compact(
            {
                "kind": "ConfigMap",
                "apiVersion": "v1",
                "metadata": {
                    "name": REGISTRY_CERT_CONFIG_MAP,
                    "namespace": "openshift-config",
                },
                "data": {"ca-bundle.crt": cert},
            }
        )
    if cert is not None or insecure:
        image_spec: Json = {}
        if cert is not None:
            image_spec["additionalTrustedCA"] = {"name": REGISTRY_CERT_CONFIG_MAP}
        if insecure:
            image_spec["registrySources"] = {"insecureRegistries": insecure}
        out["image-config.json"] = _compact(
            {
                "kind": "Image",
                "apiVersion": "config.openshift.io/v1",
                "metadata": {"name": "cluster"},
                "spec": image_spec,
            }
        )
    return {
        "apiVersion": CONFIG_MAP.api_version,
        "kind": CONFIG_MAP.kind,
        "metadata": {"name": REGISTRY_CONFIG_MAP, "namespace": namespace},
        "data": out,
    }


def _mirrors(text: str, where: str) -> tuple[list[Json], list[Json], list[str]]:
    """registries.conf's mirrors by digest and by tag, and its insecure mirrors."""
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _refuse(where, f"registries.conf is not valid TOML: {exc}") from exc
    registries = tree.get("registry")
    if not isinstance(registries, list):
        raise _refuse(where, "failed to find registry key in toml tree")
    digest: list[Json] = []
    tag: list[Json] = []
    insecure: list[str] = []
    for registry in registries:
        source, by_digest, by_tag, unsafe = _registry_mirrors(registry, where)
        if by_digest:
            digest.append({"source": source, "mirrors": by_digest})
        if by_tag:
            tag.append({"source": source, "mirrors": by_tag})
        insecure += unsafe
    if not digest and not tag:
        raise _refuse(where, "failed to find any image mirrors in registry.conf")
    return digest, tag, insecure


def _registry_mirrors(registry: Any, where: str) -> tuple[str, list[str], list[str], list[str]]:
    """One ``[[registry]]``: its location, mirrors by digest (the default) and by tag
    (``pull-from-mirror = "tag-only"``), and those marked insecure."""
    source = registry.get("location") if isinstance(registry, dict) else None
    mirrors = registry.get("mirror") if isinstance(registry, dict) else None
    if not isinstance(source, str):
        raise _refuse(where, "failed to parse image registry toml, missing registry location")
    if not isinstance(mirrors, list):
        raise _refuse(where, "failed to parse image registry toml, missing registry.mirror")
    by_digest: list[str] = []
    by_tag: list[str] = []
    insecure: list[str] = []
    for mirror in mirrors:
        location = mirror.get("location") if isinstance(mirror, dict) else None
        if not isinstance(location, str):
            raise _refuse(where, "missing mirror registry location key or it is not a string")
        if mirror.get("insecure") is True:
            insecure.append(location)
        pull = mirror.get("pull-from-mirror")
        if pull == "tag-only":
            by_tag.append(location)
        elif pull in (None, "digest-only"):
            by_digest.append(location)
    return source, by_digest, by_tag, insecure


def _refuse(where: str, message: str) -> PermanentError:
    return PermanentError(f"{where}: {message}", reason="InvalidImageRegistry")


def _mirror_set(kind: str, mirrors: list[Json]) -> str:
    key = "imageDigestMirrors" if kind == "ImageDigestMirrorSet" else "imageTagMirrors"
    return _compact(
        {
            "kind": kind,
            "apiVersion": "config.openshift.io/v1",
            "metadata": {"name": REGISTRY_NAME},
            "spec": {key: mirrors},
        }
    )


def _compact(value: Json) -> str:
    return json.dumps(value, separators=(",", ":"))


# --- the kubeconfig -------------------------------------------------------------------------


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig_secret(acp: Json, cluster: str, value_b64: str) -> Json:
    """``<cluster>-kubeconfig``, Cluster API's shape, controlled by the ACP."""
    return {
        "apiVersion": SECRET.api_version,
        "kind": SECRET.kind,
        "metadata": {
            "name": f"{cluster}-kubeconfig",
            "namespace": meta(acp)["namespace"],
            "labels": {CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [owner_reference(ACP, acp, controller=True)],
        },
        "type": KUBECONFIG_SECRET_TYPE,
        "data": {"value": value_b64},
    }


def is_admin_kubeconfig(secret: Json) -> str | None:
    """The ClusterDeployment whose admin kubeconfig ``secret`` is, if it is one."""
    found = labels(secret)
    cd = found.get(CD_NAME_LABEL)
    if not cd:
        return None
    if found.get(SECRET_TYPE_LABEL) == "kubeconfig" or name_of(secret) == f"{cd}-admin-kubeconfig":
        return str(cd)
    return None
