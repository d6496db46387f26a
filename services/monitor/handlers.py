"""The monitor's one job: turn a change of a CAPI, addon or kubeconfig object into the status
patch of the Azimuth Cluster it belongs to, and only when the Cluster does not already say so.

``on_changes`` is the handler of the monitor's one subscription (``(batch, deps)``):

1. ``logic.owner`` names the Cluster (same namespace), or the event is ignored: an unrelated
   Secret costs no API call and no write.
2. Under the Cluster's lock (its Machines, addons and control plane arrive in separate
   queues), the Cluster's status comes from ``ClusterViews`` or from a GET; an ADDED event
   always reads, since a new object may belong to a new Cluster of the same name. 404: there
   is no Cluster to report to, so nothing is published. Its uid goes into the patch, so the
   writer drops it if the Cluster was replaced meanwhile.
3. ``logic.difference`` keeps only what differs; an empty patch publishes nothing, so a
   re-delivered or re-listed event, or an idle cluster, costs no write. What differs goes to
   the writer through ``Deps.reporter`` (``shared.status``), caused by the event: a
   redelivered event reports the same message, which JetStream stores once.

For a Machine the flavor comes from its infrastructure machine, found by API discovery
because a v1beta2 reference names only the group; the client remembers what discovery said,
a kind it does not serve for a while, so that costs no request per event (``KindCache`` keeps
the log to one line per such kind and window). A missing (404) or forbidden one leaves
``size`` unset rather than failing the node: upstream dropped the whole event instead.

On claiming a partition, ``resync_partitions`` repairs what events cannot (``resync``
explains what and why). One snapshot per claim (7 lists, whatever the number of Clusters)
picks the Clusters that could need a correction; only those take the exact path,
``resync_cluster``, which lists their objects again under the Cluster's lock before reading
its status. Deciding from the snapshot would be cheaper still but could publish a removal
after the report of an object created since the snapshot, erasing it; the exact path's
ordering is what keeps that from happening. A correction has no cause: its id is derived from
the Cluster and the patch, so the same correction from two claims is one message.

Transient API or bus failures propagate as ``TemporaryError`` and the consumer retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.monitor import capi, logic, resync
from shared import freshness, ports
from shared.consumer import Batch
from shared.errors import KubeForbidden, KubeNotFound
from shared.freshness import Verdict, Versions
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import ResourceChanged
from shared.resources import CLUSTER, MACHINE, SECRET, cluster_ref, scrub
from shared.status import StatusReporter

log = logging.getLogger(__name__)

Json = dict[str, Any]
#: objects whose newest applied version is kept (``CAPIBUS_MONITOR__VERSIONS_SIZE``)
VERSIONS_SIZE = 50_000
#: (group, version or None, kind)
KindKey = tuple[str, str | None, str]


@dataclass
class KindCache:
    """When the monitor last said that an infrastructure machine kind is not served.

    Discovery and remembering its answers are the client's (``Discovery.resolve``); this keeps
    the log to one line per kind per ``miss_seconds`` instead of one per Machine event.
    """

    miss_seconds: float = 300.0
    said: dict[KindKey, float] = field(default_factory=dict)

    def first_in_window(self, key: KindKey, now: float) -> bool:
        said = self.said.get(key)
        if said is not None and now < said + self.miss_seconds:
            return False
        self.said[key] = now
        return True


class ClusterApi(ports.KubeReader, ports.Discovery, Protocol): ...


@dataclass(frozen=True)
class Deps:
    kube: ClusterApi
    reporter: StatusReporter
    #: what this replica believes each Cluster's status says
    views: logic.ClusterViews
    #: which kubeconfig Secret the status names (``logic.kubeconfig_secret_name``)
    oidc_enabled: bool = False
    clock: Callable[[], float] = time.monotonic
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    kinds: KindCache = field(default_factory=KindCache)
    #: the newest version of each object whose event was applied (``shared.freshness``)
    versions: Versions = field(default_factory=lambda: Versions(size=VERSIONS_SIZE))


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Report what the latest event of each kind in ``batch`` says (level-triggered)."""
    for kind, change in logic.latest_per_kind(batch.messages):
        await report_change(kind, change, deps)


async def report_change(kind: ResourceKind, event: ResourceChanged, deps: Deps) -> None:
    cluster = logic.owner(kind, event.object, oidc=deps.oidc_enabled)
    namespace = event.ref.namespace
    if cluster is None or namespace is None:
        return
    change = await current(kind, event, deps)
    if change is None:
        return
    await _report(kind, change, namespace, cluster, deps)
    deps.versions.note(freshness.stamp(change))


