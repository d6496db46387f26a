"""The OpenShift Assisted control-plane provider (OpenshiftAssistedControlPlane, with the
ClusterDeployment and AgentClusterInstall it drives), on the bus (``docs/assisted.md``)."""
