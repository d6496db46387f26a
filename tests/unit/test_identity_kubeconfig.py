"""The OIDC user kubeconfig's pure rules (H16 with OIDC on)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
import yaml

from services.identity import kubeconfig, logic
from shared.messages import ObjectRef, ResourceChanged
from shared.resources import OIDC_CLIENT, SECRET

Json = dict[str, Any]
CLUSTER: Json = {"metadata": {"name": "demo", "namespace": "ns", "uid": "u-1"}}
ADMIN_CONFIG: Json = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {
            "name": "demo",
            "cluster": {"server": "https://1.2.3.4:6443", "certificate-authority-data": "Q0E="},
        },
        {"name": "other", "cluster": {"server": "https://elsewhere"}},
    ],
    "users": [{"name": "demo-admin", "user": {"client-key-data": "secret"}}],
    "contexts": [{"name": "demo-admin@demo", "context": {"cluster": "demo", "user": "demo-admin"}}],
    "current-context": "demo-admin@demo",
}
LABELS = {"cluster.x-k8s.io/cluster-name": "demo", "other": "kept"}


def encoded(value: Any) -> str:
    return base64.b64encode(yaml.safe_dump(value).encode()).decode()


def admin_secret(config: Json = ADMIN_CONFIG) -> Json:
    return {
        "metadata": {"name": "demo-kubeconfig", "namespace": "ns", "labels": dict(LABELS)},
        "data": {"value": encoded(config)},
    }


def rendered(issuer: str = "https://id/realms/ns", client_id: str = "kube-demo") -> Json:
    found = kubeconfig.render("demo", ADMIN_CONFIG, issuer=issuer, client_id=client_id)
    assert found is not None
    return found


def test_the_user_kubeconfig_logs_in_through_oidc_login() -> None:
    assert rendered() == {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "demo",
                "cluster": {"server": "https://1.2.3.4:6443", "certificate-authority-data": "Q0E="},
            }
        ],
        "users": [
            {
                "name": "oidc",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "kubectl",
                        "args": [
                            "oidc-login",
                            "get-token",
                            "--grant-type=device-code",
                            "--oidc-issuer-url=https://id/realms/ns",
                            "--oidc-client-id=kube-demo",
                        ],
                    }
                },
            }
        ],
        "contexts": [{"name": "oidc@demo", "context": {"cluster": "demo", "user": "oidc"}}],
        "current-context": "oidc@demo",
    }


@pytest.mark.parametrize("clusters", [None, [], ["text"], [{"name": "x"}]])
def test_an_admin_kubeconfig_without_a_cluster_renders_nothing(clusters: Any) -> None:
    admin = {**ADMIN_CONFIG, "clusters": clusters}
    assert kubeconfig.render("demo", admin, issuer="i", client_id="c") is None


def test_the_secret_copies_labels_is_owned_by_the_cluster_and_stores_data() -> None:
    secret = kubeconfig.desired_secret(CLUSTER, admin_secret(), rendered())
    assert secret["metadata"] == {
        "name": "demo-kubeconfig-user",
        "namespace": "ns",
        "labels": LABELS,
        "ownerReferences": [
            {
                "apiVersion": "azimuth.stackhpc.com/v1alpha1",
                "kind": "Cluster",
                "name": "demo",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    assert (secret["apiVersion"], secret["kind"]) == ("v1", "Secret")
    assert kubeconfig.read(secret) == rendered()
    assert kubeconfig.read(admin_secret()) == ADMIN_CONFIG


@pytest.mark.parametrize(
    "secret",
    [None, {}, {"data": {}}, {"data": {"value": "!!not base64"}}, {"data": {"value": "W10="}}],
)
def test_unreadable_kubeconfigs_read_as_none(secret: Json | None) -> None:
    assert kubeconfig.read(secret) is None


def test_a_stored_secret_with_server_additions_is_current() -> None:
    desired = kubeconfig.desired_secret(CLUSTER, admin_secret(), rendered())
    stored = copy.deepcopy(desired)
    stored["metadata"]["labels"]["added"] = "by someone"
    stored["metadata"]["ownerReferences"].append({"kind": "Other", "uid": "u-9"})
    stored["metadata"]["resourceVersion"] = "7"
    stored["type"] = "Opaque"
    # The same document, written differently.
    stored["data"]["value"] = base64.b64encode(
        yaml.safe_dump(rendered(), default_flow_style=True).encode()
    ).decode()
    assert kubeconfig.is_current(stored, desired)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["metadata"]["labels"].pop("other"),
        lambda s: s["metadata"].pop("ownerReferences"),
        lambda s: s["data"].pop("value"),
        lambda s: s["data"].update(
            value=encoded(rendered(issuer="https://moved", client_id="kube-demo"))
        ),
    ],
)
def test_a_secret_missing_any_of_ours_is_not_current(change: Any) -> None:
    desired = kubeconfig.desired_secret(CLUSTER, admin_secret(), rendered())
    stored = copy.deepcopy(desired)
    change(stored)
    assert not kubeconfig.is_current(stored, desired)
    assert not kubeconfig.is_current(None, desired)


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        ("demo-kubeconfig", LABELS, "demo"),
        ("demo-kubeconfig-user", LABELS, "demo"),
        ("demo-ca", LABELS, None),
        ("demo-kubeconfig", {}, None),
        ("other-kubeconfig", LABELS, None),
    ],
)
def test_which_secrets_are_kubeconfigs_of_a_cluster(
    name: str, labels: dict[str, str], expected: str | None
) -> None:
    assert kubeconfig.cluster_of_secret(name, labels) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"issuerUrl": "https://id", "clientId": "c"}, ("https://id", "c")),
        ({"issuerUrl": "https://id"}, None),
        ({"clientId": "c"}, None),
        ({"issuerUrl": "", "clientId": "c"}, None),
        (None, None),
    ],
)
def test_the_login_needs_issuer_and_client_id(status: Json | None, expected: Any) -> None:
    client = None if status is None else {"status": status}
    assert kubeconfig.oidc_login(client) == expected


def event(kind: Any, name: str, obj: Json) -> ResourceChanged:
    return ResourceChanged(
        source="t",
        correlation_id="x",
        event="MODIFIED",
        ref=ObjectRef(api_version=kind.api_version, kind=kind.kind, namespace="ns", name=name),
        resource_version="1",
        object=obj,
    )


def test_events_that_may_change_a_user_kubeconfig() -> None:
    owned = {"metadata": {"ownerReferences": [logic.owner_reference(CLUSTER)]}}
    messages = [
        event(SECRET, "demo-kubeconfig", {"metadata": {"labels": LABELS}}),
        event(SECRET, "demo-ca", {"metadata": {"labels": LABELS}}),
        event(OIDC_CLIENT, "kube-demo", owned),
        event(OIDC_CLIENT, "stray", {"metadata": {}}),
        event(
            SECRET,
            "b-kubeconfig-user",
            {"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "b"}}},
        ),
    ]
    assert kubeconfig.clusters_touched(messages) == [("ns", "demo"), ("ns", "b")]
