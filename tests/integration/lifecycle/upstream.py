"""A world as azimuth-capi-operator leaves it, written from upstream's code, not capibus's.

Upstream is azimuth-cloud/azimuth-capi-operator (``azimuth_capi/operator.py``, ``status.py``,
``templates/cluster-values.yaml``, ``chart/values.yaml``) with kopf's persistence
(nolar/kopf ``kopf/_cogs/configs/diffbase.py`` and ``conventions.py``). ``left_by_upstream``
makes one Cluster and everything upstream made for it, on the real API server, with the
stand-ins playing the peers and the real helm binary installing the release:

* the Cluster as the portal made it, with kopf's finalizer, its diff-base annotation
  ``last-handled-configuration`` (the essence: the spec and the labels, compact JSON and a
  newline), its ``kopf-managed`` marker and upstream's ``cluster-template`` label;
* the ``<name>-etcd-key`` Secret (32 random bytes, no owner);
* with OIDC on (the only setting written out here), OIDCClient and Platform ``kube-<name>``
  server-side applied by upstream's field manager with the Cluster as controller
  (``kopf.adopt``), and the user kubeconfig ``<name>-kubeconfig-user``;
* with a Lease, upstream's finalizer ``azimuth.stackhpc.com`` on it (the portal's
  ownerReference already names the Cluster, so upstream adds none);
* the release ``<name>`` in the Cluster's namespace, installed once with the values
  ``generate_helm_values_for_release`` renders, written out here (``upstream_values``), not
  computed by ``services/helm/values.py``;
* the status as ``save_cluster_status`` writes it once every event was handled
  (``upstream_status``): pydantic's ``exclude_defaults`` (no ``leasePhase`` without a Lease, no
  empty ``services``, no ``lastUpdated`` once Ready), a node's ``created`` as pydantic prints a
  datetime (``+00:00``), written through the status subresource.

Zenith is off: no Zenith Secret, no zenith-operator release.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from shared.errors import CapibusError
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CLUSTER_TEMPLATE,
    CONTROL_PLANE,
    HELM_RELEASE,
    LEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    OIDC_CLIENT,
    OPENSTACK_MACHINE,
    PLATFORM,
    REALM,
    SECRET,
)
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack
from tests.integration.lifecycle.conftest import CHARTS, World
from tests.integration.support import eventually

Json = dict[str, Any]

UPSTREAM = "azimuth-capi-operator"  # upstream's field manager and managed-by label
FINALIZER = "azimuth.stackhpc.com/finalizer"
LEASE_FINALIZER = "azimuth.stackhpc.com"
LAST_HANDLED = "azimuth.stackhpc.com/last-handled-configuration"
KOPF_MARKER = "azimuth.stackhpc.com/kopf-managed"
TEMPLATE_LABEL = "azimuth.stackhpc.com/cluster-template"
CLUSTER_LABEL = "capi.stackhpc.com/cluster"
RBAC = "rbac.authorization.k8s.io"
CLUSTER_ROLE = "oidc:default-users-cluster"
#: upstream's chart default (``chart/values.yaml``), as pydantic's ``model_dump_json`` prints
#: each rule into the template
CLUSTER_ROLE_RULES = (
    '{"apiGroups":["*"],"resources":["*"],"verbs":["*"]}',
    '{"nonResourceURLs":["*"],"verbs":["*"]}',
)


# --- upstream's writing, written out ---------------------------------------------------------


def kopf_essence(manifest: Json) -> str:
    """kopf's diff-base annotation for the Cluster as last handled: the body without
    apiVersion, kind, status and metadata but its labels, compact JSON and a newline."""
    essence = {"spec": manifest["spec"], "metadata": {"labels": manifest["metadata"]["labels"]}}
    return json.dumps(essence, separators=(",", ":")) + "\n"


def upstream_cluster(namespace: str, name: str, template: str, **spec: Any) -> Json:
    """The Cluster as the portal made it and upstream's create handler left it."""
    manifest = cluster_manifest(
        namespace,
        name,
        templateName=template,
        cloudCredentialsSecretName=f"{name}-cloud-credentials",
        controlPlaneMachineSize="m1.small",
        nodeGroups=[{"name": "md-0", "machineSize": "m1.medium", "count": 2}],
        **spec,
    )
    meta = manifest["metadata"]
    meta["finalizers"] = [FINALIZER]
    meta["labels"] = {TEMPLATE_LABEL: template}
    meta["annotations"] = {KOPF_MARKER: "yes", LAST_HANDLED: kopf_essence(manifest)}
    return manifest


