"""Pure pieces of the assisted-service and hive stand-ins: names, states, shapes, decisions.

Nothing here does I/O, so what the reactors decide (is this InfraEnv's input good, which state
comes next for an AgentClusterInstall, which for a day-2 Agent) can be read on its own. The
shapes are upstream's: assisted-service ``api/v1beta1`` (InfraEnv, Agent),
``api/hiveextension/v1beta1`` (AgentClusterInstall), hive ``apis/hive/v1`` (ClusterDeployment),
the condition table of assisted-service ``docs/hive-integration/kube-api-conditions.md``, and
the state names of assisted-service ``models/cluster.go`` and ``models/host.go``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from standins.assisted.knobs import ACI_INSUFFICIENT, INSTALL_ERROR

Json = dict[str, Any]

CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
INFRAENV_LABEL = "infraenvs.agent-install.openshift.io"
CD_FINALIZER = "clusterdeployments.agent-install.openshift.io/ai-deprovision"
ACI_FINALIZER = "agentclusterinstall.agent-install.openshift.io/ai-deprovision"
CD_NAME_LABEL = "hive.openshift.io/cluster-deployment-name"
SECRET_TYPE_LABEL = "hive.openshift.io/secret-type"
PULL_SECRET_KEY = ".dockerconfigjson"

IMAGE_SERVICE = "https://image-service.sim"
ASSISTED_SERVICE = "https://assisted.sim"

# AgentClusterInstall status.debugInfo.state (assisted-service models.ClusterStatus*).
INSUFFICIENT = "insufficient"
PENDING_FOR_INPUT = "pending-for-input"
READY = "ready"
PREPARING = "preparing-for-installation"
INSTALLING = "installing"
FINALIZING = "finalizing"
INSTALLED = "installed"
ADDING_HOSTS = "adding-hosts"
ERROR = "error"
BEFORE_INSTALL = frozenset({"", INSUFFICIENT, PENDING_FOR_INPUT, READY})

# Agent status.debugInfo.state (assisted-service models.HostStatus*).
HOST_INSTALLING = "installing"
HOST_INSTALLED = "installed"
HOST_ADDED = "added-to-existing-cluster"
HOST_KNOWN_UNBOUND = "known-unbound"
HOST_DONE = frozenset({HOST_INSTALLED, HOST_ADDED})

# Upstream's status_info texts for the cluster states (assisted-service internal/cluster).
STATE_INFO = {
    INSUFFICIENT: "Cluster is not ready for install",
    PENDING_FOR_INPUT: "User input required",
    READY: "Cluster ready to be installed",
    PREPARING: "Preparing cluster for installation",
    INSTALLING: "Installation in progress",
    FINALIZING: "Finalizing cluster installation",
    INSTALLED: "Cluster is installed",
    ADDING_HOSTS: "Cluster is installed",
}
HOST_STATE_INFO = {
    HOST_INSTALLING: "Installation is in progress",
    HOST_INSTALLED: "Done",
    HOST_ADDED: "Host has rebooted and no further updates will be posted. Please check "
    "console for progress and to possibly approve pending CSRs",
    HOST_KNOWN_UNBOUND: "Host is ready to be bound to a cluster",
}

# After installing, the happy path: one state per step.
_INSTALL_CHAIN = {PREPARING: INSTALLING, FINALIZING: INSTALLED, INSTALLED: ADDING_HOSTS}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: Json) -> Json:
    result: Json = obj.get("metadata") or {}
    return result


def spec(obj: Json) -> Json:
    result: Json = obj.get("spec") or {}
    return result


def status(obj: Json) -> Json:
    result: Json = obj.get("status") or {}
    return result


def is_deleting(obj: Json) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def debug_state(obj: Json) -> str:
    return str((status(obj).get("debugInfo") or {}).get("state") or "")


def cluster_name(obj: Json) -> str:
    return str((meta(obj).get("labels") or {}).get(CLUSTER_NAME_LABEL) or "")


def fault_of(cluster: Json | None, annotation: str) -> str:
    if cluster is None:
        return ""
    return str((meta(cluster).get("annotations") or {}).get(annotation) or "")


def stable_uuid(obj: Json, purpose: str) -> str:
    """The same id for the same object across stand-in restarts (upstream keeps it in a DB)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{purpose}/{meta(obj)['uid']}"))


