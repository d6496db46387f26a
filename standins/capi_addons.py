"""HelmRelease and Manifests of the cluster-api-addon-provider stand-in (``docs/upstream.md`` §5).

Nothing is installed anywhere: an addon walks the provider's phases as separate status writes.
``Pending``; ``init_metadata`` (the provider's labels, an ownerRef to the CAPI Cluster and its
kopf finalizer); the gate (bootstrap addons: Cluster condition ``ControlPlaneInitialized``,
others ``Ready`` or ``Available``; the Cluster nudges its addons when its conditions change);
``Installing``; ``Deployed`` revision 1. Like kopf, the provider remembers the spec it last
handled in the annotation ``addons.stackhpc.com/last-handled-configuration``; a different spec
means ``Upgrading``, then ``Deployed`` with the next revision. Components listed in
``STANDIN_CAPI_FAIL_ADDONS`` end in ``Failed`` with a ``failureMessage`` instead.

The Zenith monitoring hook: when the Manifests addon ``kube-prometheus-stack-client`` is
installed or upgraded, its Reservation appears in ``spec.targetNamespace`` (what the real
release would create in the workload cluster, which here is the same API server), with the
Helm ownership annotations the capi-operator uses to map it back to the addon
(``docs/upstream.md`` §2).
Because every "workload cluster" shares this API server, clusters with monitoring share that
one Reservation; it is deleted with the last addon that uses it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable

from shared.errors import KubeConflict
from shared.kube import ResourceKind
from shared.resources import CAPI_CLUSTER, MANIFESTS, NAMESPACE, RESERVATION, SECRET
from standins.base import Json, key_of
from standins.capi_shapes import (
    ADDON_FINALIZER,
    COMPONENT_LABEL,
    condition_true,
    finalizers_of,
    has_owner,
    is_deleting,
    labels_of,
    owner_ref,
    phase_of,
)
from standins.capi_world import World

LAST_HANDLED = "addons.stackhpc.com/last-handled-configuration"
MONITORING_CLIENT = "kube-prometheus-stack-client"
PROMETHEUS_ICON = (
    "https://raw.githubusercontent.com/cncf/artwork/master/projects/prometheus/icon/color/"
    "prometheus-icon-color.png"
)


def _ns_name(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def release_name(addon: Json) -> str:
    return str(addon["spec"].get("releaseName") or addon["metadata"]["name"])


def _handled_spec(addon: Json) -> str:
    return json.dumps({"spec": addon.get("spec") or {}}, sort_keys=True)


def metadata_patch(addon: Json, cluster: Json) -> Json | None:
    """The provider's ``init_metadata``, or None when it is already in place."""
    labels = {
        "addons.stackhpc.com/cluster": cluster["metadata"]["name"],
        "addons.stackhpc.com/release-namespace": str(addon["spec"].get("targetNamespace", "")),
        "addons.stackhpc.com/release-name": release_name(addon),
    }
    meta = addon["metadata"]
    current = labels_of(addon)
    patch: Json = {}
    if any(current.get(k) != v for k, v in labels.items()):
        patch["labels"] = labels
    if not has_owner(addon, cluster):
        patch["ownerReferences"] = [
            *(meta.get("ownerReferences") or []),
            owner_ref(cluster, controller=False),
        ]
    if ADDON_FINALIZER not in finalizers_of(addon):
        patch["finalizers"] = [*finalizers_of(addon), ADDON_FINALIZER]
    return {"metadata": patch} if patch else None


def gate_open(addon: Json, cluster: Json) -> bool:
    if addon["spec"].get("bootstrap"):
        return condition_true(cluster, "ControlPlaneInitialized")
    return condition_true(cluster, "Ready") or condition_true(cluster, "Available")


def reconciler(kind: ResourceKind) -> Callable[[World, Json], Awaitable[None]]:
    """The same provider logic serves both kinds."""

    async def reconcile(world: World, seen: Json) -> None:
        await reconcile_addon(world, kind, seen)

    return reconcile


