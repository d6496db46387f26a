"""Pure rules of the resync: what a Cluster's status still claims about objects that are gone.

The monitor learns of a deletion from its DELETED event. The watcher synthesises those for
objects that vanished while it was down (its memory is the stream), so an ordinary restart
loses nothing. What events cannot repair is a status written by someone else: the upstream
operator before capibus took over, or history past the stream's retention. So whenever a
replica claims a partition it compares each Cluster's status with the objects that exist and
removes what nothing backs any more (upstream's resume pruning, capi-operator.md H7), Flux
Kustomizations included, which upstream forgot and so dropped Flux addons on every restart.

Pruning only removes; it never adds. Adding needs each Machine's infrastructure machine for
its flavor, and the events bring that anyway.

One key is corrected rather than pruned: ``kubeconfigSecretName``. A Secret's events name it
only when the Secret changes, so after OIDC is switched off the status would keep naming
``<cluster>-kubeconfig-user``, which the identity service no longer writes (and the reverse
once it is switched on again). The resync names the Secret this deployment hands out
(``logic.kubeconfig_secret_name``) when that Secret exists; while it does not, the status is
left alone until the Secret's first event names it, as it always has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.monitor.logic import COMPONENT_LABEL
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

#: The kinds whose existence backs a status entry, listed per Cluster by its label.
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