# --- InfraEnv ---------------------------------------------------------------------------------


def image_condition(ok: bool, message: str) -> Json:
    """assisted-service's ``ImageCreated`` condition (``conditionsv1.Condition`` shape)."""
    return {
        "type": "ImageCreated",
        "status": "True" if ok else "False",
        "reason": "ImageCreated" if ok else "ImageCreationError",
        "message": "Image has been created" if ok else f"Failed to create image: {message}",
        "lastTransitionTime": now(),
    }


def image_created(infraenv: Json) -> bool:
    return bool(status(infraenv).get("isoDownloadURL")) and any(
        c.get("type") == "ImageCreated" and c.get("status") == "True"
        for c in status(infraenv).get("conditions") or []
    )


def same_image_condition(infraenv: Json, wanted: Json) -> bool:
    """Whether ``wanted`` is already written (timestamps aside): no write, no event, no loop."""
    for c in status(infraenv).get("conditions") or []:
        if c.get("type") == wanted["type"]:
            return bool(
                c.get("status") == wanted["status"] and c.get("message") == wanted["message"]
            )
    return False


def image_status(infraenv: Json) -> Json:
    infra_env_id = stable_uuid(infraenv, "infraenv")
    api_key = hashlib.sha256(f"key/{meta(infraenv)['uid']}".encode()).hexdigest()[:32]
    arch = spec(infraenv).get("cpuArchitecture") or "x86_64"
    return {
        "isoDownloadURL": f"{IMAGE_SERVICE}/images/{infra_env_id}?arch={arch}&type=full-iso",
        "debugInfo": {
            "eventsURL": f"{ASSISTED_SERVICE}/api/assisted-install/v2/events"
            f"?api_key={api_key}&infra_env_id={infra_env_id}"
        },
        "conditions": [image_condition(True, "")],
    }


def pull_secret_problem(secret: Json | None, where: str) -> str | None:
    """What is wrong with the pull secret, in words; None when it is a usable one."""
    if secret is None:
        return f"pull secret {where} not found"
    encoded = (secret.get("data") or {}).get(PULL_SECRET_KEY)
    if not encoded:
        return f"pull secret {where} has no {PULL_SECRET_KEY} key"
    try:
        parsed = json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        return f"pull secret {where}: {PULL_SECRET_KEY} is not valid JSON"
    if not isinstance(parsed, dict) or not isinstance(parsed.get("auths"), dict):
        return f"pull secret {where}: {PULL_SECRET_KEY} has no auths"
    return None


# --- AgentClusterInstall ----------------------------------------------------------------------


def is_bound_to(agent: Json, cd: Json) -> bool:
    ref = spec(agent).get("clusterDeploymentName") or {}
    cd_meta = meta(cd)
    namespace = ref.get("namespace") or meta(agent).get("namespace")
    return bool(ref.get("name") == cd_meta["name"] and namespace == cd_meta.get("namespace"))


def is_ready_agent(agent: Json) -> bool:
    """Approved with a role: what the install counts (a role comes from the bootstrap provider)."""
    return bool(spec(agent).get("approved")) and bool(spec(agent).get("role"))


def required_agents(aci: Json) -> int:
    wanted = spec(aci).get("provisionRequirements") or {}
    return int(wanted.get("controlPlaneAgents") or 0) + int(wanted.get("workerAgents") or 0)


def lacks_vips(aci: Json) -> bool:
    aci_spec = spec(aci)
    return aci_spec.get("platformType") == "BareMetal" and not (
        aci_spec.get("apiVIPs") and aci_spec.get("ingressVIPs")
    )


