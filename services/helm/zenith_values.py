"""The Zenith parts of a Cluster's Helm values and charts, computed without I/O.

Zenith gives a tenant cluster a public name without a load balancer or floating IP: a static
pod on each control-plane node (the ``zenith-apiserver`` chart, rendered by ``helm template``)
tunnels the local API server to the Zenith SSHD, and a per-cluster zenith-operator (the
``zenith-operator`` chart, applied in the management cluster) publishes the tenant's own
services. The handler does the I/O (reserve the subdomain, read Secrets, run ``helm template``,
apply objects); this module only shapes the data in between, exactly as upstream
(azimuth-capi-operator ``zenith.py`` and ``templates/zenith-client.yaml``).

The files injected into ``kubeadmConfigSpec`` are part of the KubeadmControlPlane spec, and any
change there rolls every control-plane machine. They are therefore rendered deterministically
and byte-compatible with upstream: the Pod is ``yaml.safe_dump`` with sorted keys, and the
ConfigMap files follow the chart's key order.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import yaml

from services.helm.values import mergeconcat
from shared.errors import PermanentError

Json = dict[str, Any]

MANAGED_BY = {"app.kubernetes.io/managed-by": "azimuth-capi-operator"}
STATIC_POD_PATH = "/etc/kubernetes/manifests/zenith-apiserver.yaml"
CONFIG_DIR = "/etc/zenith"
ZENITH_API_VERSION = "zenith.stackhpc.com/v1alpha1"
MONITORING_CLIENT = "kube-prometheus-stack-client"
MONITORING_NAMESPACE = "monitoring-system"


def apiserver_values(*, fqdn: str, rendered: list[Json]) -> Json:
    """Values that put the API server behind Zenith at ``fqdn:443``.

    ``rendered`` is the output of ``helm template`` of the zenith-apiserver chart: a ConfigMap
    whose keys become ``/etc/zenith/<key>`` and a Pod that becomes a static manifest.
    """
    pod = _first(rendered, "Pod")
    configmap = _first(rendered, "ConfigMap")
    data: Mapping[str, str] = configmap.get("data") or {}
    files = [_file(STATIC_POD_PATH, yaml.safe_dump(pod))]
    files += [_file(f"{CONFIG_DIR}/{key}", content) for key, content in data.items()]
    return {
        "controlPlaneEndpoint": {"host": fqdn, "port": 443},
        # Zenith is the way in, so no Octavia load balancer and no floating IP.
        "apiServer": {"enableLoadBalancer": False, "associateFloatingIP": False},
        "controlPlane": {
            "kubeadmConfigSpec": {
                # Joining nodes reach the API through the tunnel, which may lag the first node.
                "useExperimentalRetryJoin": True,
                "files": files,
            }
        },
    }


def _first(rendered: list[Json], kind: str) -> Json:
    for resource in rendered:
        if resource.get("kind") == kind:
            return resource
    raise PermanentError(
        f"the zenith-apiserver chart rendered no {kind}", reason="ZenithChartInvalid"
    )


def _file(path: str, content: str) -> Json:
    return {
        "path": path,
        "content": base64.b64encode(content.encode()).decode(),
        "encoding": "base64",
        "owner": "root:root",
        "permissions": "0600",
    }


def apiserver_chart_values(
    *, defaults: Mapping[str, Any], private_key_b64: str, sshd_host: str, sshd_port: int
) -> Json:
    """Values for ``helm template`` of the zenith-apiserver chart.

    ``private_key_b64`` is the Secret's ``data.id_ed25519`` as stored (already base64).
    """
    client = {
        "sshPrivateKeyData": private_key_b64,
        "server": {"host": sshd_host, "port": sshd_port},
    }
    return mergeconcat(defaults, {"zenithClient": client})


def client_values(*, monitoring: bool, icon_url: str) -> Json:
    """The Manifests addon exposing Grafana through Zenith, when monitoring is on.

    The dashboard client upstream once had is gone (upstream PR #547), so monitoring is the
    only service the operator itself publishes.
    """
    if not monitoring:
        return {}
    manifest = yaml.safe_dump_all(
        [_reservation(MONITORING_CLIENT, "Monitoring", icon_url), _grafana_client()],
        sort_keys=False,
    )
    addon = {
        "kind": "Manifests",
        "spec": {
            "namespace": MONITORING_NAMESPACE,
            "manifests": {"zenith-client.yaml": manifest},
        },
    }
    return {"addons": {"custom": {MONITORING_CLIENT: addon}}}


def _reservation(name: str, label: str, icon_url: str) -> Json:
    annotations = {"azimuth.stackhpc.com/service-label": label}
    if icon_url:
        annotations["azimuth.stackhpc.com/service-icon-url"] = icon_url
    return {
        "apiVersion": ZENITH_API_VERSION,
        "kind": "Reservation",
        "metadata": {"name": name, "labels": dict(MANAGED_BY), "annotations": annotations},
        "spec": {"credentialSecretName": f"{name}-zenith-credential"},
    }


def _grafana_client() -> Json:
    # Grafana's admin login is injected by the proxy, so Zenith's SSO is the only login.
    basic = {
        "secretName": "kube-prometheus-stack-grafana",
        "usernameKey": "admin-user",
        "passwordKey": "admin-password",
    }
    return {
        "apiVersion": ZENITH_API_VERSION,
        "kind": "Client",
        "metadata": {"name": MONITORING_CLIENT, "labels": dict(MANAGED_BY)},
        "spec": {
            "reservationName": MONITORING_CLIENT,
            "upstream": {
                "serviceName": "kube-prometheus-stack-grafana",
                "port": 80,
                "scheme": "http",
            },
            "mitmProxy": {"enabled": True, "authInject": {"type": "Basic", "basic": basic}},
        },
    }


def operator_chart_values(
    *,
    defaults: Mapping[str, Any],
    cluster_name: str,
    registrar_admin_url: str,
    sshd_host: str,
    sshd_port: int,
    tenancy_id: str,
) -> Json:
    """Values for ``helm template`` of the per-cluster zenith-operator chart.

    ``tenancy_id`` is required: it becomes the default auth parameter that limits every
    tenant service to members of the OpenStack project, so a cluster without one must fail
    rather than publish open services.
    """
    overrides = {
        "kubeconfigSecret": {"name": f"{cluster_name}-kubeconfig", "key": "value"},
        "config": {
            "registrarAdminUrl": registrar_admin_url,
            "sshdHost": sshd_host,
            "sshdPort": sshd_port,
            "defaultAuthParams": {"tenancy-id": tenancy_id},
        },
    }
    return mergeconcat(defaults, overrides)


def tenancy_id(clouds_yaml_text: str) -> str | None:
    """``clouds.openstack.auth.project_id`` of a clouds.yaml, or None if absent or unreadable.

    Unreadable YAML gives None rather than an exception on purpose: a YAML error quotes the
    offending text, and this text holds an application credential secret.
    """
    try:
        clouds = yaml.safe_load(clouds_yaml_text)
    except yaml.YAMLError:
        return None
    project_id = _dig(clouds, "clouds", "openstack", "auth", "project_id")
    return project_id if isinstance(project_id, str) and project_id else None


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
