"""The admission reviews against a fake API, and the AdmissionReview codec (no network)."""

import asyncio
import copy
from typing import Any

import pytest

from services.admission import app
from services.admission.handlers import review_cluster, review_cluster_template
from shared.errors import KubeForbidden, KubeNotFound, KubeUnavailable
from shared.kube import ResourceKind
from shared.webhook import AdmissionRequest, MalformedReview, Verdict, decide, encode

Json = dict[str, Any]
NS = "tenant"


class FakeApi:
    """Templates and secrets in dicts; every call recorded; optional failure per kind."""

    def __init__(self) -> None:
        self.templates: dict[str, Json] = {}
        self.secrets: set[str] = {"creds"}
        self.labelled: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.failures: dict[str, Exception] = {}

    def add_template(self, name: str, version: str, *, deprecated: bool = False) -> None:
        spec = {
            "label": name,
            "description": "d",
            "deprecated": deprecated,
            "values": {"kubernetesVersion": version, "machineImageId": "img"},
        }
        self.templates[name] = {"metadata": {"name": name}, "spec": spec}

    def _call(self, verb: str, kind: ResourceKind) -> None:
        self.calls.append((verb, kind.plural))
        if kind.plural in self.failures:
            raise self.failures[kind.plural]

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        self._call("get", kind)
        if name not in self.templates:
            raise KubeNotFound(f"{kind.plural} {name}")
        return copy.deepcopy(self.templates[name])

    async def exists(self, kind: ResourceKind, namespace: str | None, name: str) -> bool:
        self._call("exists", kind)
        assert namespace == NS
        return name in self.secrets

    async def any_labelled(self, kind: ResourceKind, label_selector: str) -> bool:
        self._call("list", kind)
        return label_selector in self.labelled


@pytest.fixture
def api() -> FakeApi:
    fake = FakeApi()
    fake.add_template("k129", "1.29.4")
    fake.add_template("k130", "1.30.1")
    fake.add_template("k131", "1.31.0")
    fake.add_template("k128", "1.28.9")
    fake.add_template("k2", "2.0.0")
    fake.add_template("k130-old", "1.30.0", deprecated=True)
    return fake


