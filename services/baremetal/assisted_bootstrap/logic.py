"""Pure rules of the OpenShift Assisted bootstrap provider: names, gates, shapes it writes.

Everything here is upstream v0.2.0 (openshift-assisted/cluster-api-provider-openshift-assisted,
``bootstrap/internal/controller/openshiftassistedconfig_controller.go`` and
``agent_controller.go``, ``bootstrap/api/v1alpha1/openshiftassistedconfig_types.go``) unless a
comment says it is a capibus addition. No function here reads the cluster; the reconcilers in
``configs`` and ``agents`` read, decide through these, and write.

Malformed input (a worker Machine without its MachineDeployment label, an ACI whose
``debugInfo`` is not an object, an Agent whose ignition override is not JSON, an Agent already
approved for the other role) is a ``PermanentError`` with a reason naming the shape: retrying
cannot change it, and a human must read it.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from typing import Any

from shared.errors import PermanentError
from shared.messages import Condition

Json = dict[str, Any]

# --- names upstream relies on ---------------------------------------------------------------

FINALIZER = "openshiftassistedconfig.bootstrap.cluster.x-k8s.io/deprovision"
FIELD_MANAGER = "capibus-assistedbootstrap"
CONFIG_LABEL = "bootstrap.cluster.x-k8s.io/openshiftAssistedConfig"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
INFRAENV_LABEL = "infraenvs.agent-install.openshift.io"
NODE_UUID_LABEL = "metal3.io/uuid"
CAPI_GROUP = "cluster.x-k8s.io"
LIVE_ISO = "live-iso"

MASTER, WORKER = "master", "worker"

#: ACI states in which a worker may join (day 2): before the install starts, and after it
DAY2_OPEN = frozenset({"adding-hosts", "pending-for-input", "insufficient", ""})

# --- status vocabulary --------------------------------------------------------------------

DATA_SECRET = "DataSecretAvailable"
READY = "Ready"
#: capibus addition: whether an Agent was bound to this config, and why not
AGENT_BOUND = "AgentBound"
#: capibus addition: a control-plane config refusing deletion while its Machine lives
DELETING = "Deleting"

SECRET_CREATED = "DataSecretCreated"
INFRA_ENV_FAILED = "InfraEnvFailed"
PROPAGATING_FAILED = "PropagatingLiveISOURLFailed"
CREATING_SECRET_FAILED = "CreatingSecretFailed"
WAITING_FOR_URL = "WaitingForLiveISOURL"
WAITING_FOR_INSTALL = "WaitingForInstallComplete"
WAITING_FOR_INSTALLER = "WaitingForAssistedInstaller"
WAITING_FOR_INFRA = "WaitingForClusterInfrastructure"
NO_MATCHING_HOST = "NoMatchingHost"
BOUND = "Bound"
ROLE_CONFLICT = "AgentRoleConflict"
MACHINE_NOT_DELETED = "MachineNotDeleted"

#: sentinel file Cluster API looks for: "bootstrap succeeded" (``agent_controller.go``)
SENTINEL_PATH = "/run/cluster-api/bootstrap-success.complete"
SENTINEL_SOURCE = "data:text/plain;charset=utf-8;base64,c3VjY2Vzcw=="


# --- reading objects ----------------------------------------------------------------------


def meta(obj: Json) -> Json:
    return obj.get("metadata") or {}


def spec(obj: Json) -> Json:
    return obj.get("spec") or {}


def status(obj: Json) -> Json:
    return obj.get("status") or {}


def labels(obj: Json) -> dict[str, str]:
    return meta(obj).get("labels") or {}


def deleting(obj: Json) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def object_key(obj: Json) -> str:
    return f"{meta(obj).get('namespace')}/{meta(obj).get('name')}"


def owner_ref(obj: Json, kind: str, group: str | None = None) -> Json | None:
    """``obj``'s ownerReference of ``kind`` (of ``group``, if given)."""
    for owner in meta(obj).get("ownerReferences") or []:
        api = str(owner.get("apiVersion", ""))
        if owner.get("kind") == kind and (group is None or api.partition("/")[0] == group):
            return dict(owner)
    return None


def owner_name(obj: Json, kind: str, group: str | None = None) -> str | None:
    """The name of ``obj``'s owner of ``kind`` (of ``group``, if given)."""
    owner = owner_ref(obj, kind, group)
    return str(owner["name"]) if owner else None


def is_control_plane(obj: Json) -> bool:
    return CONTROL_PLANE_LABEL in labels(obj)


def cluster_of(machine: Json) -> str | None:
    """The Cluster a Machine belongs to: ``spec.clusterName``, else its label."""
    return spec(machine).get("clusterName") or labels(machine).get(CLUSTER_NAME_LABEL)


def condition_of(obj: Json, kind: str) -> Json | None:
    for found in status(obj).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return None


def waiting_reason(oac: Json) -> str | None:
    """Why the config is not ready yet: its ``DataSecretAvailable`` reason (None: never said)."""
    found = condition_of(oac, DATA_SECRET)
    return str(found.get("reason") or "") if found else None


