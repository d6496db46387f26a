"""End to end: what the portal reads about a living Cluster, with every service and stand-in.

Each test records every phase the Cluster passes through (a watch on the real API server),
so a transition the portal would have shown for a moment is asserted, not just the end state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

from shared.errors import KubeNotFound
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, MANIFESTS, PLATFORM, RESERVATION
from tests.integration.lifecycle.conftest import BASE_DOMAIN, World, template_manifest
from tests.integration.lifecycle.test_lifecycle import ready
from tests.integration.support import eventually

Json = dict[str, Any]


class Phases:
    """Every distinct phase of one Cluster in order, with when it was first seen."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []
        #: the resourceVersion of the newest state seen
        self.version = 0

    def add(self, cluster: Json) -> None:
        self.version = int(cluster["metadata"]["resourceVersion"])
        phase = status(cluster).get("phase")
        if phase and (not self.seen or self.seen[-1][0] != phase):
            self.seen.append((phase, time.time()))

    async def caught_up(self, cluster: Json) -> None:
        """Until the watch has shown ``cluster`` as the test read it: a watch event can trail
        the GET that found the state a test waits for."""

        async def version() -> int:
            return self.version

        target = int(cluster["metadata"]["resourceVersion"])
        await eventually(version, lambda seen: seen >= target, what="the watch to catch up")

    @property
    def names(self) -> list[str]:
        return [p for p, _ in self.seen]

    def since(self, phase: str) -> list[str]:
        names = self.names
        return names[names.index(phase) :] if phase in names else []


@contextlib.asynccontextmanager
async def recorded(world: World, name: str) -> AsyncIterator[Phases]:
    phases = Phases()

    async def follow() -> None:
        while True:
            items, version = await world.kube.list(CLUSTER, namespace=world.namespace)
            for item in items:
                if item["metadata"]["name"] == name:
                    phases.add(item)
            with contextlib.suppress(Exception):
                async for event in world.kube.watch(
                    CLUSTER, namespace=world.namespace, resource_version=version
                ):
                    if event.object["metadata"]["name"] == name:
                        phases.add(event.object)

    task = asyncio.create_task(follow())
    try:
        yield phases
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def status(cluster: Json) -> Json:
    return dict(cluster.get("status") or {})


async def settled(world: World, name: str, check: Callable[[Json], bool], what: str) -> Json:
    return await eventually(
        lambda: world.cluster(name), lambda c: check(status(c)), timeout=90, what=what
    )


async def scale(world: World, name: str, count: int) -> None:
    cluster = await world.cluster(name)
    groups = cluster["spec"]["nodeGroups"]
    groups[0]["count"] = count
    await world.kube.patch_merge(CLUSTER, world.namespace, name, {"spec": {"nodeGroups": groups}})


def workers(st: Json) -> dict[str, Json]:
    return {n: v for n, v in (st.get("nodes") or {}).items() if v.get("role") == "worker"}


async def test_nodes_follow_scaling_up_and_down(world: Callable[..., Any]) -> None:
    w: World = await world()
    await w.create_cluster("scaled")
    before = status(await ready(w, "scaled"))
    assert before["nodeCount"] == 5
    assert len(workers(before)) == 2

    async with recorded(w, "scaled") as phases:
        await scale(w, "scaled", 3)
        up = await settled(
            w,
            "scaled",
            lambda s: s.get("nodeCount") == 6 and s.get("phase") == "Ready",
            "three workers",
        )
        await phases.caught_up(up)
        assert "Reconciling" in phases.names
        new = set(workers(status(up))) - set(workers(before))
        assert len(new) == 1
        node = workers(status(up))[new.pop()]
        assert (node["phase"], node["size"], node["nodeGroup"]) == ("Ready", "m1.medium", "md-0")

        await scale(w, "scaled", 1)
        down = await settled(
            w,
            "scaled",
            lambda s: s.get("nodeCount") == 4 and s.get("phase") == "Ready",
            "one worker",
        )
        await phases.caught_up(down)
    assert len(workers(status(down))) == 1
    assert phases.names[-1] == "Ready"


async def test_an_unhealthy_machine_makes_the_cluster_unhealthy(
    world: Callable[..., Any],
) -> None:
    w: World = await world(standin_env={"STANDIN_CAPI_UNHEALTHY_MACHINES": "1"})
    await w.create_cluster("sick")
    st = status(
        await settled(
            w,
            "sick",
            lambda s: s.get("phase") == "Unhealthy" and s.get("nodeCount") == 5,
            "Unhealthy with all five nodes",
        )
    )
    phases = sorted(n["phase"] for n in st["nodes"].values())
    assert phases == ["Ready", "Ready", "Ready", "Ready", "Unhealthy"]
    assert st["controlPlanePhase"] == "Ready"
    assert all(a["phase"] == "Deployed" for a in st["addons"].values())


