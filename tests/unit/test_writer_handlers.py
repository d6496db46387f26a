"""The writer's handlers against the shared fakes (no network), and its claim work through
the composition root."""

import asyncio
from collections.abc import Collection
from typing import Any

import pytest

from services.writer.bootstrap import build
from services.writer.handlers import Deps, seed, write_metadata, write_status
from services.writer.logic import StatusCache
from services.writer.rules import Rule, Rules, rules
from services.writer.settings import WriterSettings
from shared.claims import Claim, ClaimRound
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeInvalid, KubeUnavailable, PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    Condition,
    MetadataChanged,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    StatusWritten,
)
from shared.resources import APP_TEMPLATE, CLUSTER
from shared.status import UnknownKind
from shared.timers import Timers
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]


class Kube(FakeKube):
    """Records the body of every PATCH, status and object apart."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[Json] = []
        self.main_patches: list[Json] = []

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Json,
        *,
        subresource: str | None = None,
    ) -> Json:
        written = await super().patch_merge(kind, namespace, name, patch, subresource=subresource)
        (self.patches if subresource == "status" else self.main_patches).append(patch)
        return written

    def status(self) -> Json:
        return dict(self.objects[("cluster", "t", "c")].get("status") or {})


def cluster(kube: FakeKube, **meta: Any) -> ObjectRef:
    stored = kube.put(CLUSTER, {"metadata": {"name": "c", "namespace": "t", **meta}, "spec": {}})
    return ObjectRef(
        api_version=CLUSTER.api_version,
        kind="Cluster",
        namespace="t",
        name="c",
        uid=stored["metadata"]["uid"],
    )


class Deadlines:
    def __init__(self) -> None:
        self.armed: list[tuple[str, Json, str | None]] = []

    def arm(self, ref: ObjectRef, status: Json, rule: Rule, *, after: str | None = None) -> None:
        self.armed.append((ref.key, status, after))

    def forget(self, ref: ObjectRef) -> None:
        self.armed = [a for a in self.armed if a[0] != ref.key]

    def drop(self, partitions: Collection[int]) -> None:
        self.armed.clear()


def deps(
    kube: FakeKube,
    *,
    journal: FakeBus | None = None,
    cache: StatusCache | None = None,
    rule_set: Rules | None = None,
    deadlines: Deadlines | None = None,
) -> Deps:
    return Deps(
        kube=kube,
        journal=journal or FakeBus(),
        cache=cache or StatusCache(10),
        rules=rule_set or Rules(),
        writer="w1",
        deadlines=deadlines,
    )


def batch(ref: ObjectRef, *patches: Json, token: int = 1) -> Batch[PatchStatus]:
    messages = tuple(
        PatchStatus(source="t", correlation_id="cluster:t/c", ref=ref, patch=p) for p in patches
    )
    return Batch(key="t/c", partition=0, messages=messages, lease_token=token)


def of_conditions(ref: ObjectRef, *conditions: Condition) -> Batch[PatchStatus]:
    message = PatchStatus(source="t", correlation_id="cluster:t/c", ref=ref, conditions=conditions)
    return Batch(key="t/c", partition=0, messages=(message,), lease_token=1)


def written(journal: FakeBus) -> list[StatusWritten]:
    return journal.of(StatusWritten)


async def test_a_batch_becomes_one_uid_guarded_write_recording_every_update() -> None:
    kube, journal = Kube(), FakeBus()
    ref = cluster(kube)
    b = batch(ref, {"phase": "Pending"}, {"phase": "Ready", "nodeCount": 1})
    await write_status(b, deps(kube, journal=journal))
    assert kube.patches == [
        {
            "status": {"phase": "Ready", "nodeCount": 1},
            "metadata": {"uid": ref.uid, "resourceVersion": "1"},
        }
    ]
    (entry,) = written(journal)
    assert entry.update_ids == [m.id for m in b.messages]
    assert not entry.skipped
    assert journal.published[0][0] == "capibus.journal.statuswritten.cluster.t.c"


async def test_a_write_that_changes_nothing_is_skipped() -> None:
    kube, journal = Kube(), FakeBus()
    ref, d = cluster(kube), deps(kube, journal=journal)
    await write_status(batch(ref, {"phase": "Ready"}), d)
    await write_status(batch(ref, {"phase": "Ready"}), d)
    assert len(kube.patches) == 1
    assert [e.skipped for e in written(journal)] == [False, True]


async def test_conflict_is_retried_after_a_fresh_read() -> None:
    kube = Kube()
    ref = cluster(kube)
    kube.fail("patch", KubeConflict("409"))
    await write_status(batch(ref, {"phase": "Ready"}), deps(kube))
    assert kube.status() == {"phase": "Ready"}


async def test_conditions_merge_by_type_and_keep_their_transition_time() -> None:
    kube = Kube()
    ref, d = cluster(kube), deps(kube)
    waiting = Condition(type="LeaseReady", status="False", reason="LeaseNotActive")
    other = Condition(type="IdentityReady", status="True", reason="Ready")
    await write_status(of_conditions(ref, waiting, other), d)
    first = {c["type"]: c for c in kube.status()["conditions"]}
    still = Condition(type="LeaseReady", status="False", reason="LeaseError", message="no hosts")
    await write_status(of_conditions(ref, still), d)
    after = {c["type"]: c for c in kube.status()["conditions"]}
    assert after["LeaseReady"]["reason"] == "LeaseError"
    assert after["LeaseReady"]["message"] == "no hosts"
    assert after["LeaseReady"]["lastTransitionTime"] == first["LeaseReady"]["lastTransitionTime"]
    assert after["IdentityReady"] == first["IdentityReady"]


def counting() -> Rules:
    def derive(status: Json, facts: Any, now: Any) -> Json:
        return {"nodeCount": len(status.get("nodes", {}))}

    return Rules(Rule(CLUSTER, derive=derive))


async def test_derived_keys_ride_along_and_are_not_rewritten_when_unchanged() -> None:
    kube = Kube()
    ref, d = cluster(kube), deps(kube, rule_set=counting())
    await write_status(batch(ref, {"nodes": {"a": {"phase": "Ready"}}}), d)
    assert kube.patches[-1]["status"] == {"nodes": {"a": {"phase": "Ready"}}, "nodeCount": 1}
    await write_status(batch(ref, {"nodes": {"a": {"phase": "Ready"}}}), d)
    assert len(kube.patches) == 1


async def test_other_kinds_are_written_with_their_own_rule() -> None:
    kube, journal = Kube(), FakeBus()
    stored = kube.put(APP_TEMPLATE, {"metadata": {"name": "app"}, "spec": {}})
    ref = ObjectRef(
        api_version=APP_TEMPLATE.api_version,
        kind="AppTemplate",
        name="app",
        uid=stored["metadata"]["uid"],
    )
    message = PatchStatus(source="t", correlation_id="c", ref=ref, patch={"label": "App"})
    b = Batch(key="/app", partition=0, messages=(message,), lease_token=1)
    await write_status(b, deps(kube, journal=journal, rule_set=rules(cluster_timeout_seconds=60)))
    assert kube.objects[("apptemplate", "", "app")]["status"] == {"label": "App"}
    assert journal.published[0][0] == "capibus.journal.statuswritten.apptemplate._.app"


async def test_a_kind_the_writer_does_not_write_is_permanent() -> None:
    ref = ObjectRef(api_version="v1", kind="ConfigMap", namespace="t", name="c")
    message = PatchStatus(source="t", correlation_id="c", ref=ref, patch={"a": 1})
    with pytest.raises(UnknownKind):
        await write_status(Batch(key="t/c", partition=0, messages=(message,)), deps(Kube()))


async def test_metadata_commands_respect_generation_and_keep_other_finalizers() -> None:
    kube, journal = Kube(), FakeBus()
    ref = cluster(kube, generation=2, finalizers=["someone/else"], labels={"keep": "me"})
    d = deps(kube, journal=journal)
    stale = meta_command(
        ref, if_generation=1, labels={"azimuth.stackhpc.com/cluster-template": "t"}
    )
    await write_metadata(meta_batch(stale), d)
    assert kube.main_patches == []
    current = meta_command(
        ref,
        if_generation=2,
        add_finalizers=("azimuth.stackhpc.com/finalizer",),
        labels={"azimuth.stackhpc.com/cluster-template": "t"},
    )
    await write_metadata(meta_batch(current), d)
    (patch,) = kube.main_patches
    assert patch["metadata"]["finalizers"] == ["someone/else", "azimuth.stackhpc.com/finalizer"]
    assert patch["metadata"]["labels"] == {"azimuth.stackhpc.com/cluster-template": "t"}
    assert patch["metadata"]["resourceVersion"] == "1"
    assert len(journal.of(MetadataChanged)) == 2


def meta_command(ref: ObjectRef, **fields: Any) -> PatchMetadata:
    return PatchMetadata(source="t", correlation_id="cluster:t/c", ref=ref, **fields)


def meta_batch(*commands: PatchMetadata) -> Batch[PatchMetadata]:
    return Batch(key="t/c", partition=0, messages=commands)


async def test_a_cluster_being_deleted_is_written_as_deleting_even_from_a_stale_cache() -> None:
    kube = Kube()
    ref = cluster(kube, finalizers=["azimuth.stackhpc.com/finalizer"])
    d = deps(kube, rule_set=rules(cluster_timeout_seconds=1800))
    await write_status(batch(ref, {"networkingPhase": "Provisioned"}), d)
    assert kube.status()["phase"] == "Pending"
    # The deletion moves the resourceVersion: the cached snapshot's precondition fails.
    await kube.patch_merge(
        CLUSTER, "t", "c", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}
    )
    waiting = Condition(type="Reconciled", status="False", reason="WaitingForClusterAPI")
    await write_status(of_conditions(ref, waiting), d)
    assert kube.status()["phase"] == "Deleting"
    assert kube.patches[-1]["status"]["phase"] == "Deleting"


async def test_gone_or_replaced_cluster_drops_the_updates() -> None:
    gone, replaced = Kube(), Kube()
    ref = cluster(replaced)
    replaced.objects.clear()
    cluster(replaced)  # the same name again: a new uid
    for kube in (gone, replaced):
        journal = FakeBus()
        await write_status(batch(ref, {"phase": "Ready"}), deps(kube, journal=journal))
        assert kube.patches == []
        assert written(journal) == []


async def test_persistent_422_is_permanent() -> None:
    kube = Kube()
    ref = cluster(kube)
    kube.fail("patch", *(KubeInvalid("422 phase: Unsupported value") for _ in range(5)))
    with pytest.raises(PermanentError, match="Unsupported value"):
        await write_status(batch(ref, {"phase": "Bogus"}), deps(kube))


async def test_a_partition_that_came_back_is_read_again_before_skipping() -> None:
    kube, journal = Kube(), FakeBus()
    ref, d = cluster(kube), deps(kube, journal=journal)
    await write_status(batch(ref, {"nodes": {"a": {"phase": "Ready"}}}, token=1), d)
    # While the partition was with another replica, that one wrote the node Unhealthy.
    await kube.patch_merge(
        CLUSTER,
        "t",
        "c",
        {"status": {"nodes": {"a": {"phase": "Unhealthy"}}}},
        subresource="status",
    )
    await write_status(batch(ref, {"nodes": {"a": {"phase": "Ready"}}}, token=2), d)
    assert kube.status()["nodes"]["a"]["phase"] == "Ready"
    assert [e.skipped for e in written(journal)] == [False, False]


async def test_every_write_names_the_version_it_was_computed_from() -> None:
    kube = Kube()
    ref, d = cluster(kube), deps(kube)
    await write_status(batch(ref, {"phase": "Pending"}), d)
    await write_status(batch(ref, {"phase": "Ready"}), d)
    assert [p["metadata"]["resourceVersion"] for p in kube.patches] == ["1", "2"]
    assert kube.reads == 1  # the second write came from the cache


async def test_a_seeded_cache_needs_no_read_before_the_first_write() -> None:
    kube = Kube()
    ref, d = cluster(kube), deps(kube)
    assert await seed(Claim(0, 5), d) == 1
    reads = kube.reads
    await write_status(batch(ref, {"phase": "Ready"}, token=5), d)
    assert kube.reads == reads
    assert len(kube.patches) == 1


# --- deadlines --------------------------------------------------------------------------------


async def test_a_write_arms_the_timer_from_the_status_written() -> None:
    kube, deadlines = Kube(), Deadlines()
    ref = cluster(kube)
    stuck = {"phase": "Reconciling", "lastUpdated": "2026-01-01T00:00:00Z"}
    await write_status(batch(ref, stuck), deps(kube, deadlines=deadlines))
    assert deadlines.armed == [("t/c", stuck, None)]


async def test_a_skipped_write_arms_again_after_the_nudge_it_consumed() -> None:
    """A nudge from a replica whose clock runs ahead changes nothing; the next must differ."""
    kube, journal, deadlines = Kube(), FakeBus(), Deadlines()
    ref = cluster(kube)
    d = deps(kube, journal=journal, deadlines=deadlines)
    stuck = {"phase": "Reconciling", "lastUpdated": "2026-01-01T00:00:00Z"}
    await write_status(batch(ref, stuck), d)
    await write_status(batch(ref, stuck), d)
    nudge = batch(ref, {})
    await write_status(nudge, d)
    assert [e.skipped for e in written(journal)] == [False, True, True]
    assert deadlines.armed == [
        ("t/c", stuck, None),
        ("t/c", stuck, None),
        ("t/c", stuck, nudge.latest.id),
    ]


async def test_a_claim_seeds_the_cache_and_arms_the_claimed_clusters_through_retries() -> None:
    kube = Kube()
    cluster(kube)
    await kube.patch_merge(
        CLUSTER,
        "t",
        "c",
        {"status": {"phase": "Upgrading", "lastUpdated": "2026-01-01T00:00:00Z"}},
        subresource="status",
    )
    kube.fail("list", KubeUnavailable("503"), KubeUnavailable("503"))
    settings = WriterSettings(replica="w1", partitions=1, consumer={"backoff_base": 0.01})
    timers = Timers(FakeBus())
    consumer = build(settings, bus=FakeBus(), leases=Leases(), kube=kube, timers=timers)
    assert consumer.claims is not None
    await consumer.claims.follow({0: 7})
    for _ in range(100):
        if timers.pending():
            break
        await asyncio.sleep(0.01)
    assert list(timers.pending()) == ["Cluster/t/c"]
    await consumer.claims.close()
    assert timers.pending() == {}  # the lost partition's timers went with it


async def test_the_seed_arms_from_a_newer_write_of_the_same_claim() -> None:
    kube, deadlines = Kube(), Deadlines()
    ref = cluster(kube)
    cache = StatusCache(10)
    d = deps(kube, cache=cache, deadlines=deadlines)
    claim_round = ClaimRound()
    await claim_round.once("cluster", lambda: kube.list(CLUSTER))  # listed before the write
    await write_status(batch(ref, {"phase": "Ready"}, token=5), d)
    deadlines.armed.clear()
    await seed(Claim(0, 5, claim_round), d)
    assert deadlines.armed == [("t/c", {"phase": "Ready"}, None)]


class Leases:
    ttl = 10.0
