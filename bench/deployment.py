"""A capibus deployment for the lifecycle benchmarks: the six services, the stand-ins, the portal.

The services run exactly as in ``tests/integration/lifecycle``: ``python -m services.<name>``
with the settings a deployment gives them (the helm service pointed at the real ``helm``
binary and the stand-in charts), and otherwise their defaults, including the API rate limit
(``CAPIBUS_KUBE_QPS`` 50, burst 100), since that is what a deployment runs with. The stand-ins
run as ``python -m standins``. Every process is a ``Children`` entry, so the benchmark's
``stop_all`` reaches it on any exit.

A service counts as started when its log says so: the watcher once it listed every kind,
a consumer service once it owns every partition. Objects created before that would still be
handled (the events wait in JetStream), but their latency would include the start-up.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import PARTITIONS
from bench.procs import ROOT, Child, Children, labels_for
from shared.kube import KubeClient
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, KINDS, LEASE, SECRET
from shared.settings import ServiceSettings
from testenv.examples import cluster_manifest
from testenv.harness import LocalStack

Json = dict[str, Any]

SERVICES = ("watcher", "writer", "identity", "lease", "helm", "monitor")
#: Every service with background work of its own (timers, resyncs, tenant watches): what an
#: idle-cost measurement must run. Admission only answers the API server's calls.
EVERY_SERVICE = (*SERVICES, "discovery", "catalog", "exporter")
CHARTS = ROOT / "standins" / "charts"
START_TIMEOUT = 90.0
LEASE_TTL = float(ServiceSettings.model_fields["lease_ttl"].default)
CLOUDS_YAML = """clouds:
  openstack:
    auth:
      auth_url: https://keystone.example.test/v3
      application_credential_id: app-cred-id
      application_credential_secret: app-cred-secret
      project_id: tenancy-1234
    region_name: RegionOne
"""


def deployment_env(helm: Path, *, oidc: bool) -> dict[str, str]:
    """What the lifecycle tests' ``deployment_env`` sets, Zenith off."""
    zenith = {
        "apiserver_chart": {"name": str(CHARTS / "zenith-apiserver")},
        "operator_chart": {"name": str(CHARTS / "zenith-operator")},
    }
    return {
        "CAPIBUS_AZIMUTH__OIDC_ENABLED": str(oidc).lower(),
        "CAPIBUS_AZIMUTH__ZENITH_ENABLED": "false",
        "CAPIBUS_HELM__EXECUTABLE": str(helm),
        "CAPIBUS_HELM__CHART": json.dumps({"name": str(CHARTS / "openstack-cluster")}),
        "CAPIBUS_HELM__ZENITH": json.dumps(zenith),
        "CAPIBUS_HELM__TIMEOUT": "30s",
        "CAPIBUS_WRITER__COALESCE_SECONDS": "0.05",
        # Six services on one host cannot all listen on the default 8080; nothing scrapes
        # them here (the integration harness turns the endpoint off as well).
        "CAPIBUS_METRICS_PORT": "0",
    }


@dataclass
class Deployment:
    """The running processes of one lifecycle benchmark."""

    services: dict[str, Child]
    standins: Child | None = None

    def all(self) -> list[Child]:
        return [*self.services.values(), *([self.standins] if self.standins else [])]

    def labels(self) -> dict[int, str]:
        """CPU-line labels: the services as capibus's, the stand-ins as what they are."""
        labels = labels_for(*self.services.values())
        if self.standins is not None:
            labels[self.standins.proc.pid] = f"{self.standins.label} (stand-in)"
        return labels

    def peak_memory(self) -> dict[str, int]:
        """``VmHWM`` (peak resident set, bytes) of every process, read now."""
        return {child.label: vm_hwm(child.proc.pid) for child in self.all() if child.alive()}

    def helm_cpu(self) -> float:
        """CPU seconds the helm processes run by the helm service have used so far."""
        return reaped_cpu(self.services["helm"].proc.pid)

    def stop(self, children: Children) -> None:
        for child in self.all():
            children.stop(child)


async def start(
    children: Children,
    stack: LocalStack,
    *,
    helm: Path,
    oidc: bool,
    standins: Sequence[str] = (),
    standin_env: dict[str, str] | None = None,
    prefix: str,
    services: Sequence[str] = SERVICES,
    together: bool = False,
) -> Deployment:
    """Start the services (and the stand-ins named) and wait until each one is serving.

    ``together`` runs them as one all-in-one process (``services.allinone``, the chart's
    default for small installs), listed as ``allinone`` among the deployment's services.
    """
    env = {**stack.env(), **deployment_env(helm, oidc=oidc)}
    if together:
        one = {**env, "CAPIBUS_SERVICES": ",".join(services)}
        child = children.start("allinone", one, label=f"{prefix}-allinone")
        deployment = Deployment(services={"allinone": child})
        await _all_started(services, child)
    else:
        running = {name: children.start(name, env, label=f"{prefix}-{name}") for name in services}
        deployment = Deployment(services=running)
        await asyncio.gather(*(_started(name, child) for name, child in running.items()))
    if standins:
        stand_env = {**stack.env(), **(standin_env or {})}
        args = ["--only", ",".join(standins)]
        deployment.standins = start_module(
            children, "standins", stand_env, f"{prefix}-standins", args
        )
    if deployment.standins is not None:
        await wait_for_count(deployment.standins, "stand-ins running", 1)
    return deployment