async def current(kind: ResourceKind, event: ResourceChanged, deps: Deps) -> ResourceChanged | None:
    """``event`` if it is no older than what was applied of its object; None if it is; for
    the MODIFIED event of an object not remembered, the object as the API server has it now
    (``shared.freshness`` says why)."""
    verdict = deps.versions.check(freshness.stamp(event))
    if verdict is Verdict.STALE:
        log.info(
            "%s %s: skipping resourceVersion %s, older than one already applied",
            kind.kind,
            event.ref.key,
            event.resource_version,
        )
        return None
    if verdict is Verdict.UNSEEN and event.event == "MODIFIED":
        return await read_back(kind, event, deps)
    return event


async def read_back(kind: ResourceKind, event: ResourceChanged, deps: Deps) -> ResourceChanged:
    """``event`` made to say what the API server says of its object now: gone (DELETED), or
    its current state (which may be a new object of the same name)."""
    ref = event.ref
    try:
        obj = scrub(kind, await deps.kube.get(kind, ref.namespace, ref.name))
    except KubeNotFound:
        return event.model_copy(update={"event": "DELETED"})
    meta = obj.get("metadata") or {}
    return event.model_copy(
        update={
            "object": obj,
            "resource_version": str(meta.get("resourceVersion") or event.resource_version),
            "ref": ref.model_copy(update={"uid": meta.get("uid") or ref.uid}),
            "trimmed": None,
        }
    )


async def _report(
    kind: ResourceKind, change: ResourceChanged, namespace: str, cluster: str, deps: Deps
) -> None:
    size = None
    if kind == MACHINE and change.event != "DELETED":
        size = await machine_size(change.object, deps=deps)
    wanted = logic.fragment(kind, change.event, change.object, size=size)
    if not wanted:
        return
    key = f"{namespace}/{cluster}"
    async with deps.locks(key):
        # A new object may well belong to a new Cluster of the same name: read it afresh.
        view = None if change.event == "ADDED" else deps.views.get(key, deps.clock())
        view = view or await _read(namespace, cluster, deps)
        if view is None:
            return
        patch = logic.difference(view.status, wanted)
        if not patch:
            return
        await deps.reporter.report(
            cluster_ref(namespace, cluster, view.uid), patch=patch, cause=change
        )
        deps.views.record(view, patch, deps.clock())


async def _read(namespace: str, name: str, deps: Deps) -> logic.View | None:
    key = f"{namespace}/{name}"
    try:
        cluster = await deps.kube.get(CLUSTER, namespace, name)
    except KubeNotFound:
        deps.views.forget(key)
        log.debug("%s: no such Cluster; not reporting", key)
        return None
    return deps.views.read(key, cluster, deps.clock())


async def machine_size(machine: Json, *, deps: Deps) -> str | None:
    """The flavor of ``machine``'s infrastructure machine (``spec.flavor``), if it has one."""
    ref = capi.infrastructure_ref(machine)
    if ref is None:
        return None
    try:
        kind = await resolve(ref, deps=deps)
        infra = await deps.kube.get(kind, ref.namespace, ref.name) if kind else None
    except (KubeNotFound, KubeForbidden) as exc:
        log.info("%s/%s: no size: %s", ref.namespace, ref.name, exc)
        return None
    flavor = ((infra or {}).get("spec") or {}).get("flavor")
    return flavor if isinstance(flavor, str) and flavor else None


async def resolve(ref: capi.Reference, *, deps: Deps) -> ResourceKind | None:
    """The resource ``ref`` names: its version, else the preferred one, with the plural from
    discovery. None for a kind the server does not serve."""
    if not ref.group:
        return None
    try:
        return await deps.kube.resolve(ref.group, ref.kind, version=ref.version)
    except KubeNotFound as exc:
        if deps.kinds.first_in_window((ref.group, ref.version, ref.kind), deps.clock()):
            log.info("%s of %s: nodes using it get no size: %s", ref.kind, ref.group, exc)
        return None


# --- resync: prune what vanished unseen, name the kubeconfig (see ``resync``) --------------
# A snapshot per claim picks the suspect Clusters; each of those alone takes the exact path.


