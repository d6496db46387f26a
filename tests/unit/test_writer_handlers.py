"""The writer's handlers against fakes of their Protocols (no network), and its ownership
listener through the composition root."""

import asyncio
from typing import Any

import pytest

from services.writer.bootstrap import build
from services.writer.handlers import DeriveStatus, seed_cache, write_metadata, write_status
from services.writer.logic import StatusCache, apply
from services.writer.settings import WriterSettings
from shared.bus import Published
from shared.consumer import Batch, Ownership
from shared.errors import KubeConflict, KubeInvalid, KubeNotFound, KubeUnavailable, PermanentError
from shared.kube import ResourceKind
from shared.messages import (
    Condition,
    Message,
    MetadataChanged,
    ObjectRef,
    PatchMetadata,
    PatchStatus,
    StatusWritten,
)
from shared.phase import derive as derive_phase
from shared.resources import CLUSTER

REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="t", name="c", uid="u1"
)


class FakeApi:
    def __init__(self, *failures: Exception, uid: str = "u1") -> None:
        self.failures = list(failures)
        self.uid = uid
        self.status: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.patches: list[dict[str, Any]] = []
        self.main_patches: list[dict[str, Any]] = []
        self.reads = 0

    def _obj(self) -> dict[str, Any]:
        return {
            "metadata": {**self.meta, "uid": self.uid, "resourceVersion": str(len(self.patches))},
            "spec": {},
            "status": self.status,
        }

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        self.reads += 1
        return self._obj()

    async def list(self, kind: ResourceKind) -> tuple[list[dict[str, Any]], str]:
        return [
            {**self._obj(), "metadata": {**self._obj()["metadata"], "name": "c", "namespace": "t"}}
        ], "1"

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        if subresource is None:
            self.main_patches.append(patch)
            return self._obj()
        assert subresource == "status"
        if self.failures:
            raise self.failures.pop(0)
        self.patches.append(patch)
        self.status = apply(self.status, patch["status"])
        return self._obj()


class FakeJournal:
    def __init__(self) -> None:
        self.entries: list[StatusWritten] = []

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        if isinstance(message, MetadataChanged):
            return Published(sequence=0, duplicate=False)
        assert isinstance(message, StatusWritten)
        self.entries.append(message)
        return Published(sequence=len(self.entries), duplicate=False)


def batch(*patches: dict[str, Any], token: int = 1) -> Batch[PatchStatus]:
    messages = tuple(
        PatchStatus(source="t", correlation_id="cluster:t/c", ref=REF, patch=p) for p in patches
    )
    return Batch(key="t/c", partition=0, messages=messages, lease_token=token)


async def run(
    api: FakeApi,
    journal: FakeJournal,
    b: Batch[PatchStatus],
    cache: StatusCache | None = None,
    derive: DeriveStatus | None = None,
) -> None:
    await write_status(
        batch=b,
        kube=api,
        journal=journal,
        cache=cache or StatusCache(10),
        writer="w1",
        derive=derive or (lambda status, lease, deleting, now: {}),
    )


async def test_a_batch_becomes_one_uid_guarded_write_recording_every_update() -> None:
    api, journal = FakeApi(), FakeJournal()
    b = batch({"phase": "Pending"}, {"phase": "Ready", "nodeCount": 1})
    await run(api, journal, b)
    assert api.patches == [
        {
            "status": {"phase": "Ready", "nodeCount": 1},
            "metadata": {"uid": "u1", "resourceVersion": "0"},
        }
    ]
    assert journal.entries[0].update_ids == [m.id for m in b.messages]
    assert not journal.entries[0].skipped


async def test_a_write_that_changes_nothing_is_skipped() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)
    await run(api, journal, batch({"phase": "Ready"}), cache)
    await run(api, journal, batch({"phase": "Ready"}), cache)
    assert len(api.patches) == 1
    assert [e.skipped for e in journal.entries] == [False, True]


async def test_conflict_is_retried_after_a_fresh_read() -> None:
    api, journal = FakeApi(KubeConflict("409")), FakeJournal()
    await run(api, journal, batch({"phase": "Ready"}))
    assert len(api.patches) == 1


async def test_conditions_merge_by_type_and_keep_their_transition_time() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)
    waiting = Condition(type="LeaseReady", status="False", reason="LeaseNotActive")
    other = Condition(type="IdentityReady", status="True", reason="Ready")
    await run(api, journal, batch_of(conditions=(waiting, other)), cache)
    first = {c["type"]: c for c in api.status["conditions"]}
    still = Condition(type="LeaseReady", status="False", reason="LeaseError", message="no hosts")
    await run(api, journal, batch_of(conditions=(still,)), cache)
    after = {c["type"]: c for c in api.status["conditions"]}
    assert after["LeaseReady"]["reason"] == "LeaseError"
    assert after["LeaseReady"]["message"] == "no hosts"
    assert after["LeaseReady"]["lastTransitionTime"] == first["LeaseReady"]["lastTransitionTime"]
    assert after["IdentityReady"] == first["IdentityReady"]


