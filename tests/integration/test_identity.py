"""The identity service against the real API server, NATS and Redis, run as a real process.

The watcher (this test's namespace only) turns changes into events and the writer lands the
conditions; the test plays the identity operator by writing the Realm's, OIDCClient's and
Platform's statuses itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shared import subjects
from shared.bus import Bus
from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.messages import ObjectRef, PrerequisiteChanged, ReconcileCluster, decode
from shared.resources import CLUSTER, OIDC_CLIENT, PLATFORM, REALM
from testenv.examples import cluster_manifest
from tests.integration.support import ServiceProcess, eventually, read_stream

pytestmark = pytest.mark.integration
PARTITIONS = 16
OIDC_ON = {"CAPIBUS_AZIMUTH__OIDC_ENABLED": "true"}
Json = dict[str, Any]


@pytest.fixture
def identity(
    service: Callable[..., ServiceProcess], namespace: str
) -> Callable[[], ServiceProcess]:
    """Watcher and writer running; call the result to start (another) identity replica."""
    service("watcher", CAPIBUS_WATCHER__NAMESPACE=namespace)
    service("writer")
    return lambda: service("identity", **OIDC_ON)


async def create_realm(kube: KubeClient, namespace: str, name: str, **status: Any) -> None:
    await kube.create(
        REALM,
        {
            "apiVersion": REALM.api_version,
            "kind": REALM.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"tenancyId": "t1"},
        },
    )
    if status:
        await set_status(kube, REALM, namespace, name, **status)


async def set_status(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str, **status: Any
) -> None:
    await kube.patch_merge(kind, namespace, name, {"status": status}, subresource="status")


async def create_cluster(kube: KubeClient, namespace: str, name: str, **spec: Any) -> Json:
    return await kube.create(CLUSTER, cluster_manifest(namespace, name, **spec))


async def find(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def condition(kube: KubeClient, namespace: str, name: str) -> Json | None:
    cluster = await kube.get(CLUSTER, namespace, name)
    found = (cluster.get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == "IdentityReady"), None)


def partition(namespace: str, name: str) -> int:
    return subjects.partition_of(f"{namespace}/{name}", PARTITIONS)


async def prerequisite(bus: Bus, namespace: str, name: str) -> PrerequisiteChanged | None:
    subject = subjects.prerequisite("identity", partition(namespace, name), namespace, name)
    body = await bus.last_message(subjects.LIFECYCLE.name, subject)
    return decode(body, PrerequisiteChanged) if body else None


async def wait_for_reason(
    kube: KubeClient, namespace: str, name: str, reason: str, saying: str = ""
) -> Json:
    found = await eventually(
        lambda: condition(kube, namespace, name),
        lambda c: c is not None and c["reason"] == reason and saying in c["message"],
        timeout=60,
        what=f"IdentityReady {reason}",
    )
    assert found is not None
    return found


async def wait_for(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> Json:
    found = await eventually(
        lambda: find(kube, kind, namespace, name),
        lambda o: o is not None,
        timeout=60,
        what=f"{kind.kind} {name}",
    )
    assert found is not None
    return found


async def published_about(bus: Bus, namespace: str, name: str) -> list[str]:
    """Stream sequences of everything said about the Cluster and of its OIDCClient's events."""
    p = partition(namespace, name)
    where = [
        (subjects.STATUS.name, subjects.cluster_status(p, namespace, name)),
        (subjects.LIFECYCLE.name, subjects.prerequisite("identity", p, namespace, name)),
        (subjects.EVENTS.name, f"capibus.evt.oidcclient.*.{namespace}.kube-{name}"),
    ]
    found: list[str] = []
    for stream, subject in where:
        found += [f"{stream}:{seq}" for seq, _ in await read_stream(bus, stream, subject)]
    return found


