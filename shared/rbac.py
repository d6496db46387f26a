"""Least-privilege Kubernetes permissions: declared per service in code, rendered for the chart,
and asked of the real API server.

Each service declares what it asks of the Kubernetes API in ``services/<svc>/rbac.py``: a
``RULES`` tuple of ``Rule``, each naming ``shared.resources`` kinds (so a group or a plural is
never typed twice), the verbs, optionally a subresource and fixed ``resourceNames``, and why.
This module turns those declarations into Kubernetes ``PolicyRule``s and into the two things
that are checked against them:

* **The chart's rule files** (``deploy/chart/capibus/files/rbac/<service>.yaml``, read by the
  chart's ``templates/rbac.yaml``): one ``rules:`` list per service, merged (one entry per API
  group and verb set, verbs already granted without ``resourceNames`` dropped from the named
  entries) and sorted, so a declaration change is a small, reviewable diff.
* **The permission matrix** in ``docs/permissions.md``: a fixed list of ``Question``s (every
  resource any service uses, and the resources nobody should touch) answered for each service
  by ``allows``, RBAC's own matching rules over the merged rules. The integration test
  ``tests/integration/test_least_privilege.py`` asks the real API server the same questions
  with a ``SubjectAccessReview`` per service account (``review``) and requires the same answers,
  and that the ``NEVER`` cells (Secrets ``*``, deleting Namespaces, RBAC ``escalate``/``bind``,
  cluster-scoped RBAC, CRDs...) are denied to every service.

Why the declarations are written by hand rather than recorded from a run: a run shows what one
scenario happened to do, while a rule must also cover the deletion path, the error paths and the
claims a test rarely reaches; reading the code decides, and the end-to-end runs on service
account tokens (the same test module) prove nothing necessary is missing, since any 403 fails
them.

No rule may say ``*`` (as a verb, a resource or a group): the ``Rule`` type refuses it.

Usage (from ``python -m services rbac``, which imports every service's declarations):
``--write DIR`` / ``--check DIR`` for the rule files, ``--doc FILE`` to write or check the
generated part of the permissions page as well (``make rbac``; ``make lint`` checks both).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from shared.kube import ResourceKind

Json = dict[str, Any]

#: the verbs a rule may grant, in the order rules and tables show them
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
#: verbs only ever asked about, never granted: RBAC's own, that would let a service grant more
#: than it holds
ESCALATING = ("escalate", "bind")
#: the matrix's columns: the verbs, and ``*`` (never granted, so always denied)
COLUMNS = (*VERBS, "*")
REGENERATE_HINT = "run `make rbac` and commit the result"
DOC_BEGIN = "<!-- BEGIN GENERATED: make rbac (python -m services rbac --doc); do not edit below -->"
DOC_END = "<!-- END GENERATED -->"


class RuleError(ValueError):
    """A declaration that is not a least-privilege rule (a wildcard, an unknown verb...)."""


@dataclass(frozen=True, init=False)
class Rule:
    """Some ``verbs`` on ``kinds`` (on their ``subresource``, if given), with why.

    ``kinds`` is one ``ResourceKind`` or several; ``verbs`` a space-separated string or a
    sequence. ``names`` restricts the rule to those object names (RBAC ``resourceNames``): only
    for objects whose names are fixed, and never with ``create`` or ``list``/``watch``, which
    RBAC cannot restrict by name.
    """

    kinds: tuple[ResourceKind, ...]
    verbs: tuple[str, ...]
    subresource: str | None
    names: tuple[str, ...]
    why: str

    def __init__(
        self,
        kinds: ResourceKind | Iterable[ResourceKind],
        verbs: str | Iterable[str],
        *,
        subresource: str | None = None,
        names: Iterable[str] = (),
        why: str = "",
    ) -> None:
        kinds = (kinds,) if isinstance(kinds, ResourceKind) else tuple(kinds)
        verbs = tuple(verbs.split()) if isinstance(verbs, str) else tuple(verbs)
        names = tuple(names)
        _validate(kinds, verbs, subresource, names, why)
        object.__setattr__(self, "kinds", kinds)
        object.__setattr__(self, "verbs", tuple(v for v in VERBS if v in verbs))
        object.__setattr__(self, "subresource", subresource)
        object.__setattr__(self, "names", tuple(sorted(set(names))))
        object.__setattr__(self, "why", why)

    @property
    def resources(self) -> list[tuple[str, str]]:
        """``(group, resource)`` pairs, the resource with its subresource (``clusters/status``)."""
        suffix = f"/{self.subresource}" if self.subresource else ""
        return [(kind.group, kind.plural + suffix) for kind in self.kinds]


def _validate(
    kinds: tuple[ResourceKind, ...],
    verbs: tuple[str, ...],
    subresource: str | None,
    names: tuple[str, ...],
    why: str,
) -> None:
    if not kinds or not verbs:
        raise RuleError("a rule names at least one kind and one verb")
    unknown = [v for v in verbs if v not in VERBS]
    if unknown:
        raise RuleError(f"verbs {unknown} are not among {list(VERBS)} (no wildcards)")
    wild = [k for k in kinds if "*" in (k.group, k.plural)] + (["*"] if subresource == "*" else [])
    if wild:
        raise RuleError(f"a rule names no wildcard resource: {wild}")
    if names and {"create", "list", "watch"} & set(verbs):
        raise RuleError("resourceNames cannot restrict create, list or watch")
    if not why:
        raise RuleError(f"say why {verbs} on {[k.plural for k in kinds]} is needed")


@dataclass(frozen=True)
class PolicyRule:
    """A Kubernetes ``PolicyRule`` (``rbac.authorization.k8s.io/v1``) of one API group."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()

    def as_dict(self) -> Json:
        rule: Json = {
            "apiGroups": [self.group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.names:
            rule["resourceNames"] = list(self.names)
        return rule


def merge(rules: Iterable[Rule]) -> list[PolicyRule]:
    """The smallest sorted list of ``PolicyRule``s that grants exactly what ``rules`` grant:
    the verbs of each (group, resource, names) are united, named verbs already granted without
    names are dropped, and resources of one group with the same verbs share one entry."""
    granted: dict[tuple[str, str, tuple[str, ...]], set[str]] = defaultdict(set)
    for rule in rules:
        for group, resource in rule.resources:
            granted[(group, resource, rule.names)].update(rule.verbs)
    for (group, resource, names), verbs in granted.items():
        if names:
            verbs.difference_update(granted.get((group, resource, ()), set()))
    shared: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = defaultdict(list)
    for (group, resource, names), verbs in granted.items():
        if verbs:
            ordered = tuple(v for v in VERBS if v in verbs)
            shared[(group, ordered, names)].append(resource)
    merged = [
        PolicyRule(group, tuple(sorted(resources)), verbs, names)
        for (group, verbs, names), resources in shared.items()
    ]
    return sorted(merged, key=lambda r: (r.group, r.resources, r.names, r.verbs))


# --- the services' declarations ---------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """A service as the chart names it (``assisted-bootstrap``) and its declarations."""

    name: str
    #: the module that declares ``RULES``, named in the generated files
    module: str
    rules: tuple[Rule, ...]

    @property
    def policy(self) -> list[PolicyRule]:
        return merge(self.rules)


def header(service: Service) -> str:
    source = service.module.replace(".", "/") + ".py"
    return (
        f"# Generated by `make rbac` from {source} (python -m services rbac --write); "
        "do not edit.\n"
    )


def render(service: Service) -> str:
    """The chart's rule file of ``service``: ``rules:`` as a ClusterRole takes them."""
    body = {"rules": [rule.as_dict() for rule in service.policy]}
    return header(service) + yaml.safe_dump(
        body, sort_keys=False, default_flow_style=None, width=100
    )


def render_all(services: Iterable[Service]) -> dict[str, str]:
    return {f"{service.name}.yaml": render(service) for service in services}


def write(directory: Path, services: Sequence[Service]) -> list[Path]:
    """Write every service's rule file and remove generated files of services that are gone."""
    directory.mkdir(parents=True, exist_ok=True)
    rendered = render_all(services)
    for path in directory.glob("*.yaml"):
        if path.name not in rendered and path.read_text().startswith("# Generated by `make rbac`"):
            path.unlink()
    written = []
    for name, text in rendered.items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check(directory: Path, services: Sequence[Service]) -> list[str]:
    """Differences between ``directory`` and the declarations; empty when up to date."""
    rendered = render_all(services)
    problems = [
        f"{path}: generated for a service that declares no rules"
        for path in sorted(directory.glob("*.yaml"))
        if path.name not in rendered
    ]
    for name, expected in rendered.items():
        problems += _diff(directory / name, expected)
    return problems


def _diff(path: Path, expected: str) -> list[str]:
    if not path.is_file():
        return [f"{path}: missing"]
    return _diff_text(path, path.read_text(encoding="utf-8"), expected)


def _diff_text(path: Path, actual: str, expected: str) -> list[str]:
    if actual == expected:
        return []
    diff = difflib.unified_diff(
        actual.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=f"{path} (committed)",
        tofile=f"{path} (generated)",
    )
    return ["".join(diff)]


# --- questions, and RBAC's answer ---------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """May the service ``verb`` ``resource`` (of ``group``) in ``namespace`` ("" = any)?"""

    group: str
    resource: str
    verb: str
    namespace: str = ""

    @property
    def row(self) -> Row:
        return Row(self.group, self.resource, self.namespace)

    def attributes(self) -> Json:
        """The ``resourceAttributes`` of a ``SubjectAccessReview``."""
        resource, _, subresource = self.resource.partition("/")
        found: Json = {"group": self.group, "resource": resource, "verb": self.verb}
        if subresource:
            found["subresource"] = subresource
        if self.namespace:
            found["namespace"] = self.namespace
        return found


@dataclass(frozen=True, order=True)
class Row:
    """A resource as the matrix shows it: a line of a service's table."""

    group: str
    resource: str
    namespace: str = ""

    @property
    def label(self) -> str:
        """``clusters.azimuth.stackhpc.com/status``, ``secrets`` in kube-system, ``*``."""
        if self.group == "*":
            return "`*` (any resource of any group)"
        plural, _, subresource = self.resource.partition("/")
        name = f"{plural}.{self.group}" if self.group else plural
        name += f"/{subresource}" if subresource else ""
        return f"`{name}`" + (f" in {self.namespace}" if self.namespace else "")

    def questions(self, verbs: Iterable[str] = COLUMNS) -> list[Question]:
        return [Question(self.group, self.resource, verb, self.namespace) for verb in verbs]


def allows(policy: Iterable[PolicyRule], question: Question) -> bool:
    """RBAC's answer (k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go, ``RuleAllows``):
    a rule allows when the group, the resource (with its subresource) and the verb each match
    exactly or by ``*``, and it names no objects (a question names none)."""
    return any(
        _matches(rule.group, question.group)
        and any(_matches(r, question.resource) for r in rule.resources)
        and any(_matches(v, question.verb) for v in rule.verbs)
        and not rule.names
        for rule in policy
    )


def _matches(granted: str, asked: str) -> bool:
    return granted in ("*", asked)


#: resources no service should need, asked of every service
SENSITIVE: tuple[Row, ...] = (
    Row("", "secrets", "kube-system"),
    Row("", "configmaps"),
    Row("", "pods"),
    Row("", "pods/exec"),
    Row("", "nodes"),
    Row("", "namespaces"),
    Row("", "serviceaccounts/token"),
    Row("rbac.authorization.k8s.io", "roles"),
    Row("rbac.authorization.k8s.io", "rolebindings"),
    Row("rbac.authorization.k8s.io", "clusterroles"),
    Row("rbac.authorization.k8s.io", "clusterrolebindings"),
    Row("apiextensions.k8s.io", "customresourcedefinitions"),
    Row("*", "*"),
)
_WRITES = ("create", "update", "patch", "delete")
#: what no service may ever do: ``*`` on Secrets or on anything, RBAC escalation, cluster-wide
#: RBAC, CRDs, Namespaces, Nodes, Pods and their exec, tokens of other service accounts
NEVER: tuple[Question, ...] = (
    Question("", "secrets", "*"),
    *Row("*", "*").questions(),
    *Row("", "namespaces").questions(_WRITES),
    *Row("", "nodes").questions(_WRITES),
    *Row("", "pods").questions(_WRITES),
    *Row("", "pods/exec").questions(("get", "create")),
    *Row("", "serviceaccounts/token").questions(("create",)),
    *(
        Question("rbac.authorization.k8s.io", resource, verb)
        for resource in ("roles", "clusterroles")
        for verb in ESCALATING
    ),
    *Row("rbac.authorization.k8s.io", "clusterroles").questions(_WRITES),
    *Row("rbac.authorization.k8s.io", "clusterrolebindings").questions(_WRITES),
    *Row("apiextensions.k8s.io", "customresourcedefinitions").questions(_WRITES),
)


def used_rows(services: Iterable[Service]) -> list[Row]:
    """Every resource some service's rules name, sorted."""
    return sorted({Row(r.group, res) for s in services for r in s.policy for res in r.resources})


def questions(services: Sequence[Service]) -> list[Question]:
    """The fixed list asked of every service: each used resource and each sensitive one, by
    every column's verb, then the ``NEVER`` questions not among those."""
    asked = [q for row in [*used_rows(services), *SENSITIVE] for q in row.questions()]
    seen = set(asked)
    return asked + [q for q in NEVER if q not in seen]


Answers = Mapping[Question, bool]


def expected(service: Service, asked: Iterable[Question]) -> dict[Question, bool]:
    policy = service.policy
    return {question: allows(policy, question) for question in asked}


# --- asking the API server --------------------------------------------------------------------


class Requester(Protocol):
    """``shared.kube.KubeClient.request``: a reviewer needs nothing else."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> Json: ...


@dataclass(frozen=True)
class Subject:
    """Whom a review is about: a service account, with the groups its tokens carry."""

    namespace: str
    name: str
    groups: tuple[str, ...] = field(default=())

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    def all_groups(self) -> list[str]:
        own = ("system:serviceaccounts", f"system:serviceaccounts:{self.namespace}")
        return [*own, "system:authenticated", *self.groups]


async def review(kube: Requester, subject: Subject, question: Question) -> bool:
    """The API server's answer to ``question`` for ``subject`` (a ``SubjectAccessReview``)."""
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": subject.user,
            "groups": subject.all_groups(),
            "resourceAttributes": question.attributes(),
        },
    }
    answer = await kube.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body=json.dumps(body).encode(),
    )
    return bool((answer.get("status") or {}).get("allowed"))


