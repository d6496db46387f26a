"""The generated CRDs, applied to a real kube-apiserver, make it enforce the models' rules.

Every CRD in ``deploy/crds`` and ``standins/crds`` is server-side applied the way a deployer
would, then the API server itself must accept valid objects and reject invalid ones with
messages that name the field: the CEL rules, required fields, enums on the status subresource.
"""

from __future__ import annotations

import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from shared import crdgen, names
from shared.models import AppTemplate, Cluster, ClusterPhase, ClusterTemplate
from shared.models import azimuth as models

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((REPO / "deploy" / "crds").glob("*.yaml")) + sorted(
    (REPO / "standins" / "crds").glob("*.yaml")
)
FIELD_MANAGER = "capibus-tests"
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
AZIMUTH_API = "/apis/azimuth.stackhpc.com/v1alpha1"
READY_DEADLINE = 30.0
POLL_INTERVAL = 0.1


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _poll(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + READY_DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(POLL_INTERVAL)


def _condition_true(obj: dict[str, Any], condition_type: str) -> bool:
    # A CRD read right after it was created may carry "conditions": null.
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == condition_type and c["status"] == "True" for c in conditions)


def _apply_crd(kube: httpx.Client, path: Path) -> str:
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    response = kube.patch(
        f"{CRD_API}/{name}",
        params={"fieldManager": FIELD_MANAGER, "force": "true"},
        content=path.read_bytes(),
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert response.status_code in (200, 201), f"{path.name}: {response.text}"
    return str(name)


def _wait_established(kube: httpx.Client, name: str) -> None:
    _poll(
        lambda: _condition_true(kube.get(f"{CRD_API}/{name}").json(), "Established"),
        f"CRD {name} to be Established",
    )


@pytest.fixture(scope="module")
def kube(stack: Any) -> Iterator[httpx.Client]:
    endpoints = stack.endpoints
    with httpx.Client(
        base_url=endpoints.api_url,
        verify=ssl.create_default_context(cafile=str(endpoints.ca_file)),
        headers={"Authorization": f"Bearer {endpoints.token}"},
        timeout=30.0,
    ) as client:
        yield client


@pytest.fixture(scope="module")
def crds(kube: httpx.Client) -> list[str]:
    names = [_apply_crd(kube, path) for path in CRD_FILES]
    for name in names:
        _wait_established(kube, name)
    return names


@pytest.fixture(scope="module")
def namespace(kube: httpx.Client, crds: list[str]) -> Iterator[str]:
    name = _unique("crd-test")
    created = kube.post("/api/v1/namespaces", json={"metadata": {"name": name}})
    assert created.status_code == 201, created.text
    # Established can precede the handler serving the new resource; wait until it lists.
    _poll(
        lambda: kube.get(f"{AZIMUTH_API}/namespaces/{name}/clusters").status_code == 200,
        "the clusters resource to be served",
    )
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def cluster_scoped(kube: httpx.Client) -> Iterator[list[str]]:
    """Paths of cluster-scoped objects a test created, deleted afterwards."""
    paths: list[str] = []
    yield paths
    for path in paths:
        kube.delete(path)


def _cluster(name: str, **spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "label": name,
        "templateName": "kube-1-31",
        "cloudCredentialsSecretName": f"{name}-cloud-credentials",
        "controlPlaneMachineSize": "m1.medium",
        "nodeGroups": [{"name": "md-0", "machineSize": "m1.large", "count": 2}],
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": models.API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": spec,
    }


def _create_cluster(kube: httpx.Client, namespace: str, body: dict[str, Any]) -> httpx.Response:
    return kube.post(f"{AZIMUTH_API}/namespaces/{namespace}/clusters", json=body)


def _rejection(response: httpx.Response) -> tuple[str, list[dict[str, Any]]]:
    assert response.status_code == 422, response.text
    body = response.json()
    return body["message"], body.get("details", {}).get("causes", [])


# --------------------------------------------------------------------------------------------


def test_every_crd_is_established(kube: httpx.Client, crds: list[str]) -> None:
    for name in crds:
        crd = kube.get(f"{CRD_API}/{name}").json()
        assert _condition_true(crd, "NamesAccepted"), name
    assert {f"{kind.resource.crd_name}" for kind in models.RESOURCES} <= set(crds)


def test_valid_cluster_is_accepted_and_stored_without_defaults(
    kube: httpx.Client, namespace: str
) -> None:
    name = _unique("ok")

    response = _create_cluster(kube, namespace, _cluster(name))

    assert response.status_code == 201, response.text
    stored = response.json()
    # No server-side defaults: what the client sent is what is stored.
    assert "paused" not in stored["spec"]
    assert "addons" not in stored["spec"]
    cluster = Cluster.model_validate(stored)
    assert cluster.spec.autohealing is True
    assert cluster.status.phase is ClusterPhase.UNKNOWN


def test_autoscaling_node_group_is_accepted(kube: httpx.Client, namespace: str) -> None:
    groups = [
        {"name": "md-0", "machineSize": "m1", "autoscale": True, "minCount": 1, "maxCount": 3}
    ]

    response = _create_cluster(kube, namespace, _cluster(_unique("auto"), nodeGroups=groups))

    assert response.status_code == 201, response.text


def test_missing_count_is_rejected_by_cel_naming_the_field(
    kube: httpx.Client, namespace: str
) -> None:
    body = _cluster(_unique("nocount"), nodeGroups=[{"name": "md-0", "machineSize": "m1"}])

    message, causes = _rejection(_create_cluster(kube, namespace, body))

    assert "spec.nodeGroups[0].count" in message
    assert models.COUNT_REQUIRED in message
    assert any(cause.get("field") == "spec.nodeGroups[0].count" for cause in causes)


@pytest.mark.parametrize(
    ("group", "field", "text"),
    [
        ({"maxCount": 3}, "minCount", models.MIN_COUNT_REQUIRED),
        ({"minCount": 1}, "maxCount", models.MAX_COUNT_REQUIRED),
        ({"minCount": 3, "maxCount": 2}, "maxCount", models.MAX_COUNT_BELOW_MIN),
    ],
)
def test_autoscaling_bounds_are_enforced_by_cel(
    kube: httpx.Client, namespace: str, group: dict[str, int], field: str, text: str
) -> None:
    groups = [{"name": "md-0", "machineSize": "m1", "autoscale": True, **group}]

    message, _ = _rejection(
        _create_cluster(kube, namespace, _cluster(_unique("bounds"), nodeGroups=groups))
    )

    assert f"spec.nodeGroups[0].{field}" in message
    assert text in message


def test_missing_required_field_is_rejected(kube: httpx.Client, namespace: str) -> None:
    body = _cluster(_unique("notemplate"))
    del body["spec"]["templateName"]

    message, _ = _rejection(_create_cluster(kube, namespace, body))

    assert "spec.templateName: Required value" in message


def test_invalid_status_enum_is_rejected_on_the_status_subresource(
    kube: httpx.Client, namespace: str
) -> None:
    name = _unique("status")
    assert _create_cluster(kube, namespace, _cluster(name)).status_code == 201
    status_path = f"{AZIMUTH_API}/namespaces/{namespace}/clusters/{name}/status"
    merge = {"Content-Type": "application/merge-patch+json"}

    bad = kube.patch(status_path, content=b'{"status": {"phase": "Bogus"}}', headers=merge)
    good = kube.patch(
        status_path,
        content=b'{"status": {"phase": "Ready", "futureField": {"kept": true}}}',
        headers=merge,
    )

    message, _ = _rejection(bad)
    assert 'status.phase: Unsupported value: "Bogus"' in message
    assert good.status_code == 200, good.text
    status = good.json()["status"]
    assert status["phase"] == "Ready"
    assert status["futureField"] == {"kept": True}  # status preserves unknown fields


def test_printer_columns_are_served(kube: httpx.Client, namespace: str) -> None:
    name = _unique("table")
    assert _create_cluster(kube, namespace, _cluster(name)).status_code == 201

    table = kube.get(
        f"{AZIMUTH_API}/namespaces/{namespace}/clusters/{name}",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    ).json()

    columns = [column["name"] for column in table["columnDefinitions"]]
    assert columns[:3] == ["Name", "Label", "Template"]
    assert "Node Count" in columns
    assert "Age" in columns


def test_cluster_template_keeps_free_form_values(
    kube: httpx.Client, crds: list[str], cluster_scoped: list[str]
) -> None:
    name = _unique("tmpl")
    path = f"{AZIMUTH_API}/clustertemplates/{name}"
    cluster_scoped.append(path)
    values = {"kubernetesVersion": "1.31.2", "machineImageId": "img", "etcd": {"size": 5}}
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "ClusterTemplate",
        "metadata": {"name": name},
        "spec": {"label": "K8s", "description": "A cluster.", "values": values},
    }

    response = kube.post(f"{AZIMUTH_API}/clustertemplates", json=body)

    assert response.status_code == 201, response.text
    template = ClusterTemplate.model_validate(response.json())
    assert template.spec.values.model_dump()["etcd"] == {"size": 5}


def test_app_template_chart_name_is_checked_by_cel(
    kube: httpx.Client, crds: list[str], cluster_scoped: list[str]
) -> None:
    def body(name: str, chart_name: str) -> dict[str, Any]:
        return {
            "apiVersion": models.API_VERSION,
            "kind": "AppTemplate",
            "metadata": {"name": name},
            "spec": {"chart": {"repo": "https://charts.example.org", "name": chart_name}},
        }

    good_name, bad_name = _unique("app"), _unique("badapp")
    cluster_scoped.append(f"{AZIMUTH_API}/apptemplates/{good_name}")

    good = kube.post(f"{AZIMUTH_API}/apptemplates", json=body(good_name, "jupyterhub"))
    bad = kube.post(f"{AZIMUTH_API}/apptemplates", json=body(bad_name, "Jupyter_Hub"))

    assert good.status_code == 201, good.text
    assert AppTemplate.model_validate(good.json()).spec.keep_versions == 5
    message, _ = _rejection(bad)
    assert "spec.chart.name" in message
    assert models.CHART_NAME_INVALID in message


def test_standin_accepts_any_shape_and_has_a_status_subresource(
    kube: httpx.Client, namespace: str
) -> None:
    name = _unique("capi")
    base = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{namespace}/clusters"
    body = {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"controlPlaneRef": {"kind": "KubeadmControlPlane", "name": f"{name}-cp"}},
        "status": {"phase": "ignored on create"},
    }

    created = kube.post(base, json=body)
    patched = kube.patch(
        f"{base}/{name}/status",
        content=b'{"status": {"phase": "Provisioned", "conditions": []}}',
        headers={"Content-Type": "application/merge-patch+json"},
    )

    assert created.status_code == 201, created.text
    assert created.json()["spec"]["controlPlaneRef"]["name"] == f"{name}-cp"
    assert "status" not in created.json()  # status is a subresource
    assert patched.json()["status"]["phase"] == "Provisioned"


