"""Admission reviews of Clusters and ClusterTemplates: gather the facts, apply ``logic``.

Each review is a plain async function of an ``AdmissionRequest`` with the API as a keyword-only
``Protocol`` dependency, and answers a ``Verdict``:

* allowed, possibly with a warning (a Cluster keeping a template that is now deprecated);
* denied with 400 when a rule refuses the change; the message is the rule's reason;
* denied with 503 "cannot verify ..." when a fact could not be looked up (API server down,
  overloaded, or our RBAC wrong). The webhook is ``failurePolicy: Fail``: admitting what we
  could not check would let a broken Cluster in, and the client is told the refusal is
  temporary (503 is retried by well-behaved clients).

A new Cluster's name must fit every name capibus derives from it (``shared.names``: at most
53 characters, the Helm release name). Upstream accepts any DNS subdomain and fails at helm,
leaving a Cluster that can never be installed nor cleanly deleted. The rule applies to CREATE
only, so a Cluster that exists with a longer name can still lose its finalizer.

Cheap paths come first. A Cluster UPDATE that leaves ``spec`` alone (labels, annotations,
finalizers, the deletion itself) is allowed without a single API call, so a slow or partly
broken API server can never hold up finalizer removal; the object was admitted when its spec
last changed. The production webhook configuration also filters such updates out with a
``matchConditions`` expression, so they do not even reach this service.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from services.admission import logic
from shared.errors import CapibusError, KubeNotFound, TemporaryError
from shared.kube import ResourceKind
from shared.models import ClusterSpec
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, SECRET
from shared.webhook import AdmissionRequest, Verdict

Json = dict[str, Any]
T = TypeVar("T")


class AdmissionApi(Protocol):
    """Read-only lookups; errors are ``shared.errors`` types, a missing object ``KubeNotFound``."""

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def exists(self, kind: ResourceKind, namespace: str | None, name: str) -> bool:
        """Whether the object exists, reading its metadata only (never a Secret's data)."""
        ...

    async def any_labelled(self, kind: ResourceKind, label_selector: str) -> bool:
        """Whether any object of ``kind``, in any namespace, matches ``label_selector``."""
        ...


class Unverifiable(Exception):
    """A fact a rule needs could not be looked up."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


async def _lookup(what: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except KubeNotFound:
        raise
    except CapibusError as exc:
        # Temporary (unreachable, 429, 5xx) is worth a retry; anything else (403) is ours to fix.
        code = 503 if isinstance(exc, TemporaryError) else 500
        raise Unverifiable(f"cannot verify {what}: {exc}", code=code) from exc


# --------------------------------------------------------------------------------------------
# Cluster (H4)
# --------------------------------------------------------------------------------------------


async def review_cluster(request: AdmissionRequest, *, api: AdmissionApi) -> Verdict:
    if request.operation not in ("CREATE", "UPDATE"):
        return Verdict.allow()
    if request.operation == "UPDATE" and logic.spec_unchanged(request.old_object, request.object):
        return Verdict.allow()
    cluster = request.object or {}
    # Only on CREATE: a Cluster admitted before this rule must stay updatable and deletable.
    problem = logic.name_problem(request.name, cluster) if request.operation == "CREATE" else None
    problem = problem or logic.spec_problem(ClusterSpec, cluster.get("spec"))
    if problem is not None:
        return Verdict.deny(problem)
    try:
        return await _check_cluster(request, cluster, api=api)
    except Unverifiable as exc:
        return Verdict.deny(str(exc), code=exc.code)


async def _check_cluster(request: AdmissionRequest, cluster: Json, *, api: AdmissionApi) -> Verdict:
    spec = ClusterSpec.model_validate(cluster["spec"])
    namespace = request.namespace or cluster.get("metadata", {}).get("namespace")
    deleting = bool(cluster.get("metadata", {}).get("deletionTimestamp"))
    secret = spec.cloud_credentials_secret_name
    # A Cluster being deleted may outlive its credentials (upstream PR #60).
    if not deleting and not await _lookup(
        f"the cloud credentials secret {secret!r}", api.exists(SECRET, namespace, secret)
    ):
        return Verdict.deny(f"{logic.SECRET_MISSING}: {secret!r} in namespace {namespace!r}")
    target = await _template(spec.template_name, api=api)
    if target is None:
        return Verdict.deny(f"{logic.TEMPLATE_MISSING}: {spec.template_name!r}")
    if isinstance(target, str):
        return Verdict.deny(target)
    old = request.old_object if request.operation == "UPDATE" else None
    current_name = ((old or {}).get("spec") or {}).get("templateName")
    if current_name == target.name:
        # Keeping a template is always allowed, even once it is deprecated.
        return Verdict.allow(*_deprecation_warning(target))
    problem = logic.deprecation_problem(target)
    if problem is None and old is not None:
        current = await _template(str(current_name), api=api) if current_name else None
        problem = logic.upgrade_problem(
            target=target,
            current=current if isinstance(current, logic.Template) else None,
            oldest_kubelet=logic.oldest_kubelet(old),
        )
    return Verdict.deny(problem) if problem else Verdict.allow()


async def _template(name: str, *, api: AdmissionApi) -> logic.Template | str | None:
    """The template's facts, why they are unreadable, or None when it does not exist."""
    try:
        obj = await _lookup(f"the cluster template {name!r}", api.get(CLUSTER_TEMPLATE, None, name))
    except KubeNotFound:
        return None
    return logic.read_template(obj)


def _deprecation_warning(template: logic.Template) -> list[str]:
    if not template.deprecated:
        return []
    return [f"cluster template {template.name!r} is deprecated; consider moving to another"]


# --------------------------------------------------------------------------------------------
# ClusterTemplate (H3)
# --------------------------------------------------------------------------------------------


async def review_cluster_template(request: AdmissionRequest, *, api: AdmissionApi) -> Verdict:
    if request.operation == "DELETE":
        return await _check_template_unused(request.name, api=api)
    if request.operation not in ("CREATE", "UPDATE"):
        return Verdict.allow()
    if request.operation == "UPDATE" and logic.spec_unchanged(request.old_object, request.object):
        return Verdict.allow()
    problem = logic.template_spec_problem((request.object or {}).get("spec"))
    return Verdict.deny(problem) if problem else Verdict.allow()


async def _check_template_unused(name: str, *, api: AdmissionApi) -> Verdict:
    selector = logic.in_use_selector(name)
    if selector is None:
        return Verdict.allow()
    try:
        in_use = await _lookup(
            f"whether template {name!r} is in use", api.any_labelled(CLUSTER, selector)
        )
    except Unverifiable as exc:
        return Verdict.deny(str(exc), code=exc.code)
    return Verdict.deny(logic.TEMPLATE_IN_USE) if in_use else Verdict.allow()
