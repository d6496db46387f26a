"""Example objects that tests and the benchmark create on the local stack."""

from __future__ import annotations

from typing import Any

from shared.resources import CLUSTER


def cluster_manifest(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """A minimal valid Azimuth ``Cluster``; keyword arguments override or extend its spec."""
    return {
        "apiVersion": CLUSTER.api_version,
        "kind": CLUSTER.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "label": name,
            "templateName": "kube-1-34",
            "cloudCredentialsSecretName": "creds",
            "controlPlaneMachineSize": "small",
            "nodeGroups": [{"name": "md-0", "machineSize": "small", "count": 1}],
            **spec,
        },
    }
