"""The invariants, as pure functions of what the workload intended and what the system shows.

Nothing here reads the system: ``soak.observe`` gathers ``Facts``, ``soak.run`` keeps each
Cluster's ``Intent`` as it issues steps, and these functions compare the two, so each
invariant is unit-tested on made-up data (``tests/unit/test_soak_checks.py``). Each
invariant yields a ``Verdict`` naming every violation it found, so a failing soak says which
Cluster broke what, not only that something did.

How each invariant is judged:

* **converged**: a deleted Cluster is gone; a live one is ``Ready`` with ``Reconciled``,
  ``IdentityReady`` (and ``LeaseReady`` with a Lease) true, its
  ``last-handled-configuration`` annotation is its current spec, its template label and
  ``kubernetesVersion`` are the template's, and its first node group has the count asked
  for, every node Ready on that version.
* **helm-revisions**: the Cluster's release has exactly one *completed* revision (Helm's
  ``Install complete`` or ``Upgrade complete``) for its install and for each spec change the
  workload made; other revisions (one SIGKILLed mid-upgrade, the rollback that repairs it)
  are recovery, counted and shown but not changes. A completed revision whose values equal
  the one before it is a redundant upgrade, a violation.
* **one-of-each**: exactly one OIDCClient and one Platform owned by each live Cluster and
  none owned by anything else, one registrar reservation per Cluster ever created (and none
  nobody's), one ``azimuth.stackhpc.com`` finalizer on each live Cluster's Lease.
* **status-complete**: the status is what the stand-ins' objects imply, key for key (the
  monitor's own mapping, ``services/monitor/logic.py``, applied to the final objects, node
  sizes aside): no node, addon or phase lost, none left that nothing backs.
* **nothing-left**: nothing named for a deleted Cluster remains, of any kind it had.
* **acked-xor-dead**: no message the writer journaled as carried out is also a dead letter.
* **dead-letters-explained**: every dead letter carries a reason and an error.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from soak.plan import Step

Json = dict[str, Any]

LAST_HANDLED = "azimuth.stackhpc.com/last-handled-configuration"
TEMPLATE_LABEL = "azimuth.stackhpc.com/cluster-template"
LEASE_FINALIZER = "azimuth.stackhpc.com"
COMPLETED = ("Install complete", "Upgrade complete")
#: node fields the comparison leaves out: the size comes from the machine template's
#: flavor through the Lease's map, which the objects alone do not say
UNCOMPARED_NODE_FIELDS = ("size",)


@dataclass
class Intent:
    """What the workload has asked of one Cluster so far."""

    name: str
    created: bool = False
    leased: bool = False
    count: int = 0
    template: str = ""
    deleted: bool = False
    #: spec changes after the create that change the Helm values (scale, upgrade)
    changes: int = 0

    def apply(self, step: Step, *, first: str, second: str) -> None:
        if step.action == "create":
            self.created, self.leased = True, step.lease
            self.count, self.template = step.count, first
        elif step.action == "scale":
            self.count, self.changes = step.count, self.changes + 1
        elif step.action == "upgrade":
            self.template, self.changes = second, self.changes + 1
        else:
            self.deleted = True

    @property
    def live(self) -> bool:
        return self.created and not self.deleted


@dataclass(frozen=True)
class Revision:
    number: int
    status: str
    description: str
    #: a digest of the revision's values
    values: str


@dataclass(frozen=True)
class DeadLetter:
    service: str
    subject: str
    original_id: str | None
    reason: str
    error: str


@dataclass
class Facts:
    """What the system shows at the end (``soak.observe.gather``)."""

    clusters: dict[str, Json] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    #: per live Cluster, the status its objects imply
    implied: dict[str, Json] = field(default_factory=dict)
    #: objects of a kind per owning live Cluster; ``""`` counts those no live Cluster owns
    oidc_clients: dict[str, int] = field(default_factory=dict)
    platforms: dict[str, int] = field(default_factory=dict)
    lease_finalizers: dict[str, int] = field(default_factory=dict)
    #: registrar: reservations per subdomain
    reservations: dict[str, int] = field(default_factory=dict)
    #: each Cluster's Zenith subdomain (recorded before a delete for deleted ones)
    subdomains: dict[str, str] = field(default_factory=dict)
    #: each Cluster's Helm revisions (recorded before a delete for deleted ones)
    revisions: dict[str, list[Revision]] = field(default_factory=dict)
    #: per deleted Cluster, what is left of it
    leftovers: dict[str, list[str]] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: ids of the status and metadata messages the writer journaled as carried out
    journaled: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Verdict:
    name: str
    what: str
    problems: tuple[str, ...]
    #: one line of figures for the report
    summary: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


# --- converged -----------------------------------------------------------------------------


def cluster_problems(
    intent: Intent, cluster: Json | None, versions: Mapping[str, str]
) -> list[str]:
    """Why ``cluster`` is not (yet) what ``intent`` asked for; empty when it is."""
    if not intent.created:
        return []
    if intent.deleted:
        return [] if cluster is None else [f"{intent.name}: still exists after its delete"]
    if cluster is None:
        return [f"{intent.name}: missing"]
    found = (
        _phase_problems(intent, cluster)
        + _spec_problems(intent, cluster)
        + _node_problems(intent, cluster, versions.get(intent.template, ""))
    )
    return [f"{intent.name}: {problem}" for problem in found]


def _status(cluster: Json) -> Json:
    status = cluster.get("status")
    return status if isinstance(status, dict) else {}


def condition(cluster: Json, kind: str) -> Json:
    for entry in _status(cluster).get("conditions") or []:
        if isinstance(entry, dict) and entry.get("type") == kind:
            return entry
    return {}


def _phase_problems(intent: Intent, cluster: Json) -> list[str]:
    status = _status(cluster)
    problems = [] if status.get("phase") == "Ready" else [f"phase {status.get('phase')}"]
    wanted = ["Reconciled", "IdentityReady"] + (["LeaseReady"] if intent.leased else [])
    for kind in wanted:
        found = condition(cluster, kind)
        if found.get("status") != "True":
            problems.append(f"{kind} {found.get('status')}/{found.get('reason')}")
    if intent.leased and status.get("leasePhase") != "Active":
        problems.append(f"leasePhase {status.get('leasePhase')}")
    if status.get("kubeconfigSecretName") != f"{intent.name}-kubeconfig-user":
        problems.append(f"kubeconfigSecretName {status.get('kubeconfigSecretName')}")
    return problems


def _spec_problems(intent: Intent, cluster: Json) -> list[str]:
    meta, spec = cluster.get("metadata") or {}, cluster.get("spec") or {}
    problems = []
    if spec.get("templateName") != intent.template:
        problems.append(f"spec.templateName {spec.get('templateName')} (asked {intent.template})")
    if _first_count(spec) != intent.count:
        problems.append(f"spec count {_first_count(spec)} (asked {intent.count})")
    handled = _json((meta.get("annotations") or {}).get(LAST_HANDLED))
    if handled.get("spec") != spec:
        problems.append("last-handled-configuration is not the current spec")
    if (meta.get("labels") or {}).get(TEMPLATE_LABEL) != intent.template:
        problems.append(f"template label {(meta.get('labels') or {}).get(TEMPLATE_LABEL)}")
    return problems


def _first_count(spec: Json) -> int | None:
    groups = spec.get("nodeGroups") or [{}]
    count = groups[0].get("count")
    return count if isinstance(count, int) else None


def _json(text: Any) -> Json:
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _node_problems(intent: Intent, cluster: Json, version: str) -> list[str]:
    status = _status(cluster)
    found = status.get("nodes")
    nodes: Json = found if isinstance(found, dict) else {}
    problems = []
    if status.get("kubernetesVersion") != version:
        problems.append(f"kubernetesVersion {status.get('kubernetesVersion')} (want {version})")
    workers = [n for n in nodes.values() if n.get("nodeGroup") == "md-0"]
    if len(workers) != intent.count:
        problems.append(f"{len(workers)} md-0 nodes (want {intent.count})")
    for name, node in sorted(nodes.items()):
        if node.get("phase") != "Ready" or node.get("kubeletVersion") != version:
            problems.append(f"node {name} {node.get('phase')} {node.get('kubeletVersion')}")
    return problems


def converged(intents: Iterable[Intent], facts: Facts) -> Verdict:
    problems = [
        p
        for intent in intents
        for p in cluster_problems(intent, facts.clusters.get(intent.name), facts.versions)
    ]
    stray = sorted(set(facts.clusters) - {i.name for i in intents if i.created})
    problems += [f"{name}: exists, never created by the workload" for name in stray]
    live = sum(1 for i in intents if i.live)
    return Verdict(
        "converged",
        "every Cluster converged to its last spec, or is gone if deleted",
        tuple(problems),
        f"{live} live, {sum(1 for i in intents if i.deleted)} deleted",
    )


# --- status keys ---------------------------------------------------------------------------


def status_problems(name: str, status: Json, implied: Json) -> list[str]:
    """Where ``status`` differs from what the objects imply (``implied``)."""
    problems = []
    for key, wanted in sorted(implied.items()):
        if key in ("nodes", "addons"):
            continue
        if status.get(key) != wanted:
            problems.append(f"{name}: {key} {status.get(key)!r}, the objects say {wanted!r}")
    problems += _entries(name, "nodes", status.get("nodes"), implied.get("nodes"))
    problems += _entries(name, "addons", status.get("addons"), implied.get("addons"))
    return problems


def _entries(name: str, key: str, found: Any, wanted: Any) -> list[str]:
    found = found if isinstance(found, dict) else {}
    wanted = wanted if isinstance(wanted, dict) else {}
    problems = [f"{name}: {key}.{k} lost" for k in sorted(set(wanted) - set(found))]
    problems += [f"{name}: {key}.{k} backed by nothing" for k in sorted(set(found) - set(wanted))]
    for k in sorted(set(found) & set(wanted)):
        differs = {
            f: (found[k].get(f), v)
            for f, v in wanted[k].items()
            if f not in UNCOMPARED_NODE_FIELDS and found[k].get(f) != v
        }
        if differs:
            problems.append(f"{name}: {key}.{k} differs (found, objects): {differs}")
    return problems


def status_complete(intents: Iterable[Intent], facts: Facts) -> Verdict:
    problems = []
    checked = 0
    for intent in intents:
        cluster = facts.clusters.get(intent.name)
        if not intent.live or cluster is None:
            continue
        checked += 1
        implied = facts.implied.get(intent.name, {})
        problems += status_problems(intent.name, _status(cluster), implied)
    return Verdict(
        "status-complete",
        "no status key lost (each live Cluster's status is what the stand-ins' objects imply)",
        tuple(problems),
        f"{checked} live Clusters compared",
    )


# --- Helm revisions ------------------------------------------------------------------------


def revision_problems(intent: Intent, revisions: Sequence[Revision]) -> tuple[list[str], int]:
    """Violations, and how many revisions were recovery (interrupted, rolled back)."""
    ordered = sorted(revisions, key=lambda r: r.number)
    completed = [r for r in ordered if r.description in COMPLETED]
    problems = []
    if len(completed) != 1 + intent.changes:
        problems.append(
            f"{intent.name}: {len(completed)} completed revisions for {1 + intent.changes} "
            f"changes ({_history(ordered)})"
        )
    for before, after in itertools.pairwise(completed):
        if before.values == after.values:
            problems.append(f"{intent.name}: revision {after.number} repeats {before.number}")
    return problems, len(ordered) - len(completed)


def _history(revisions: Sequence[Revision]) -> str:
    return ", ".join(f"{r.number} {r.status} {r.description!r}" for r in revisions)


def helm_revisions(intents: Iterable[Intent], facts: Facts) -> Verdict:
    problems: list[str] = []
    recovery = changes = 0
    for intent in intents:
        if not intent.created:
            continue
        found, extra = revision_problems(intent, facts.revisions.get(intent.name, []))
        problems += found
        recovery += extra
        changes += 1 + intent.changes
    return Verdict(
        "helm-revisions",
        "exactly one Helm revision per real change",
        tuple(problems),
        f"{changes} changes (installs, scales, upgrades); {recovery} recovery revisions",
    )


# --- one of each ---------------------------------------------------------------------------


def one_of_each(intents: Sequence[Intent], facts: Facts) -> Verdict:
    live = [i for i in intents if i.live]
    problems = _owned("OIDCClient", live, facts.oidc_clients)
    problems += _owned("Platform", live, facts.platforms)
    for intent in live:
        if intent.leased and facts.lease_finalizers.get(intent.name, 0) != 1:
            found = facts.lease_finalizers.get(intent.name, 0)
            problems.append(f"{intent.name}: {found} Lease finalizers")
    problems += _reservations([i for i in intents if i.created], facts)
    return Verdict(
        "one-of-each",
        "exactly one OIDCClient, Platform, Zenith reservation and Lease finalizer per Cluster",
        tuple(problems),
        f"{sum(facts.reservations.values())} reservations for "
        f"{sum(1 for i in intents if i.created)} Clusters created",
    )


def _owned(kind: str, live: Sequence[Intent], counts: Mapping[str, int]) -> list[str]:
    problems = [
        f"{i.name}: {counts.get(i.name, 0)} {kind}s" for i in live if counts.get(i.name, 0) != 1
    ]
    if counts.get(""):
        problems.append(f"{counts['']} {kind}s owned by no live Cluster")
    return problems


def _reservations(created: Sequence[Intent], facts: Facts) -> list[str]:
    problems = []
    for intent in created:
        subdomain = facts.subdomains.get(intent.name)
        if subdomain is None:
            problems.append(f"{intent.name}: no Zenith subdomain recorded")
        elif facts.reservations.get(subdomain, 0) != 1:
            found = facts.reservations.get(subdomain, 0)
            problems.append(f"{intent.name}: {found} reservations of {subdomain}")
    known = set(facts.subdomains.values())
    orphans = sorted(s for s in facts.reservations if s not in known)
    if orphans:
        problems.append(f"{len(orphans)} reservations no Cluster names: {', '.join(orphans)}")
    return problems


# --- delete, dead letters ------------------------------------------------------------------


def nothing_left(intents: Iterable[Intent], facts: Facts) -> Verdict:
    deleted = [i.name for i in intents if i.deleted]
    problems = [
        f"{name}: left {', '.join(facts.leftovers[name])}"
        for name in deleted
        if facts.leftovers.get(name)
    ]
    return Verdict(
        "nothing-left",
        "nothing left after delete",
        tuple(problems),
        f"{len(deleted)} deleted Clusters searched",
    )


def acked_xor_dead(facts: Facts) -> Verdict:
    both = sorted(
        f"{letter.service} {letter.subject} ({letter.original_id})"
        for letter in facts.dead_letters
        if letter.original_id and letter.original_id in facts.journaled
    )
    return Verdict(
        "acked-xor-dead",
        "no message both acked (journaled as carried out) and dead-lettered",
        tuple(both),
        f"{len(facts.journaled)} journaled message ids, {len(facts.dead_letters)} dead letters",
    )


def dead_letters_explained(facts: Facts) -> Verdict:
    unexplained = [
        f"{letter.service} {letter.subject}: reason {letter.reason!r}, error {letter.error!r}"
        for letter in facts.dead_letters
        if not letter.reason.strip() or not letter.error.strip()
    ]
    reasons: dict[str, int] = {}
    for letter in facts.dead_letters:
        reasons[letter.reason] = reasons.get(letter.reason, 0) + 1
    summary = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) or "none"
    return Verdict(
        "dead-letters-explained",
        "every dead letter explained (a reason and an error)",
        tuple(unexplained),
        f"dead letters by reason: {summary}",
    )


def all_verdicts(intents: Sequence[Intent], facts: Facts) -> list[Verdict]:
    return [
        converged(intents, facts),
        helm_revisions(intents, facts),
        one_of_each(intents, facts),
        status_complete(intents, facts),
        nothing_left(intents, facts),
        acked_xor_dead(facts),
        dead_letters_explained(facts),
    ]
