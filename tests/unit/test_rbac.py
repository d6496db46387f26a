"""The declared permissions: the rule type, merging, RBAC's matching, and what every service's
declarations must hold (the chart's files and the permissions page current, a ``get`` for every
kind a service consumes events of, Secrets only where the code touches them)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from services.__main__ import permissions
from shared import rbac
from shared.rbac import PolicyRule, Question, Rule, RuleError
from shared.resources import CLUSTER, CONFIG_MAP, KINDS, LEASE, SECRET
from shared.status import WRITTEN

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {service.name: service for service in permissions()}
#: the services whose code reads or writes Secrets; the others must not be able to
WITH_SECRETS = {
    "watcher",
    "identity",
    "helm",
    "monitor",
    "discovery",
    "admission",
    "metalstack",
    "assisted-bootstrap",
    "assisted-controlplane",
    "ladybug-api",
    "ladybug-provisioner",
}


def secret(verb: str) -> Question:
    return Question("", "secrets", verb)


# --- the rule type ------------------------------------------------------------------------------


def test_a_rule_takes_one_kind_or_several_and_orders_its_verbs() -> None:
    rule = Rule(CLUSTER, "patch get", why="because")
    assert rule.kinds == (CLUSTER,)
    assert rule.verbs == ("get", "patch")
    assert Rule([CLUSTER, LEASE], ["list"], why="because").resources == [
        ("azimuth.stackhpc.com", "clusters"),
        ("scheduling.azimuth.stackhpc.com", "leases"),
    ]
    assert Rule(CLUSTER, "patch", subresource="status", why="w").resources == [
        ("azimuth.stackhpc.com", "clusters/status")
    ]


@pytest.mark.parametrize(
    ("verbs", "options"),
    [
        ("*", {}),
        ("get escalate", {}),
        ("", {}),
        ("create", {"names": ["fixed"]}),
        ("list", {"names": ["fixed"]}),
        ("get", {"subresource": "*"}),
        ("get", {"why": ""}),
    ],
)
def test_a_rule_refuses_wildcards_unknown_verbs_names_it_cannot_restrict_and_no_reason(
    verbs: str, options: dict[str, object]
) -> None:
    arguments: dict[str, object] = {"why": "because", **options}
    with pytest.raises(RuleError):
        Rule(CLUSTER, verbs, **arguments)  # type: ignore[arg-type]


# --- merging ------------------------------------------------------------------------------------


def test_merge_unites_verbs_and_groups_resources_with_the_same_verbs() -> None:
    merged = rbac.merge(
        [
            Rule(CLUSTER, "get", why="a"),
            Rule(CLUSTER, "list", why="b"),
            Rule(LEASE, "get patch", why="c"),
            Rule(SECRET, "get", why="d"),
            Rule(CONFIG_MAP, "get", why="e"),
        ]
    )
    assert merged == [
        PolicyRule("", ("configmaps", "secrets"), ("get",)),
        PolicyRule("azimuth.stackhpc.com", ("clusters",), ("get", "list")),
        PolicyRule("scheduling.azimuth.stackhpc.com", ("leases",), ("get", "patch")),
    ]


def test_named_verbs_already_granted_to_every_name_are_dropped() -> None:
    merged = rbac.merge(
        [
            Rule(CONFIG_MAP, "get", why="a"),
            Rule(CONFIG_MAP, "get patch", names=["fixed"], why="b"),
        ]
    )
    assert merged == [
        PolicyRule("", ("configmaps",), ("get",)),
        PolicyRule("", ("configmaps",), ("patch",), ("fixed",)),
    ]
    assert merged[1].as_dict()["resourceNames"] == ["fixed"]


# --- RBAC's answer ------------------------------------------------------------------------------


def test_allows_matches_group_resource_and_verb_exactly() -> None:
    policy = rbac.merge(
        [
            Rule(CLUSTER, "get patch", why="a"),
            Rule(CLUSTER, "patch", subresource="status", why="b"),
            Rule(CONFIG_MAP, "patch", names=["fixed"], why="c"),
        ]
    )
    assert rbac.allows(policy, Question("azimuth.stackhpc.com", "clusters", "get"))
    assert rbac.allows(policy, Question("azimuth.stackhpc.com", "clusters/status", "patch"))
    assert not rbac.allows(policy, Question("azimuth.stackhpc.com", "clusters/status", "get"))
    assert not rbac.allows(policy, Question("azimuth.stackhpc.com", "clusters", "delete"))
    assert not rbac.allows(policy, Question("cluster.x-k8s.io", "clusters", "get"))
    assert not rbac.allows(policy, Question("azimuth.stackhpc.com", "clusters", "*"))
    assert not rbac.allows(policy, Question("*", "*", "get"))
    # A question names no object, and a rule restricted to names answers only for those.
    assert not rbac.allows(policy, Question("", "configmaps", "patch"))


def test_a_question_becomes_the_attributes_of_a_subject_access_review() -> None:
    question = Question("azimuth.stackhpc.com", "clusters/status", "patch", "team-a")
    assert question.attributes() == {
        "group": "azimuth.stackhpc.com",
        "resource": "clusters",
        "subresource": "status",
        "verb": "patch",
        "namespace": "team-a",
    }
    subject = rbac.Subject("capibus", "writer")
    assert subject.user == "system:serviceaccount:capibus:writer"
    assert "system:serviceaccounts:capibus" in subject.all_groups()


# --- the services' declarations -----------------------------------------------------------------


def test_every_service_of_the_chart_declares_its_rules() -> None:
    assert list(SERVICES) == [
        "watcher",
        "writer",
        "identity",
        "lease",
        "helm",
        "monitor",
        "discovery",
        "admission",
        "catalog",
        "exporter",
        "metalstack",
        "assisted-bootstrap",
        "assisted-controlplane",
        "ladybug-api",
        "ladybug-provisioner",
    ]
    assert all(service.rules for service in SERVICES.values())


def test_the_chart_files_and_the_permissions_page_are_current() -> None:
    services = list(SERVICES.values())
    assert rbac.check(ROOT / "deploy/chart/capibus/files/rbac", services) == []
    page = (ROOT / "docs/permissions.md").read_text()
    assert rbac.replace_generated(page, rbac.doc_expected(services)) == page


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_secrets_only_for_the_services_that_touch_them_and_never_every_verb(name: str) -> None:
    policy = SERVICES[name].policy
    touches = any(rbac.allows(policy, secret(verb)) for verb in rbac.VERBS)
    assert touches == (name in WITH_SECRETS)
    assert not all(rbac.allows(policy, secret(verb)) for verb in rbac.VERBS)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_no_service_is_granted_what_no_service_may_do(name: str) -> None:
    policy = SERVICES[name].policy
    assert [q for q in rbac.NEVER if rbac.allows(policy, q)] == []


CONSUMERS = {
    "writer": "writer",
    "identity": "identity",
    "lease": "lease",
    "helm": "helm",
    "monitor": "monitor",
    "discovery": "discovery",
    "catalog": "catalog",
    "metalstack": "baremetal.metalstack",
    "assisted-bootstrap": "baremetal.assisted_bootstrap",
    "assisted-controlplane": "baremetal.assisted_controlplane",
    "ladybug-provisioner": "ladybug.provisioner",
}


@pytest.mark.parametrize("name", sorted(CONSUMERS))
def test_a_service_may_read_back_every_kind_it_consumes_events_of(name: str) -> None:
    """The consumer reads a trimmed event's object back before a handler sees it
    (``shared.oversize``): a ``get`` on every kind of the service's event subscriptions."""
    routes = importlib.import_module(f"services.{CONSUMERS[name]}.app").ROUTES
    tokens = {
        row.subject.split(".")[2]
        for row in routes.consumed()
        if row.subject.startswith("capibus.evt.")
    }
    policy = SERVICES[name].policy
    missing = [
        token
        for token in sorted(tokens)
        if not rbac.allows(policy, Question(KINDS[token].group, KINDS[token].plural, "get"))
    ]
    assert missing == []


