"""The identity service through its composition root, with in-memory fakes (no network)."""

from __future__ import annotations

import base64
import copy
import json
import logging
from typing import Any

import pytest
import yaml

from services.identity.app import ROUTES
from services.identity.bootstrap import dependencies
from services.identity.settings import IdentitySettings
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.errors import KubeInvalid, PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    EventType,
    Message,
    ObjectRef,
    PatchStatus,
    PrerequisiteChanged,
    ReconcileCluster,
    ResourceChanged,
)
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
PARTITIONS = 16


class Kube(FakeKube):
    """Server-side apply as the tests need it: what we apply replaces our fields (spec, data),
    labels and ownerReferences (by uid) merge into what is there."""

    async def apply(self, kind: ResourceKind, obj: Json, **options: Any) -> Json:
        assert (options["field_manager"], options["force"]) == ("capibus-identity", True)
        meta = obj["metadata"]
        self._called("apply", kind, meta["namespace"], meta["name"])
        current = self.stored(kind, meta["namespace"], meta["name"])
        merged = copy.deepcopy(current) if current else {"metadata": dict(meta)}
        merged["metadata"]["labels"] = {**merged["metadata"].get("labels", {}), **meta["labels"]}
        owners = {o["uid"]: o for o in merged["metadata"].get("ownerReferences", [])}
        owners.update({o["uid"]: o for o in meta["ownerReferences"]})
        merged["metadata"]["ownerReferences"] = list(owners.values())
        for key in set(obj) - {"apiVersion", "kind", "metadata"}:
            merged[key] = copy.deepcopy(obj[key])
        return self.put(kind, merged)

    @property
    def applied(self) -> list[tuple[str, str]]:
        return [(kind, name) for verb, kind, _, name in self.calls if verb == "apply"]

    @property
    def listed(self) -> list[str]:
        return [kind for verb, kind, _, _ in self.calls if verb == "list"]

    def reject(self, name: str) -> None:
        """The next apply fails as the API server refuses an invalid ``name``."""
        self.fail("apply", KubeInvalid(f"{name}: spec.realmName: Invalid value"))

    def status(self, kind: ResourceKind, namespace: str, name: str, **status: Any) -> None:
        self.objects[(kind.token, namespace, name)].setdefault("status", {}).update(status)


class Bus(FakeBus):
    async def last_message(self, stream: str, subject: str) -> bytes | None:
        assert stream == subjects.LIFECYCLE.name
        return await super().last_message(stream, subject)


Routes = dict[str, Subscription[Any]]


def service(kube: Kube, bus: Bus, *, enabled: bool = True, zenith: bool = False) -> Routes:
    settings = IdentitySettings(
        azimuth={"oidc_enabled": enabled, "zenith_enabled": zenith},
        replica="r1",
        partitions=PARTITIONS,
    )
    deps = dependencies(settings, bus=bus, kube=kube)
    return {s.name: s for s in ROUTES.bind(deps)}


async def deliver(routes: Routes, name: str, *messages: Message) -> None:
    await routes[name].handle(Batch(key="k", partition=0, messages=messages))


def changed(
    kube: Kube,
    kind: ResourceKind,
    namespace: str,
    name: str,
    event: EventType = "MODIFIED",
) -> ResourceChanged:
    obj = kube.objects[(kind.token, namespace, name)]
    return ResourceChanged(
        source="watcher/w",
        correlation_id=f"cluster:{namespace}/{name}",
        event=event,
        ref=ObjectRef(
            api_version=kind.api_version,
            kind=kind.kind,
            namespace=namespace,
            name=name,
            uid=obj["metadata"]["uid"],
        ),
        resource_version=obj["metadata"]["resourceVersion"],
        # As the watcher sends them: Secret data stays in the API server.
        object={k: copy.deepcopy(v) for k, v in obj.items() if k not in ("data", "stringData")},
    )


def world(**cluster_spec: Any) -> Kube:
    kube = Kube()
    kube.put(
        REALM,
        {"metadata": {"name": "ns", "namespace": "ns"}, "status": {"phase": "Ready"}},
    )
    kube.put(
        CLUSTER,
        {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"label": "c", **cluster_spec}},
    )
    return kube