async def review_all(
    kube: Requester, subject: Subject, asked: Iterable[Question], *, concurrency: int = 8
) -> dict[Question, bool]:
    """Every answer for ``subject``, ``concurrency`` reviews in flight."""
    slots = asyncio.Semaphore(concurrency)

    async def one(question: Question) -> tuple[Question, bool]:
        async with slots:
            return question, await review(kube, subject, question)

    return dict(await asyncio.gather(*(one(q) for q in asked)))


# --- the permissions page ---------------------------------------------------------------------


def matrix(services: Sequence[Service], answers: Mapping[str, Answers]) -> str:
    """The generated part of ``docs/permissions.md``, from ``answers`` (each service's answer
    to every question): per service, its rules with why, then the table of its answers for the
    resources it uses and the sensitive ones it is allowed anything on; then the ``NEVER``
    questions; then one sentence for every question no table shows."""
    parts = [DOC_BEGIN, ""]
    hidden: list[bool] = []
    for service in services:
        shown = _shown_rows(service, answers[service.name])
        parts += _service_section(service, answers[service.name], shown)
        hidden += [
            answers[service.name][q]
            for q in questions(services)
            if q.row not in shown and q not in NEVER
        ]
    parts += _never_section(services, answers)
    verdict = "denied" if not any(hidden) else f"NOT all denied: {sum(hidden)} allowed"
    parts += [
        f"Every other question ({len(hidden)} in all: the resources other services use and "
        f"the sensitive ones, by each column's verb) is {verdict}.",
        "",
        DOC_END,
    ]
    return "\n".join(parts) + "\n"


