"""Discovery's two kinds of work: a recompute for one Cluster, and events that steer watches.

``sync`` is one recompute (its caller, ``tenant.TenantWatch``, debounces bursts into it):

1. On the first run after a (re-)list, read the Cluster: its ``status.services`` (with recent
   patches folded in, ``logic.Belief``) is what the patch is computed against. 404 or another
   uid: the Cluster is going or was replaced; its events stop or restart the watch, so nothing
   is written here.
2. List the Cluster's addons (label ``addons.stackhpc.com/cluster``), HelmReleases first, and
   merge-patch each one whose ``azimuth.stackhpc.com/services`` differs from its services.
   An addon that refuses its patch for good (403, 422: a ``PermanentError``) is logged and
   counted in ``capibus_discovery_annotation_failures_total`` and the others go on: one
   broken addon must not keep every other service of the Cluster out of its status. A
   ``TemporaryError`` still ends the recompute, which is retried whole (nothing reported).
3. Report the merge patch from what the Cluster says to what the Reservations say, only if it
   is not empty, through the ``StatusReporter``, with the Cluster's uid in ``ref`` and an id
   derived from the state the recompute saw (``logic.report_id``).

``on_changes`` (the consumer's handler) turns Cluster, kubeconfig-Secret and addon events of a
partition into calls on the ``Tracker`` (``watches.Watches``), which owns the long-lived
watches and follows the partitions this replica claims.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.discovery import logic
from shared import freshness, mergepatch
from shared.consumer import Batch
from shared.errors import KubeNotFound, PermanentError
from shared.freshness import Verdict, Versions
from shared.kube import ResourceKind
from shared.messages import ResourceChanged
from shared.metrics import counter
from shared.ports import KubeMergePatcher, KubeReader, KubeWatcher
from shared.resources import CLUSTER, HELM_RELEASE, MANIFESTS, SECRET
from shared.status import StatusReporter

log = logging.getLogger(__name__)

ANNOTATION_FAILURES = counter(
    "capibus_discovery_annotation_failures",
    "Addon services annotations the API server refused for good, by addon kind and error",
    ["kind", "error"],
)

Json = dict[str, Any]

#: Kinds whose events reach discovery, in the order their filters are declared.
WATCHED: tuple[ResourceKind, ...] = (CLUSTER, SECRET, HELM_RELEASE, MANIFESTS)
_BY_REF = {(k.api_version, k.kind): k for k in WATCHED}


class ManagementApi(KubeReader, KubeMergePatcher, Protocol): ...


class TenantApi(KubeWatcher, Protocol):
    async def aclose(self) -> None: ...


#: Builds a client for a tenant cluster from its kubeconfig text.
Connect = Callable[[str], TenantApi]


class Tracker(Protocol):
    async def cluster_changed(self, cluster: Json) -> None: ...

    async def secret_changed(self, namespace: str, cluster: str, version: str) -> None: ...

    async def forget(self, namespace: str, cluster: str) -> None: ...

    def nudge(self, namespace: str, cluster: str) -> None: ...


#: Clusters whose newest applied event version is kept (``shared.freshness``)
VERSIONS_SIZE = 10_000


@dataclass(frozen=True)
class Deps:
    #: this replica's tenant watches (``watches.Watches``)
    tracker: Tracker
    #: the newest version of each Cluster whose event steered the watches
    versions: Versions = field(default_factory=lambda: Versions(size=VERSIONS_SIZE))


# --- one recompute -------------------------------------------------------------------------


async def sync(
    *,
    target: logic.Target,
    reservations: Sequence[Json],
    tenant_version: str,
    belief: logic.Belief,
    reread: bool,
    kube: ManagementApi,
    reporter: StatusReporter,
    now: float,
) -> None:
    """Bring the addons' annotations and ``status.services`` in line with ``reservations``,
    as the tenant had them at ``tenant_version``."""
    if (reread or belief.services is None) and not await _read(target, kube, belief, now):
        return
    addons = await cluster_addons(target, kube)
    plan = logic.plan(logic.services(reservations), addons)
    versions = {addon.key: addon.version for addon in addons}
    for addon, patch in plan.annotations:
        versions[addon.key] = await _annotate(target, addon, patch, kube)
    patch = mergepatch.diff(belief.services or {}, plan.cluster_services)
    if not patch:
        return
    status = {"services": patch}
    seen = logic.report_id(target, tenant_version=tenant_version, addons=versions, patch=status)
    log.debug("%s: reporting %s", target.key, json.dumps(status, sort_keys=True))
    await reporter.report(target.ref, patch=status, message_id=seen)
    belief.record(patch, now)
    log.info("%s: services now %s", target.key, sorted(plan.cluster_services))


async def _annotate(
    target: logic.Target, addon: logic.Addon, patch: Json, kube: ManagementApi
) -> str:
    """Patch ``addon``'s services annotation; its resourceVersion afterwards ("" if gone)."""
    what = f"{addon.kind.kind} {addon.name}"
    try:
        patched = await kube.patch_merge(addon.kind, addon.namespace, addon.name, patch)
    except KubeNotFound:
        return ""  # deleted meanwhile: nothing left to announce on
    except PermanentError as exc:
        # Retried at the next change; the Cluster's status must not wait for this addon.
        ANNOTATION_FAILURES.inc(addon.kind.kind, type(exc).__name__)
        log.error("%s: cannot write the services of %s: %s", target.key, what, exc)
        return addon.version
    log.info("%s: services of %s updated", target.key, what)
    return str(patched.get("metadata", {}).get("resourceVersion", ""))


