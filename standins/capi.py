"""Stand-in for Cluster API (core, kubeadm control plane, OpenStack provider) and the
cluster-api-addon-provider, acting on the real API server.

Its input is what a ``helm install`` of the openstack-cluster chart creates in a cluster's
namespace (``docs/upstream.md`` §3): the CAPI ``Cluster``, ``OpenStackCluster``,
``KubeadmControlPlane``, ``MachineDeployment``\\ s, ``OpenStackMachineTemplate``\\ s and the
addon ``HelmRelease``/``Manifests``. Its output is what the capi-operator watches
(``docs/upstream.md`` §5):
phases and conditions on those objects, Machines with their OpenStackMachines, the
``<cluster>-kubeconfig`` Secret, and a Zenith Reservation for the monitoring addon.

A Cluster whose infrastructure is another provider's (a ``MetalStackCluster``, with
``MetalStackMachineTemplate``\\ s; a ``Metal3Cluster``) gets only CAPI core's part: the provider,
a real program, makes its objects ready, and the stand-in waits for it (``capi_infra``). The
same holds for an OpenShift Assisted control plane and bootstrap provider (``capi_assisted``).

One controller per kind, each in its own module:

- ``capi_cluster``: CAPI Cluster (phases, endpoint, conditions, ordered deletion) and
  KubeadmControlPlane (control-plane Machines, kubeconfig, rolling upgrade);
- ``capi_machines``: Machine (phases, finalizer) and MachineDeployment (worker Machines);
- ``capi_addons``: HelmRelease and Manifests (addon phases, the Zenith hook);
- ``capi_infra``: CAPI core for another infrastructure provider (metal-stack, metal3), and the
  watches on that provider's objects;
- ``capi_assisted``: CAPI core for OpenShift Assisted's control plane and bootstrap provider,
  and the watches on their objects;
- ``capi_world``: knobs, shared client helpers and the explicit cross-controller nudges;
- ``capi_shapes``: pure shapes and decisions.

Knobs (environment, read when the controllers are built):

- ``STANDIN_STEP_DELAY``: seconds before each status write (default 0.05);
- ``STANDIN_CAPI_FAIL_ADDONS``: addon components that end ``Failed``, e.g. ``metrics-server``;
- ``STANDIN_CAPI_UNHEALTHY_MACHINES``: worker Machines per cluster running with
  ``NodeHealthy False``: a count (``2``) or, with a dot, a fraction (``0.5``, ``1.0``);
- ``STANDIN_CAPI_STUCK``: ``namespace/name`` of CAPI Clusters that never leave Provisioning;
- ``STANDIN_CAPI_KUBECONFIG``: file whose content is every ``<cluster>-kubeconfig`` value
  (default ``$KUBECONFIG``: the workload cluster is the test API server itself; for a
  metal-stack cluster, the provider reads it, so point it at a self-contained kubeconfig
  such as ``LocalStack.workload()``'s).
"""

from __future__ import annotations

from shared.kube import KubeClient
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
)
from standins import capi_assisted, capi_infra
from standins.base import Controller
from standins.capi_addons import reconciler
from standins.capi_cluster import (
    on_cluster_deleted,
    reconcile_cluster,
    reconcile_control_plane,
)
from standins.capi_machines import (
    on_deployment_deleted,
    on_machine_deleted,
    reconcile_deployment,
    reconcile_machine,
)
from standins.capi_world import CapiKnobs, World

__all__ = ["CapiKnobs", "controllers"]


def controllers(
    kube: KubeClient, *, namespace: str | None = None, knobs: CapiKnobs | None = None
) -> list[Controller]:
    """The stand-in's controllers; ``namespace`` confines them to one (tests)."""
    world = World(kube, knobs or CapiKnobs())
    watches: list[Controller] = []
    for cluster_kind, machine_kind in capi_infra.WATCHED:
        nudge = capi_infra.cluster_watcher(cluster_kind)
        watches += [
            world.controller(cluster_kind, nudge, on_delete=nudge, namespace=namespace),
            world.controller(
                machine_kind,
                capi_infra.machine_changed,
                on_delete=capi_infra.machine_gone,
                namespace=namespace,
            ),
        ]
    for kind, changed in (
        (OPENSHIFT_ASSISTED_CONTROL_PLANE, capi_assisted.control_plane_changed),
        (OPENSHIFT_ASSISTED_CONFIG, capi_assisted.config_changed),
    ):
        watches.append(world.controller(kind, changed, on_delete=changed, namespace=namespace))
    return [
        world.controller(
            CAPI_CLUSTER, reconcile_cluster, on_delete=on_cluster_deleted, namespace=namespace
        ),
        world.controller(CONTROL_PLANE, reconcile_control_plane, namespace=namespace),
        world.controller(
            MACHINE_DEPLOYMENT,
            reconcile_deployment,
            on_delete=on_deployment_deleted,
            namespace=namespace,
        ),
        world.controller(
            MACHINE, reconcile_machine, on_delete=on_machine_deleted, namespace=namespace
        ),
        world.controller(HELM_RELEASE, reconciler(HELM_RELEASE), namespace=namespace),
        world.controller(MANIFESTS, reconciler(MANIFESTS), namespace=namespace),
        *watches,
    ]