def next_cluster_state(aci: Json, *, ready_agents: int, fault: str) -> str | None:
    """The state the ACI moves to next, one step at a time; None when it stays.

    Before installation the state follows the inputs (and can go back: an Agent unbound makes
    a ready cluster insufficient again); from ``preparing-for-installation`` on it only moves
    forward, and ``error`` and ``adding-hosts`` are where it stays.
    """
    state = debug_state(aci)
    if state in BEFORE_INSTALL:
        if lacks_vips(aci):
            wanted = PENDING_FOR_INPUT
        elif fault == ACI_INSUFFICIENT or ready_agents < required_agents(aci):
            wanted = INSUFFICIENT
        elif state == READY and not spec(aci).get("holdInstallation"):
            wanted = PREPARING
        else:
            wanted = READY
        return wanted if wanted != state else None
    if state == INSTALLING:
        return ERROR if fault == INSTALL_ERROR else FINALIZING
    return _INSTALL_CHAIN.get(state)


def cluster_status(state: str, info: str = "") -> Json:
    return {"debugInfo": {"state": state, "stateInfo": info or STATE_INFO.get(state, "")}}


def install_error_info(agents: list[Json]) -> str:
    first = sorted(agents, key=lambda a: (spec(a).get("role") != "master", node_name(a)))
    host = node_name(first[0]) if first else "master-0"
    return f"Host {host}: failed to write image to disk"


def cluster_metadata(cd: Json) -> Json:
    cluster_id = stable_uuid(cd, "cluster")
    name = spec(cd).get("clusterName") or meta(cd)["name"]
    return {
        "clusterID": cluster_id,
        "infraID": f"{name}-{cluster_id[:5]}",
        "adminKubeconfigSecretRef": {"name": f"{meta(cd)['name']}-admin-kubeconfig"},
    }


def owner_ref(kind: str, api_version: str, obj: Json) -> Json:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta(obj)["name"],
        "uid": meta(obj)["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def admin_secret(cd: Json, *, suffix: str, secret_type: str, data: dict[str, str]) -> Json:
    cd_meta = meta(cd)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{cd_meta['name']}-{suffix}",
            "namespace": cd_meta["namespace"],
            "labels": {CD_NAME_LABEL: cd_meta["name"], SECRET_TYPE_LABEL: secret_type},
            "ownerReferences": [owner_ref("ClusterDeployment", "hive.openshift.io/v1", cd)],
        },
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


# --- Agents -----------------------------------------------------------------------------------


def next_day2_state(agent: Json, cluster_state: str) -> str | None:
    """A host added after the install: ``installing`` then ``added-to-existing-cluster``."""
    if cluster_state != ADDING_HOSTS or not is_ready_agent(agent):
        return None
    state = debug_state(agent)
    if state in HOST_DONE or state == ERROR:
        return None
    return HOST_ADDED if state == HOST_INSTALLING else HOST_INSTALLING


def host_status(state: str) -> Json:
    return {"debugInfo": {"state": state, "stateInfo": HOST_STATE_INFO.get(state, "")}}


def node_name(agent: Json) -> str:
    """The host's name as its kubelet registers it: requested, else discovered, else the id."""
    inventory = status(agent).get("inventory") or {}
    return str(spec(agent).get("hostname") or inventory.get("hostname") or meta(agent)["name"])


def node(agent: Json) -> Json:
    name = node_name(agent)
    role = "master" if spec(agent).get("role") == "master" else "worker"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        f"node-role.kubernetes.io/{role}": "",
        **(spec(agent).get("nodeLabels") or {}),
    }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def node_status(agent: Json) -> Json:
    stamp = now()
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    # assisted-service names an Agent after the host's system UUID.
    return {
        "conditions": [ready],
        "addresses": [{"type": "Hostname", "address": node_name(agent)}],
        "nodeInfo": {
            "machineID": meta(agent)["name"].replace("-", ""),
            "systemUUID": meta(agent)["name"],
            "bootID": stable_uuid(agent, "boot"),
            "kernelVersion": "5.14.0-427.rhcos",
            "osImage": "Red Hat Enterprise Linux CoreOS (capibus assisted stand-in)",
            "containerRuntimeVersion": "cri-o://1.29.0",
            "kubeletVersion": "v1.29.0",
            "kubeProxyVersion": "v1.29.0",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }
