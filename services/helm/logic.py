"""Pure decisions of the helm service: what a Cluster waits for, what to write, what changed.

The helm service runs the steps of upstream's create handler (``on_cluster_create`` in
azimuth-cloud/azimuth-capi-operator ``azimuth_capi/operator.py``) in the same order, but each
wait ends the run instead of raising "retry the whole handler in 15 s": the run that follows
is triggered by the event that ends the wait (the prerequisite published by the identity or
lease service, the template or Secret appearing, the CAPI Cluster going away). ``Wait`` is
the value every step returns when it cannot go on; it becomes the ``Reconciled`` condition on
the Cluster, so the portal's users see why.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.helm import ChartRef
from shared.messages import Condition, PrerequisiteChanged

Json = dict[str, Any]

CONDITION = "Reconciled"
TEMPLATE_LABEL = "azimuth.stackhpc.com/cluster-template"
LAST_HANDLED = "azimuth.stackhpc.com/last-handled-configuration"
MANAGED_BY = {"app.kubernetes.io/managed-by": "azimuth-capi-operator"}


@dataclass(frozen=True)
class Wait:
    """Why a Cluster cannot go on yet; ``retry_after`` only for deadlines, never for polling."""

    reason: str
    message: str
    retry_after: float | None = None

    def condition(self) -> Condition:
        return Condition(type=CONDITION, status="False", reason=self.reason, message=self.message)


def chart_ref(chart: Any) -> ChartRef:
    """``ChartSettings`` → the adapter's ``ChartRef``."""
    return ChartRef(name=chart.name, repo=chart.repo, version=chart.version)


def prerequisite_wait(cluster: Json, step: str, fact: PrerequisiteChanged | None) -> Wait | None:
    """None when ``fact`` says ``step`` is done for this Cluster's current spec."""
    meta = cluster["metadata"]
    title = step.capitalize()
    if fact is None or fact.ref.uid != meta["uid"] or fact.generation != meta.get("generation"):
        return Wait(f"WaitingFor{title}", f"waiting for the {step} service")
    if not fact.ready:
        return Wait(f"WaitingFor{title}", f"{step}: {fact.reason}: {fact.detail}".rstrip(": "))
    return None


def last_handled(spec: Json) -> str:
    """The annotation kopf keeps and the Azimuth portal reads: the spec last reconciled."""
    return json.dumps({"spec": spec}, separators=(",", ":"), sort_keys=True)


def handled_metadata(cluster: Json) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """The label and annotation that say ``cluster``'s spec was reconciled; the annotation only
    when it does not say so already. The portal reads only its ``spec``; kopf's own (the
    upstream operator's diff-base) holds the labels too, and is kept as it is while it names
    this spec, so taking a Cluster over from upstream rewrites nothing."""
    spec = cluster["spec"]
    labels: dict[str, str | None] = {TEMPLATE_LABEL: spec["templateName"]}
    if handled_spec(cluster) == spec:
        return labels, {}
    return labels, {LAST_HANDLED: last_handled(spec)}


def handled_spec(cluster: Json) -> Any:
    """The spec the ``last-handled-configuration`` annotation names, whoever wrote it; None
    when there is none or it cannot be read."""
    text = (cluster["metadata"].get("annotations") or {}).get(LAST_HANDLED)
    try:
        handled = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return handled.get("spec") if isinstance(handled, dict) else None


def digest(*parts: Any) -> str:
    """A stable fingerprint of what a release would be installed with."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def etcd_key_secret(cluster: Json, key: bytes) -> Json:
    """No ownerReference, as upstream: it must outlive a Foreground delete until the release
    is gone, and is deleted explicitly.

    Upstream gives it no label; ours names the cluster it belongs to, so its ADDED event joins
    the cluster's story and partition and is never taken for cloud credentials (which cost a
    LIST of the namespace's Clusters per install in a burst).
    """
    meta = cluster["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{meta['name']}-etcd-key",
            "namespace": meta["namespace"],
            "labels": {CLUSTER_LABELS[0]: meta["name"]},
        },
        "data": {"key": base64.b64encode(key).decode()},
    }


def delete_deadline(cluster: Json, seconds: float) -> datetime | None:
    stamp = cluster["metadata"].get("deletionTimestamp")
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) + timedelta(seconds=seconds)


def stuck_message(capi_cluster: Json) -> str:
    meta, status = capi_cluster["metadata"], capi_cluster.get("status") or {}
    finalizers = ", ".join(meta.get("finalizers") or []) or "none"
    return (
        f"the Cluster API cluster {meta['name']} is still present "
        f"(phase {status.get('phase', 'Unknown')}, finalizers: {finalizers})"
    )


def decode_secret_value(secret: Json, key: str) -> str | None:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value).decode() if value else None


CLUSTER_LABELS = ("capi.stackhpc.com/cluster", "cluster.x-k8s.io/cluster-name")


HELM_RELEASE_TYPE = "helm.sh/release.v1"


def may_be_credentials(secret: Json) -> bool:
    """Cloud credentials come from the portal: never a Secret that belongs to a cluster, nor
    Helm's record of a release (one per install and upgrade, each worth a LIST of Clusters
    otherwise)."""
    labels = secret["metadata"].get("labels") or {}
    if secret.get("type") == HELM_RELEASE_TYPE:
        return False
    return not any(label in labels for label in CLUSTER_LABELS)