def cluster(template: str = "k129", *, deleting: bool = False, **spec: Any) -> Json:
    meta: Json = {"name": "c", "namespace": NS, "finalizers": ["f"]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    body = {
        "label": "c",
        "templateName": template,
        "cloudCredentialsSecretName": "creds",
        "controlPlaneMachineSize": "small",
        **spec,
    }
    return {"metadata": meta, "spec": body}


def with_nodes(obj: Json, *kubelets: str) -> Json:
    nodes = {f"n{i}": {"kubeletVersion": k} for i, k in enumerate(kubelets)}
    return {**obj, "status": {"nodes": nodes}}


def create(obj: Json) -> AdmissionRequest:
    return AdmissionRequest(
        uid="u", operation="CREATE", kind="Cluster", name="c", namespace=NS, object=obj
    )


def update(old: Json, new: Json) -> AdmissionRequest:
    return AdmissionRequest(
        uid="u",
        operation="UPDATE",
        kind="Cluster",
        name="c",
        namespace=NS,
        object=new,
        old_object=old,
    )


def denied(verdict: Verdict, fragment: str, code: int = 400) -> bool:
    return not verdict.allowed and verdict.code == code and fragment in verdict.message


# --- Cluster CREATE ---------------------------------------------------------------------------


async def test_valid_cluster_is_allowed(api: FakeApi) -> None:
    verdict = await review_cluster(create(cluster()), api=api)
    assert verdict == Verdict.allow()
    assert api.calls == [("exists", "secrets"), ("get", "clustertemplates")]


async def test_invalid_spec_is_denied_before_any_lookup(api: FakeApi) -> None:
    obj = cluster(nodeGroups=[{"name": "md", "machineSize": "s", "autoscale": True}])
    verdict = await review_cluster(create(obj), api=api)
    assert denied(verdict, "spec.nodeGroups[0].minCount: minCount is required")
    assert api.calls == []


async def test_missing_secret_is_denied(api: FakeApi) -> None:
    api.secrets.clear()
    verdict = await review_cluster(create(cluster()), api=api)
    assert denied(verdict, "specified cloud credentials secret does not exist: 'creds'")


async def test_missing_template_is_denied(api: FakeApi) -> None:
    verdict = await review_cluster(create(cluster("nope")), api=api)
    assert denied(verdict, "specified cluster template does not exist: 'nope'")


async def test_unreadable_template_is_denied(api: FakeApi) -> None:
    api.templates["bad"] = {"metadata": {"name": "bad"}, "spec": {"label": "x"}}
    verdict = await review_cluster(create(cluster("bad")), api=api)
    assert denied(verdict, "specified cluster template is invalid: bad:")


async def test_new_cluster_on_deprecated_template_is_denied(api: FakeApi) -> None:
    verdict = await review_cluster(create(cluster("k130-old")), api=api)
    assert denied(verdict, "specified cluster template is deprecated: k130-old")


async def test_new_cluster_may_start_on_any_version(api: FakeApi) -> None:
    assert (await review_cluster(create(cluster("k2")), api=api)).allowed


# --- Cluster UPDATE ---------------------------------------------------------------------------


async def test_metadata_only_update_makes_no_call(api: FakeApi) -> None:
    api.secrets.clear()
    api.templates.clear()
    old = cluster()
    new = {**cluster(deleting=True), "metadata": {"name": "c", "finalizers": []}}
    assert (await review_cluster(update(old, new), api=api)).allowed
    assert api.calls == []


async def test_metadata_only_update_is_allowed_even_if_the_stored_spec_is_invalid(
    api: FakeApi,
) -> None:
    broken = {"metadata": {"name": "c"}, "spec": {"label": ""}}
    assert (await review_cluster(update(broken, copy.deepcopy(broken)), api=api)).allowed


async def test_spec_change_while_deleting_needs_no_secret(api: FakeApi) -> None:
    api.secrets.clear()
    old = cluster(deleting=True)
    new = cluster(deleting=True, label="renamed")
    assert (await review_cluster(update(old, new), api=api)).allowed
    assert ("exists", "secrets") not in api.calls


async def test_spec_change_needs_the_secret(api: FakeApi) -> None:
    api.secrets.clear()
    verdict = await review_cluster(update(cluster(), cluster(label="renamed")), api=api)
    assert denied(verdict, "specified cloud credentials secret does not exist")


async def test_keeping_a_deprecated_template_is_allowed_with_a_warning(api: FakeApi) -> None:
    old, new = cluster("k130-old"), cluster("k130-old", label="renamed")
    verdict = await review_cluster(update(old, new), api=api)
    assert verdict.allowed
    assert verdict.warnings == (
        "cluster template 'k130-old' is deprecated; consider moving to another",
    )


async def test_moving_to_a_deprecated_template_is_denied(api: FakeApi) -> None:
    verdict = await review_cluster(update(cluster("k129"), cluster("k130-old")), api=api)
    assert denied(verdict, "specified cluster template is deprecated")


async def test_one_minor_upgrade_is_allowed(api: FakeApi) -> None:
    old = with_nodes(cluster("k129"), "v1.29.4", "v1.29.4")
    verdict = await review_cluster(update(old, cluster("k130")), api=api)
    assert verdict == Verdict.allow()
    assert api.calls.count(("get", "clustertemplates")) == 2


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("k129", "k128", "would be a downgrade (1.29.4 -> 1.28.9)"),
        ("k129", "k2", "upgrading to a new major version is not supported"),
        ("k129", "k131", "upgrading by more than one minor version is not supported"),
    ],
)
async def test_upgrade_rules(api: FakeApi, old: str, new: str, reason: str) -> None:
    verdict = await review_cluster(update(cluster(old), cluster(new)), api=api)
    assert denied(verdict, reason)


async def test_upgrade_beyond_the_oldest_kubelet_is_denied(api: FakeApi) -> None:
    old = with_nodes(cluster("k130"), "v1.30.1", "v1.29.8")
    verdict = await review_cluster(update(old, cluster("k131")), api=api)
    assert denied(verdict, "newer than the oldest node is not supported (oldest node 1.29.8")


