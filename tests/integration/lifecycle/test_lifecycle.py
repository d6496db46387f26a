"""End to end: Azimuth Clusters created, changed and deleted, with every service and stand-in.

Each test runs the whole system as processes on the real stack: watcher, writer, identity,
lease, helm and monitor services, and the stand-ins for the identity operator, the schedule
operator, Zenith and Cluster API. The helm service installs the stand-in openstack-cluster
chart with the real helm binary; the CAPI stand-in brings what it renders to life.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from typing import Any

import httpx

from shared import subjects
from shared.bus import Bus
from shared.kube import KubeClient
from shared.messages import ResourceChanged
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    LEASE,
    MANIFESTS,
    OIDC_CLIENT,
    PLATFORM,
    SECRET,
)
from testenv.examples import CLUSTER_LIFE_KINDS, DEPLOYMENT, OSM_TEMPLATE
from tests.integration.lifecycle.conftest import BASE_DOMAIN, World
from tests.integration.support import eventually, read_stream

LEFTOVER_KINDS = CLUSTER_LIFE_KINDS


async def ready(world: World, name: str, timeout: float = 120) -> dict[str, Any]:
    return await eventually(
        lambda: world.cluster(name),
        lambda c: (c.get("status") or {}).get("phase") == "Ready",
        timeout=timeout,
        what=f"Cluster {name} Ready",
    )


def condition(cluster: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (cluster.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


async def delete_like_the_portal(kube: KubeClient, namespace: str, name: str) -> None:
    body = json.dumps({"propagationPolicy": "Foreground"}).encode()
    await kube.request("DELETE", CLUSTER.path(namespace, name), body=body)


async def leftovers(world: World) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for kind in LEFTOVER_KINDS:
        items, _ = await world.kube.list(kind, namespace=world.namespace)
        if items:
            found[kind.plural] = [i["metadata"]["name"] for i in items]
    secrets, _ = await world.kube.list(SECRET, namespace=world.namespace)
    ours = [
        s["metadata"]["name"]
        for s in secrets
        if not s["metadata"]["name"].endswith("-cloud-credentials")
        and s.get("type") != "kubernetes.io/service-account-token"
    ]
    if ours:
        found["secrets"] = ours
    return found


async def deleted_without_leftovers(world: World, name: str) -> None:
    await delete_like_the_portal(world.kube, world.namespace, name)
    await eventually(lambda: leftovers(world), lambda f: not f, timeout=90, what="nothing left")


def helm_history(world: World, release: str) -> list[dict[str, Any]]:
    env = world.processes["helm"].env
    out = subprocess.run(
        [env["CAPIBUS_HELM__EXECUTABLE"], "history", release, "-n", world.namespace, "-o", "json"],
        env=env,
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    return list(json.loads(out))


async def test_plain_cluster_reaches_ready_and_leaves_nothing_behind(
    world: Callable[..., Any], bus: Bus
) -> None:
    w: World = await world()
    await w.create_cluster("plain")
    cluster = await ready(w, "plain")
    assert cluster["metadata"]["labels"]["azimuth.stackhpc.com/cluster-template"] == w.template
    handled = json.loads(
        cluster["metadata"]["annotations"]["azimuth.stackhpc.com/last-handled-configuration"]
    )
    assert handled["spec"] == cluster["spec"]
    assert condition(cluster, "Reconciled")["status"] == "True"
    status = cluster["status"]
    assert status["networkingPhase"] == "Provisioned"
    assert status["controlPlanePhase"] == "Ready"
    assert status["kubeconfigSecretName"] == "plain-kubeconfig"
    assert status["nodeCount"] == len(status["nodes"]) == 5
    assert len(helm_history(w, "plain")) == 1
    await deleted_without_leftovers(w, "plain")
    assert await phases_while_deleting(bus, w, "plain") == ["Ready", "Deleting"]


async def phases_while_deleting(bus: Bus, world: World, name: str) -> list[str]:
    """Each phase the Cluster showed once its deletion began, from the watcher's events."""
    found = await read_stream(
        bus, subjects.EVENTS.name, f"capibus.evt.cluster.*.{world.namespace}.{name}"
    )
    phases: list[str] = []
    for _, event in found:
        obj = event.object if isinstance(event, ResourceChanged) else {}
        if obj.get("kind") == "Cluster" and obj["metadata"].get("deletionTimestamp"):
            phase = str((obj.get("status") or {}).get("phase"))
            if not phases or phases[-1] != phase:
                phases.append(phase)
    return phases


async def test_spec_change_is_exactly_one_upgrade_and_replays_are_none(
    world: Callable[..., Any],
) -> None:
    w: World = await world()
    created = await w.create_cluster("change")
    await ready(w, "change")
    spec = created["spec"]
    spec["nodeGroups"][0]["count"] = 3
    await w.kube.patch_merge(
        CLUSTER, w.namespace, "change", {"spec": {"nodeGroups": spec["nodeGroups"]}}
    )
    await eventually(
        lambda: w.cluster("change"),
        lambda c: c["status"].get("nodeCount") == 6 and c["status"].get("phase") == "Ready",
        timeout=90,
        what="scaled up",
    )
    assert [r["revision"] for r in helm_history(w, "change")] == [1, 2]
    # A restart replays nothing new, and re-running every step changes nothing.
    w.processes["helm"].kill()
    w.processes["helm"].start()
    await w.kube.patch_merge(
        CLUSTER, w.namespace, "change", {"metadata": {"labels": {"nudge": "1"}}}
    )
    cluster = await ready(w, "change")
    assert cluster["metadata"]["labels"]["nudge"] == "1"
    assert [r["revision"] for r in helm_history(w, "change")] == [1, 2]