async def resync_partitions(
    claimed: frozenset[int], deps: Deps, *, snapshot: resync.Snapshot | None = None
) -> int:
    """Resync the Clusters of the ``claimed`` partitions (from ``snapshot``, else one taken
    now); returns how many were patched.

    Only a Cluster the snapshot makes suspect (``resync.suspect``) costs requests: it goes
    through ``resync_cluster``, which lists again under its lock and decides. The snapshot
    alone never decides a removal (the module docstring of ``resync`` says why).
    """
    if not claimed:
        return 0
    if snapshot is None:
        snapshot = await resync_snapshot(deps.kube)
    patched = 0
    for cluster in snapshot.clusters:
        meta = cluster["metadata"]
        ref = cluster_ref(meta["namespace"], meta["name"], meta.get("uid"))
        if deps.reporter.partition(ref) not in claimed or meta.get("deletionTimestamp"):
            continue
        if not resync.suspect(cluster, snapshot.backing, oidc=deps.oidc_enabled):
            continue
        patched += await resync_cluster(meta["namespace"], meta["name"], deps)
    return patched


def seed_versions(snapshot: resync.Snapshot, partition: int, deps: Deps) -> int:
    """Remember the listed version of every backing object of ``partition``'s Clusters, so
    that an older event of one, arriving after this replica took the partition over, is
    skipped without a read (``shared.freshness``); returns how many."""
    seeded = 0
    for (namespace, name), objects in snapshot.backing.items():
        if deps.reporter.partition(cluster_ref(namespace, name, None)) != partition:
            continue
        for items in objects.values():
            for obj in items:
                deps.versions.note(freshness.object_stamp(obj))
                seeded += 1
    return seeded


async def resync_snapshot(kube: ClusterApi) -> resync.Snapshot:
    """Every Cluster, then every object of each ``resync.BACKING`` kind that carries the
    Cluster label, in all namespaces: 7 lists (and their pages) whatever the Cluster count."""
    clusters, _ = await kube.list(CLUSTER)
    listed = {
        kind.token: await _listed(kind, logic.CLUSTER_LABEL, kube=kube) for kind in resync.BACKING
    }
    return resync.Snapshot(clusters=clusters, backing=resync.group(listed))


async def resync_cluster(namespace: str, name: str, deps: Deps) -> int:
    """Remove the status entries of one Cluster that no object backs, and name the kubeconfig
    Secret this deployment hands out (1 if it published).

    Under the Cluster's lock, the objects are listed *before* the status is read: a patch
    for an object created after the listing can then only be published after this one, so
    the writer never applies a removal over a newer addition.
    """
    key, kube = f"{namespace}/{name}", deps.kube
    async with deps.locks(key):
        selector = f"{logic.CLUSTER_LABEL}={name}"
        objects = {
            kind.token: await _listed(kind, selector, kube=kube, namespace=namespace)
            for kind in resync.BACKING
        }
        secret = await _kubeconfig_secret(namespace, name, kube=kube, oidc=deps.oidc_enabled)
        view = await _read(namespace, name, deps)
        if view is None:
            return 0
        patch = {
            **resync.stale(view.status, resync.present(objects)),
            **resync.kubeconfig(view.status, secret),
        }
        if not patch:
            return 0
        log.info("%s: resync corrects %s", key, sorted(patch))
        await deps.reporter.report(cluster_ref(namespace, name, view.uid), patch=patch)
        deps.views.record(view, patch, deps.clock())
        return 1


async def _kubeconfig_secret(
    namespace: str, cluster: str, *, kube: ClusterApi, oidc: bool
) -> str | None:
    """The name of the kubeconfig Secret the status should name, if it exists (by the same
    rule as its events, ``logic.owner``)."""
    name = logic.kubeconfig_secret_name(cluster, oidc=oidc)
    try:
        secret = await kube.get(SECRET, namespace, name)
    except KubeNotFound:
        return None
    except KubeForbidden as exc:
        log.warning("%s/%s: cannot check the kubeconfig Secret: %s", namespace, cluster, exc)
        return None
    return name if logic.owner(SECRET, secret, oidc=oidc) == cluster else None


async def _listed(
    kind: ResourceKind, selector: str, *, kube: ClusterApi, namespace: str | None = None
) -> list[Json]:
    try:
        items, _ = await kube.list(kind, namespace=namespace, label_selector=selector)
    except KubeNotFound:
        # The kind is not served here (no Flux, say): nothing of it can back an entry.
        return []
    return items