def reasons(bus: Bus) -> list[str]:
    return [m.reason for m in bus.of(PrerequisiteChanged)]


async def test_the_whole_way_to_ready_driven_by_the_objects_events() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    appeared = changed(kube, CLUSTER, "ns", "c")
    await deliver(consumer, "resources", appeared)
    assert kube.applied == [("OIDCClient", "kube-c")]
    assert reasons(bus) == ["WaitingForOIDCClient"]

    kube.status(OIDC_CLIENT, "ns", "kube-c", issuerUrl="https://id/realms/ns", clientId="kube-c")
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert kube.applied[-1] == ("Platform", "kube-c")
    assert reasons(bus)[-1] == "WaitingForPlatform"

    kube.status(PLATFORM, "ns", "kube-c", rootGroup="/kube-c")
    await deliver(consumer, "resources", changed(kube, PLATFORM, "ns", "kube-c"))
    ready = bus.of(PrerequisiteChanged)[-1]
    assert (ready.ready, ready.reason, ready.step, ready.generation) == (
        True,
        "Ready",
        "identity",
        1,
    )
    assert ready.outputs == {
        "realmName": "ns",
        "issuerUrl": "https://id/realms/ns",
        "clientId": "kube-c",
        "rootGroup": "/kube-c",
        "platformUsersGroup": None,
    }
    conditions = [m.conditions[0] for m in bus.of(PatchStatus)]
    assert [(c.status, c.reason) for c in conditions] == [
        ("False", "WaitingForOIDCClient"),
        ("False", "WaitingForPlatform"),
        ("True", "Ready"),
    ]
    assert all(m.patch == {} for m in bus.of(PatchStatus))
    # Each said by the reporter with its cause: the event that ran the Cluster.
    for status, prerequisite in zip(bus.of(PatchStatus), bus.of(PrerequisiteChanged), strict=True):
        assert status.causation_id == prerequisite.causation_id
        assert prerequisite.correlation_id == "cluster:ns/c"
    assert bus.of(PatchStatus)[0].causation_id == appeared.id
    assert bus.of(PatchStatus)[0].correlation_id == appeared.correlation_id
    partition = subjects.partition_of("ns/c", PARTITIONS)
    assert {s for s, _ in bus.published} == {
        subjects.cluster_status(partition, "ns", "c"),
        subjects.prerequisite("identity", partition, "ns", "c"),
    }


async def test_unchanged_objects_are_not_applied_and_nothing_is_said_twice() -> None:
    kube, bus = world(), Bus()
    kube.status(REALM, "ns", "ns", platformUsersGroup="/platform-users")
    consumer = service(kube, bus)
    nudge = changed(kube, CLUSTER, "ns", "c")
    await deliver(consumer, "resources", nudge)
    kube.status(OIDC_CLIENT, "ns", "kube-c", issuerUrl="https://id", clientId="kube-c")
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    kube.status(PLATFORM, "ns", "kube-c", rootGroup="/kube-c")
    await deliver(consumer, "resources", changed(kube, PLATFORM, "ns", "kube-c"))
    applied, published = list(kube.applied), list(bus.published)

    # Redelivery, the writer's status write coming back, a replay: all the same state.
    for _ in range(3):
        await deliver(consumer, "resources", nudge, changed(kube, CLUSTER, "ns", "c"))
        await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert kube.applied == applied == [("OIDCClient", "kube-c"), ("Platform", "kube-c")]
    assert bus.published == published


async def test_a_state_that_returns_is_said_again() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await oidc_ready(kube, consumer)
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    for root_group in ("/kube-c", None, "/kube-c"):
        kube.status(PLATFORM, "ns", "kube-c", rootGroup=root_group)
        await deliver(consumer, "resources", changed(kube, PLATFORM, "ns", "kube-c"))
    said = ["Ready", "WaitingForPlatform", "Ready"]
    assert [m.conditions[0].reason for m in bus.of(PatchStatus)][-3:] == said
    assert reasons(bus)[-3:] == said