async def test_derived_keys_ride_along_and_are_not_rewritten_when_unchanged() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)

    def derive(
        status: dict[str, Any], lease: str | None, deleting: bool, now: Any
    ) -> dict[str, Any]:
        return {"nodeCount": len(status.get("nodes", {}))}

    await run(api, journal, batch({"nodes": {"a": {"phase": "Ready"}}}), cache, derive)
    assert api.patches[-1]["status"] == {"nodes": {"a": {"phase": "Ready"}}, "nodeCount": 1}
    await run(api, journal, batch({"nodes": {"a": {"phase": "Ready"}}}), cache, derive)
    assert len(api.patches) == 1


async def test_metadata_commands_respect_generation_and_keep_other_finalizers() -> None:
    api, journal = FakeApi(), FakeJournal()
    api.meta = {"generation": 2, "finalizers": ["someone/else"], "labels": {"keep": "me"}}
    stale = meta_command(if_generation=1, labels={"azimuth.stackhpc.com/cluster-template": "t"})
    await write_metadata(batch=meta_batch(stale), kube=api, journal=journal, writer="w1")
    assert api.main_patches == []
    current = meta_command(
        if_generation=2,
        add_finalizers=("azimuth.stackhpc.com/finalizer",),
        labels={"azimuth.stackhpc.com/cluster-template": "t"},
    )
    await write_metadata(batch=meta_batch(current), kube=api, journal=journal, writer="w1")
    (patch,) = api.main_patches
    assert patch["metadata"]["finalizers"] == ["someone/else", "azimuth.stackhpc.com/finalizer"]
    assert patch["metadata"]["labels"] == {"azimuth.stackhpc.com/cluster-template": "t"}
    assert patch["metadata"]["resourceVersion"] == "0"


def meta_command(**fields: Any) -> PatchMetadata:
    return PatchMetadata(source="t", correlation_id="cluster:t/c", ref=REF, **fields)


def meta_batch(*commands: PatchMetadata) -> Batch[PatchMetadata]:
    return Batch(key="t/c", partition=0, messages=commands)


def batch_of(*, conditions: tuple[Condition, ...]) -> Batch[PatchStatus]:
    message = PatchStatus(source="t", correlation_id="cluster:t/c", ref=REF, conditions=conditions)
    return Batch(key="t/c", partition=0, messages=(message,))


def phase_rules(status: dict[str, Any], lease: str | None, deleting: bool, now: Any) -> Any:
    return derive_phase(status, lease_name=lease, now=now, deleting=deleting)


async def test_a_cluster_being_deleted_is_written_as_deleting_even_from_a_stale_cache() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)
    await run(api, journal, batch({"networkingPhase": "Provisioned"}), cache, phase_rules)
    assert api.status["phase"] == "Pending"
    # The deletion moved the resourceVersion: the cached snapshot's precondition fails.
    api.meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api.failures.append(KubeConflict("409 the object has been modified"))
    waiting = Condition(type="Reconciled", status="False", reason="WaitingForClusterAPI")
    await run(api, journal, batch_of(conditions=(waiting,)), cache, phase_rules)
    assert api.status["phase"] == "Deleting"
    assert api.patches[-1]["status"]["phase"] == "Deleting"


async def test_gone_or_replaced_cluster_drops_the_updates() -> None:
    for api in (FakeApi(KubeNotFound("404")), FakeApi(KubeConflict("uid precondition"), uid="u2")):
        journal = FakeJournal()
        await run(api, journal, batch({"phase": "Ready"}))
        assert api.patches == []
        assert journal.entries == []


async def test_persistent_422_is_permanent() -> None:
    api = FakeApi(*(KubeInvalid("422 phase: Unsupported value") for _ in range(5)))
    with pytest.raises(PermanentError, match="Unsupported value"):
        await run(api, FakeJournal(), batch({"phase": "Bogus"}))


async def test_a_partition_that_came_back_is_read_again_before_skipping() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)
    await run(api, journal, batch({"nodes": {"a": {"phase": "Ready"}}}, token=1), cache)
    # While the partition was with another replica, that one wrote the node Unhealthy.
    api.status = apply(api.status, {"nodes": {"a": {"phase": "Unhealthy"}}})
    await run(api, journal, batch({"nodes": {"a": {"phase": "Ready"}}}, token=2), cache)
    assert api.status["nodes"]["a"]["phase"] == "Ready"
    assert [e.skipped for e in journal.entries] == [False, False]


