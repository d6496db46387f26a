"""The soak's checker on made-up facts: a converged world passes every invariant, and each kind
of breakage fails exactly the invariant it should, naming the Cluster."""

from __future__ import annotations

import copy
import json
from typing import Any

from soak.checks import (
    LAST_HANDLED,
    TEMPLATE_LABEL,
    DeadLetter,
    Facts,
    Intent,
    Revision,
    all_verdicts,
    cluster_problems,
    revision_problems,
    status_problems,
)
from soak.plan import Step

VERSIONS = {"old": "1.34.2", "new": "1.35.1"}
Json = dict[str, Any]


def intent(name: str, *steps: Step) -> Intent:
    made = Intent(name)
    for step in steps:
        made.apply(step, first="old", second="new")
    return made


def node(group: str, version: str) -> Json:
    return {"phase": "Ready", "kubeletVersion": version, "nodeGroup": group, "role": "worker"}


def cluster(want: Intent, **status: Any) -> Json:
    """The Cluster as capibus leaves it once converged on ``want``."""
    version = VERSIONS[want.template]
    spec = {"templateName": want.template, "nodeGroups": [{"name": "md-0", "count": want.count}]}
    nodes = {f"{want.name}-cp-0": node("", version)} | {
        f"{want.name}-md-{i}": node("md-0", version) for i in range(want.count)
    }
    conditions = [
        {"type": kind, "status": "True", "reason": "Ready"}
        for kind in ("Reconciled", "IdentityReady", "LeaseReady")
    ]
    return {
        "metadata": {
            "name": want.name,
            "uid": f"uid-{want.name}",
            "labels": {TEMPLATE_LABEL: want.template},
            "annotations": {LAST_HANDLED: json.dumps({"spec": spec})},
        },
        "spec": spec,
        "status": {
            "phase": "Ready",
            "conditions": conditions,
            "kubernetesVersion": version,
            "kubeconfigSecretName": f"{want.name}-kubeconfig-user",
            "nodes": nodes,
            **({"leasePhase": "Active"} if want.leased else {}),
            **status,
        },
    }


def implied(obj: Json) -> Json:
    """What the stand-ins' objects say about a converged Cluster: its status, less the
    keys capibus derives itself."""
    status = obj["status"]
    keys = ("kubernetesVersion", "kubeconfigSecretName", "nodes", "leasePhase")
    return copy.deepcopy({k: status[k] for k in keys if k in status})


def revisions(count: int) -> list[Revision]:
    done = [Revision(1, "superseded", "Install complete", "v1")]
    done += [Revision(n, "superseded", "Upgrade complete", f"v{n}") for n in range(2, count + 1)]
    return done


CREATE = Step("a", "create", count=2, lease=True)


def world() -> tuple[list[Intent], Facts]:
    """Three Clusters: ``a`` leased and scaled, ``b`` upgraded, ``c`` deleted."""
    a = intent("a", CREATE, Step("a", "scale", count=3))
    b = intent("b", Step("b", "create", count=2), Step("b", "upgrade"))
    c = intent("c", Step("c", "create", count=2), Step("c", "delete"))
    live = {x.name: cluster(x) for x in (a, b)}
    facts = Facts(
        clusters=live,
        versions=dict(VERSIONS),
        implied={name: implied(obj) for name, obj in live.items()},
        oidc_clients={"a": 1, "b": 1},
        platforms={"a": 1, "b": 1},
        lease_finalizers={"a": 1},
        reservations={"sub-a": 1, "sub-b": 1, "sub-c": 1},
        subdomains={"a": "sub-a", "b": "sub-b", "c": "sub-c"},
        revisions={"a": revisions(2), "b": revisions(2), "c": revisions(1)},
        leftovers={"c": []},
        dead_letters=[DeadLetter("helm", "capibus.evt.x", "m9", "ChartRenderFailed", "boom")],
        journaled={"m1", "m2"},
    )
    return [a, b, c], facts


def failed(intents: list[Intent], facts: Facts) -> dict[str, tuple[str, ...]]:
    return {v.name: v.problems for v in all_verdicts(intents, facts) if not v.ok}


def test_a_converged_world_passes_every_invariant() -> None:
    assert failed(*world()) == {}


def test_a_cluster_short_of_its_spec_is_not_converged() -> None:
    intents, facts = world()
    facts.clusters["a"]["status"]["phase"] = "Reconciling"
    del facts.clusters["a"]["status"]["nodes"]["a-md-2"]
    facts.clusters["b"]["metadata"]["labels"][TEMPLATE_LABEL] = "old"
    problems = failed(intents, facts)["converged"]
    assert any(p.startswith("a: phase Reconciling") for p in problems)
    assert "a: 2 md-0 nodes (want 3)" in problems
    assert "b: template label old" in problems