async def test_a_lost_owner_reference_is_put_back() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    kube.objects[(OIDC_CLIENT.token, "ns", "kube-c")]["metadata"]["ownerReferences"] = []
    cluster = kube.objects[(CLUSTER.token, "ns", "c")]["metadata"]
    ref = ObjectRef(
        api_version=CLUSTER.api_version,
        kind="Cluster",
        namespace="ns",
        name="c",
        uid=cluster["uid"],
    )
    await deliver(
        consumer,
        "reconciles",
        ReconcileCluster(source="t", correlation_id="x", ref=ref, reason="t"),
    )
    owners = kube.objects[(OIDC_CLIENT.token, "ns", "kube-c")]["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in owners] == [
        ("Cluster", "c", cluster["uid"], True)
    ]
    assert reasons(bus) == ["WaitingForOIDCClient"]  # nothing new to say


async def test_services_of_the_cluster_reach_the_platform() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    kube.status(OIDC_CLIENT, "ns", "kube-c", issuerUrl="https://id", clientId="kube-c")
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert "zenithServices" not in kube.objects[(PLATFORM.token, "ns", "kube-c")]["spec"]
    web = {"subdomain": "abc", "fqdn": "abc.example.org", "label": "Web"}
    kube.status(CLUSTER, "ns", "c", services={"web": web})
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    spec = kube.objects[(PLATFORM.token, "ns", "kube-c")]["spec"]
    assert spec["zenithServices"] == {"web": {"subdomain": "abc", "fqdn": "abc.example.org"}}


@pytest.mark.parametrize(
    ("realm_status", "expected"),
    [(None, "RealmNotFound"), ({}, "RealmNotReady"), ({"phase": "Pending"}, "RealmNotReady")],
)
async def test_no_usable_realm_means_no_oidc_client(
    realm_status: Json | None, expected: str
) -> None:
    kube, bus = world(), Bus()
    if realm_status is None:
        del kube.objects[(REALM.token, "ns", "ns")]
    else:
        kube.objects[(REALM.token, "ns", "ns")]["status"] = realm_status
    await deliver(service(kube, bus), "resources", changed(kube, CLUSTER, "ns", "c"))
    assert kube.applied == []
    assert reasons(bus) == [expected]
    assert bus.of(PatchStatus)[0].conditions[0].reason == expected


async def test_a_rejected_apply_is_reported_then_dead_lettered() -> None:
    kube, bus = world(), Bus()
    kube.reject("kube-c")
    with pytest.raises(PermanentError) as raised:
        await deliver(service(kube, bus), "resources", changed(kube, CLUSTER, "ns", "c"))
    assert raised.value.reason == "Invalid"
    condition = bus.of(PatchStatus)[0].conditions[0]
    assert (condition.status, condition.reason) == ("False", "Invalid")
    assert "spec.realmName" in condition.message


async def test_a_server_that_keeps_changing_what_we_apply_is_not_fought_forever() -> None:
    kube, bus = world(), Bus()
    apply = kube.apply

    async def webhook_strips_labels(kind: ResourceKind, obj: Json, **options: Any) -> Json:
        applied = await apply(kind, obj, **options)
        applied["metadata"]["labels"] = {}
        return applied

    kube.apply = webhook_strips_labels  # type: ignore[method-assign]
    with pytest.raises(PermanentError) as raised:
        await deliver(service(kube, bus), "resources", changed(kube, CLUSTER, "ns", "c"))
    assert raised.value.reason == "NotConverging"
    assert kube.applied == [("OIDCClient", "kube-c")] * 3


async def test_new_services_reach_the_platform_while_the_oidc_client_waits() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await oidc_ready(kube, consumer)
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert kube.applied == [("OIDCClient", "kube-c"), ("Platform", "kube-c")]

    # The OIDCClient is re-created (a restore, the identity operator) and has no client id yet.
    kube.objects[(OIDC_CLIENT.token, "ns", "kube-c")]["status"] = {}
    web = {"subdomain": "abc", "fqdn": "abc.example.org", "label": "Web"}
    kube.status(CLUSTER, "ns", "c", services={"web": web})
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    assert kube.applied[-1] == ("Platform", "kube-c")
    spec = kube.objects[(PLATFORM.token, "ns", "kube-c")]["spec"]
    assert spec["zenithServices"] == {"web": {"subdomain": "abc", "fqdn": "abc.example.org"}}
    assert reasons(bus)[-1] == "WaitingForOIDCClient"