async def test_every_write_names_the_version_it_was_computed_from() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)
    await run(api, journal, batch({"phase": "Pending"}), cache)
    await run(api, journal, batch({"phase": "Ready"}), cache)
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["0", "1"]
    assert api.reads == 1  # the second write came from the cache


async def test_a_seeded_cache_needs_no_read_before_the_first_write() -> None:
    api, journal, cache = FakeApi(), FakeJournal(), StatusCache(10)
    assert await seed_cache(claims={0: 5}, kube=api, cache=cache, partitions=1) == 1
    await run(api, journal, batch({"phase": "Ready"}, token=5), cache)
    assert api.reads == 0
    assert len(api.patches) == 1
    assert await seed_cache(claims={}, kube=api, cache=cache, partitions=1) == 0


# --- the timeout's timers ----------------------------------------------------------------


class FakeDeadlines:
    def __init__(self) -> None:
        self.armed: list[tuple[str, dict[str, Any], str | None]] = []

    def arm(self, ref: ObjectRef, status: dict[str, Any], *, after: str | None = None) -> None:
        self.armed.append((ref.key, status, after))


async def test_a_write_arms_the_timer_from_the_status_written() -> None:
    api, journal, deadlines = FakeApi(), FakeJournal(), FakeDeadlines()
    await write_status(
        batch=batch({"phase": "Reconciling", "lastUpdated": "2026-01-01T00:00:00Z"}),
        kube=api,
        journal=journal,
        cache=StatusCache(10),
        writer="w1",
        derive=lambda status, lease, deleting, now: {},
        deadlines=deadlines,
    )
    assert deadlines.armed == [
        ("t/c", {"phase": "Reconciling", "lastUpdated": "2026-01-01T00:00:00Z"}, None)
    ]


async def test_a_skipped_write_arms_again_after_the_nudge_it_consumed() -> None:
    """A nudge from a replica whose clock runs ahead changes nothing; the next must differ."""
    api, journal, deadlines, cache = FakeApi(), FakeJournal(), FakeDeadlines(), StatusCache(10)
    stuck = {"phase": "Reconciling", "lastUpdated": "2026-01-01T00:00:00Z"}

    async def write(b: Batch[PatchStatus]) -> None:
        await write_status(
            batch=b,
            kube=api,
            journal=journal,
            cache=cache,
            writer="w1",
            derive=lambda status, lease, deleting, now: {},
            deadlines=deadlines,
        )

    await write(batch(stuck))
    await write(batch(stuck))
    nudge = batch({})
    await write(nudge)
    assert [e.skipped for e in journal.entries] == [False, True, True]
    assert deadlines.armed == [
        ("t/c", stuck, None),
        ("t/c", stuck, None),
        ("t/c", stuck, nudge.latest.id),
    ]


async def test_a_claim_seeds_the_cache_and_arms_the_claimed_clusters_through_retries() -> None:
    api, deadlines = FakeApi(), FakeDeadlines()
    api.status = {"phase": "Upgrading", "lastUpdated": "2026-01-01T00:00:00Z"}
    failures = [KubeUnavailable("503"), KubeUnavailable("503")]
    listed = api.list

    async def flaky_list(kind: ResourceKind) -> tuple[list[dict[str, Any]], str]:
        if failures:
            raise failures.pop(0)
        return await listed(kind)

    api.list = flaky_list  # type: ignore[method-assign]
    settings = WriterSettings(replica="w1", partitions=1, consumer={"backoff_base": 0.01})
    consumer = build(settings, bus=None, leases=None, kube=api, deadlines=deadlines)  # type: ignore[arg-type]
    assert consumer.on_ownership is not None
    await consumer.on_ownership(Ownership({0: 7}))
    for _ in range(100):
        if deadlines.armed:
            break
        await asyncio.sleep(0.01)
    assert failures == []
    assert deadlines.armed == [("t/c", api.status, None)]


async def test_the_seed_arms_from_a_newer_write_of_the_same_claim() -> None:
    api, journal, deadlines, cache = FakeApi(), FakeJournal(), FakeDeadlines(), StatusCache(10)
    listed = await api.list(CLUSTER)
    await run(api, journal, batch({"phase": "Ready"}, token=5), cache)
    api.list = lambda kind: _returning(listed)  # type: ignore[method-assign,assignment]
    await seed_cache(claims={0: 5}, kube=api, cache=cache, partitions=1, deadlines=deadlines)
    assert deadlines.armed == [("t/c", {"phase": "Ready"}, None)]


async def _returning(value: Any) -> Any:
    return value