def _own_rows(service: Service) -> list[Row]:
    return sorted({Row(r.group, res) for r in service.policy for res in r.resources})


def _shown_rows(service: Service, answers: Answers) -> list[Row]:
    """The resources the service uses, then the sensitive ones it may do anything on."""
    sensitive = [row for row in SENSITIVE if any(answers[q] for q in row.questions())]
    return [*_own_rows(service), *sensitive]


def _service_section(service: Service, answers: Answers, rows: Sequence[Row]) -> list[str]:
    source = service.module.replace(".", "/") + ".py"
    lines = [f"### {service.name}", "", f"`{source}`:", ""]
    lines += [f"- {_rule_line(rule)}" for rule in service.rules]
    lines += ["", "| resource | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = ["✓" if answers[q] else "·" for q in row.questions()]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _rule_line(rule: Rule) -> str:
    """``**verbs** group: resources; group: resources (named ...): why``."""
    by_group: dict[str, list[str]] = defaultdict(list)
    for group, resource in rule.resources:
        by_group[group or "core"].append(resource)
    resources = "; ".join(f"{group}: {', '.join(found)}" for group, found in by_group.items())
    named = f" named {', '.join(f'`{n}`' for n in rule.names)}" if rule.names else ""
    return f"**{' '.join(rule.verbs)}** {resources}{named}: {rule.why}"


def _never_section(services: Sequence[Service], answers: Mapping[str, Answers]) -> list[str]:
    """The ``NEVER`` questions, by resource: the verbs, and who is allowed any (nobody)."""
    lines = ["### Denied to every service", ""]
    by_row: dict[Row, list[Question]] = defaultdict(list)
    for question in NEVER:
        by_row[question.row].append(question)
    for row, asked in by_row.items():
        allowed = sorted({s.name for s in services for q in asked if answers[s.name][q]})
        verdict = f"ALLOWED to {', '.join(allowed)}" if allowed else "denied to every service"
        verbs = ", ".join(f"`{q.verb}`" for q in asked)
        lines.append(f"- {verbs} on {row.label}: {verdict}")
    return [*lines, ""]


def replace_generated(text: str, generated: str) -> str:
    """``text`` with its generated block (``DOC_BEGIN`` to ``DOC_END``) replaced."""
    start, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if start < 0 or end < start:
        raise RuleError(f"the page has no {DOC_BEGIN!r} ... {DOC_END!r} block")
    return text[:start] + generated + text[end + len(DOC_END) + 1 :]


def doc_expected(services: Sequence[Service]) -> str:
    """The generated block as the declarations answer every question."""
    asked = questions(services)
    return matrix(services, {s.name: expected(s, asked) for s in services})


# --- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str], services: Sequence[Service]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services rbac",
        description="Write or check the chart's per-service RBAC rules and the permission page.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", type=Path, metavar="DIR", help="write the rule files")
    action.add_argument("--check", type=Path, metavar="DIR", help="fail if DIR is stale")
    parser.add_argument("--doc", type=Path, metavar="FILE", help="the permissions page too")
    args = parser.parse_args(argv)
    if args.write is not None:
        for path in write(args.write, services):
            print(f"wrote {path}")
        if args.doc is not None:
            args.doc.write_text(replace_generated(args.doc.read_text(), doc_expected(services)))
            print(f"wrote {args.doc}")
        return 0
    problems = check(args.check, services)
    if args.doc is not None:
        text = args.doc.read_text()
        problems += _diff_text(args.doc, text, replace_generated(text, doc_expected(services)))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"RBAC rules are out of date: {REGENERATE_HINT}", file=sys.stderr)
    return 1 if problems else 0
