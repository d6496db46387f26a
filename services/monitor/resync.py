"""Pure rules of the resync: what a Cluster's status still claims about objects that are gone.

The monitor learns of a deletion from its DELETED event. The watcher synthesises those for
objects that vanished while it was down (its memory is the stream), so an ordinary restart
loses nothing. What events cannot repair is a status written by someone else: the upstream
operator before capibus took over, or history past the stream's retention. So whenever a
replica claims a partition it compares each Cluster's status with the objects that exist and
removes what nothing backs any more (upstream's resume pruning in ``on_cluster_resume``, H7
of ``docs/upstream.md`` §1), Flux Kustomizations included, which upstream forgot and so
dropped Flux addons on every restart.

Pruning only removes; it never adds. Adding needs each Machine's infrastructure machine for
its flavor, and the events bring that anyway.

One key is corrected rather than pruned: ``kubeconfigSecretName``. A Secret's events name it
only when the Secret changes, so after OIDC is switched off the status would keep naming
``<cluster>-kubeconfig-user``, which the identity service no longer writes (and the reverse
once it is switched on again). The resync names the Secret this deployment hands out
(``logic.kubeconfig_secret_name``) when that Secret exists; while it does not, the status is
left alone until the Secret's first event names it, as it always has.

Cost: a cheap pre-filter, then the exact path. Deciding per Cluster takes 6 lists, the GET of
the kubeconfig Secret and the GET of the Cluster; for 1,000 Clusters that is ~8,000 requests
through the rate-limited client (minutes at 50 QPS) on every claim, delaying the replica's
events, while almost always nothing is stale. So each claim lists the Clusters and each kind
of ``BACKING`` once, across namespaces by the existence of the Cluster label, and groups the
objects by Cluster (``group``). Only a Cluster these lists say could need a correction
(``suspect``) takes the exact path, which lists again for that one Cluster and decides.

Why not decide from the bulk lists? Ordering. The exact path lists under the Cluster's lock
and reads the status afterwards, so a patch for an object created after its listing is
published after the removal and the writer never applies a removal over a newer addition.
The bulk lists were taken before any lock, possibly long before the Cluster's turn: a removal
decided from them could land after the report of an object created meanwhile and erase it.
They can safely say only "nothing to do": an entry that loses its object after the lists
does so by a deletion, whose event the monitor reports itself. A false suspicion costs the
exact path's requests and nothing else; a Cluster whose kubeconfig Secret does not exist yet
stays suspect (the pre-filter does not list Secrets) until the Secret's event names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from services.monitor.logic import CLUSTER_LABEL, COMPONENT_LABEL, kubeconfig_secret_name
from shared.kube import ResourceKind
from shared.models.azimuth import ControlPlanePhase, NetworkingPhase
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    KUSTOMIZATION,
    MACHINE,
    MANIFESTS,
)

Json = dict[str, Any]
#: (namespace, Cluster name)
Key = tuple[str, str]
#: Backing objects by the Cluster they are labelled with, then by kind token.
Grouped = dict[Key, dict[str, list[Json]]]

#: The kinds whose existence backs a status entry: listed once per claim, then again for each
#: suspect Cluster by its label.
BACKING: tuple[ResourceKind, ...] = (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    MACHINE,
    HELM_RELEASE,
    MANIFESTS,
    KUSTOMIZATION,
)


@dataclass(frozen=True)
class Present:
    """What exists for one Cluster, reduced to what its status entries are keyed by."""

    capi_cluster: bool
    control_plane: bool
    machines: frozenset[str]
    components: frozenset[str]


def present(objects: dict[str, list[Json]]) -> Present:
    """``objects`` by kind token (every kind of ``BACKING``; absent means none)."""

    def names(kind: ResourceKind) -> Iterable[str]:
        return (str(o.get("metadata", {}).get("name")) for o in objects.get(kind.token, []))

    def components() -> Iterable[str]:
        for kind in (HELM_RELEASE, MANIFESTS, KUSTOMIZATION):
            for obj in objects.get(kind.token, []):
                component = (obj.get("metadata", {}).get("labels") or {}).get(COMPONENT_LABEL)
                if component:
                    yield str(component)

    return Present(
        capi_cluster=bool(objects.get(CAPI_CLUSTER.token)),
        control_plane=bool(objects.get(CONTROL_PLANE.token)),
        machines=frozenset(names(MACHINE)),
        components=frozenset(components()),
    )


def stale(status: Json, backing: Present) -> Json:
    """The merge patch that removes from ``status`` whatever ``backing`` no longer supports."""
    patch: Json = {}
    gone_nodes = {n: None for n in status.get("nodes") or {} if n not in backing.machines}
    if gone_nodes:
        patch["nodes"] = gone_nodes
    gone_addons = {a: None for a in status.get("addons") or {} if a not in backing.components}
    if gone_addons:
        patch["addons"] = gone_addons
    unknown_networking = NetworkingPhase.UNKNOWN.value
    if not backing.capi_cluster and status.get("networkingPhase", unknown_networking) != (
        unknown_networking
    ):
        patch["networkingPhase"] = unknown_networking
    if not backing.control_plane:
        unknown_control_plane = ControlPlanePhase.UNKNOWN.value
        if status.get("controlPlanePhase", unknown_control_plane) != unknown_control_plane:
            patch["controlPlanePhase"] = unknown_control_plane
        if "kubernetesVersion" in status:
            patch["kubernetesVersion"] = None
    return patch


def kubeconfig(status: Json, expected: str | None) -> Json:
    """The merge patch that names ``expected`` (the kubeconfig Secret, if it exists)."""
    if expected is None or status.get("kubeconfigSecretName") == expected:
        return {}
    return {"kubeconfigSecretName": expected}


# --- the pre-filter: one list per kind for a whole claim -------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What one claim lists: every Cluster and every backing object, grouped (``group``)."""

    clusters: list[Json]
    backing: Grouped


def group(listed: Mapping[str, list[Json]]) -> Grouped:
    """``listed`` (by kind token, across namespaces) by the Cluster each object is labelled
    with; an object without the label backs no Cluster."""
    grouped: Grouped = {}
    for token, items in listed.items():
        for obj in items:
            meta = obj.get("metadata") or {}
            cluster = (meta.get("labels") or {}).get(CLUSTER_LABEL)
            if cluster and meta.get("namespace"):
                key = (str(meta["namespace"]), str(cluster))
                grouped.setdefault(key, {}).setdefault(token, []).append(obj)
    return grouped


def suspect(cluster: Json, backing: Grouped, *, oidc: bool) -> bool:
    """Whether the exact resync could correct anything on ``cluster`` (as listed): an entry
    ``backing`` does not support, or a kubeconfig name other than this deployment's."""
    meta = cluster["metadata"]
    status = cluster.get("status") or {}
    objects = backing.get((meta["namespace"], meta["name"]), {})
    if stale(status, present(objects)):
        return True
    return status.get("kubeconfigSecretName") != kubeconfig_secret_name(meta["name"], oidc=oidc)