def test_the_watcher_lists_and_watches_every_kind_and_reads_nothing_by_name() -> None:
    policy = SERVICES["watcher"].policy
    for kind in KINDS.values():
        for verb in ("list", "watch"):
            assert rbac.allows(policy, Question(kind.group, kind.plural, verb))
        assert not rbac.allows(policy, Question(kind.group, kind.plural, "get"))


def test_the_writer_writes_the_status_of_every_kind_it_writes_and_nothing_else() -> None:
    policy = SERVICES["writer"].policy
    for kind in WRITTEN:
        status = f"{kind.plural}/status" if kind.status_subresource else kind.plural
        assert rbac.allows(policy, Question(kind.group, status, "patch"))
    assert {r.group for r in policy} == {k.group for k in WRITTEN}
    assert not any(set(r.verbs) & {"create", "update", "delete"} for r in policy)


def test_the_writer_changes_the_metadata_of_the_kinds_it_is_asked_to_only() -> None:
    """Only the helm service sends ``PatchMetadata``, for Azimuth Clusters."""
    senders = [
        path.relative_to(ROOT)
        for path in sorted((ROOT / "services").rglob("*.py"))
        if ".change_metadata(" in path.read_text()
    ]
    assert senders == [Path("services/helm/handlers.py")]
    policy = SERVICES["writer"].policy
    patched = {
        (k.group, k.plural)
        for k in WRITTEN
        if rbac.allows(policy, Question(k.group, k.plural, "patch"))
    }
    assert patched == {(CLUSTER.group, CLUSTER.plural)} | {
        (k.group, k.plural) for k in WRITTEN if not k.status_subresource
    }