async def _read(
    target: logic.Target, kube: ManagementApi, belief: logic.Belief, now: float
) -> bool:
    try:
        cluster = await kube.get(CLUSTER, target.namespace, target.name)
    except KubeNotFound:
        log.info("%s: Cluster gone; not reporting services", target.key)
        return False
    if (cluster.get("metadata") or {}).get("uid") != target.uid:
        log.info("%s: Cluster replaced; not reporting services", target.key)
        return False
    belief.read(cluster.get("status") or {}, now)
    return True


async def cluster_addons(target: logic.Target, kube: ManagementApi) -> list[logic.Addon]:
    """The Cluster's HelmReleases, then its Manifests (upstream's order of preference)."""
    selector = f"{logic.ADDON_CLUSTER}={target.name}"
    found: list[logic.Addon] = []
    for kind in (HELM_RELEASE, MANIFESTS):
        items, _ = await kube.list(kind, namespace=target.namespace, label_selector=selector)
        found += [logic.Addon.of(kind, item) for item in items]
    return found


# --- events --------------------------------------------------------------------------------


def latest_per_kind(
    changes: Sequence[ResourceChanged],
) -> list[tuple[ResourceKind, ResourceChanged]]:
    """The newest change of each kind, by resourceVersion rather than stream order
    (``shared.freshness``): a Cluster and an addon may share a name and a queue."""
    by_kind: dict[ResourceKind, list[ResourceChanged]] = {}
    for change in changes:
        kind = _BY_REF.get((change.ref.api_version, change.ref.kind))
        if kind is not None:
            by_kind.setdefault(kind, []).append(change)
    latest = ((kind, freshness.newest(events)) for kind, events in by_kind.items())
    return [(kind, change) for kind, change in latest if change is not None]


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Steer the watches by the newest event of each kind.

    A Cluster's event is applied as state (deleting or not, which incarnation), so one older
    than a Cluster event already applied is skipped: a lagging watcher replica's copy of the
    Cluster from before its deletion began would start a watch again (after its DELETED, of
    a Cluster that is gone). Secret and addon events only make ``Tracker`` read.
    """
    for kind, change in latest_per_kind(batch.messages):
        if kind != CLUSTER:
            await on_change(kind=kind, change=change, tracker=deps.tracker)
            continue
        seen = freshness.stamp(change)
        if deps.versions.check(seen) is Verdict.STALE:
            log.info(
                "Cluster %s: skipping resourceVersion %s, older than one applied",
                change.ref.key,
                change.resource_version,
            )
            continue
        await on_change(kind=kind, change=change, tracker=deps.tracker)
        deps.versions.note(seen)


async def on_change(*, kind: ResourceKind, change: ResourceChanged, tracker: Tracker) -> None:
    namespace = change.ref.namespace or ""
    obj = change.object
    if kind == CLUSTER:
        if change.event == "DELETED" or logic.is_deleting(obj):
            await tracker.forget(namespace, change.ref.name)
        else:
            await tracker.cluster_changed(obj)
    elif kind == SECRET:
        cluster = logic.kubeconfig_owner(obj)
        if cluster is None:
            return
        if change.event == "DELETED":
            await tracker.forget(namespace, cluster)
        else:
            await tracker.secret_changed(namespace, cluster, change.resource_version)
    else:
        # An addon appeared, changed labels or went: its services may now map elsewhere.
        cluster = logic.addon_cluster(obj)
        if cluster is not None:
            tracker.nudge(namespace, cluster)
