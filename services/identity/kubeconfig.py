"""Pure rules of the OIDC user kubeconfig (with OIDC on; upstream's
``ensure_user_kubeconfig_secret``).

CAPI writes the admin kubeconfig to Secret ``<cluster>-kubeconfig`` (key ``value``). Portal
users get ``<cluster>-kubeconfig-user`` instead: the admin kubeconfig's first cluster (server
and CA), and a user ``oidc`` that logs in through ``kubectl oidc-login`` with the device-code
grant against the Cluster's OIDCClient. The Secret copies the admin Secret's labels (so its
``cluster.x-k8s.io/cluster-name`` routes its events to the Cluster's partition and the monitor
can point ``status.kubeconfigSecretName`` at it) and is controlled by the Azimuth Cluster.

**When it is written.** Only when what is stored differs from what we would write: the stored
kubeconfig is decoded and compared as a document, so the admin Secret's events (a rotated
client certificate the user kubeconfig does not carry) and our own write coming back as an
event cost reads, never a write. A changed server, CA, issuer or client id does differ, and is
written. Comparing content makes recording the admin Secret's resourceVersion unnecessary.

The Secret is applied with ``data`` rather than ``stringData``: ``stringData`` is write-only, so
server-side apply could never see it as already applied.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import yaml

from services.identity import logic
from shared.messages import ResourceChanged
from shared.resources import OIDC_CLIENT, SECRET

Json = dict[str, Any]

CAPI_CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
ADMIN_SUFFIX = "-kubeconfig"
USER_SUFFIX = "-kubeconfig-user"
KEY = "value"
USER = "oidc"
EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"


def admin_secret_name(cluster_name: str) -> str:
    return f"{cluster_name}{ADMIN_SUFFIX}"


def user_secret_name(cluster_name: str) -> str:
    return f"{cluster_name}{USER_SUFFIX}"


def cluster_of_secret(name: str, labels: dict[str, str]) -> str | None:
    """The Cluster whose admin or user kubeconfig Secret this is; None for any other Secret.

    Decided from the event alone (name, then label), so the many other Secrets of a Cluster
    (CA, etcd, service account, cloud credentials) cost no API call.
    """
    if not (name.endswith(ADMIN_SUFFIX) or name.endswith(USER_SUFFIX)):
        return None
    cluster = labels.get(CAPI_CLUSTER_NAME_LABEL)
    if not cluster or name not in (admin_secret_name(cluster), user_secret_name(cluster)):
        return None
    return cluster


def oidc_login(client: Json | None) -> tuple[str, str] | None:
    """(issuer URL, client id) from the OIDCClient's status, once it has both."""
    status = (client or {}).get("status") or {}
    issuer, client_id = status.get("issuerUrl"), status.get("clientId")
    if isinstance(issuer, str) and issuer and isinstance(client_id, str) and client_id:
        return issuer, client_id
    return None


def read(secret: Json | None) -> Json | None:
    """The kubeconfig stored under ``data.value``; None when absent or unreadable."""
    encoded = ((secret or {}).get("data") or {}).get(KEY)
    if not isinstance(encoded, str):
        return None
    try:
        loaded = yaml.safe_load(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def render(cluster_name: str, admin: Json, *, issuer: str, client_id: str) -> Json | None:
    """The user kubeconfig: the admin's first cluster, the ``oidc`` user, its context.

    None when the admin kubeconfig names no cluster to reach.
    """
    clusters = admin.get("clusters")
    first = clusters[0] if isinstance(clusters, list) and clusters else None
    if not isinstance(first, dict) or not isinstance(first.get("cluster"), dict):
        return None
    context = f"{USER}@{cluster_name}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": first["cluster"]}],
        "users": [{"name": USER, "user": {"exec": _exec(issuer, client_id)}}],
        "contexts": [{"name": context, "context": {"cluster": cluster_name, "user": USER}}],
        "current-context": context,
    }


def _exec(issuer: str, client_id: str) -> Json:
    return {
        "apiVersion": EXEC_API_VERSION,
        "command": "kubectl",
        "args": [
            "oidc-login",
            "get-token",
            "--grant-type=device-code",
            f"--oidc-issuer-url={issuer}",
            f"--oidc-client-id={client_id}",
        ],
    }


def desired_secret(cluster: Json, admin_secret: Json, kubeconfig: Json) -> Json:
    meta = cluster["metadata"]
    text = yaml.safe_dump(kubeconfig, sort_keys=False)
    return {
        "apiVersion": SECRET.api_version,
        "kind": SECRET.kind,
        "metadata": {
            "name": user_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": dict((admin_secret.get("metadata") or {}).get("labels") or {}),
            "ownerReferences": [logic.owner_reference(cluster)],
        },
        "data": {KEY: base64.b64encode(text.encode()).decode()},
    }


def is_current(actual: Json | None, desired: Json) -> bool:
    """Whether the stored Secret has our labels, our owner and the same kubeconfig."""
    if actual is None or not logic.metadata_current(actual, desired):
        return False
    return read(actual) == read(desired)


def clusters_touched(messages: Sequence[ResourceChanged]) -> list[tuple[str, str]]:
    """(namespace, name) of each Cluster whose user kubeconfig these events may change.

    Its admin or user kubeconfig Secret changed, or its OIDCClient (issuer, client id).
    """
    found: dict[tuple[str, str], None] = {}
    for message in messages:
        ref, meta = message.ref, message.object.get("metadata") or {}
        if ref.kind == SECRET.kind:
            name = cluster_of_secret(ref.name, meta.get("labels") or {})
        elif ref.kind == OIDC_CLIENT.kind:
            name = logic.owning_cluster(message.object)
        else:
            name = None
        if ref.namespace and name:
            found[(ref.namespace, name)] = None
    return list(found)
