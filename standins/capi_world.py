"""What the Cluster API stand-in's controllers share: knobs, the client, and each other.

Every reconcile reads its object (and anything it decides on, e.g. the Machines of a node
group) fresh from the API server instead of trusting the watch cache: a controller that just
created a Machine must not create it again because the cache has not caught up. Watch events
are only triggers.

Controllers wake each other explicitly with ``nudge``: an object whose progress depends on
another (a MachineDeployment on its Cluster's ``ControlPlaneInitialized``, a Cluster's
conditions on its control plane) is offered again to its controller after that other object
was written. A nudge is only sent after a write that changed something, so nudges cannot
bounce between controllers forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import KubeConflict, KubeNotFound, TemporaryError
from shared.kube import KubeClient, ResourceKind
from standins.base import Controller, Json, Knobs, Reconcile, env_set, key_of
from standins.capi_shapes import cluster_name_of, finalizers_of, unhealthy_limit

log = logging.getLogger("standins.capi")

RETRY_DELAY = 2.0


def _kubeconfig_path() -> str:
    return os.environ.get("STANDIN_CAPI_KUBECONFIG") or os.environ.get("KUBECONFIG", "")


@dataclass
class CapiKnobs(Knobs):
    """``STANDIN_CAPI_*``: ways to make the Cluster API stand-in misbehave, read once."""

    # Addon components (label capi.stackhpc.com/component) that end in phase Failed.
    fail_addons: set[str] = field(default_factory=lambda: env_set("STANDIN_CAPI_FAIL_ADDONS"))
    # Worker Machines per cluster that run with NodeHealthy False: a count or a fraction.
    unhealthy_machines: str = field(
        default_factory=lambda: os.environ.get("STANDIN_CAPI_UNHEALTHY_MACHINES", "").strip()
    )
    # "<namespace>/<name>" of CAPI Clusters that never leave Provisioning.
    stuck: set[str] = field(default_factory=lambda: env_set("STANDIN_CAPI_STUCK"))
    # The file whose content becomes every <cluster>-kubeconfig (default: $KUBECONFIG).
    kubeconfig_path: str = field(default_factory=_kubeconfig_path)
    kubeconfig: str = field(init=False, default="")

    def __post_init__(self) -> None:
        if self.kubeconfig_path:
            self.kubeconfig = Path(self.kubeconfig_path).read_text()

    def unhealthy_workers(self, workers: int) -> int:
        return unhealthy_limit(self.unhealthy_machines, workers)


@dataclass
class World:
    kube: KubeClient
    knobs: CapiKnobs
    controllers: dict[str, Controller] = field(default_factory=dict)

    def controller(
        self,
        kind: ResourceKind,
        reconcile: Callable[[World, Json], Awaitable[None]],
        *,
        on_delete: Callable[[World, Json], Awaitable[None]] | None = None,
        namespace: str | None = None,
    ) -> Controller:
        """Register the controller of ``kind``; see ``_guarded`` for its error handling."""
        deleted = _guarded(self, kind, on_delete) if on_delete else None
        built = Controller(
            self.kube,
            kind,
            _guarded(self, kind, reconcile),
            on_delete=deleted,
            namespace=namespace,
            name=f"capi-{kind.plural}",
        )
        self.controllers[kind.token] = built
        return built

    def nudge(self, kind: ResourceKind, namespace: str, cluster: str) -> None:
        """Offer every known ``kind`` object of CAPI Cluster ``namespace/cluster`` again."""
        controller = self.controllers.get(kind.token)
        if controller is None:
            return
        for obj in controller.known():
            if obj["metadata"].get("namespace") == namespace and cluster_name_of(obj) == cluster:
                controller.offer(obj)

    def offer(self, kind: ResourceKind, namespace: str, name: str) -> None:
        controller = self.controllers.get(kind.token)
        if controller is None:
            return
        for obj in controller.known():
            if key_of(obj) == f"{namespace}/{name}":
                controller.offer(obj)

    def requeue(self, kind: ResourceKind, obj: Json, after: float = 1.0) -> None:
        controller = self.controllers.get(kind.token)
        if controller:
            controller.requeue(obj, after)

    def known(self, kind: ResourceKind) -> list[Json]:
        controller = self.controllers.get(kind.token)
        return controller.known() if controller else []

    async def get(self, kind: ResourceKind, namespace: str, name: str) -> Json | None:
        try:
            return await self.kube.get(kind, namespace, name)
        except KubeNotFound:
            return None

    async def delete(self, kind: ResourceKind, namespace: str, name: str) -> None:
        with contextlib.suppress(KubeNotFound):
            await self.kube.delete(kind, namespace, name)

    async def list(self, kind: ResourceKind, namespace: str, selector: str) -> list[Json]:
        items, _ = await self.kube.list(kind, namespace=namespace, label_selector=selector)
        return items

    async def write_status(self, kind: ResourceKind, obj: Json, status: Json) -> Json:
        """One step: wait the step delay, then merge ``status`` if ``obj`` is unchanged."""
        await self.knobs.step()
        meta = obj["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        return await self.kube.patch_merge(
            kind, meta["namespace"], meta["name"], patch, subresource="status"
        )

    async def patch(self, kind: ResourceKind, obj: Json, patch: Json) -> Json:
        """Merge ``patch`` into ``obj`` if nobody changed it since we read it."""
        meta = obj["metadata"]
        precondition = {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}
        body = {**patch, "metadata": precondition}
        return await self.kube.patch_merge(kind, meta["namespace"], meta["name"], body)

    async def add_finalizer(self, kind: ResourceKind, obj: Json, finalizer: str) -> Json:
        return await self.patch(
            kind, obj, {"metadata": {"finalizers": [*finalizers_of(obj), finalizer]}}
        )

    async def remove_finalizer(self, kind: ResourceKind, obj: Json, finalizer: str) -> None:
        remaining = [f for f in finalizers_of(obj) if f != finalizer]
        await self.patch(kind, obj, {"metadata": {"finalizers": remaining}})


def _guarded(
    world: World, kind: ResourceKind, fn: Callable[[World, Json], Awaitable[None]]
) -> Reconcile:
    """A lost write race means the object changed, and its event brings us back; any other
    temporary failure (API server down, overloaded) is retried after a delay, as a real
    controller's rate-limited requeue would."""

    async def run(obj: Json) -> None:
        try:
            await fn(world, obj)
        except KubeConflict as exc:
            log.debug("%s: %s; the next event retries", key_of(obj), exc)
        except TemporaryError as exc:
            log.warning("%s %s: %s; retrying", kind.plural, key_of(obj), exc)
            world.requeue(kind, obj, exc.delay or RETRY_DELAY)

    return run
