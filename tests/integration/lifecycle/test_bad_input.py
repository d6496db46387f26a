"""Bad input and faults on the whole system: a clear reason on the Cluster, nothing half-made.

Every wait must also be quiet: while a Cluster waits, nothing is published for it (no busy
loops; upstream's app handler retried with no sleep at all).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from shared.bus import Bus
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, OIDC_CLIENT, SECRET
from testenv.examples import cluster_manifest
from tests.integration.lifecycle.conftest import World, template_manifest
from tests.integration.lifecycle.test_lifecycle import (
    _reservations_of,
    condition,
    helm_history,
)
from tests.integration.support import eventually, read_stream


async def waiting_for(world: World, name: str, reason: str, **match: str) -> dict[str, Any]:
    def check(cluster: dict[str, Any]) -> bool:
        found = condition(cluster, "Reconciled")
        return found.get("reason") == reason and all(
            text in found.get(key, "") for key, text in match.items()
        )

    return await eventually(
        lambda: world.cluster(name), check, timeout=60, what=f"{name} waiting: {reason}"
    )


async def quiet(bus: Bus, world: World, name: str, seconds: float = 3.0) -> None:
    """Nothing is published about ``name`` while it waits."""
    subject = f"capibus.*.*.*.{world.namespace}.{name}"
    before = len(await read_stream(bus, "CAPIBUS_STATUS", subject))
    await _sleep(seconds)
    after = len(await read_stream(bus, "CAPIBUS_STATUS", subject))
    assert after == before, f"{after - before} status messages while {name} was waiting"


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def test_missing_template_and_credentials_wait_quietly_then_proceed(
    world: Callable[..., Any], bus: Bus
) -> None:
    w: World = await world(only=("watcher", "writer", "helm", "monitor"))
    manifest_spec = {"templateName": "does-not-exist-yet"}
    await w.create_cluster("notemplate", **manifest_spec)
    await waiting_for(w, "notemplate", "TemplateNotFound", message="does-not-exist-yet")
    await quiet(bus, w, "notemplate")
    assert await w.gone(SECRET, "notemplate-etcd-key")
    assert await w.gone(CAPI_CLUSTER, "notemplate")

    body = cluster_manifest(
        w.namespace, "nocreds", templateName=w.template, cloudCredentialsSecretName="missing"
    )
    await w.kube.create(CLUSTER, body)
    await waiting_for(w, "nocreds", "CloudCredentialsNotFound", message="missing")
    assert await w.gone(SECRET, "nocreds-etcd-key")

    # The fixes arrive in other partitions; the nudges bring both Clusters back.
    template = template_manifest("does-not-exist-yet")
    await w.kube.create(CLUSTER_TEMPLATE, template)
    try:
        await w.create_credentials("missing")
        for name in ("notemplate", "nocreds"):
            await eventually(
                lambda n=name: w.gone(CAPI_CLUSTER, n),  # type: ignore[misc]
                lambda gone: not gone,
                timeout=60,
                what=f"{name} released",
            )
    finally:
        await w.kube.delete(CLUSTER_TEMPLATE, None, "does-not-exist-yet")


async def test_identity_that_never_settles_blocks_helm(
    world: Callable[..., Any], namespace: str, bus: Bus
) -> None:
    w: World = await world(
        oidc=True,
        standin_env={
            "STANDIN_IDENTITY_NEVER_READY_REALMS": f"{namespace}/stuck",
            "STANDIN_IDENTITY_WITHHOLD_CLIENT_ID": f"{namespace}/kube-noclient",
        },
    )
    await w.create_realm("stuck")
    await w.create_realm()
    await w.create_cluster("norealm", zenithIdentityRealmName="stuck")
    await w.create_cluster("noclient")
    await waiting_for(w, "norealm", "WaitingForIdentity", message="RealmNotReady")
    await waiting_for(w, "noclient", "WaitingForIdentity", message="WaitingForOIDCClient")
    await quiet(bus, w, "noclient")
    assert await w.gone(OIDC_CLIENT, "kube-norealm")
    clients, _ = await w.kube.list(OIDC_CLIENT, namespace=namespace)
    assert [c["metadata"]["name"] for c in clients] == ["kube-noclient"]
    for name in ("norealm", "noclient"):
        assert await w.gone(CAPI_CLUSTER, name)


async def test_lease_in_error_fails_the_cluster_with_its_message(
    world: Callable[..., Any],
) -> None:
    w: World = await world(standin_env={"STANDIN_SCHEDULE_ERROR": "*"})
    cluster = await w.create_cluster("nohosts", leaseName="kube-nohosts")
    await w.create_lease(cluster, ["f-small"])
    failed = await eventually(
        lambda: w.cluster("nohosts"),
        lambda c: condition(c, "LeaseReady").get("reason") == "LeaseError",
        timeout=60,
        what="lease error on the Cluster",
    )
    assert "Not enough hosts" in condition(failed, "LeaseReady")["message"]
    await eventually(
        lambda: w.cluster("nohosts"),
        lambda c: c["status"].get("phase") == "Failed",
        what="phase Failed",
    )
    assert await w.gone(CAPI_CLUSTER, "nohosts")


async def test_registrar_conflict_leaves_nothing_half_made(world: Callable[..., Any]) -> None:
    w: World = await world(zenith=True, standin_env={"STANDIN_ZENITH_REGISTRAR_FAIL": "409"})
    await w.create_cluster("clash")
    await waiting_for(w, "clash", "ZenithReservationConflict")
    # Each attempt writes its intent Secret before calling the registrar and deletes it on the
    # conflict, so one may be caught in flight: what matters is that none stays behind.
    await eventually(
        lambda: w.gone(SECRET, "clash-zenith-apiserver"),
        lambda gone: gone,
        timeout=30,
        what="the intent Secret removed after the conflict",
    )
    assert await w.gone(CAPI_CLUSTER, "clash")


async def test_registrar_outage_is_retried_and_reserves_once(world: Callable[..., Any]) -> None:
    w: World = await world(
        zenith=True,
        standin_env={
            "STANDIN_ZENITH_REGISTRAR_FAIL": "500",
            "STANDIN_ZENITH_REGISTRAR_FAIL_TIMES": "2",
        },
    )
    await w.create_cluster("flaky")
    await eventually(
        lambda: w.gone(CAPI_CLUSTER, "flaky"), lambda gone: not gone, timeout=90, what="release"
    )
    assert await _reservations_of(w, "flaky") == 1


async def test_chart_that_fails_to_render_is_a_clear_permanent_error(
    world: Callable[..., Any],
) -> None:
    failing = {"default_values": {"standin": {"failRender": "stand-in render failure"}}}
    w: World = await world(service_env={"CAPIBUS_HELM__VALUES": json.dumps(failing)})
    await w.create_cluster("broken")
    await waiting_for(w, "broken", "ChartRenderFailed", message="stand-in render failure")
    assert await w.gone(CAPI_CLUSTER, "broken")


async def test_helm_killed_mid_upgrade_recovers_with_the_new_values(
    world: Callable[..., Any],
) -> None:
    hooked = {"default_values": {"standin": {"preUpgradeHookSeconds": 60}}}
    w: World = await world(service_env={"CAPIBUS_HELM__VALUES": json.dumps(hooked)})
    created = await w.create_cluster("midway")
    await eventually(
        lambda: w.cluster("midway"),
        lambda c: condition(c, "Reconciled").get("status") == "True",
        timeout=90,
        what="installed",
    )
    groups = created["spec"]["nodeGroups"]
    groups[0]["count"] = 3
    await w.kube.patch_merge(CLUSTER, w.namespace, "midway", {"spec": {"nodeGroups": groups}})
    await eventually(
        lambda: _statuses(w, "midway"),
        lambda s: "pending-upgrade" in s,
        timeout=60,
        what="upgrade in flight",
    )
    helm = w.processes["helm"]
    helm.kill()
    helm.env.pop("CAPIBUS_HELM__VALUES", None)
    helm.start()
    await eventually(
        lambda: w.cluster("midway"),
        lambda c: c["status"].get("nodeCount") == 6 and c["status"].get("phase") == "Ready",
        timeout=120,
        what="the upgrade applied after recovery",
    )
    history = helm_history(w, "midway")
    assert history[-1]["status"] == "deployed"


async def _statuses(world: World, name: str) -> list[str]:
    return [r["status"] for r in helm_history(world, name)]