def ready(oac: Json) -> bool:
    return bool(status(oac).get("ready"))


def infra_env_ref_name(oac: Json) -> str | None:
    ref = status(oac).get("infraEnvRef") or {}
    return ref.get("name") or None


def agent_ref_name(oac: Json) -> str | None:
    ref = status(oac).get("agentRef") or {}
    return ref.get("name") or None


def config_ref(machine: Json) -> Json | None:
    """The Machine's bootstrap configRef when it names an OpenshiftAssistedConfig."""
    ref = (spec(machine).get("bootstrap") or {}).get("configRef") or {}
    if ref.get("kind") != "OpenshiftAssistedConfig" or not ref.get("name"):
        return None
    return dict(ref)


# --- the OAC's gates ------------------------------------------------------------------------


def aci_state(aci: Json) -> str:
    """``status.debugInfo.state``; "" while assisted-service has not reported, as upstream
    (its ``DebugInfo`` is a value, so a fresh ACI reads as the empty state)."""
    debug = status(aci).get("debugInfo")
    if debug is None:
        return ""
    if not isinstance(debug, dict) or not isinstance(debug.get("state", ""), str):
        raise PermanentError(
            f"AgentClusterInstall {object_key(aci)} has a malformed status.debugInfo: {debug!r}",
            reason="MalformedAgentClusterInstall",
        )
    return str(debug.get("state") or "")


def lenient_aci_state(aci: Json) -> str | None:
    """The state, or None when it cannot be read (a mapper never fails on a shape)."""
    try:
        return aci_state(aci)
    except PermanentError:
        return None


def day2_open(state: str) -> bool:
    return state in DAY2_OPEN


def infra_env_name(cluster: str, machine: Json) -> str:
    """The pool's InfraEnv: ``<cluster>-control-plane``, or ``<cluster>-<machine deployment>``."""
    if is_control_plane(machine):
        return f"{cluster}-control-plane"
    deployment = labels(machine).get(DEPLOYMENT_LABEL)
    if not deployment:
        raise PermanentError(
            f"worker Machine {object_key(machine)} has no label {DEPLOYMENT_LABEL}: "
            "its pool's InfraEnv cannot be named",
            reason=INFRA_ENV_FAILED,
        )
    return f"{cluster}-{deployment}"


def pool_by_labels(oac: Json, cluster: str) -> str | None:
    """The InfraEnv an OAC's own labels name (None when they do not tell)."""
    if is_control_plane(oac):
        return f"{cluster}-control-plane"
    deployment = labels(oac).get(DEPLOYMENT_LABEL)
    return f"{cluster}-{deployment}" if deployment else None


#: the OAC spec fields an InfraEnv takes over as they are (§B.2 of the InfraEnv's shape)
_INFRA_ENV_FIELDS = (
    "proxy",
    "pullSecretRef",
    "additionalNTPSources",
    "sshAuthorizedKey",
    "nmStateConfigLabelSelector",
    "cpuArchitecture",
    "kernelArguments",
    "additionalTrustBundle",
    "osImageVersion",
)


def infra_env(oac: Json, *, name: str, cluster: str, cluster_deployment: str, owner: Json) -> Json:
    """The pool's InfraEnv from the first config that needs it, owned by that config."""
    namespace = meta(oac)["namespace"]
    body = {k: spec(oac)[k] for k in _INFRA_ENV_FIELDS if spec(oac).get(k) not in (None, "", [])}
    body["clusterRef"] = {"name": cluster_deployment, "namespace": namespace}
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "InfraEnv",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CONFIG_LABEL: meta(oac)["name"], CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [owner],
        },
        "spec": body,
    }


def infra_env_ref(infra: Json) -> Json:
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "InfraEnv",
        "name": meta(infra)["name"],
        "namespace": meta(infra)["namespace"],
    }


def iso_url(infra: Json) -> str:
    return str(status(infra).get("isoDownloadURL") or "")


