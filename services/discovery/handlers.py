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
   ``TemporaryError`` still ends the recompute, which is retried whole (nothing published).
3. Publish ``PatchStatus`` with the merge patch from what the Cluster says to what the
   Reservations say, only if it is not empty, with the Cluster's uid in ``ref``.

``on_changes`` turns Cluster, kubeconfig-Secret and addon events of a partition into calls on
the ``Tracker`` (``watches.Watches``), which owns the long-lived watches.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from services.discovery import logic
from shared import subjects
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeNotFound, PermanentError
from shared.kube import ResourceKind, WatchEvent
from shared.messages import Message, ObjectRef, PatchStatus, ResourceChanged
from shared.metrics import counter
from shared.resources import CLUSTER, HELM_RELEASE, MANIFESTS, SECRET

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


class ManagementApi(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Json], str]: ...

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json: ...


class TenantApi(Protocol):
    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[Json], str]: ...

    def watch(
        self,
        kind: ResourceKind,
        *,
        resource_version: str,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]: ...

    async def aclose(self) -> None: ...


#: Builds a client for a tenant cluster from its kubeconfig text.
Connect = Callable[[str], TenantApi]


class Publisher(Protocol):
    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published: ...


class Tracker(Protocol):
    async def cluster_changed(self, cluster: Json) -> None: ...

    async def secret_changed(self, namespace: str, cluster: str, version: str) -> None: ...

    async def forget(self, namespace: str, cluster: str) -> None: ...

    def nudge(self, namespace: str, cluster: str) -> None: ...


# --- one recompute -------------------------------------------------------------------------


async def sync(
    *,
    target: logic.Target,
    reservations: Sequence[Json],
    belief: logic.Belief,
    reread: bool,
    kube: ManagementApi,
    bus: Publisher,
    partitions: int,
    source: str,
    now: float,
) -> None:
    """Bring the addons' annotations and ``status.services`` in line with ``reservations``."""
    if (reread or belief.services is None) and not await _read(target, kube, belief, now):
        return
    addons = await cluster_addons(target, kube)
    plan = logic.plan(logic.services(reservations), addons)
    for addon, patch in plan.annotations:
        await _annotate(target, addon, patch, kube)
    patch = logic.merge_diff(belief.services or {}, plan.cluster_services)
    if patch:
        await _publish(target, {"services": patch}, bus=bus, partitions=partitions, source=source)
        belief.record(patch, now)
        log.info("%s: services now %s", target.key, sorted(plan.cluster_services))


async def _annotate(
    target: logic.Target, addon: logic.Addon, patch: Json, kube: ManagementApi
) -> None:
    what = f"{addon.kind.kind} {addon.name}"
    try:
        await kube.patch_merge(addon.kind, addon.namespace, addon.name, patch)
    except KubeNotFound:
        return  # deleted meanwhile: nothing left to announce on
    except PermanentError as exc:
        # Retried at the next change; the Cluster's status must not wait for this addon.
        ANNOTATION_FAILURES.inc(addon.kind.kind, type(exc).__name__)
        log.error("%s: cannot write the services of %s: %s", target.key, what, exc)
        return
    log.info("%s: services of %s updated", target.key, what)


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


async def _publish(
    target: logic.Target, patch: Json, *, bus: Publisher, partitions: int, source: str
) -> None:
    ref = ObjectRef(
        api_version=CLUSTER.api_version,
        kind=CLUSTER.kind,
        namespace=target.namespace,
        name=target.name,
        uid=target.uid,
    )
    # A fresh id, not one derived from the content: the same patch may rightly be sent again
    # (a service that comes, goes and comes back) and must not be dropped as a duplicate.
    message = PatchStatus(
        source=source, correlation_id=f"cluster:{target.key}", ref=ref, patch=patch
    )
    subject = subjects.cluster_status(target.partition, target.namespace, target.name)
    log.debug("%s: publishing %s", target.key, json.dumps(patch, sort_keys=True))
    await bus.publish(subject, message)


# --- events --------------------------------------------------------------------------------


def latest_per_kind(
    changes: Sequence[ResourceChanged],
) -> list[tuple[ResourceKind, ResourceChanged]]:
    """The newest change of each kind: a Cluster and an addon may share a name and a queue."""
    latest: dict[ResourceKind, ResourceChanged] = {}
    for change in changes:
        kind = _BY_REF.get((change.ref.api_version, change.ref.kind))
        if kind is not None:
            latest[kind] = change
    return list(latest.items())


async def on_changes(*, batch: Batch[ResourceChanged], tracker: Tracker) -> None:
    for kind, change in latest_per_kind(batch.messages):
        await on_change(kind=kind, change=change, tracker=tracker)


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