def test_a_deleted_cluster_that_is_still_there_or_a_live_one_gone() -> None:
    intents, facts = world()
    facts.clusters["c"] = cluster(intent("c", Step("c", "create", count=2)))
    del facts.clusters["b"]
    problems = failed(intents, facts)["converged"]
    assert "b: missing" in problems
    assert "c: still exists after its delete" in problems


def test_a_spec_not_yet_handled_is_not_converged() -> None:
    want = intent("a", CREATE)
    obj = cluster(want)
    obj["spec"]["nodeGroups"][0]["count"] = 2
    obj["metadata"]["annotations"][LAST_HANDLED] = json.dumps({"spec": {"templateName": "x"}})
    assert cluster_problems(want, obj, VERSIONS) == [
        "a: last-handled-configuration is not the current spec"
    ]


def test_an_extra_completed_revision_or_a_repeated_one_fails() -> None:
    want = intent("a", CREATE, Step("a", "scale", count=3))
    twice = [*revisions(2), Revision(3, "deployed", "Upgrade complete", "v3")]
    assert revision_problems(want, twice)[0] == [
        "a: 3 completed revisions for 2 changes (1 superseded 'Install complete', "
        "2 superseded 'Upgrade complete', 3 deployed 'Upgrade complete')"
    ]
    repeated = [*revisions(1), Revision(2, "deployed", "Upgrade complete", "v1")]
    assert revision_problems(want, repeated)[0] == ["a: revision 2 repeats 1"]


def test_an_interrupted_upgrade_and_its_rollback_are_recovery_not_changes() -> None:
    want = intent("a", CREATE, Step("a", "scale", count=3))
    history = [
        Revision(1, "superseded", "Install complete", "v1"),
        Revision(2, "failed", 'Upgrade "a" failed: killed', "v2"),
        Revision(3, "superseded", "Rollback to 1", "v1"),
        Revision(4, "deployed", "Upgrade complete", "v2"),
    ]
    assert revision_problems(want, history) == ([], 2)


def test_duplicates_and_orphans_fail_one_of_each() -> None:
    intents, facts = world()
    facts.oidc_clients = {"a": 2, "b": 1}
    facts.platforms = {"a": 1, "b": 1, "": 1}
    facts.lease_finalizers = {"a": 0}
    facts.reservations = {"sub-a": 1, "sub-b": 2, "sub-c": 1, "stray": 1}
    problems = failed(intents, facts)["one-of-each"]
    assert set(problems) == {
        "a: 2 OIDCClients",
        "1 Platforms owned by no live Cluster",
        "a: 0 Lease finalizers",
        "b: 2 reservations of sub-b",
        "1 reservations no Cluster names: stray",
    }


def test_a_lost_or_unbacked_status_key_fails_status_complete() -> None:
    intents, facts = world()
    facts.implied["a"]["nodes"]["a-md-9"] = node("md-0", "1.34.2")
    facts.implied["b"]["nodes"].pop("b-md-0")
    facts.implied["b"]["networkingPhase"] = "Provisioned"
    problems = failed(intents, facts)["status-complete"]
    assert set(problems) == {
        "a: nodes.a-md-9 lost",
        "b: nodes.b-md-0 backed by nothing",
        "b: networkingPhase None, the objects say 'Provisioned'",
    }


def test_a_node_field_that_differs_is_named_but_its_size_is_not_compared() -> None:
    status = {"nodes": {"n": {"phase": "Ready", "size": "m1.small"}}}
    objects = {"nodes": {"n": {"phase": "Provisioning", "size": "f-small"}}}
    assert status_problems("a", status, objects) == [
        "a: nodes.n differs (found, objects): {'phase': ('Ready', 'Provisioning')}"
    ]


def test_leftovers_of_a_deleted_cluster_fail_nothing_left() -> None:
    intents, facts = world()
    facts.leftovers = {"c": ["secrets/c-etcd-key"]}
    assert failed(intents, facts) == {"nothing-left": ("c: left secrets/c-etcd-key",)}


def test_a_message_journaled_and_dead_lettered_fails() -> None:
    intents, facts = world()
    facts.dead_letters.append(DeadLetter("writer", "capibus.status.patch.x", "m2", "X", "y"))
    assert failed(intents, facts) == {"acked-xor-dead": ("writer capibus.status.patch.x (m2)",)}


def test_a_dead_letter_without_a_reason_is_unexplained() -> None:
    intents, facts = world()
    facts.dead_letters.append(DeadLetter("lease", "capibus.evt.y", None, " ", "boom"))
    assert failed(intents, facts) == {
        "dead-letters-explained": ("lease capibus.evt.y: reason ' ', error 'boom'",)
    }


def test_a_cluster_nobody_created_is_reported() -> None:
    intents, facts = world()
    facts.clusters["zz"] = cluster(intent("zz", Step("zz", "create", count=2)))
    assert "zz: exists, never created by the workload" in failed(intents, facts)["converged"]