def owned_by(cluster: Json) -> list[Json]:
    """``kopf.adopt``'s ownerReference: the Cluster as controller."""
    meta = cluster["metadata"]
    return [
        {
            "apiVersion": CLUSTER.api_version,
            "kind": CLUSTER.kind,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _subjects(realm_group: str | None, cluster_group: str) -> str:
    """A binding's subjects as upstream's template renders them (Jinja keeps the lines of its
    ``{% if %}`` tags as blank ones)."""
    group = f"  - apiGroup: {RBAC}\n    kind: Group\n    name: oidc:{{}}\n"
    realm = group.format(realm_group) + "  \n" if realm_group else ""
    return "subjects:\n  \n" + realm + group.format(cluster_group)


def oidc_default_rbac(realm_group: str | None, cluster_group: str) -> Json:
    """Upstream's ``oidc-default-rbac`` Manifests addon for the chart's default identity
    settings, byte for byte as ``cluster-values.yaml`` renders it."""
    rules = "".join(f"  - {rule}\n  \n" for rule in CLUSTER_ROLE_RULES)
    role = (
        f"apiVersion: {RBAC}/v1\nkind: ClusterRole\nmetadata:\n  name: {CLUSTER_ROLE}\n"
        f"\nrules:\n  \n{rules}"
    )
    binding = (
        f"apiVersion: {RBAC}/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {CLUSTER_ROLE}\n"
        + _subjects(realm_group, cluster_group)
        + f"roleRef:\n  apiGroup: {RBAC}\n  kind: ClusterRole\n  name: {CLUSTER_ROLE}\n"
    )
    manifests = {
        "oidc-default-cluster-role.yaml": role,
        "oidc-default-cluster-role-binding.yaml": binding,
    }
    return {"kind": "Manifests", "spec": {"namespace": "oidc-system", "manifests": manifests}}


@dataclass(frozen=True)
class Identity:
    """What upstream's create handler read from the Realm, OIDCClient and Platform."""

    issuer_url: str
    client_id: str
    realm_group: str | None
    cluster_group: str


def upstream_values(
    spec: Json, template_values: Json, identity: Identity, size_name_map: Json | None
) -> Json:
    """``generate_helm_values_for_release`` for these specs (no default values, no flavor
    overrides, autoscaling, ingress or monitoring), then the Lease's remap."""
    flavor = spec["controlPlaneMachineSize"]
    groups = [
        {
            "name": g["name"],
            "machineFlavor": g["machineSize"],
            "autoscale": False,
            "machineCount": g["count"],
        }
        for g in spec["nodeGroups"]
    ]
    if size_name_map is not None:
        flavor = size_name_map.get(flavor, flavor)
        for group in groups:
            group["machineFlavor"] = size_name_map.get(
                group["machineFlavor"], group["machineFlavor"]
            )
    rbac = oidc_default_rbac(identity.realm_group, identity.cluster_group)
    return {
        **template_values,
        "cloudCredentialsSecretName": spec["cloudCredentialsSecretName"],
        "oidc": {
            "issuerUrl": identity.issuer_url,
            "clientId": identity.client_id,
            "usernameClaim": "preferred_username",
        },
        "controlPlane": {"machineFlavor": flavor, "healthCheck": {"enabled": True}},
        "nodeGroupDefaults": {"healthCheck": {"enabled": True}},
        "nodeGroups": groups,
        "addons": {
            "ingress": {"enabled": False},
            "monitoring": {"enabled": False},
            "custom": {"oidc-default-rbac": rbac},
        },
    }


def user_kubeconfig(admin: Json, identity: Identity) -> str:
    """``ensure_user_kubeconfig_secret``'s document, as ``yaml.safe_dump`` wrote it."""
    cluster = yaml.safe_load(base64.b64decode(admin["data"]["value"]))["clusters"][0]
    login = [
        "oidc-login",
        "get-token",
        "--grant-type=device-code",
        f"--oidc-issuer-url={identity.issuer_url}",
        f"--oidc-client-id={identity.client_id}",
    ]
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [
            {
                "name": "oidc",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "kubectl",
                        "args": login,
                    }
                },
            }
        ],
        "contexts": [
            {
                "name": f"oidc@{cluster['name']}",
                "context": {"cluster": cluster["name"], "user": "oidc"},
            }
        ],
        "current-context": f"oidc@{cluster['name']}",
        "preferences": {},
    }
    return str(yaml.safe_dump(document))


