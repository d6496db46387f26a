"""The Zenith values: the API-server tunnel files, the monitoring client and the chart values."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
import yaml

from services.helm.zenith_values import (
    apiserver_chart_values,
    apiserver_values,
    client_values,
    operator_chart_values,
    tenancy_id,
)
from shared.errors import PermanentError

Json = dict[str, Any]

POD: Json = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "zenith-apiserver", "namespace": "kube-system"},
    "spec": {"containers": [{"name": "zenith-client", "image": "zenith-client:0.1"}]},
}
CONFIGMAP: Json = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "zenith-apiserver"},
    "data": {"client.yaml": "server_address: sshd.test\n", "ssh-key": "KEY"},
}


def decode(content: str) -> str:
    return base64.b64decode(content).decode()


def test_apiserver_values_put_the_api_behind_zenith() -> None:
    values = apiserver_values(fqdn="abc.zenith.test", rendered=[CONFIGMAP, POD])
    assert values["controlPlaneEndpoint"] == {"host": "abc.zenith.test", "port": 443}
    assert values["apiServer"] == {"enableLoadBalancer": False, "associateFloatingIP": False}
    spec = values["controlPlane"]["kubeadmConfigSpec"]
    assert spec["useExperimentalRetryJoin"] is True
    files = spec["files"]
    assert [f["path"] for f in files] == [
        "/etc/kubernetes/manifests/zenith-apiserver.yaml",
        "/etc/zenith/client.yaml",
        "/etc/zenith/ssh-key",
    ]
    for file in files:
        assert file["encoding"] == "base64"
        assert file["owner"] == "root:root"
        assert file["permissions"] == "0600"
    assert yaml.safe_load(decode(files[0]["content"])) == POD
    assert decode(files[1]["content"]) == "server_address: sshd.test\n"
    assert decode(files[2]["content"]) == "KEY"


def test_the_static_pod_is_rendered_deterministically_like_upstream() -> None:
    # A changed file rolls every control-plane machine: the text must be stable and equal to
    # upstream's yaml.safe_dump (sorted keys), whatever order the chart rendered keys in.
    shuffled = dict(reversed(list(POD.items())))
    first = apiserver_values(fqdn="f", rendered=[POD, CONFIGMAP])
    second = apiserver_values(fqdn="f", rendered=[CONFIGMAP, shuffled])
    assert first == second
    pod_file = first["controlPlane"]["kubeadmConfigSpec"]["files"][0]
    assert decode(pod_file["content"]) == yaml.safe_dump(POD)


def test_apiserver_values_need_a_pod_and_a_configmap() -> None:
    with pytest.raises(PermanentError) as caught:
        apiserver_values(fqdn="f", rendered=[CONFIGMAP])
    assert caught.value.reason == "ZenithChartInvalid"
    with pytest.raises(PermanentError):
        apiserver_values(fqdn="f", rendered=[POD])


def test_a_configmap_without_data_gives_only_the_static_pod() -> None:
    empty = {"kind": "ConfigMap", "metadata": {"name": "x"}}
    values = apiserver_values(fqdn="f", rendered=[POD, empty])
    assert len(values["controlPlane"]["kubeadmConfigSpec"]["files"]) == 1


def test_apiserver_chart_values_merge_over_the_defaults() -> None:
    defaults = {"zenithClient": {"image": {"tag": "1"}, "server": {"port": 2222}}, "other": 1}
    before = copy.deepcopy(defaults)
    values = apiserver_chart_values(
        defaults=defaults, private_key_b64="UFJJVg==", sshd_host="sshd.test", sshd_port=22
    )
    assert defaults == before
    assert values == {
        "zenithClient": {
            "image": {"tag": "1"},
            "sshPrivateKeyData": "UFJJVg==",
            "server": {"host": "sshd.test", "port": 22},
        },
        "other": 1,
    }


def test_no_client_values_without_monitoring() -> None:
    assert client_values(monitoring=False, icon_url="https://icon") == {}


def test_monitoring_client_is_a_manifests_addon_with_reservation_and_client() -> None:
    values = client_values(monitoring=True, icon_url="https://icons.test/prometheus.png")
    addon = values["addons"]["custom"]["kube-prometheus-stack-client"]
    assert addon["kind"] == "Manifests"
    assert addon["spec"]["namespace"] == "monitoring-system"
    assert set(addon["spec"]["manifests"]) == {"zenith-client.yaml"}
    reservation, client = yaml.safe_load_all(addon["spec"]["manifests"]["zenith-client.yaml"])
    assert reservation == {
        "apiVersion": "zenith.stackhpc.com/v1alpha1",
        "kind": "Reservation",
        "metadata": {
            "name": "kube-prometheus-stack-client",
            "labels": {"app.kubernetes.io/managed-by": "azimuth-capi-operator"},
            "annotations": {
                "azimuth.stackhpc.com/service-label": "Monitoring",
                "azimuth.stackhpc.com/service-icon-url": "https://icons.test/prometheus.png",
            },
        },
        "spec": {"credentialSecretName": "kube-prometheus-stack-client-zenith-credential"},
    }
    assert client == {
        "apiVersion": "zenith.stackhpc.com/v1alpha1",
        "kind": "Client",
        "metadata": {
            "name": "kube-prometheus-stack-client",
            "labels": {"app.kubernetes.io/managed-by": "azimuth-capi-operator"},
        },
        "spec": {
            "reservationName": "kube-prometheus-stack-client",
            "upstream": {
                "serviceName": "kube-prometheus-stack-grafana",
                "port": 80,
                "scheme": "http",
            },
            "mitmProxy": {
                "enabled": True,
                "authInject": {
                    "type": "Basic",
                    "basic": {
                        "secretName": "kube-prometheus-stack-grafana",
                        "usernameKey": "admin-user",
                        "passwordKey": "admin-password",
                    },
                },
            },
        },
    }


def test_an_empty_icon_url_leaves_the_annotation_out() -> None:
    values = client_values(monitoring=True, icon_url="")
    text = values["addons"]["custom"]["kube-prometheus-stack-client"]["spec"]["manifests"]
    reservation, _ = yaml.safe_load_all(text["zenith-client.yaml"])
    assert reservation["metadata"]["annotations"] == {
        "azimuth.stackhpc.com/service-label": "Monitoring"
    }


def test_operator_chart_values() -> None:
    values = operator_chart_values(
        defaults={"config": {"logLevel": "info"}, "image": {"tag": "0.18.1"}},
        cluster_name="demo",
        registrar_admin_url="http://registrar-admin.test",
        sshd_host="sshd.test",
        sshd_port=2222,
        tenancy_id="project-1",
    )
    assert values == {
        "image": {"tag": "0.18.1"},
        "kubeconfigSecret": {"name": "demo-kubeconfig", "key": "value"},
        "config": {
            "logLevel": "info",
            "registrarAdminUrl": "http://registrar-admin.test",
            "sshdHost": "sshd.test",
            "sshdPort": 2222,
            "defaultAuthParams": {"tenancy-id": "project-1"},
        },
    }


CLOUDS_YAML = """
clouds:
  openstack:
    auth:
      auth_url: https://keystone.test:5000
      application_credential_id: abc
      application_credential_secret: s3cr3t
      project_id: 0123456789abcdef
    region_name: RegionOne
"""


def test_tenancy_id_reads_the_project_of_the_openstack_cloud() -> None:
    assert tenancy_id(CLOUDS_YAML) == "0123456789abcdef"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "clouds: {}",
        "clouds: {other: {auth: {project_id: x}}}",
        "clouds: {openstack: {auth: {project_id: ''}}}",
        "clouds: {openstack: {auth: {project_id: 12}}}",
        "clouds: {openstack: [1]}",
        "- a list",
        "clouds: {openstack: {auth: {password: s3cr3t, project_id: [",  # unreadable
    ],
)
def test_tenancy_id_is_none_when_absent_or_unreadable(text: str) -> None:
    assert tenancy_id(text) is None