async def test_oidc_cluster_waits_for_identity_before_helm(world: Callable[..., Any]) -> None:
    w: World = await world(oidc=True)
    await w.create_cluster("sso")
    await eventually(
        lambda: w.cluster("sso"),
        lambda c: condition(c, "Reconciled").get("reason") == "WaitingForIdentity",
        what="waiting for identity",
    )
    assert not await _release_exists(w, "sso")
    await w.create_realm()
    cluster = await ready(w, "sso")
    client = await w.kube.get(OIDC_CLIENT, w.namespace, "kube-sso")
    assert client["spec"] == {
        "realmName": w.namespace,
        "public": True,
        "grantTypes": ["DeviceCode"],
    }
    assert client["metadata"]["ownerReferences"][0]["uid"] == cluster["metadata"]["uid"]
    await w.kube.get(PLATFORM, w.namespace, "kube-sso")
    await w.kube.get(MANIFESTS, w.namespace, "sso-oidc-default-rbac")
    config = await w.kube.get(SECRET, w.namespace, "sso-oidc-default-rbac-config")
    rendered = "".join(base64.b64decode(v).decode() for v in config["data"].values())
    assert "oidc:/kube-sso" in rendered
    await deleted_without_leftovers(w, "sso")


async def test_lease_flavors_are_remapped_and_the_lease_is_released(
    world: Callable[..., Any],
) -> None:
    w: World = await world(standin_env={"STANDIN_SCHEDULE_BLAZAR": "1"})
    cluster = await w.create_cluster("leased", leaseName="kube-leased")
    await w.create_lease(cluster, ["f-small", "f-medium"])
    await ready(w, "leased")
    lease = await w.kube.get(LEASE, w.namespace, "kube-leased")
    assert "azimuth.stackhpc.com" in lease["metadata"]["finalizers"]
    mapping = lease["status"]["sizeNameMap"]
    templates, _ = await w.kube.list(OSM_TEMPLATE, namespace=w.namespace)
    flavors = {t["spec"]["template"]["spec"]["flavor"] for t in templates}
    assert flavors == {mapping["m1.small"], mapping["m1.medium"]}
    assert not flavors & {"m1.small", "m1.medium"}
    await deleted_without_leftovers(w, "leased")


async def test_zenith_reserves_once_and_points_the_control_plane_at_it(
    world: Callable[..., Any],
) -> None:
    w: World = await world(zenith=True)
    await w.create_cluster("tunnel")
    cluster = await ready(w, "tunnel")
    secret = await w.kube.get(SECRET, w.namespace, "tunnel-zenith-apiserver")
    fqdn = secret["metadata"]["annotations"]["azimuth.stackhpc.com/zenith-fqdn"]
    assert fqdn.endswith(BASE_DOMAIN)
    capi = await w.kube.get(CAPI_CLUSTER, w.namespace, "tunnel")
    assert capi["spec"]["controlPlaneEndpoint"] == {"host": fqdn, "port": 443}
    deployments, _ = await w.kube.list(DEPLOYMENT, namespace=w.namespace)
    assert [d["metadata"]["ownerReferences"][0]["uid"] for d in deployments] == [
        cluster["metadata"]["uid"]
    ]
    assert await _reservations_of(w, "tunnel") == 1
    await deleted_without_leftovers(w, "tunnel")


async def test_oidc_lease_and_zenith_together(world: Callable[..., Any]) -> None:
    w: World = await world(oidc=True, zenith=True)
    await w.create_realm()
    cluster = await w.create_cluster("full", leaseName="kube-full", addons={"monitoring": True})
    await w.create_lease(cluster, ["f-small", "f-medium"])
    await ready(w, "full", timeout=150)
    await w.kube.get(MANIFESTS, w.namespace, "full-kube-prometheus-stack-client")
    assert await _reservations_of(w, "full") == 1
    assert len(helm_history(w, "full")) == 1
    await deleted_without_leftovers(w, "full")


async def _release_exists(world: World, name: str) -> bool:
    secrets, _ = await world.kube.list(
        SECRET, namespace=world.namespace, label_selector="owner=helm"
    )
    return any(s["metadata"]["labels"].get("name") == name for s in secrets)


async def _reservations_of(world: World, cluster: str) -> int:
    """Registrar reservations for the Cluster's API server (monitoring has its own)."""
    secret = await world.kube.get(SECRET, world.namespace, f"{cluster}-zenith-apiserver")
    subdomain = secret["metadata"]["annotations"]["azimuth.stackhpc.com/zenith-subdomain"]
    return sum(1 for r in await _reservations(world) if r["subdomain"] == subdomain)


async def _reservations(world: World) -> list[Any]:
    async with httpx.AsyncClient(base_url=str(world.registrar_url)) as client:
        response = await client.get("/admin/reservations")
        response.raise_for_status()
        data = response.json()
    return list(data.values() if isinstance(data, dict) else data)
