"""Pure admission rules for Clusters and ClusterTemplates (upstream's ``validate_cluster`` and
``validate_cluster_template`` webhooks, H4 and H3 of ``docs/upstream.md`` §1).

Every rule is a function of values already in hand and answers ``None`` (fine) or the reason
to refuse, worded as upstream words it (the Azimuth portal shows these messages), followed by
the specifics. The handlers gather the facts; nothing here does I/O.

Rules, in the order the handlers apply them:

* A new Cluster's name must fit every name derived from it (``shared.names``); stricter than
  upstream, which accepts any DNS subdomain and then fails at ``helm install``.
* The spec must validate against the same pydantic model the services parse with
  (``shared.models``), so nothing is admitted that a service would later fail to read.
* A ClusterTemplate's ``values.kubernetesVersion`` must be SemVer (``1.30.2``, ``v1.30.2``).
  This is a capibus addition: upstream compared versions of templates it never checked, so a
  template with ``latest`` made every later upgrade check crash.
* The template a Cluster moves to must not be deprecated; a Cluster may keep a template that
  became deprecated.
* Moving to another template (SemVer of ``values.kubernetesVersion``): no downgrade, same
  major, at most one minor ahead of the current template, and at most one minor ahead of the
  oldest node's kubelet (stricter than Kubernetes' skew policy, as upstream: a second upgrade
  cannot start before the first has reached every node). With no nodes, or no node reporting
  a kubelet version, the kubelet rule is skipped; when the current template is gone or its
  version unreadable, the template-to-template rules are (the kubelet rule still holds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from shared import names
from shared.models import ClusterTemplateSpec

Json = dict[str, Any]

TEMPLATE_LABEL = "azimuth.stackhpc.com/cluster-template"

SECRET_MISSING = "specified cloud credentials secret does not exist"
TEMPLATE_MISSING = "specified cluster template does not exist"
TEMPLATE_INVALID = "specified cluster template is invalid"
TEMPLATE_DEPRECATED = "specified cluster template is deprecated"
DOWNGRADE = "specified cluster template would be a downgrade"
MAJOR_CHANGE = "upgrading to a new major version is not supported"
MINOR_JUMP = "upgrading by more than one minor version is not supported"
KUBELET_SKEW = (
    "upgrading to more than one minor version newer than the oldest node is not supported"
)
TEMPLATE_IN_USE = "template is in use by at least one cluster"
VERSION_NOT_SEMVER = "kubernetesVersion must be a SemVer version such as 1.30.2"

# ASCII: in a str pattern ``\d`` also matches other scripts' digits, which int() reads, so
# "v1.3\u0660.0" (an Arabic-Indic zero) would pass for 1.30.0 and reach the Helm values as is.
_SEMVER = re.compile(
    r"^v?(?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?P<patch>0|[1-9]\d*)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$",
    re.ASCII,
)


@total_ordering
@dataclass(frozen=True)
class Version:
    """A SemVer 2.0 version, ordered by precedence (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _SEMVER.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a SemVer version")
        pre = match["pre"]
        return cls(
            int(match["major"]),
            int(match["minor"]),
            int(match["patch"]),
            tuple(pre.split(".")) if pre else (),
        )

    def _key(self) -> tuple[Any, ...]:
        # A release outranks its pre-releases; numeric identifiers rank below alphanumeric.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, not self.prerelease, pre)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.prerelease)}" if self.prerelease else core


def parse_version(text: object) -> Version | None:
    return Version.parse(text) if isinstance(text, str) and _SEMVER.match(text.strip()) else None


@dataclass(frozen=True)
class Template:
    """What the rules need to know of a ClusterTemplate."""

    name: str
    deprecated: bool
    version: Version | None


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------


def name_problem(request_name: str, obj: Json) -> str | None:
    """Why a new Cluster's name cannot be carried; the object's name wins, because a request
    for a ``generateName`` object may arrive without one."""
    name = str((obj.get("metadata") or {}).get("name") or request_name)
    problem = names.problem(name)
    return f"metadata.name: {problem}" if problem else None


def spec_problem(model: type[BaseModel], spec: object) -> str | None:
    """Why ``spec`` does not validate against ``model``, one line per error; None if it does."""
    try:
        model.model_validate(spec)
    except ValidationError as exc:
        return "; ".join(_describe(error) for error in exc.errors())
    return None


def _describe(error: Any) -> str:
    path = "spec"
    for part in error["loc"]:
        # A field that was absent is reported by its Python name; users know the API name.
        path += f"[{part}]" if isinstance(part, int) else f".{to_camel(part)}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{path}: {message}"


def template_spec_problem(spec: object) -> str | None:
    problem = spec_problem(ClusterTemplateSpec, spec)
    if problem is not None:
        return problem
    version = ClusterTemplateSpec.model_validate(spec).values.kubernetes_version
    if parse_version(version) is None:
        return f"spec.values.kubernetesVersion: {VERSION_NOT_SEMVER}, not {version!r}"
    return None


def read_template(obj: Json) -> Template | str:
    """The rule-relevant facts of a stored ClusterTemplate, or why they cannot be read."""
    name = str(obj.get("metadata", {}).get("name", ""))
    problem = spec_problem(ClusterTemplateSpec, obj.get("spec"))
    if problem is not None:
        return f"{TEMPLATE_INVALID}: {name}: {problem}"
    spec = ClusterTemplateSpec.model_validate(obj["spec"])
    return Template(name, spec.deprecated, parse_version(spec.values.kubernetes_version))


def spec_unchanged(old: Json | None, new: Json | None) -> bool:
    """An UPDATE that leaves the spec alone: metadata only (labels, finalizers, deletion)."""
    return old is not None and new is not None and old.get("spec") == new.get("spec")


# --------------------------------------------------------------------------------------------
# Template changes and upgrades
# --------------------------------------------------------------------------------------------


def oldest_kubelet(cluster: Json | None) -> Version | None:
    """The oldest readable ``status.nodes[*].kubeletVersion``; None without any."""
    nodes = ((cluster or {}).get("status") or {}).get("nodes") or {}
    versions = [
        parse_version(node.get("kubeletVersion"))
        for node in nodes.values()
        if isinstance(node, dict)
    ]
    return min((v for v in versions if v is not None), default=None)


def deprecation_problem(target: Template) -> str | None:
    return f"{TEMPLATE_DEPRECATED}: {target.name}" if target.deprecated else None


def upgrade_problem(
    *, target: Template, current: Template | None, oldest_kubelet: Version | None
) -> str | None:
    """Why moving from ``current`` to ``target`` is refused (for a Cluster that exists)."""
    version = target.version
    if version is None:
        return f"{TEMPLATE_INVALID}: {target.name}: kubernetesVersion is not SemVer"
    was = current.version if current is not None else None
    if was is not None:
        change = f"{was} -> {version}"
        if version < was:
            return f"{DOWNGRADE} ({change})"
        if version.major != was.major:
            return f"{MAJOR_CHANGE} ({change})"
        if version.minor > was.minor + 1:
            return f"{MINOR_JUMP} ({change})"
    if oldest_kubelet is not None and version.minor > oldest_kubelet.minor + 1:
        return f"{KUBELET_SKEW} (oldest node {oldest_kubelet}, template {version})"
    return None


# --------------------------------------------------------------------------------------------
# Template deletion
# --------------------------------------------------------------------------------------------


def in_use_selector(template_name: str) -> str | None:
    """The label selector finding Clusters on ``template_name``; None if no label can name it.

    Template names may be longer than a label value may be (63 characters); such a template
    can never be recorded in the label, so no Cluster can be found through it.
    """
    too_long = len(template_name) > names.LABEL_VALUE_LIMIT
    if not template_name or too_long or not names.LABEL_VALUE.match(template_name):
        return None
    return f"{TEMPLATE_LABEL}={template_name}"