async def test_a_failed_addon_makes_the_cluster_unhealthy(world: Callable[..., Any]) -> None:
    w: World = await world(standin_env={"STANDIN_CAPI_FAIL_ADDONS": "metrics-server"})
    await w.create_cluster("broken")
    st = status(
        await settled(
            w,
            "broken",
            lambda s: s.get("phase") == "Unhealthy" and "metrics-server" in (s.get("addons") or {}),
            "Unhealthy with the failed addon",
        )
    )
    assert st["addons"]["metrics-server"]["phase"] == "Failed"
    others = [a["phase"] for c, a in st["addons"].items() if c != "metrics-server"]
    assert others
    assert set(others) == {"Deployed"}
    assert {n["phase"] for n in st["nodes"].values()} == {"Ready"}


async def test_a_control_plane_upgrade_shows_upgrading(world: Callable[..., Any]) -> None:
    w: World = await world()
    newer = f"{w.template}-next"
    await w.kube.create(CLUSTER_TEMPLATE, template_manifest(newer, "1.34.3"))
    try:
        await w.create_cluster("upgraded")
        before = status(await ready(w, "upgraded"))
        assert before["kubernetesVersion"] == "1.34.2"
        async with recorded(w, "upgraded") as phases:
            await w.kube.patch_merge(
                CLUSTER, w.namespace, "upgraded", {"spec": {"templateName": newer}}
            )
            after = await settled(
                w,
                "upgraded",
                lambda s: s.get("phase") == "Ready" and s.get("kubernetesVersion") == "1.34.3",
                "upgraded and Ready",
            )
            await phases.caught_up(after)
            # The portal saw the upgrade as such before it was Ready again.
            assert "Upgrading" in phases.names
        kubelets = {n["kubeletVersion"] for n in status(after)["nodes"].values()}
        assert kubelets == {"1.34.3"}
        assert status(after)["nodeCount"] == 5
    finally:
        with contextlib.suppress(KubeNotFound):
            await w.kube.delete(CLUSTER_TEMPLATE, None, newer)


def rfc3339(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def test_a_stuck_cluster_shows_unhealthy_at_its_deadline(
    world: Callable[..., Any], namespace: str
) -> None:
    timeout = 8
    w: World = await world(
        standin_env={"STANDIN_CAPI_STUCK": f"{namespace}/stuck"},
        service_env={"CAPIBUS_WRITER__CLUSTER_TIMEOUT_SECONDS": str(timeout)},
    )
    async with recorded(w, "stuck") as phases:
        await w.create_cluster("stuck")
        stuck = await settled(
            w, "stuck", lambda s: s.get("phase") == "Unhealthy", "Unhealthy after the timeout"
        )
        await phases.caught_up(stuck)
    st = status(stuck)
    flipped = dict(phases.seen)["Unhealthy"]
    deadline = rfc3339(st["lastUpdated"]) + timeout
    # Scheduled for the deadline, not found by a periodic sweep: within a few seconds of it.
    assert deadline - 1 <= flipped <= deadline + 4, (flipped - deadline, phases.seen)
    assert st["networkingPhase"] == "Provisioning"
    assert phases.names[0] in ("Pending", "Reconciling")
    assert "Ready" not in phases.names


MONITORING_SERVICE = "monitoring-system-kube-prometheus-stack-client"


async def test_zenith_services_appear_on_the_cluster_and_its_platform_and_go(
    world: Callable[..., Any],
) -> None:
    w: World = await world(oidc=True, zenith=True)
    await w.create_realm()
    await w.create_cluster("seen", addons={"monitoring": True})
    st = await settled(
        w,
        "seen",
        lambda s: s.get("phase") == "Ready" and MONITORING_SERVICE in (s.get("services") or {}),
        "Ready with the monitoring service",
    )
    service = status(st)["services"][MONITORING_SERVICE]
    assert service["label"] == "Monitoring"
    assert service["fqdn"] == f"{service['subdomain']}.{BASE_DOMAIN}"
    assert service["iconUrl"].startswith("https://")
    addon = await w.kube.get(MANIFESTS, w.namespace, "seen-kube-prometheus-stack-client")
    annotated = json.loads(addon["metadata"]["annotations"]["azimuth.stackhpc.com/services"])
    assert set(annotated) == {MONITORING_SERVICE}
    platform = await eventually(
        lambda: w.kube.get(PLATFORM, w.namespace, "kube-seen"),
        lambda p: MONITORING_SERVICE in (p["spec"].get("zenithServices") or {}),
        timeout=60,
        what="the Platform to carry the service",
    )
    assert platform["spec"]["zenithServices"][MONITORING_SERVICE] == {
        "subdomain": service["subdomain"],
        "fqdn": service["fqdn"],
    }

    # The service goes away in the tenant cluster: it leaves the status and the Platform.
    await w.kube.delete(RESERVATION, "monitoring-system", "kube-prometheus-stack-client")
    await settled(
        w, "seen", lambda s: MONITORING_SERVICE not in (s.get("services") or {}), "service gone"
    )
    await eventually(
        lambda: w.kube.get(PLATFORM, w.namespace, "kube-seen"),
        lambda p: not (p["spec"].get("zenithServices") or {}),
        timeout=60,
        what="the Platform to drop the service",
    )
