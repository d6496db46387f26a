"""The OpenShift Assisted bootstrap provider (OpenshiftAssistedConfig, InfraEnv, Agent), on the
bus: upstream's cluster-api-provider-openshift-assisted v0.2.0 bootstrap controllers."""