async def test_a_cluster_gets_its_oidc_client_and_platform_and_becomes_ready(
    kube, bus, namespace, identity
) -> None:
    identity()
    await create_realm(kube, namespace, namespace)  # the portal's Realm; no status yet
    cluster = await create_cluster(kube, namespace, "one")
    await wait_for_reason(kube, namespace, "one", "RealmNotReady")
    assert await find(kube, OIDC_CLIENT, namespace, "kube-one") is None

    await set_status(
        kube,
        REALM,
        namespace,
        namespace,
        phase="Ready",
        oidcIssuerUrl="https://id.example/realms/x",
        platformUsersGroup="/platform-users",
    )
    client = await wait_for(kube, OIDC_CLIENT, namespace, "kube-one")
    assert client["spec"] == {"realmName": namespace, "public": True, "grantTypes": ["DeviceCode"]}
    assert client["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "azimuth-capi-operator"}
    assert client["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "azimuth.stackhpc.com/v1alpha1",
            "kind": "Cluster",
            "name": "one",
            "uid": cluster["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    await wait_for_reason(kube, namespace, "one", "WaitingForOIDCClient")
    assert await find(kube, PLATFORM, namespace, "kube-one") is None

    await set_status(
        kube,
        OIDC_CLIENT,
        namespace,
        "kube-one",
        phase="Ready",
        issuerUrl="https://id.example/realms/x",
        clientId="kube-one",
    )
    platform = await wait_for(kube, PLATFORM, namespace, "kube-one")
    assert platform["spec"] == {"realmName": namespace}
    assert platform["metadata"]["ownerReferences"] == client["metadata"]["ownerReferences"]
    await wait_for_reason(kube, namespace, "one", "WaitingForPlatform")

    await set_status(kube, PLATFORM, namespace, "kube-one", phase="Ready", rootGroup="/kube-one")
    ready = await wait_for_reason(kube, namespace, "one", "Ready")
    assert ready["status"] == "True"
    said = await prerequisite(bus, namespace, "one")
    assert said is not None
    assert (said.ready, said.reason, said.step) == (True, "Ready", "identity")
    assert said.generation == cluster["metadata"]["generation"]
    assert said.ref.uid == cluster["metadata"]["uid"]
    assert said.outputs == {
        "realmName": namespace,
        "issuerUrl": "https://id.example/realms/x",
        "clientId": "kube-one",
        "rootGroup": "/kube-one",
        "platformUsersGroup": "/platform-users",
    }


async def test_a_realm_that_never_gets_ready_means_no_oidc_client(
    kube, namespace, identity
) -> None:
    identity()
    await create_realm(kube, namespace, namespace, phase="Pending")
    await create_cluster(kube, namespace, "stuck")
    found = await wait_for_reason(kube, namespace, "stuck", "RealmNotReady")
    assert found["status"] == "False"
    assert "Pending" in found["message"]
    await asyncio.sleep(1)
    items, _ = await kube.list(OIDC_CLIENT, namespace=namespace)
    assert items == []


async def test_waiting_for_a_client_id_costs_nothing(kube, bus, namespace, identity) -> None:
    identity()
    # The requested Realm hashes to a partition of its own; its event reaches the Cluster
    # through a ReconcileCluster nudge.
    await create_realm(kube, namespace, namespace, phase="Ready")
    await create_realm(kube, namespace, "chosen", phase="Pending")
    await create_cluster(kube, namespace, "wait", zenithIdentityRealmName="chosen")
    await wait_for_reason(kube, namespace, "wait", "RealmNotReady")
    await set_status(kube, REALM, namespace, "chosen", phase="Ready")
    client = await wait_for(kube, OIDC_CLIENT, namespace, "kube-wait")
    assert client["spec"]["realmName"] == "chosen"
    await set_status(kube, OIDC_CLIENT, namespace, "kube-wait", issuerUrl="https://id")
    await wait_for_reason(kube, namespace, "wait", "WaitingForOIDCClient", "no clientId yet")

    before = await published_about(bus, namespace, "wait")
    assert before
    await asyncio.sleep(3)
    assert await published_about(bus, namespace, "wait") == before


async def test_a_crash_after_the_oidc_client_leaves_one_of_each(kube, namespace, identity) -> None:
    first = identity()
    await create_realm(kube, namespace, namespace, phase="Ready")
    await create_cluster(kube, namespace, "crash")
    await wait_for(kube, OIDC_CLIENT, namespace, "kube-crash")
    first.kill()

    identity()
    await set_status(
        kube, OIDC_CLIENT, namespace, "kube-crash", issuerUrl="https://id", clientId="kube-crash"
    )
    await wait_for(kube, PLATFORM, namespace, "kube-crash")
    await set_status(kube, PLATFORM, namespace, "kube-crash", rootGroup="/kube-crash")
    await wait_for_reason(kube, namespace, "crash", "Ready")
    clients, _ = await kube.list(OIDC_CLIENT, namespace=namespace)
    platforms, _ = await kube.list(PLATFORM, namespace=namespace)
    assert [c["metadata"]["name"] for c in clients] == ["kube-crash"]
    assert [p["metadata"]["name"] for p in platforms] == ["kube-crash"]


async def test_an_oidc_client_that_lost_its_owner_is_adopted_again(
    kube, bus, namespace, identity
) -> None:
    identity()
    await create_realm(kube, namespace, namespace, phase="Ready")
    cluster = await create_cluster(kube, namespace, "restored")
    await wait_for_reason(kube, namespace, "restored", "WaitingForOIDCClient")

    # What a Velero restore leaves: the same object, no ownerReference.
    await kube.patch_merge(
        OIDC_CLIENT, namespace, "kube-restored", {"metadata": {"ownerReferences": None}}
    )
    orphan = await kube.get(OIDC_CLIENT, namespace, "kube-restored")
    assert not orphan["metadata"].get("ownerReferences")

    ref = ObjectRef(
        api_version=CLUSTER.api_version,
        kind="Cluster",
        namespace=namespace,
        name="restored",
        uid=cluster["metadata"]["uid"],
    )
    nudge = ReconcileCluster(
        source="tests", correlation_id=f"cluster:{ref.key}", ref=ref, reason="restored"
    )
    await bus.publish(
        subjects.reconcile(partition(namespace, "restored"), namespace, "restored"), nudge
    )
    adopted = await eventually(
        lambda: kube.get(OIDC_CLIENT, namespace, "kube-restored"),
        lambda o: bool(o["metadata"].get("ownerReferences")),
        timeout=30,
        what="ownerReference back",
    )
    [owner] = adopted["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["controller"]) == (cluster["metadata"]["uid"], True)