async def test_a_paused_cluster_keeps_its_derived_objects_current_and_says_nothing() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await oidc_ready(kube, consumer)
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    put_app(kube, services={"web": WEB})
    put_admin_kubeconfig(kube)
    kube.objects[(CLUSTER.token, "ns", "c")]["spec"]["paused"] = True
    published = list(bus.published)

    # status.services still moves while paused (discovery ignores paused, as upstream's H19).
    kube.status(CLUSTER, "ns", "c", services={"web": WEB})
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    assert kube.objects[(PLATFORM.token, "ns", "kube-c")]["spec"]["zenithServices"]
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert app_platform(kube) is not None
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert (SECRET.token, "ns", "c-kubeconfig-user") in kube.objects
    assert kube.applied[2:] == [
        ("Platform", "kube-c"),
        ("Platform", "kubeapp-hub"),
        ("Secret", "c-kubeconfig-user"),
    ]
    assert bus.published == published  # no condition, no prerequisite while paused

    # Deleting stops all of it: garbage collection follows the owners.
    kube.objects[(CLUSTER.token, "ns", "c")]["metadata"]["deletionTimestamp"] = "now"
    del kube.objects[(SECRET.token, "ns", "c-kubeconfig-user")]
    del kube.objects[(PLATFORM.token, "ns", "kubeapp-hub")]
    applied = list(kube.applied)
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert kube.applied == applied


@pytest.mark.parametrize("state", ["gone", "paused", "deleting"])
async def test_gone_paused_or_deleting_clusters_get_no_new_objects(state: str) -> None:
    kube, bus = world(paused=state == "paused"), Bus()
    event = changed(kube, CLUSTER, "ns", "c")
    if state == "gone":
        del kube.objects[(CLUSTER.token, "ns", "c")]
    if state == "deleting":
        kube.objects[(CLUSTER.token, "ns", "c")]["metadata"]["deletionTimestamp"] = "now"
    await deliver(service(kube, bus), "resources", event)
    assert kube.applied == []
    assert bus.published == []


async def test_objects_without_a_cluster_owner_are_ignored() -> None:
    kube, bus = world(), Bus()
    kube.put(OIDC_CLIENT, {"metadata": {"name": "stray", "namespace": "ns"}, "spec": {}})
    await deliver(service(kube, bus), "resources", changed(kube, OIDC_CLIENT, "ns", "stray"))
    assert kube.reads == 0
    assert bus.published == []


async def test_a_realm_event_nudges_the_clusters_using_it_in_their_partitions() -> None:
    kube, bus = world(), Bus()
    kube.put(REALM, {"metadata": {"name": "other", "namespace": "ns"}})
    for name, spec in [("d", {}), ("e", {"zenithIdentityRealmName": "other"})]:
        kube.put(CLUSTER, {"metadata": {"name": name, "namespace": "ns"}, "spec": spec})
    consumer = service(kube, bus)
    # As the watcher tells it: a Realm belongs to no cluster, so it is its own story.
    realm_event = changed(kube, REALM, "ns", "ns").model_copy(
        update={"correlation_id": "realm:ns/ns"}
    )
    await deliver(consumer, "realms", realm_event)
    await deliver(consumer, "realms", realm_event)  # redelivered: the same nudges, dropped
    nudges = bus.of(ReconcileCluster)
    assert sorted(n.ref.name for n in nudges) == ["c", "d"]
    assert {s for s, _ in bus.published} == {
        subjects.reconcile(subjects.partition_of(f"ns/{n}", PARTITIONS), "ns", n) for n in "cd"
    }
    assert all(n.causation_id == realm_event.id for n in nudges)
    assert all(n.correlation_id == f"cluster:ns/{n.ref.name}" for n in nudges)  # theirs
    assert kube.applied == []  # the Clusters' own partitions do the work

    await deliver(consumer, "realms", changed(kube, REALM, "ns", "other"))
    assert bus.of(ReconcileCluster)[-1].ref.name == "e"