async def test_upgrade_from_a_vanished_template_keeps_the_kubelet_rule(api: FakeApi) -> None:
    old = cluster("gone")
    assert (await review_cluster(update(old, cluster("k131")), api=api)).allowed
    old_with_nodes = with_nodes(old, "v1.29.0")
    verdict = await review_cluster(update(old_with_nodes, cluster("k131")), api=api)
    assert denied(verdict, "newer than the oldest node")


async def test_delete_and_connect_are_not_reviewed(api: FakeApi) -> None:
    for operation in ("DELETE", "CONNECT"):
        request = AdmissionRequest(uid="u", operation=operation, kind="Cluster", name="c")
        assert (await review_cluster(request, api=api)).allowed
    assert api.calls == []


# --- lookups that fail ------------------------------------------------------------------------


async def test_unreachable_api_denies_with_cannot_verify(api: FakeApi) -> None:
    api.failures["secrets"] = KubeUnavailable("GET secrets: 503 etcd down")
    verdict = await review_cluster(create(cluster()), api=api)
    assert denied(verdict, "cannot verify the cloud credentials secret 'creds': GET", code=503)


async def test_forbidden_lookup_is_a_server_error(api: FakeApi) -> None:
    api.failures["clustertemplates"] = KubeForbidden("GET clustertemplates: 403 forbidden")
    verdict = await review_cluster(create(cluster()), api=api)
    assert denied(verdict, "cannot verify the cluster template 'k129'", code=500)


async def test_failure_to_read_the_current_template_denies(api: FakeApi) -> None:
    old, new = cluster("k129"), cluster("k130")
    api.failures["clustertemplates"] = KubeUnavailable("timeout")
    verdict = await review_cluster(update(old, new), api=api)
    assert denied(verdict, "cannot verify the cluster template 'k130'", code=503)


# --- ClusterTemplate --------------------------------------------------------------------------


def template_request(operation: str, obj: Json | None, old: Json | None = None) -> AdmissionRequest:
    return AdmissionRequest(
        uid="u",
        operation=operation,
        kind="ClusterTemplate",
        name="k130",
        object=obj,
        old_object=old,
    )


async def test_template_create_and_update_validate_the_spec(api: FakeApi) -> None:
    good = api.templates["k130"]
    bad = {"metadata": {"name": "k130"}, "spec": {**good["spec"], "values": {"x": 1}}}
    assert (await review_cluster_template(template_request("CREATE", good), api=api)).allowed
    verdict = await review_cluster_template(template_request("UPDATE", bad, good), api=api)
    assert denied(verdict, "spec.values.kubernetesVersion: Field required")
    latest = copy.deepcopy(good)
    latest["spec"]["values"]["kubernetesVersion"] = "latest"
    verdict = await review_cluster_template(template_request("CREATE", latest), api=api)
    assert denied(verdict, "must be a SemVer version")
    assert api.calls == []


async def test_template_metadata_update_is_allowed(api: FakeApi) -> None:
    stored = {"metadata": {"name": "k130"}, "spec": {"label": "legacy"}}
    relabelled = {"metadata": {"name": "k130", "labels": {"a": "b"}}, "spec": {"label": "legacy"}}
    verdict = await review_cluster_template(template_request("UPDATE", relabelled, stored), api=api)
    assert verdict.allowed


async def test_template_in_use_cannot_be_deleted(api: FakeApi) -> None:
    api.labelled.append("azimuth.stackhpc.com/cluster-template=k130")
    request = template_request("DELETE", None, api.templates["k130"])
    verdict = await review_cluster_template(request, api=api)
    assert denied(verdict, "template is in use by at least one cluster")
    api.labelled.clear()
    assert (await review_cluster_template(request, api=api)).allowed
    assert api.calls == [("list", "clusters")] * 2


async def test_template_delete_denied_when_usage_cannot_be_checked(api: FakeApi) -> None:
    api.failures["clusters"] = KubeUnavailable("connection refused")
    verdict = await review_cluster_template(template_request("DELETE", None), api=api)
    assert denied(verdict, "cannot verify whether template 'k130' is in use", code=503)