# --- Cluster names ----------------------------------------------------------------------------


def test_a_new_cluster_named_longer_than_the_helm_release_allows_is_refused(
    kube: httpx.Client, namespace: str
) -> None:
    longest = _unique("a").ljust(names.MAX_LENGTH, "a")

    message, _ = _rejection(_create_cluster(kube, namespace, _cluster("a" * 60)))

    assert names.problem("a" * 60) in message  # the webhook's words, with the actual length
    assert _create_cluster(kube, namespace, _cluster(longest)).status_code == 201


def test_a_cluster_named_before_the_rule_existed_can_still_be_deleted(kube: httpx.Client) -> None:
    """The rule is on the root, so it runs on every update: only its transition form lets a
    Cluster created before it lose its finalizer. Checked on a copy of the Cluster CRD under a
    group of its own, first applied without the rule."""
    group = f"{_unique('names')}.capibus.test"
    crd = crdgen.crd_for(Cluster)
    crd["metadata"]["name"] = f"clusters.{group}"
    crd["spec"]["group"] = group
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema.pop("x-kubernetes-validations")
    _apply_crd_document(kube, crd)
    namespace = _unique("names")
    assert kube.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).is_success
    base = f"/apis/{group}/v1alpha1/namespaces/{namespace}/clusters"
    body = {**_cluster("b" * 60), "apiVersion": f"{group}/v1alpha1"}
    body["metadata"]["finalizers"] = ["capibus.test/keep"]
    _poll(lambda: kube.post(base, json=body).status_code == 201, "the old-style Cluster")
    old = f"{base}/{'b' * 60}"
    merge = {"Content-Type": "application/merge-patch+json"}

    schema["x-kubernetes-validations"] = rules
    _apply_crd_document(kube, crd)
    other = {**body, "metadata": {"name": "c" * 60}}
    _poll(lambda: kube.post(base, json=other).status_code == 422, "the rule to be enforced")
    labelled = kube.patch(old, content=b'{"metadata": {"labels": {"x": "y"}}}', headers=merge)
    status = kube.patch(f"{old}/status", content=b'{"status": {"phase": "Pending"}}', headers=merge)
    deleting = kube.delete(old)
    released = kube.patch(old, content=b'{"metadata": {"finalizers": null}}', headers=merge)

    try:
        assert labelled.status_code == 200, labelled.text
        assert status.status_code == 200, status.text
        assert deleting.status_code == 200, deleting.text
        assert released.status_code == 200, released.text
        assert kube.get(old).status_code == 404
    finally:
        kube.delete(f"/api/v1/namespaces/{namespace}")
        kube.delete(f"{CRD_API}/clusters.{group}")


def _apply_crd_document(kube: httpx.Client, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    response = kube.patch(
        f"{CRD_API}/{name}",
        params={"fieldManager": FIELD_MANAGER, "force": "true"},
        content=yaml.safe_dump(crd).encode(),
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert response.status_code in (200, 201), response.text
    _wait_established(kube, name)