async def test_with_oidc_disabled_everything_is_acked_untouched() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus, enabled=False)
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    await deliver(consumer, "realms", changed(kube, REALM, "ns", "ns"))
    assert (kube.reads, kube.applied, bus.published) == (0, [], [])


async def test_with_oidc_off_and_zenith_on_only_platforms_are_kept_silently() -> None:
    kube, bus = world(), Bus()
    kube.status(CLUSTER, "ns", "c", services={"web": {"subdomain": "a", "fqdn": "a.example"}})
    consumer = service(kube, bus, enabled=False, zenith=True)
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    assert kube.applied == [("Platform", "kube-c")]
    spec = kube.objects[(PLATFORM.token, "ns", "kube-c")]["spec"]
    assert spec == {
        "realmName": "ns",
        "zenithServices": {"web": {"subdomain": "a", "fqdn": "a.example"}},
    }
    await deliver(consumer, "resources", changed(kube, PLATFORM, "ns", "kube-c"))
    assert kube.applied == [("Platform", "kube-c")]
    assert bus.published == []  # the helm service does not wait for identity without OIDC

    put_app(kube, services={"web": WEB})
    put_admin_kubeconfig(kube)
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert kube.applied[1:] == [("Platform", "kubeapp-hub")]


# --- the user kubeconfig ------------------------------------------------------------------

ADMIN_CONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
    "users": [{"name": "c-admin", "user": {"client-key-data": "secret"}}],
}


def put_admin_kubeconfig(kube: Kube, config: Json = ADMIN_CONFIG) -> None:
    text = base64.b64encode(yaml.safe_dump(config).encode()).decode()
    kube.put(
        SECRET,
        {
            "metadata": {
                "name": "c-kubeconfig",
                "namespace": "ns",
                "labels": {"cluster.x-k8s.io/cluster-name": "c"},
            },
            "data": {"value": text},
        },
    )


def user_kubeconfig(kube: Kube) -> Json:
    secret = kube.objects[(SECRET.token, "ns", "c-kubeconfig-user")]
    loaded: Json = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
    return loaded


async def oidc_ready(kube: Kube, consumer: Routes, issuer: str = "https://id") -> None:
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    kube.status(OIDC_CLIENT, "ns", "kube-c", issuerUrl=issuer, clientId="kube-c")


async def test_the_user_kubeconfig_is_written_once_and_follows_the_issuer() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await oidc_ready(kube, consumer)
    put_admin_kubeconfig(kube)
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert kube.applied[-1] == ("Secret", "c-kubeconfig-user")
    secret = kube.objects[(SECRET.token, "ns", "c-kubeconfig-user")]
    assert secret["metadata"]["labels"] == {"cluster.x-k8s.io/cluster-name": "c"}
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Cluster", "c", True)
    config = user_kubeconfig(kube)
    assert config["clusters"] == [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}]
    assert config["current-context"] == "oidc@c"
    assert "--oidc-issuer-url=https://id" in config["users"][0]["user"]["exec"]["args"]

    applied = list(kube.applied)
    for name in ("c-kubeconfig", "c-kubeconfig-user", "c-kubeconfig"):
        await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", name))
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert kube.applied == [*applied, ("Platform", "kube-c")]  # the OIDCClient's own next step

    kube.status(OIDC_CLIENT, "ns", "kube-c", issuerUrl="https://moved")
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert kube.applied[-1] == ("Secret", "c-kubeconfig-user")
    assert (
        "--oidc-issuer-url=https://moved"
        in user_kubeconfig(kube)["users"][0]["user"]["exec"]["args"]
    )

    moved = {**ADMIN_CONFIG, "clusters": [{"name": "c", "cluster": {"server": "https://new"}}]}
    put_admin_kubeconfig(kube, moved)
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert user_kubeconfig(kube)["clusters"][0]["cluster"] == {"server": "https://new"}