# --- upstream's status -----------------------------------------------------------------------


def _created(stamp: str) -> str:
    """A creationTimestamp as pydantic parses it into a datetime and easykube encodes it."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).isoformat()


def _conditions(obj: Json) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def upstream_node(machine: Json, flavor: str) -> Json:
    """``machine_updated``'s NodeStatus, defaults left out (``exclude_defaults``)."""
    status, labels = machine.get("status") or {}, machine["metadata"]["labels"]
    phase = status.get("phase", "Unknown")
    if phase == "Running":
        phase = "Ready" if _conditions(machine).get("NodeHealthy") == "True" else "Unhealthy"
    elif phase == "Provisioned":
        phase = "Provisioning"
    ips = [a["address"] for a in status.get("addresses", []) if a["type"] == "InternalIP"]
    node: Json = {
        "role": labels["capi.stackhpc.com/component"],
        "phase": phase,
        "size": flavor,
        "ip": ips[0] if ips else None,
        "ips": ips,
        "kubeletVersion": machine["spec"]["version"].lstrip("v"),
        "nodeGroup": labels.get("capi.stackhpc.com/node-group"),
        "created": _created(machine["metadata"]["creationTimestamp"]),
    }
    return {k: v for k, v in node.items() if v not in (None, [])}


def upstream_addon(addon: Json) -> Json:
    status = addon.get("status") or {}
    entry = {"phase": status.get("phase", "Unknown"), "revision": status.get("revision", 0)}
    return {k: v for k, v in entry.items() if v not in ("Unknown", 0)}


def control_plane_phase(kcp: Json) -> str:
    """``control_plane_updated`` for the states a settled stand-in reaches."""
    conditions = _conditions(kcp)
    if conditions.get("Ready") != "True":
        return "Pending" if "Ready" not in conditions else "ScalingUp"
    return "Ready" if conditions.get("ControlPlaneComponentsHealthy") == "True" else "Unhealthy"