def internal_url(url: str, cluster_ip: str, port: int) -> str:
    """``url`` sent to the image service's cluster address, path and query kept."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(("http", f"{cluster_ip}:{port}", parts.path, parts.query, ""))


def same_image(recorded: str, published: str, *, internal: bool) -> bool:
    """Whether ``recorded`` (an OAC's) is what the InfraEnv's ``published`` URL becomes: equal,
    or, when rewritten to the internal address, with the same path and query."""
    if not internal:
        return recorded == published
    a, b = urllib.parse.urlsplit(recorded), urllib.parse.urlsplit(published)
    return bool(recorded) and (a.path, a.query) == (b.path, b.query)


def image(url: str) -> Json:
    return {"url": url, "format": LIVE_ISO}


#: Cluster API's annotations on a clone (``external.CreateFromTemplate``): its template
CLONED_FROM_NAME = "cluster.x-k8s.io/cloned-from-name"
CLONED_FROM_GROUPKIND = "cluster.x-k8s.io/cloned-from-groupkind"
METAL3_TEMPLATE_GROUPKIND = "Metal3MachineTemplate.infrastructure.cluster.x-k8s.io"


def cloned_from(infra: Json) -> str | None:
    """The Metal3MachineTemplate a Metal3Machine was cloned from, as its annotations say."""
    annotations = meta(infra).get("annotations") or {}
    if annotations.get(CLONED_FROM_GROUPKIND) != METAL3_TEMPLATE_GROUPKIND:
        return None
    return str(annotations.get(CLONED_FROM_NAME) or "") or None


# --- the Agent ------------------------------------------------------------------------------


def ignition_override() -> str:
    """Ignition 3.1.0 with the one sentinel file: root, mode 0644, overwrite, "success"."""
    config = {
        "ignition": {"version": "3.1.0"},
        "storage": {
            "files": [
                {
                    "path": SENTINEL_PATH,
                    "user": {"name": "root"},
                    "mode": 420,
                    "overwrite": True,
                    "contents": {"source": SENTINEL_SOURCE},
                }
            ]
        },
    }
    return json.dumps(config, separators=(",", ":"))


def carries_sentinel(agent: Json) -> bool:
    """Whether the Agent's ignition override is already ours. Another valid override is
    replaced (as upstream); one that is not Ignition JSON at all is refused: someone wrote it
    by hand, and overwriting it would hide that it never worked."""
    text = spec(agent).get("ignitionConfigOverrides")
    if not text:
        return False
    try:
        config = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise PermanentError(
            f"Agent {object_key(agent)} has a malformed ignitionConfigOverrides: {exc}",
            reason="MalformedIgnition",
        ) from exc
    if not isinstance(config, dict):
        raise PermanentError(
            f"Agent {object_key(agent)} has an ignitionConfigOverrides that is not an object",
            reason="MalformedIgnition",
        )
    return bool(config == json.loads(ignition_override()))


def macs(agent: Json) -> list[str]:
    """The Agent's inventory MAC addresses, lower-cased."""
    inventory = status(agent).get("inventory") or {}
    interfaces = inventory.get("interfaces") or []
    return [str(i["macAddress"]).lower() for i in interfaces if i.get("macAddress")]


def boot_mac(host: Json) -> str:
    return str(spec(host).get("bootMACAddress") or "").lower()


def host_for(agent_macs: Iterable[str], hosts: Iterable[Json]) -> Json | None:
    """The BareMetalHost whose boot MAC is one of the Agent's (case-insensitive)."""
    wanted = set(agent_macs)
    return next((h for h in hosts if boot_mac(h) and boot_mac(h) in wanted), None)


def role_for(machine: Json) -> str:
    return MASTER if is_control_plane(machine) else WORKER


def agent_patch(agent: Json, *, role: str, host_uid: str, cluster: str) -> Json | None:
    """The one patch that binds ``agent`` (None when it is bound so already).

    An Agent already approved for the other role is refused: approving it again would
    change a host's role under an install in progress.
    """
    current = spec(agent)
    approved_as = current.get("role") if current.get("approved") else None
    if approved_as in (MASTER, WORKER) and approved_as != role:
        raise PermanentError(
            f"Agent {object_key(agent)} is approved as {current['role']}, "
            f"its Machine asks for {role}",
            reason=ROLE_CONFLICT,
        )
    wanted_spec: Json = {}
    if current.get("role") != role:
        wanted_spec["role"] = role
    if current.get("approved") is not True:
        wanted_spec["approved"] = True
    if (current.get("nodeLabels") or {}).get(NODE_UUID_LABEL) != host_uid:
        wanted_spec["nodeLabels"] = {NODE_UUID_LABEL: host_uid}
    if not carries_sentinel(agent):
        wanted_spec["ignitionConfigOverrides"] = ignition_override()
    patch: Json = {"spec": wanted_spec} if wanted_spec else {}
    if labels(agent).get(CLUSTER_NAME_LABEL) != cluster:
        patch["metadata"] = {"labels": {CLUSTER_NAME_LABEL: cluster}}
    return patch or None


def bound(agent: Json) -> bool:
    """Whether an Agent was bound by this provider (approved, with a role and our label)."""
    current = spec(agent)
    return bool(
        current.get("approved")
        and current.get("role") in (MASTER, WORKER)
        and labels(agent).get(CLUSTER_NAME_LABEL)
    )


# --- status ----------------------------------------------------------------------------------


def condition(kind: str, ok: bool, reason: str, message: str = "") -> Condition:
    return Condition(type=kind, status="True" if ok else "False", reason=reason, message=message)


def summary(available: Condition) -> tuple[Condition, Condition]:
    """``DataSecretAvailable`` and the ``Ready`` summary derived from it (its only input)."""
    return available, available.model_copy(update={"type": READY})


def holds(obj: Json, patch: Json, conditions: Iterable[Condition]) -> bool:
    """Whether ``obj``'s status already says all of ``patch`` and ``conditions``."""
    current = status(obj)
    for key, value in patch.items():
        if current.get(key) != value:
            return False
    for wanted in conditions:
        found = condition_of(obj, wanted.type)
        if found is None or any(
            (found.get(k) or "") != getattr(wanted, k) for k in ("status", "reason", "message")
        ):
            return False
    return True