async def test_a_user_kubeconfig_waits_for_the_client_and_the_admin_secret() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    put_admin_kubeconfig(kube)
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert (SECRET.token, "ns", "c-kubeconfig-user") not in kube.objects  # no client id yet

    del kube.objects[(SECRET.token, "ns", "c-kubeconfig")]
    kube.status(OIDC_CLIENT, "ns", "kube-c", issuerUrl="https://id", clientId="kube-c")
    await deliver(consumer, "resources", changed(kube, OIDC_CLIENT, "ns", "kube-c"))
    assert (SECRET.token, "ns", "c-kubeconfig-user") not in kube.objects  # no admin Secret yet

    put_admin_kubeconfig(kube)
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert (SECRET.token, "ns", "c-kubeconfig-user") in kube.objects


async def test_other_secrets_cost_nothing() -> None:
    kube, bus = world(), Bus()
    kube.put(
        SECRET,
        {
            "metadata": {
                "name": "c-ca",
                "namespace": "ns",
                "labels": {"cluster.x-k8s.io/cluster-name": "c"},
            }
        },
    )
    kube.put(SECRET, {"metadata": {"name": "x-kubeconfig", "namespace": "ns"}})
    consumer = service(kube, bus)
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-ca"))
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "x-kubeconfig"))
    assert (kube.reads, kube.applied) == (0, [])


async def test_an_admin_kubeconfig_without_clusters_is_logged_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await oidc_ready(kube, consumer)
    put_admin_kubeconfig(kube, {"clusters": []})
    with caplog.at_level(logging.WARNING):
        await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert (SECRET.token, "ns", "c-kubeconfig-user") not in kube.objects
    assert "names no cluster" in caplog.text


# --- the apps -----------------------------------------------------------------------------

WEB = {"subdomain": "abc", "fqdn": "abc.example.org", "label": "Web"}
APP_LABELS = {"azimuth.stackhpc.com/app-template": "hub", "addons.stackhpc.com/cluster": "c"}


def put_app(kube: Kube, *, services: Any = None, labels: Json = APP_LABELS) -> Json:
    annotations = {}
    if services is not None:
        text = services if isinstance(services, str) else json.dumps(services)
        annotations["azimuth.stackhpc.com/services"] = text
    kube.put(
        HELM_RELEASE,
        {
            "metadata": {
                "name": "hub",
                "namespace": "ns",
                "labels": dict(labels),
                "annotations": annotations,
            },
            "spec": {"clusterName": "c"},
        },
    )
    # The stored object itself: a test edits it as another client would.
    return kube.objects[(HELM_RELEASE.token, "ns", "hub")]


def app_platform(kube: Kube) -> Json | None:
    return kube.objects.get((PLATFORM.token, "ns", "kubeapp-hub"))


async def test_an_app_gets_its_platform_and_follows_its_annotation() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    release = put_app(kube, services={"web": WEB})
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    platform = app_platform(kube)
    assert platform is not None
    assert platform["spec"] == {
        "realmName": "ns",
        "zenithServices": {"web": {"subdomain": "abc", "fqdn": "abc.example.org"}},
    }
    [owner] = platform["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "HelmRelease",
        "hub",
        release["metadata"]["uid"],
        True,
    )
    # Its own event coming back, a redelivery, a status change of the release: no write.
    await deliver(consumer, "resources", changed(kube, PLATFORM, "ns", "kubeapp-hub"))
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert kube.applied == [("Platform", "kubeapp-hub")]

    release["metadata"]["annotations"]["azimuth.stackhpc.com/services"] = "{}"
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert kube.applied == [("Platform", "kubeapp-hub")] * 2
    assert app_platform(kube)["spec"] == {"realmName": "ns"}  # type: ignore[index]
    assert bus.published == []


async def test_a_malformed_annotation_is_no_services(caplog: pytest.LogCaptureFixture) -> None:
    kube, bus = world(), Bus()
    put_app(kube, services="{broken")
    with caplog.at_level(logging.WARNING):
        await deliver(service(kube, bus), "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert app_platform(kube)["spec"] == {"realmName": "ns"}  # type: ignore[index]
    assert "is not JSON" in caplog.text


async def test_an_app_without_a_realm_waits_quietly_until_the_realm_nudges_its_cluster() -> None:
    kube, bus = world(), Bus()
    del kube.objects[(REALM.token, "ns", "ns")]
    consumer = service(kube, bus)
    put_app(kube, services={"web": WEB})
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))  # no error
    assert app_platform(kube) is None

    kube.put(REALM, {"metadata": {"name": "ns", "namespace": "ns"}, "status": {"phase": "Ready"}})
    await deliver(consumer, "realms", changed(kube, REALM, "ns", "ns"))
    [nudge] = bus.of(ReconcileCluster)
    await deliver(consumer, "reconciles", nudge)
    assert ("Platform", "kubeapp-hub") in kube.applied
    assert app_platform(kube)["spec"]["zenithServices"]  # type: ignore[index]