async def test_routes_reach_the_reviews(api: FakeApi) -> None:
    routes = app.routes(app.Deps(api=api))
    assert set(routes) == {"/validate-cluster", "/validate-cluster-template"}
    verdict = await routes["/validate-cluster"](create(cluster("nope")))
    assert denied(verdict, "does not exist")
    delete = template_request("DELETE", None)
    assert (await routes["/validate-cluster-template"](delete)).allowed


# --- the AdmissionReview codec ----------------------------------------------------------------


def review(request: Json) -> Json:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_request_is_decoded() -> None:
    request = AdmissionRequest.from_review(
        review(
            {
                "uid": "abc",
                "kind": {"group": "azimuth.stackhpc.com", "version": "v1alpha1", "kind": "Cluster"},
                "operation": "UPDATE",
                "name": "c",
                "namespace": "ns",
                "object": {"spec": 1},
                "oldObject": {"spec": 2},
                "dryRun": True,
                "userInfo": {"username": "alice"},
            }
        )
    )
    assert request == AdmissionRequest(
        uid="abc",
        operation="UPDATE",
        kind="Cluster",
        name="c",
        namespace="ns",
        object={"spec": 1},
        old_object={"spec": 2},
        dry_run=True,
        username="alice",
    )


@pytest.mark.parametrize(
    "body",
    [[], {"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "a"}}, review({})],
)
def test_malformed_reviews_are_refused(body: Any) -> None:
    with pytest.raises(MalformedReview):
        AdmissionRequest.from_review(body)


def test_verdicts_are_encoded() -> None:
    assert encode("u1", Verdict.allow()) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u1", "allowed": True},
    }
    denial = encode("u2", Verdict.deny("no", code=503))["response"]
    assert denial == {
        "uid": "u2",
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": 503,
            "reason": "ServiceUnavailable",
            "message": "no",
        },
    }
    assert encode("u3", Verdict.allow("careful"))["response"]["warnings"] == ["careful"]


async def test_a_slow_review_becomes_a_denial() -> None:
    async def slow(_: AdmissionRequest) -> Verdict:
        await asyncio.sleep(10)
        return Verdict.allow()

    verdict = await decide(slow, create(cluster()), within=0.01)
    assert denied(verdict, "did not finish within 0.01s", code=504)


async def test_a_crashing_review_becomes_a_denial(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(_: AdmissionRequest) -> Verdict:
        raise KeyError("spec")

    verdict = await decide(broken, create(cluster()), within=1)
    assert denied(verdict, "admission review failed: KeyError", code=500)
    assert "failed" in caplog.text


# --- Cluster names ----------------------------------------------------------------------------


def named(name: str, obj: Json) -> Json:
    return {**obj, "metadata": {**obj["metadata"], "name": name}}


async def test_a_name_longer_than_the_helm_release_allows_is_denied_on_create(
    api: FakeApi,
) -> None:
    verdict = await review_cluster(create(named("a" * 60, cluster())), api=api)
    assert denied(
        verdict,
        "metadata.name: name is 60 characters; at most 53 are allowed because it is the Helm"
        " release name",
    )
    assert api.calls == []


async def test_the_longest_name_is_allowed(api: FakeApi) -> None:
    assert (await review_cluster(create(named("a" * 53, cluster())), api=api)).allowed


async def test_a_long_name_is_judged_from_the_object_when_the_request_has_none(
    api: FakeApi,
) -> None:
    request = AdmissionRequest(
        uid="u",
        operation="CREATE",
        kind="Cluster",
        name="",
        namespace=NS,
        object=named("b" * 54, cluster()),
    )
    assert denied(await review_cluster(request, api=api), "name is 54 characters")


async def test_an_existing_long_name_may_still_be_updated_and_deleted(api: FakeApi) -> None:
    old = named("a" * 60, cluster())
    assert (await review_cluster(update(old, named("a" * 60, cluster(label="x"))), api=api)).allowed
    finalizer_gone = named("a" * 60, cluster(deleting=True))
    assert (await review_cluster(update(old, finalizer_gone), api=api)).allowed
    delete = AdmissionRequest(uid="u", operation="DELETE", kind="Cluster", name="a" * 60)
    assert (await review_cluster(delete, api=api)).allowed
