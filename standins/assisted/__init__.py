"""Stand-ins for assisted-service, hive and the metal3 hosts (OpenShift Assisted on bare metal).

They play, against the real management API server, the peers the OpenShift Assisted providers
(``services/baremetal/assisted_bootstrap``, ``services/baremetal/assisted_controlplane``) drive
through the Kubernetes API only (cluster-api-provider-openshift-assisted v0.2.0 makes no other
call):

- ``infraenv``: assisted-service's InfraEnv controller (the discovery ISO URL);
- ``install``: assisted-service's ClusterDeployment/AgentClusterInstall/Agent controllers and
  hive (the install walk, the admin kubeconfig, day-2 hosts, deprovisioning);
- ``nodes``: the workload cluster's kubelets (a Node per installed host, in a second API
  server);
- ``hosts``: Metal3/CAPM3 and the hardware (BareMetalHosts claimed, Agents booted);
- ``knobs``: the pace and the per-object fault annotations; ``shapes``: pure decisions.

``controllers`` builds all of them; ``reactors`` only the assisted-service and hive part (for
tests that play the hosts themselves). ``python -m standins.assisted`` runs ``controllers``.
"""

from __future__ import annotations

import importlib

from shared.kube import KubeClient
from standins.assisted.infraenv import InfraEnvReactor
from standins.assisted.install import InstallReactor
from standins.assisted.knobs import AssistedKnobs
from standins.assisted.nodes import Nodes, Workload
from standins.base import Controller

__all__ = ["AssistedKnobs", "Workload", "controllers", "reactors"]


def reactors(
    kube: KubeClient,
    *,
    workload: Workload,
    knobs: AssistedKnobs | None = None,
    namespace: str | None = None,
) -> list[Controller]:
    """assisted-service and hive: InfraEnv, ClusterDeployment, AgentClusterInstall, Agent."""
    knobs = knobs or AssistedKnobs()
    infraenvs = InfraEnvReactor(kube, knobs, namespace)
    install = InstallReactor(
        kube,
        knobs,
        workload_kubeconfig=workload.kubeconfig,
        nodes=Nodes(workload),
        on_cluster_deployment=infraenvs.nudge_for,
        namespace=namespace,
    )
    return [infraenvs.controller, *install.controllers()]


def controllers(
    kube: KubeClient,
    *,
    workload: Workload,
    knobs: AssistedKnobs | None = None,
    namespace: str | None = None,
) -> list[Controller]:
    """Every stand-in of the package: ``reactors`` and the metal3 host stand-in."""
    knobs = knobs or AssistedKnobs()
    # Imported here, not at the top: ``hosts`` imports this package's modules itself.
    hosts = importlib.import_module("standins.assisted.hosts")
    found: list[Controller] = hosts.controllers(kube, knobs=knobs, namespace=namespace)
    return [*reactors(kube, workload=workload, knobs=knobs, namespace=namespace), *found]
