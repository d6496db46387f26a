"""Which Cluster names capibus can carry: every name derived from one, with its limit.

Kubernetes accepts any DNS subdomain (up to 253 characters) as the name of a Cluster, and so
does upstream's operator, which then fails at ``helm install``: a Helm release name has at
most 53 characters (helm's ``pkg/chart/v2/util/validate_name.go``, ``maxReleaseNameLen``),
and worse, ``helm uninstall`` refuses the same name, so such a Cluster could never be deleted
cleanly. capibus refuses these names when the Cluster is created instead (the admission
webhook and a CEL rule in the CRD, both worded from ``length_problem``), and its Helm adapter
checks the release name before running helm at all.

``DERIVED`` is the one table of what is derived from a Cluster name, in the form each takes
and the limit and format the thing it names imposes. ``MAX_LENGTH`` and the wording of the
refusal come from the table, so a new derived name is one new row. Object names derived with
a prefix or suffix are listed even though their limit (253) is far from binding: the table is
also the inventory a reviewer reads when a new name is derived. The identity service's name
templates are settings; the rows carry their defaults (``services/identity/settings.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: ``pkg/chart/v2/util/validate_name.go`` in helm: a DNS subdomain in lower case.
HELM_RELEASE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
HELM_RELEASE_LIMIT = 53
#: apimachinery's label value: alphanumeric at both ends, ``-_.`` inside, at most 63.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_LIMIT = 63
#: apimachinery's DNS-1123 subdomain, the rule for the names of Secrets and custom resources.
DNS_SUBDOMAIN = HELM_RELEASE
DNS_SUBDOMAIN_LIMIT = 253

_PLACEHOLDER = "{name}"


@dataclass(frozen=True)
class DerivedName:
    """One name made from a Cluster name: ``form`` with ``{name}`` in it, what it names,
    and the longest and the shape that thing accepts."""

    form: str
    names: str
    limit: int
    pattern: re.Pattern[str]

    def render(self, name: str) -> str:
        return self.form.replace(_PLACEHOLDER, name)

    @property
    def allowed(self) -> int:
        """The longest Cluster name whose derived name fits."""
        return self.limit - (len(self.form) - len(_PLACEHOLDER))

    @property
    def why(self) -> str:
        """``because ...``: the reason a name longer than ``allowed`` is refused."""
        if self.form == _PLACEHOLDER:
            return f"because it is {self.names}"
        return f"because {self.form.replace(_PLACEHOLDER, '<name>')} is {self.names}"


DERIVED: tuple[DerivedName, ...] = (
    DerivedName("{name}", "the Helm release name", HELM_RELEASE_LIMIT, HELM_RELEASE),
    DerivedName(
        "{name}",
        "the value of the labels capi.stackhpc.com/cluster, cluster.x-k8s.io/cluster-name "
        "and addons.stackhpc.com/cluster",
        LABEL_VALUE_LIMIT,
        LABEL_VALUE,
    ),
    DerivedName(
        "kube-{name}",
        "the name of the OIDCClient, the Platform and the portal's Lease",
        DNS_SUBDOMAIN_LIMIT,
        DNS_SUBDOMAIN,
    ),
    DerivedName(
        "{name}-kubeconfig",
        "the name of the admin kubeconfig Secret",
        DNS_SUBDOMAIN_LIMIT,
        DNS_SUBDOMAIN,
    ),
    DerivedName(
        "{name}-kubeconfig-user",
        "the name of the OIDC kubeconfig Secret",
        DNS_SUBDOMAIN_LIMIT,
        DNS_SUBDOMAIN,
    ),
    DerivedName(
        "{name}-zenith-apiserver",
        "the name of the Zenith API server Secret",
        DNS_SUBDOMAIN_LIMIT,
        DNS_SUBDOMAIN,
    ),
    DerivedName(
        "{name}-zenith-credential",
        "the name of the Zenith monitoring credential Secret",
        DNS_SUBDOMAIN_LIMIT,
        DNS_SUBDOMAIN,
    ),
    DerivedName(
        "{name}-etcd-key", "the name of the etcd key Secret", DNS_SUBDOMAIN_LIMIT, DNS_SUBDOMAIN
    ),
)

#: The row that binds first, and so the longest Cluster name capibus accepts.
STRICTEST = min(DERIVED, key=lambda row: row.allowed)
MAX_LENGTH = STRICTEST.allowed


def length_problem(length: int | str) -> str:
    """The refusal of a name of ``length`` characters. ``length`` may also be an expression
    spliced in by the caller (the CRD's CEL ``messageExpression`` builds the same text)."""
    return f"name is {length} characters; at most {MAX_LENGTH} are allowed {STRICTEST.why}"


def problem(name: str) -> str | None:
    """Why capibus cannot carry a Cluster named ``name``; None when every derived name fits."""
    if len(name) > MAX_LENGTH:
        return length_problem(len(name))
    for row in DERIVED:
        derived = row.render(name)
        if not row.pattern.match(derived):
            return (
                f"name {name!r} cannot be used {row.why}: {derived!r} must match "
                f"{row.pattern.pattern}"
            )
    return None


def release_name_problem(name: str) -> str | None:
    """Why helm would refuse ``name`` as a release name; None if it would not."""
    if len(name) > HELM_RELEASE_LIMIT:
        return f"release name is {len(name)} characters; helm allows at most {HELM_RELEASE_LIMIT}"
    if not HELM_RELEASE.match(name):
        return f"release name {name!r} does not match {HELM_RELEASE.pattern}"
    return None