async def _started(name: str, child: Child) -> None:
    if name == "watcher":
        await wait_for_count(child, "listed at", len(KINDS))
    elif name == "exporter":
        await wait_for_count(child, "caught up with the event stream", 1)
    else:
        await wait_for_count(child, "owns partition", PARTITIONS)
        # A freshly claimed partition is fenced for one lease TTL ("usable in 6.0s (previous
        # owner unknown)") before its consumers fetch; nothing says when that is over.
        await asyncio.sleep(LEASE_TTL + 0.5)


async def _all_started(services: Sequence[str], child: Child) -> None:
    """One process's log holds every service's lines; each consumer service claims every
    partition under its own name, so the counts add up."""
    if "watcher" in services:
        await wait_for_count(child, "listed at", len(KINDS))
    if "exporter" in services:
        await wait_for_count(child, "caught up with the event stream", 1)
    consumers = [s for s in services if s not in ("watcher", "exporter")]
    if consumers:
        await wait_for_count(child, "owns partition", PARTITIONS * len(consumers))
        await asyncio.sleep(LEASE_TTL + 0.5)  # the fencing, as in ``_started``


def start_module(
    children: Children, module: str, env: dict[str, str], label: str, args: Sequence[str] = ()
) -> Child:
    """``Children.start`` for a module outside ``services`` (the stand-ins)."""
    log_path = children.log_dir / f"{label}.log"
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    child = Child(label=label, proc=proc, log_path=log_path)
    children.running.append(child)
    return child


async def wait_for_count(child: Child, text: str, count: int) -> None:
    """Until ``text`` appears ``count`` times in the child's log; fails if the child died."""
    deadline = time.monotonic() + START_TIMEOUT
    while child.log().count(text) < count:
        if not child.alive():
            raise RuntimeError(f"{child.label} exited; log tail:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.label}: {text!r} not {count}x:\n{child.log_tail()}")
        await asyncio.sleep(0.1)


def reaped_cpu(pid: int) -> float:
    """CPU seconds of the children ``pid`` has waited for (``cutime`` + ``cstime``).

    The helm processes the helm service runs are its children, not the benchmark's, so the
    CPU lines count them under "other processes"; this is their share.
    """
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    # Fields after the name, 0-based: 13 = cutime, 14 = cstime (clock ticks).
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def vm_hwm(pid: int) -> int:
    """Peak resident set size of ``pid`` in bytes (``/proc/<pid>/status`` ``VmHWM``)."""
    return vm_status(pid, "VmHWM")


def vm_status(pid: int, field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of ``/proc/<pid>/status``, in bytes; 0 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


# -- the portal's objects -------------------------------------------------------------------


async def create_template(kube: KubeClient, name: str) -> None:
    await kube.create(
        CLUSTER_TEMPLATE,
        {
            "apiVersion": CLUSTER_TEMPLATE.api_version,
            "kind": CLUSTER_TEMPLATE.kind,
            "metadata": {"name": name},
            "spec": {
                "label": "Kubernetes 1.34.2",
                "description": "stand-in template",
                "values": {"kubernetesVersion": "1.34.2", "machineImageId": "image-1234"},
            },
        },
    )


async def create_credentials(kube: KubeClient, namespace: str, cluster: str) -> None:
    secret = {
        "metadata": {"name": f"{cluster}-cloud-credentials", "namespace": namespace},
        "data": {"clouds.yaml": base64.b64encode(CLOUDS_YAML.encode()).decode()},
    }
    await kube.create(SECRET, secret)


def cluster_object(namespace: str, name: str, template: str, **spec: Any) -> Json:
    """The Cluster the lifecycle tests create: one control plane, one group of two workers."""
    return cluster_manifest(
        namespace,
        name,
        templateName=template,
        cloudCredentialsSecretName=f"{name}-cloud-credentials",
        controlPlaneMachineSize="m1.small",
        nodeGroups=[{"name": "md-0", "machineSize": "m1.medium", "count": 2}],
        **spec,
    )


async def create_cluster(
    kube: KubeClient, namespace: str, name: str, template: str, **spec: Any
) -> Json:
    return await kube.create(CLUSTER, cluster_object(namespace, name, template, **spec))


def lease_object(cluster: Json, flavors: Sequence[str]) -> Json:
    """The Lease the portal makes for a Cluster: ``kube-<name>``, owned by the Cluster."""
    meta = cluster["metadata"]
    return {
        "apiVersion": LEASE.api_version,
        "kind": LEASE.kind,
        "metadata": {
            "name": f"kube-{meta['name']}",
            "namespace": meta["namespace"],
            "labels": {"app.kubernetes.io/managed-by": "azimuth"},
            "ownerReferences": [
                {
                    "apiVersion": CLUSTER.api_version,
                    "kind": CLUSTER.kind,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "cloudCredentialsSecretName": f"{meta['name']}-cloud-credentials",
            "resources": {"machines": [{"sizeId": f, "count": 1} for f in flavors]},
        },
    }


async def delete_like_the_portal(kube: KubeClient, namespace: str, name: str) -> None:
    body = json.dumps({"propagationPolicy": "Foreground"}).encode()
    await kube.request("DELETE", CLUSTER.path(namespace, name), body=body)


def condition(cluster: Json | None, kind: str) -> Json:
    for c in ((cluster or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())
