"""The workload's hand: what the Azimuth portal does to a Cluster, one ``Step`` at a time.

The objects are the lifecycle tests' (``bench/deployment.py`` builds them the same way): a
cloud-credentials Secret and the Cluster, with a Lease ``kube-<name>`` owned by the Cluster
when the step asks for one; a scale is a merge patch of the first node group's count, an
upgrade a merge patch of ``templateName``, a delete is the portal's Foreground delete.
Before a delete, what the checker needs of the Cluster and will not find afterwards (its
Helm revisions, its Zenith subdomain) is recorded.

Each request is retried on a temporary error for a while: a step is issued just before a
fault, and the API server may be restarting from the previous episode's one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bench.deployment import (
    cluster_object,
    create_credentials,
    delete_like_the_portal,
    lease_object,
)
from shared.errors import KubeConflict, KubeNotFound, TemporaryError
from shared.kube import KubeClient
from shared.resources import CLUSTER, LEASE
from soak.checks import Intent
from soak.plan import Step
from soak.world import FIRST, NAMESPACE_NAME, SECOND

T = TypeVar("T")
RETRY_SECONDS = 120.0
TOUCH = "soak.capibus.dev/touch"


async def retried(call: Callable[[], Awaitable[T]]) -> T:
    """``call`` until it stops failing temporarily (an API server restarting)."""
    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return await call()
        except KubeConflict:
            raise  # a fact about the object (it exists), not an outage
        except TemporaryError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def issue(kube: KubeClient, step: Step, intent: Intent) -> None:
    """Carry out ``step`` and record it in ``intent``."""
    if step.action == "create":
        await create(kube, step)
    elif step.action == "scale":
        await patch_spec(kube, step.cluster, {"nodeGroups": [_group(step.count)]})
    elif step.action == "upgrade":
        await patch_spec(kube, step.cluster, {"templateName": SECOND})
    else:
        await retried(lambda: delete_like_the_portal(kube, NAMESPACE_NAME, step.cluster))
    intent.apply(step, first=FIRST, second=SECOND)


def _group(count: int) -> dict[str, Any]:
    return {"name": "md-0", "machineSize": "m1.medium", "count": count}


async def create(kube: KubeClient, step: Step) -> None:
    name = step.cluster
    spec: dict[str, Any] = {"leaseName": f"kube-{name}"} if step.lease else {}
    manifest = cluster_object(NAMESPACE_NAME, name, FIRST, **spec)
    manifest["spec"]["nodeGroups"] = [_group(step.count)]
    await _idempotent(lambda: create_credentials(kube, NAMESPACE_NAME, name))
    await _idempotent(lambda: kube.create(CLUSTER, manifest))
    if step.lease:
        cluster = await retried(lambda: kube.get(CLUSTER, NAMESPACE_NAME, name))
        lease = lease_object(cluster, ["f-small", "f-medium"])
        await _idempotent(lambda: kube.create(LEASE, lease))


async def _idempotent(call: Callable[[], Awaitable[Any]]) -> None:
    """A create retried after a timeout may find its object made by the first try."""
    with contextlib.suppress(KubeConflict):
        await retried(call)


async def patch_spec(kube: KubeClient, name: str, spec: dict[str, Any]) -> None:
    await retried(lambda: kube.patch_merge(CLUSTER, NAMESPACE_NAME, name, {"spec": spec}))


async def touch(kube: KubeClient, names: list[str], mark: str) -> int:
    """An annotation on each live Cluster: a change that is no spec change, so it must
    cost no Helm revision; returns how many were touched."""
    touched = 0
    for name in names:
        patch = {"metadata": {"annotations": {TOUCH: mark}}}
        try:
            await kube.patch_merge(CLUSTER, NAMESPACE_NAME, name, patch)
        except (KubeNotFound, TemporaryError):
            continue
        touched += 1
    return touched
