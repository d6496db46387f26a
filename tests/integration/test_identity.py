"""The identity service against the real API server, NATS and Redis, run as a real process.

The watcher (this test's namespace only) turns changes into events and the writer lands the
conditions; the test plays the identity operator by writing the Realm's, OIDCClient's and
Platform's statuses itself, CAPI by writing the admin kubeconfig, and the portal by creating
app HelmReleases. The stack's kube-controller-manager runs the garbage collector, so owned
objects really go with their owners.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from shared import subjects
from shared.bus import Bus
from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.messages import ObjectRef, PrerequisiteChanged, ReconcileCluster, decode
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET
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


# --- the user kubeconfig ------------------------------------------------------------------

ADMIN_KUBECONFIG: Json = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "kc", "cluster": {"server": "https://192.0.2.10:6443"}}],
    "users": [{"name": "kc-admin", "user": {"token": "admin-only"}}],
    "contexts": [{"name": "kc-admin@kc", "context": {"cluster": "kc", "user": "kc-admin"}}],
    "current-context": "kc-admin@kc",
}


def stored_kubeconfig(secret: Json) -> Json:
    loaded: Json = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
    return loaded


def exec_args(secret: Json | None) -> list[str]:
    if secret is None:
        return []
    args: list[str] = stored_kubeconfig(secret)["users"][0]["user"]["exec"]["args"]
    return args


async def test_the_user_kubeconfig_logs_in_through_oidc_and_is_written_once(
    kube, namespace, identity, service
) -> None:
    identity()
    service("monitor", **OIDC_ON)
    await create_realm(kube, namespace, namespace, phase="Ready")
    cluster = await create_cluster(kube, namespace, "kc")
    await wait_for(kube, OIDC_CLIENT, namespace, "kube-kc")
    await set_status(
        kube, OIDC_CLIENT, namespace, "kube-kc", issuerUrl="https://id/realms/x", clientId="kube-kc"
    )
    labels = {"cluster.x-k8s.io/cluster-name": "kc"}
    await kube.create(
        SECRET,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "kc-kubeconfig", "namespace": namespace, "labels": labels},
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": base64.b64encode(yaml.safe_dump(ADMIN_KUBECONFIG).encode()).decode()},
        },
    )
    secret = await wait_for(kube, SECRET, namespace, "kc-kubeconfig-user")
    config = stored_kubeconfig(secret)
    assert config["clusters"] == [{"name": "kc", "cluster": {"server": "https://192.0.2.10:6443"}}]
    assert config["current-context"] == "oidc@kc"
    assert config["contexts"] == [{"name": "oidc@kc", "context": {"cluster": "kc", "user": "oidc"}}]
    assert config["users"] == [
        {
            "name": "oidc",
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": "kubectl",
                    "args": [
                        "oidc-login",
                        "get-token",
                        "--grant-type=device-code",
                        "--oidc-issuer-url=https://id/realms/x",
                        "--oidc-client-id=kube-kc",
                    ],
                }
            },
        }
    ]
    assert secret["metadata"]["labels"] == labels
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "azimuth.stackhpc.com/v1alpha1",
            "kind": "Cluster",
            "name": "kc",
            "uid": cluster["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    # The monitor (OIDC on) hands the portal the user kubeconfig, never the admin one.
    await eventually(
        lambda: kube.get(CLUSTER, namespace, "kc"),
        lambda c: (c.get("status") or {}).get("kubeconfigSecretName") == "kc-kubeconfig-user",
        timeout=60,
        what="kubeconfigSecretName",
    )

    # Events that change nothing the user kubeconfig carries write nothing.
    await kube.patch_merge(
        SECRET, namespace, "kc-kubeconfig", {"metadata": {"annotations": {"touched": "1"}}}
    )
    await kube.patch_merge(
        OIDC_CLIENT, namespace, "kube-kc", {"metadata": {"annotations": {"touched": "1"}}}
    )
    await asyncio.sleep(3)
    again = await kube.get(SECRET, namespace, "kc-kubeconfig-user")
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]

    await set_status(kube, OIDC_CLIENT, namespace, "kube-kc", clientId="kube-kc-2")
    await eventually(
        lambda: find(kube, SECRET, namespace, "kc-kubeconfig-user"),
        lambda s: "--oidc-client-id=kube-kc-2" in exec_args(s),
        timeout=60,
        what="the new client id in the user kubeconfig",
    )


# --- app Platforms ------------------------------------------------------------------------


def services_annotation(**services: str) -> dict[str, str]:
    found = {
        name: {"subdomain": sub, "fqdn": f"{sub}.apps.example.org", "label": name.title()}
        for name, sub in services.items()
    }
    return {"azimuth.stackhpc.com/services": json.dumps(found)}


async def app_platform(kube: KubeClient, namespace: str) -> Json | None:
    return await find(kube, PLATFORM, namespace, "kubeapp-hub")


async def create_app(
    kube: KubeClient, namespace: str, cluster: str, annotations: dict[str, str]
) -> Json:
    """App HelmRelease ``hub`` of ``cluster``, as the portal creates it."""
    return await kube.create(
        HELM_RELEASE,
        {
            "apiVersion": HELM_RELEASE.api_version,
            "kind": HELM_RELEASE.kind,
            "metadata": {
                "name": "hub",
                "namespace": namespace,
                "labels": {
                    "azimuth.stackhpc.com/app-template": "jupyterhub",
                    "addons.stackhpc.com/cluster": cluster,
                },
                "annotations": annotations,
            },
            "spec": {"clusterName": cluster, "releaseName": "hub", "targetNamespace": "hub"},
        },
    )


async def test_an_app_gets_a_platform_that_follows_its_services_and_goes_with_it(
    kube, namespace, identity
) -> None:
    identity()
    await create_realm(kube, namespace, namespace, phase="Ready")
    await create_cluster(kube, namespace, "apps")
    release = await create_app(kube, namespace, "apps", services_annotation(web="abc123"))
    platform = await wait_for(kube, PLATFORM, namespace, "kubeapp-hub")
    assert platform["metadata"]["labels"]["addons.stackhpc.com/cluster"] == "apps"
    assert platform["spec"] == {
        "realmName": namespace,
        "zenithServices": {"web": {"subdomain": "abc123", "fqdn": "abc123.apps.example.org"}},
    }
    assert platform["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "addons.stackhpc.com/v1alpha1",
            "kind": "HelmRelease",
            "name": "hub",
            "uid": release["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]

    # A status change of the release (the addon provider at work) writes nothing.
    await set_status(kube, HELM_RELEASE, namespace, "hub", phase="Deployed", revision=1)
    await asyncio.sleep(3)
    same = await app_platform(kube, namespace)
    assert same is not None
    assert same["metadata"]["resourceVersion"] == platform["metadata"]["resourceVersion"]

    await kube.patch_merge(
        HELM_RELEASE,
        namespace,
        "hub",
        {"metadata": {"annotations": services_annotation(web="abc123", api="def456")}},
    )
    updated = await eventually(
        lambda: app_platform(kube, namespace),
        lambda p: p is not None and "api" in p["spec"].get("zenithServices", {}),
        timeout=60,
        what="the api service in the app Platform",
    )
    assert updated is not None
    assert updated["spec"]["zenithServices"]["api"] == {
        "subdomain": "def456",
        "fqdn": "def456.apps.example.org",
    }

    await kube.delete(HELM_RELEASE, namespace, "hub")
    await eventually(
        lambda: app_platform(kube, namespace),
        lambda p: p is None,
        timeout=90,
        what="the garbage collector to remove the app Platform",
    )


async def test_an_app_waits_for_a_realm_without_retrying(kube, bus, namespace, identity) -> None:
    identity()
    await create_cluster(kube, namespace, "later")
    await create_app(kube, namespace, "later", {"azimuth.stackhpc.com/services": "{not json"})
    await wait_for_reason(kube, namespace, "later", "RealmNotFound")
    await asyncio.sleep(2)
    assert await app_platform(kube, namespace) is None

    await create_realm(kube, namespace, namespace, phase="Ready")
    platform = await wait_for(kube, PLATFORM, namespace, "kubeapp-hub")
    assert platform["spec"] == {"realmName": namespace}  # malformed services: none


async def test_an_app_made_before_its_cluster_gets_its_platform_when_the_cluster_appears(
    kube, namespace, identity
) -> None:
    identity()
    await create_realm(kube, namespace, namespace, phase="Ready")
    await create_app(kube, namespace, "early", services_annotation(web="abc123"))
    await asyncio.sleep(3)
    assert await app_platform(kube, namespace) is None  # no Cluster: waits, quietly

    await create_cluster(kube, namespace, "early")
    platform = await wait_for(kube, PLATFORM, namespace, "kubeapp-hub")
    assert platform["spec"]["zenithServices"] == {
        "web": {"subdomain": "abc123", "fqdn": "abc123.apps.example.org"}
    }
