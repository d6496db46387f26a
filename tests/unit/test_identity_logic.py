"""Pure rules of the identity service: Realm choice, documents, decisions, what is reported."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from services.identity import logic
from services.identity.logic import Apply, Names, Observed, Reason, Report, Verdict
from services.identity.settings import IdentityTuning
from shared.messages import ObjectRef, PrerequisiteChanged, ResourceChanged
from shared.resources import OIDC_CLIENT, PLATFORM

Json = dict[str, Any]
NAMES = Names(oidc_client="kube-c", platform="kube-c")
OWNER = {
    "apiVersion": "azimuth.stackhpc.com/v1alpha1",
    "kind": "Cluster",
    "name": "c",
    "uid": "u1",
    "controller": True,
    "blockOwnerDeletion": True,
}


def cluster(name: str = "c", *, realm: str | None = None, **status: Any) -> Json:
    spec: Json = {"label": name}
    if realm:
        spec["zenithIdentityRealmName"] = realm
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": "u1", "generation": 2},
        "spec": spec,
        "status": status,
    }


def realm(name: str, phase: str | None = "Ready", **status: Any) -> Json:
    body: Json = {"metadata": {"name": name, "namespace": "ns"}, "status": dict(status)}
    if phase:
        body["status"]["phase"] = phase
    return body


def stored(document: Json, **status: Any) -> Json:
    """``document`` as the API server returns it: defaults, extra metadata and a status."""
    obj = copy.deepcopy(document)
    obj["metadata"]["uid"] = "x"
    obj["metadata"]["labels"]["other"] = "label"
    obj["spec"].setdefault("redirectUris", [])
    obj["status"] = status
    return obj


def client_doc(c: Json | None = None, realm_name: str = "ns") -> Json:
    return logic.desired_oidc_client(c or cluster(), realm_name=realm_name, name="kube-c")


def platform_doc(c: Json | None = None, realm_name: str = "ns") -> Json:
    return logic.desired_platform(c or cluster(), realm_name=realm_name, name="kube-c")


READY_CLIENT = {"issuerUrl": "https://id/realms/ns", "clientId": "kube-c"}
SERVICES = {"web": {"subdomain": "abc", "fqdn": "abc.example.org", "label": "Web"}}


def paused(c: Json) -> Json:
    c["spec"]["paused"] = True
    return c


# --- Realm choice -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["b", "ns", "a"], "ns"),  # the portal's Realm, named like the namespace
        (["zeta", "alpha", "mid"], "alpha"),  # else the alphabetically first
        ([], None),
    ],
)
def test_default_realm(names: list[str], expected: str | None) -> None:
    assert logic.default_realm_name("ns", names) == expected


def test_the_requested_realm_wins_even_when_absent() -> None:
    assert logic.wanted_realm_name(cluster(realm="b"), ["ns", "a"]) == "b"
    verdict = logic.usable_realm(cluster(realm="b"), [realm("ns"), realm("a")])
    assert verdict == Verdict(False, Reason.REALM_NOT_FOUND, "no Realm b in namespace ns")


@pytest.mark.parametrize(
    ("c", "event_realm", "others", "uses"),
    [
        (cluster(realm="r1"), "r1", [], True),
        (cluster(realm="r1"), "r2", ["r1"], False),
        (cluster(), "ns", ["a"], True),  # now the default
        (cluster(), "b", ["a"], False),  # "a" stays the default
        (cluster(), "a", [], True),  # deleted: it was the default
        (cluster(), "a", ["ns"], False),  # the namespace's Realm is the default
    ],
)
def test_which_clusters_a_realm_event_concerns(
    c: Json, event_realm: str, others: list[str], uses: bool
) -> None:
    assert logic.uses_realm(c, event_realm, others) is uses


# --- documents ----------------------------------------------------------------------------


def test_oidc_client_document() -> None:
    assert client_doc() == {
        "apiVersion": "identity.azimuth.stackhpc.com/v1alpha1",
        "kind": "OIDCClient",
        "metadata": {
            "name": "kube-c",
            "namespace": "ns",
            "labels": {"app.kubernetes.io/managed-by": "azimuth-capi-operator"},
            "ownerReferences": [OWNER],
        },
        "spec": {"realmName": "ns", "public": True, "grantTypes": ["DeviceCode"]},
    }


def test_platform_document_lists_services_or_omits_the_key() -> None:
    services = {
        "web": {"subdomain": "abc", "fqdn": "abc.example.org", "label": "Web"},
        "dash": {"subdomain": "def", "fqdn": "def.example.org", "label": "Dash", "iconUrl": "x"},
    }
    with_services = platform_doc(cluster(services=services))
    assert with_services["kind"] == "Platform"
    assert with_services["metadata"]["ownerReferences"] == [OWNER]
    assert with_services["spec"] == {
        "realmName": "ns",
        "zenithServices": {
            "dash": {"subdomain": "def", "fqdn": "def.example.org"},
            "web": {"subdomain": "abc", "fqdn": "abc.example.org"},
        },
    }
    assert platform_doc(cluster(services={}))["spec"] == {"realmName": "ns"}


def test_a_stored_document_with_server_additions_is_current() -> None:
    assert logic.is_current(stored(client_doc()), client_doc())
    defaulted = stored(platform_doc())
    defaulted["spec"]["zenithServices"] = {}
    assert logic.is_current(defaulted, platform_doc())


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o["metadata"].pop("ownerReferences"),  # a Velero restore
        lambda o: o["metadata"]["ownerReferences"][0].update(controller=False),
        lambda o: o["metadata"]["labels"].pop("app.kubernetes.io/managed-by"),
        lambda o: o["spec"].update(realmName="other"),
        lambda o: o["spec"].update(grantTypes=[]),
        lambda o: o["spec"].update(zenithServices={"old": {"subdomain": "a", "fqdn": "a.b"}}),
    ],
)
def test_a_document_missing_any_of_our_fields_is_not_current(change: Any) -> None:
    obj = stored(client_doc())
    change(obj)
    assert not logic.is_current(obj, client_doc())
    assert not logic.is_current(None, client_doc())


# --- decision table -----------------------------------------------------------------------


def observe(
    *,
    realms: list[Json] | None = None,
    client: Json | None = None,
    platform: Json | None = None,
    c: Json | None = None,
) -> Observed:
    return Observed(
        cluster=c or cluster(),
        realms=[realm("ns")] if realms is None else realms,
        oidc_client=client,
        platform=platform,
    )


def test_decision_table() -> None:
    ready_client = stored(client_doc(), **READY_CLIENT)
    table: list[tuple[Observed, Apply | tuple[bool, str]]] = [
        (observe(realms=[]), (False, Reason.REALM_NOT_FOUND)),
        (observe(realms=[realm("ns", phase=None)]), (False, Reason.REALM_NOT_READY)),
        (observe(realms=[realm("ns", phase="Pending")]), (False, Reason.REALM_NOT_READY)),
        (observe(), Apply(OIDC_CLIENT, client_doc())),
        (observe(client=stored(client_doc())), (False, Reason.WAITING_FOR_OIDC_CLIENT)),
        (
            observe(client=stored(client_doc(), issuerUrl="https://id")),
            (False, Reason.WAITING_FOR_OIDC_CLIENT),
        ),
        (observe(client=ready_client), Apply(PLATFORM, platform_doc())),
        (
            observe(client=ready_client, platform=stored(platform_doc())),
            (False, Reason.WAITING_FOR_PLATFORM),
        ),
        (
            observe(client=ready_client, platform=stored(platform_doc(), rootGroup="/kube-c")),
            (True, Reason.READY),
        ),
        # A Realm change moves the OIDCClient before anything else is looked at.
        (
            observe(realms=[realm("ns"), realm("b")], c=cluster(realm="b"), client=ready_client),
            Apply(OIDC_CLIENT, client_doc(realm_name="b")),
        ),
        # New services reach an existing Platform while the OIDCClient waits (H17) ...
        (
            observe(
                c=cluster(services=SERVICES),
                client=stored(client_doc()),
                platform=stored(platform_doc()),
            ),
            Apply(PLATFORM, platform_doc(cluster(services=SERVICES))),
        ),
        # ... but a missing Platform still waits for the OIDCClient (H5 step 6).
        (
            observe(c=cluster(services=SERVICES), client=stored(client_doc())),
            (False, Reason.WAITING_FOR_OIDC_CLIENT),
        ),
        (
            observe(
                c=cluster(services=SERVICES),
                client=stored(client_doc()),
                platform=stored(platform_doc(cluster(services=SERVICES))),
            ),
            (False, Reason.WAITING_FOR_OIDC_CLIENT),
        ),
        # Paused: no OIDCClient, no new Platform; an existing one follows the services.
        (observe(c=paused(cluster())), (False, Reason.PAUSED)),
        (
            observe(c=paused(cluster(services=SERVICES)), platform=stored(platform_doc())),
            Apply(PLATFORM, platform_doc(paused(cluster(services=SERVICES)))),
        ),
        (
            observe(c=paused(cluster()), platform=stored(platform_doc())),
            (False, Reason.PAUSED),
        ),
        (observe(c=paused(cluster()), realms=[]), (False, Reason.REALM_NOT_FOUND)),
    ]
    for observed, expected in table:
        step = logic.next_step(observed, NAMES)
        if isinstance(expected, Apply):
            assert step == expected
        else:
            assert isinstance(step, Verdict)
            assert (step.ready, step.reason) == expected, step


def test_a_deleting_oidc_client_is_waited_for() -> None:
    client = stored(client_doc(), **READY_CLIENT)
    client["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    step = logic.next_step(observe(client=client), NAMES)
    assert isinstance(step, Verdict)
    assert step.reason == Reason.WAITING_FOR_OIDC_CLIENT


def test_ready_outputs() -> None:
    observed = observe(
        realms=[realm("ns", platformUsersGroup="/platform-users")],
        client=stored(client_doc(), **READY_CLIENT),
        platform=stored(platform_doc(), rootGroup="/kube-c"),
    )
    step = logic.next_step(observed, NAMES)
    assert isinstance(step, Verdict)
    assert step.outputs == {
        "realmName": "ns",
        "issuerUrl": "https://id/realms/ns",
        "clientId": "kube-c",
        "rootGroup": "/kube-c",
        "platformUsersGroup": "/platform-users",
    }


def test_paused_and_deleting_clusters() -> None:
    deleting = cluster()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for c, expected in [(cluster(), (False, False)), (paused(cluster()), (True, False))]:
        assert (logic.is_paused(c), logic.is_deleting(c)) == expected
    assert (logic.is_paused(deleting), logic.is_deleting(deleting)) == (False, True)


# --- what is reported ---------------------------------------------------------------------

WAITING = Verdict(False, Reason.WAITING_FOR_PLATFORM, "Platform kube-c has no rootGroup yet")
READY = Verdict(True, Reason.READY, "ready", {"clientId": "kube-c"})


def report(
    verdict: Verdict, last: PrerequisiteChanged | None, c: Json | None = None
) -> logic.Report | None:
    return logic.report(
        verdict, cluster=c or cluster(), last=last, source="identity/r1", causation_id="cause"
    )


def said(verdict: Verdict, last: PrerequisiteChanged | None, c: Json | None = None) -> Report:
    found = report(verdict, last, c)
    assert found is not None
    return found


def test_a_new_verdict_reports_the_condition_then_the_prerequisite() -> None:
    first = said(WAITING, None)
    assert first.condition is not None
    assert first.condition.model_dump() == {
        "type": "IdentityReady",
        "status": "False",
        "reason": "WaitingForPlatform",
        "message": WAITING.message,
    }
    prerequisite = first.prerequisite
    assert prerequisite.ref == ObjectRef(
        api_version="azimuth.stackhpc.com/v1alpha1",
        kind="Cluster",
        namespace="ns",
        name="c",
        uid="u1",
    )
    assert (prerequisite.step, prerequisite.generation, prerequisite.ready) == (
        "identity",
        2,
        False,
    )
    assert (prerequisite.reason, prerequisite.detail) == (WAITING.reason, WAITING.message)
    assert prerequisite.correlation_id == "cluster:ns/c"
    assert prerequisite.causation_id == "cause"


def test_saying_the_same_again_reports_nothing_and_redelivery_reuses_ids() -> None:
    first = said(WAITING, None)
    assert report(WAITING, first.prerequisite) is None
    assert said(WAITING, None).prerequisite.id == first.prerequisite.id


def test_a_new_generation_with_the_same_verdict_is_a_prerequisite_only() -> None:
    last = said(READY, None).prerequisite
    newer = cluster()
    newer["metadata"]["generation"] = 3
    again = said(READY, last, newer)
    assert again.condition is None
    assert again.prerequisite.generation == 3


def test_a_replaced_cluster_is_told_everything_again() -> None:
    last = said(READY, None).prerequisite
    replaced = cluster()
    replaced["metadata"]["uid"] = "u2"
    again = said(READY, last, replaced)
    assert again.condition is not None
    assert again.prerequisite.ref.uid == "u2"


def test_a_state_that_returns_gets_fresh_ids() -> None:
    first = said(READY, None)
    second = said(WAITING, first.prerequisite)
    third = said(READY, second.prerequisite)
    ids = [r.prerequisite.id for r in (first, second, third)]
    assert len(set(ids)) == len(ids) == 3
    assert all(r.condition is not None for r in (first, second, third))


def test_rejections_carry_a_bounded_message() -> None:
    verdict = logic.rejected(PLATFORM, "kube-c", ValueError("x" * 5000))
    assert (verdict.ready, verdict.reason) == (False, "Invalid")
    assert len(verdict.message) == logic.MAX_MESSAGE


# --- events to Clusters -------------------------------------------------------------------


def event(kind: str, name: str, owners: list[Json] | None = None) -> ResourceChanged:
    return ResourceChanged(
        source="watcher/w",
        correlation_id="x",
        event="MODIFIED",
        ref=ObjectRef(api_version="v", kind=kind, namespace="ns", name=name, uid="o"),
        resource_version="1",
        object={"metadata": {"name": name, "namespace": "ns", "ownerReferences": owners or []}},
    )


def test_events_map_to_their_cluster_once() -> None:
    not_controller = {**OWNER, "name": "d", "controller": False}
    other_group = {**OWNER, "name": "e", "apiVersion": "cluster.x-k8s.io/v1beta1"}
    messages = [
        event("Cluster", "c"),
        event("OIDCClient", "kube-c", [OWNER]),
        event("Platform", "kube-b", [{**OWNER, "name": "b"}]),
        event("OIDCClient", "restored"),
        event("OIDCClient", "kube-d", [not_controller]),
        event("Platform", "kube-e", [other_group]),
    ]
    assert logic.clusters_touched(messages) == [("ns", "c"), ("ns", "b")]


def test_only_a_cluster_that_appears_has_its_apps_listed() -> None:
    def added(kind: str, name: str) -> ResourceChanged:
        return event(kind, name).model_copy(update={"event": "ADDED"})

    messages = [
        event("Cluster", "status-write"),
        added("Cluster", "new"),
        added("Platform", "kube-c"),
        added("Cluster", "new"),
        added("Cluster", "other"),
    ]
    assert logic.clusters_appeared(messages) == [("ns", "new"), ("ns", "other")]


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["kube", "kube-{name}", "kube-{cluster_name"])
def test_name_templates_must_name_the_cluster(template: str) -> None:
    with pytest.raises(ValidationError):
        IdentityTuning(oidc_client_name_template=template)
    assert IdentityTuning(platform_name_template="p-{cluster_name}").platform_name_template