async def test_apps_made_before_their_cluster_get_platforms_when_it_appears() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    cluster = kube.objects.pop((CLUSTER.token, "ns", "c"))
    put_app(kube, services={"web": WEB})
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert app_platform(kube) is None  # waits for the Cluster, quietly

    kube.put(CLUSTER, cluster)
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c", "ADDED"))
    platform = app_platform(kube)
    assert platform is not None
    assert platform["spec"]["zenithServices"] == {
        "web": {"subdomain": "abc", "fqdn": "abc.example.org"}
    }
    # Its label puts the Platform's own events in the Cluster's partition (one replica per app).
    assert platform["metadata"]["labels"]["addons.stackhpc.com/cluster"] == "c"

    # The Cluster's later events (its status writes) do not list its apps.
    kube.calls.clear()
    await deliver(consumer, "resources", changed(kube, CLUSTER, "ns", "c"))
    assert HELM_RELEASE.kind not in kube.listed


async def test_a_platform_removed_by_hand_comes_back_from_its_own_event() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    put_app(kube)
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    gone = changed(kube, PLATFORM, "ns", "kubeapp-hub")
    del kube.objects[(PLATFORM.token, "ns", "kubeapp-hub")]
    await deliver(consumer, "resources", gone)
    assert kube.applied == [("Platform", "kubeapp-hub")] * 2


async def test_releases_that_are_not_apps_cost_nothing() -> None:
    kube, bus = world(), Bus()
    put_app(kube, labels={"capi.stackhpc.com/cluster": "c", "addons.stackhpc.com/cluster": "c"})
    await deliver(service(kube, bus), "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert (kube.reads, kube.applied) == (0, [])


async def test_an_app_whose_release_or_cluster_is_going_is_left_alone() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    release = put_app(kube)
    release["metadata"]["deletionTimestamp"] = "now"
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    del release["metadata"]["deletionTimestamp"]
    del kube.objects[(CLUSTER.token, "ns", "c")]
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert kube.applied == []


async def test_with_both_switches_off_apps_and_kubeconfigs_are_acked_untouched() -> None:
    kube, bus = world(), Bus()
    put_app(kube)
    put_admin_kubeconfig(kube)
    consumer = service(kube, bus, enabled=False)
    await deliver(consumer, "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert (kube.reads, kube.applied, bus.published) == (0, [], [])


async def test_a_rejected_app_platform_is_dead_lettered_without_a_cluster_condition() -> None:
    kube, bus = world(), Bus()
    kube.reject("kubeapp-hub")
    put_app(kube)
    with pytest.raises(PermanentError) as raised:
        await deliver(service(kube, bus), "apps", changed(kube, HELM_RELEASE, "ns", "hub"))
    assert raised.value.reason == "Invalid"
    assert bus.published == []  # the app's trouble is not the Cluster's identity


async def test_a_user_kubeconfig_the_server_keeps_changing_is_not_fought() -> None:
    kube, bus = world(), Bus()
    consumer = service(kube, bus)
    await oidc_ready(kube, consumer)
    put_admin_kubeconfig(kube)
    apply = kube.apply

    async def mutating_webhook(kind: ResourceKind, obj: Json, **options: Any) -> Json:
        applied = await apply(kind, obj, **options)
        applied.get("data", {}).pop("value", None)
        return applied

    kube.apply = mutating_webhook  # type: ignore[method-assign]
    with pytest.raises(PermanentError) as raised:
        await deliver(consumer, "kubeconfigs", changed(kube, SECRET, "ns", "c-kubeconfig"))
    assert raised.value.reason == "NotConverging"