async def _labelled(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> list[Json]:
    items, _ = await kube.list(kind, namespace=namespace, label_selector=f"{CLUSTER_LABEL}={name}")
    return items


async def upstream_status(kube: KubeClient, namespace: str, name: str, lease: str | None) -> Json:
    """What ``save_cluster_status`` would PUT once every event was handled; ``phase`` is Ready
    only when upstream's last rule would say so (every part settled), else Reconciling."""
    capi = await kube.get(CAPI_CLUSTER, namespace, name)
    [kcp] = await _labelled(kube, CONTROL_PLANE, namespace, name)
    kcp_status = kcp.get("status") or {}
    deployments = await _labelled(kube, MACHINE_DEPLOYMENT, namespace, name)
    nodes = {}
    for machine in await _labelled(kube, MACHINE, namespace, name):
        infra = machine["spec"]["infrastructureRef"]["name"]
        flavor = (await kube.get(OPENSTACK_MACHINE, namespace, infra))["spec"]["flavor"]
        nodes[machine["metadata"]["name"]] = upstream_node(machine, flavor)
    addons = {
        a["metadata"]["labels"]["capi.stackhpc.com/component"]: upstream_addon(a)
        for kind in (HELM_RELEASE, MANIFESTS)
        for a in await _labelled(kube, kind, namespace, name)
    }
    status: Json = {
        "kubernetesVersion": (kcp_status.get("version") or kcp["spec"]["version"]).lstrip("v"),
        "kubeconfigSecretName": f"{name}-kubeconfig-user",
        "networkingPhase": (capi.get("status") or {}).get("phase", "Unknown"),
        "controlPlanePhase": control_plane_phase(kcp),
        "nodeCount": len(nodes),
        "nodes": nodes,
        "addonCount": len(addons),
        "addons": addons,
    }
    if lease:
        status["leasePhase"] = (await kube.get(LEASE, namespace, lease))["status"]["phase"]
    expected = kcp["spec"]["replicas"] + sum(d["spec"]["replicas"] for d in deployments)
    settled = (
        status["networkingPhase"] == "Provisioned"
        and status["controlPlanePhase"] == "Ready"
        and len(nodes) == expected
        and all(n["phase"] == "Ready" for n in nodes.values())
        and all(a.get("phase") == "Deployed" for a in addons.values())
        and status.get("leasePhase", "Active") == "Active"
    )
    # Rule 8 of ``_reconcile_cluster_phase``; Ready clears ``lastUpdated``.
    status["phase"] = "Ready" if settled else "Reconciling"
    return status


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """The paths (``/a/b``) at which ``new`` differs from ``old``."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            found
            for key in sorted(old.keys() | new.keys())
            for found in differences(old.get(key), new.get(key), f"{path}/{key}")
        ]
    return [] if old == new else [path or "/"]


# --- preparing the world ---------------------------------------------------------------------


@dataclass
class Helm:
    """The real helm binary, as upstream's pyhelm3 client runs it (Secrets driver)."""

    executable: Path
    env: dict[str, str]

    @classmethod
    def private(cls, tools_bin: Path | None, stack: LocalStack, home: Path) -> Helm:
        homes = {
            f"HELM_{d.upper()}_HOME": str(home / "helm" / d) for d in ("cache", "config", "data")
        }
        env = {**os.environ, **stack.env(), **homes, "HELM_DRIVER": "secret"}
        return cls((tools_bin / "helm") if tools_bin else Path("helm"), env)

    def run(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [str(self.executable), *args],
            input=stdin,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def changed(self, name: str, namespace: str) -> list[str]:
        """The value paths the release's latest revision changed from its first."""

        def values(revision: str) -> Json:
            args = ("get", "values", name, "-n", namespace, "-o", "json", "--revision", revision)
            return dict(json.loads(self.run(*args)) or {})

        history = json.loads(self.run("history", name, "-n", namespace, "-o", "json"))
        first, last = values("1"), values(str(history[-1]["revision"]))
        return differences(first, last)

    def install(self, name: str, namespace: str, values: Json) -> None:
        chart = str(CHARTS / "openstack-cluster")
        self.run(
            *("upgrade", name, chart, "--history-max", "10", "--install", "--output", "json"),
            *("--timeout", "1h", "--namespace", namespace, "--values", "-"),
            stdin=json.dumps(values),
        )


async def applied(kube: KubeClient, kind: ResourceKind, obj: Json) -> Json:
    return await kube.apply(kind, obj, field_manager=UPSTREAM, force=True)


async def identity_of(w: World, cluster: Json) -> Identity:
    """OIDCClient and Platform ``kube-<name>`` as upstream applies them, once they are ready."""
    name, namespace = cluster["metadata"]["name"], w.namespace
    meta = {"name": f"kube-{name}", "namespace": namespace, "ownerReferences": owned_by(cluster)}
    client_meta = {**meta, "labels": {"app.kubernetes.io/managed-by": UPSTREAM}}
    spec = {"realmName": namespace, "public": True, "grantTypes": ["DeviceCode"]}
    await applied(w.kube, OIDC_CLIENT, _doc(OIDC_CLIENT, client_meta, spec))
    await applied(w.kube, PLATFORM, _doc(PLATFORM, meta, {"realmName": namespace}))
    client = await _ready(w, OIDC_CLIENT, f"kube-{name}", "clientId")
    platform = await _ready(w, PLATFORM, f"kube-{name}", "rootGroup")
    realm = await _ready(w, REALM, namespace, "oidcIssuerUrl")
    return Identity(
        issuer_url=client["status"]["issuerUrl"],
        client_id=client["status"]["clientId"],
        realm_group=realm["status"].get("platformUsersGroup"),
        cluster_group=platform["status"]["rootGroup"],
    )


def _doc(kind: ResourceKind, metadata: Json, spec: Json) -> Json:
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata, "spec": spec}


async def _ready(w: World, kind: ResourceKind, name: str, key: str) -> Json:
    return await eventually(
        lambda: w.kube.get(kind, w.namespace, name),
        lambda o: bool((o.get("status") or {}).get(key)),
        what=f"{kind.kind} {name} with {key}",
    )


async def lease_of(w: World, cluster: Json) -> Json:
    """The portal's Lease, adopted by upstream (its finalizer; the portal's ownerReference
    already names the Cluster), once the schedule operator made it Active."""
    name = await w.create_lease(cluster, ["f-small", "f-medium"])
    lease = await eventually(
        lambda: w.kube.get(LEASE, w.namespace, name),
        lambda o: (o.get("status") or {}).get("phase") == "Active",
        what=f"Lease {name} Active",
    )
    adopt = [{"op": "add", "path": "/metadata/finalizers/-", "value": LEASE_FINALIZER}]
    await w.kube.patch_json(LEASE, w.namespace, name, adopt)
    return lease


@dataclass(frozen=True)
class Left:
    """What upstream left of one Cluster that a takeover must keep."""

    metadata: Json  # finalizers, labels and annotations
    status: Json


async def left_by_upstream(w: World, helm: Helm, name: str, **spec: Any) -> Left:
    """One Cluster and everything upstream made for it, up to its Ready status (the module
    docstring lists what)."""
    kube, namespace = w.kube, w.namespace
    manifest = upstream_cluster(namespace, name, w.template, **spec)
    await w.create_credentials(f"{name}-cloud-credentials")
    cluster = await kube.create(CLUSTER, manifest)
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    etcd = {"metadata": {"name": f"{name}-etcd-key", "namespace": namespace}, "data": {"key": key}}
    await kube.create(SECRET, etcd)
    identity = await identity_of(w, cluster)
    lease = await lease_of(w, cluster) if spec.get("leaseName") else None
    size_map = lease["status"]["sizeNameMap"] if lease else None
    template = await kube.get(CLUSTER_TEMPLATE, None, w.template)
    values = upstream_values(manifest["spec"], template["spec"]["values"], identity, size_map)
    await asyncio.to_thread(helm.install, name, namespace, values)
    admin = await eventually(
        lambda: _get(kube, SECRET, namespace, f"{name}-kubeconfig"),
        lambda s: s is not None,
        timeout=60,
        what=f"{name}-kubeconfig",
    )
    assert admin is not None
    await applied(kube, SECRET, _user_secret(cluster, admin, identity))
    status = await eventually(
        lambda: _settled(kube, namespace, name, spec.get("leaseName")),
        lambda s: s is not None,
        timeout=60,
        what=f"{name} settled under the stand-ins",
    )
    assert status is not None
    await kube.patch_merge(CLUSTER, namespace, name, {"status": status}, subresource="status")
    meta = manifest["metadata"]
    return Left({k: meta[k] for k in ("finalizers", "labels", "annotations")}, status)


async def _settled(kube: KubeClient, namespace: str, name: str, lease: str | None) -> Json | None:
    """``upstream_status`` once it says Ready; None while an object it reads is still missing
    (no control plane yet: ValueError; a Machine's OpenStackMachine not made yet: 404)."""
    with contextlib.suppress(CapibusError, ValueError):
        status = await upstream_status(kube, namespace, name, lease)
        return status if status["phase"] == "Ready" else None
    return None


def _user_secret(cluster: Json, admin: Json, identity: Identity) -> Json:
    meta = admin["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{meta['name']}-user",
            "namespace": meta["namespace"],
            "labels": meta["labels"],
            "ownerReferences": owned_by(cluster),
        },
        "stringData": {"value": user_kubeconfig(admin, identity)},
    }


async def _get(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> Json | None:
    with contextlib.suppress(CapibusError):
        return await kube.get(kind, namespace, name)
    return None