async def reconcile_addon(world: World, kind: ResourceKind, seen: Json) -> None:
    addon = await world.kube.get(kind, *_ns_name(seen))
    if is_deleting(addon):
        await _uninstall(world, kind, addon)
        return
    phase = phase_of(addon)
    if phase in ("", "Unknown"):
        await world.write_status(kind, addon, {"phase": "Pending"})
        return
    namespace = addon["metadata"]["namespace"]
    cluster = await world.get(CAPI_CLUSTER, namespace, str(addon["spec"].get("clusterName")))
    if cluster is None or is_deleting(cluster):
        return  # the Cluster's first status write nudges us
    patch = metadata_patch(addon, cluster)
    if patch is not None:
        await world.patch(kind, addon, patch)
        return
    if not gate_open(addon, cluster) or addon["spec"].get("paused"):
        return
    kubeconfig = f"{cluster['metadata']['name']}-kubeconfig"
    if await world.get(SECRET, namespace, kubeconfig) is None:
        return
    if phase in ("Installing", "Upgrading"):
        await _finish_release(world, kind, addon)
    elif phase not in ("Deployed", "Failed"):
        await world.write_status(kind, addon, {"phase": "Installing"})
    elif (addon["metadata"].get("annotations") or {}).get(LAST_HANDLED) != _handled_spec(addon):
        await world.write_status(kind, addon, {"phase": "Upgrading"})


async def _finish_release(world: World, kind: ResourceKind, addon: Json) -> None:
    revision = int((addon.get("status") or {}).get("revision") or 0) + 1
    handled = {"metadata": {"annotations": {LAST_HANDLED: _handled_spec(addon)}}}
    addon = await world.patch(kind, addon, handled)
    component = labels_of(addon).get(COMPONENT_LABEL, "")
    if component in world.knobs.fail_addons:
        message = f"release {release_name(addon)}: stand-in knob STANDIN_CAPI_FAIL_ADDONS"
        status: Json = {"phase": "Failed", "revision": revision, "failureMessage": message}
    else:
        if kind == MANIFESTS and component == MONITORING_CLIENT:
            await _ensure_reservation(world, addon)
        status = {"phase": "Deployed", "revision": revision, "failureMessage": None}
    await world.write_status(kind, addon, status)


async def _uninstall(world: World, kind: ResourceKind, addon: Json) -> None:
    """Uninstalling, unless the workload cluster is going anyway; then the finalizer goes."""
    if ADDON_FINALIZER not in finalizers_of(addon):
        return
    namespace = addon["metadata"]["namespace"]
    cluster_name = str(addon["spec"].get("clusterName"))
    cluster = await world.get(CAPI_CLUSTER, namespace, cluster_name)
    kubeconfig = await world.get(SECRET, namespace, f"{cluster_name}-kubeconfig")
    going = cluster is None or is_deleting(cluster) or phase_of(cluster) == "Deleting"
    if not going and kubeconfig is not None and phase_of(addon) != "Uninstalling":
        await world.write_status(kind, addon, {"phase": "Uninstalling"})
        return
    if kind == MANIFESTS and labels_of(addon).get(COMPONENT_LABEL) == MONITORING_CLIENT:
        await _drop_reservation(world, addon)
    await world.knobs.step()
    await world.remove_finalizer(kind, addon, ADDON_FINALIZER)


def reservation(addon: Json) -> Json:
    target = str(addon["spec"].get("targetNamespace", ""))
    return {
        "apiVersion": RESERVATION.api_version,
        "kind": RESERVATION.kind,
        "metadata": {
            "name": MONITORING_CLIENT,
            "namespace": target,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": release_name(addon),
                "meta.helm.sh/release-namespace": target,
                "azimuth.stackhpc.com/service-label": "Monitoring",
                "azimuth.stackhpc.com/service-icon-url": PROMETHEUS_ICON,
            },
        },
        "spec": {"credentialSecretName": f"{MONITORING_CLIENT}-zenith-credential"},
    }


async def _ensure_reservation(world: World, addon: Json) -> None:
    wanted = reservation(addon)
    target = wanted["metadata"]["namespace"]
    if await world.get(NAMESPACE, "", target) is None:
        with contextlib.suppress(KubeConflict):  # another addon created it first
            await world.kube.create(NAMESPACE, {"metadata": {"name": target}})
    with contextlib.suppress(KubeConflict):  # another cluster's addon made it; it serves both
        await world.kube.create(RESERVATION, wanted)


async def _drop_reservation(world: World, addon: Json) -> None:
    target = addon["spec"].get("targetNamespace")
    for other in world.known(MANIFESTS):
        if (
            key_of(other) != key_of(addon)
            and not is_deleting(other)
            and labels_of(other).get(COMPONENT_LABEL) == MONITORING_CLIENT
            and (other.get("spec") or {}).get("targetNamespace") == target
            and phase_of(other) == "Deployed"
        ):
            return  # still in use
    await world.delete(RESERVATION, str(target), MONITORING_CLIENT)
