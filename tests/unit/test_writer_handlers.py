"""The writer's handler against fakes of its two Protocols (no network)."""

from typing import Any

import pytest

from services.writer.handlers import write_status
from services.writer.logic import StatusCache
from shared.bus import Published
from shared.consumer import Batch
from shared.errors import KubeConflict, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.messages import ClusterStatusWritten, Message, ObjectRef, PatchClusterStatus

REF = ObjectRef(
    api_version="azimuth.stackhpc.com/v1alpha1", kind="Cluster", namespace="t", name="c", uid="u1"
)


class FakeApi:
    def __init__(self, *failures: Exception, uid: str = "u1") -> None:
        self.failures = list(failures)
        self.uid = uid
        self.status: dict[str, Any] = {}
        self.patches: list[dict[str, Any]] = []

    def _obj(self) -> dict[str, Any]:
        return {
            "metadata": {"uid": self.uid, "resourceVersion": str(len(self.patches))},
            "status": self.status,
        }

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        return self._obj()

    async def patch_merge(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        assert subresource == "status"
        if self.failures:
            raise self.failures.pop(0)
        self.patches.append(patch)
        self.status = {**self.status, **patch["status"]}
        return self._obj()


class FakeJournal:
    def __init__(self) -> None:
        self.entries: list[ClusterStatusWritten] = []

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published:
        assert isinstance(message, ClusterStatusWritten)
        self.entries.append(message)
        return Published(sequence=len(self.entries), duplicate=False)


def batch(*patches: dict[str, Any]) -> Batch[PatchClusterStatus]:
    messages = tuple(
        PatchClusterStatus(source="t", correlation_id="cluster:t/c", ref=REF, patch=p)
        for p in patches
    )
    return Batch(key="t/c", partition=0, messages=messages)


async def run(
    api: FakeApi,
    journal: FakeJournal,
    b: Batch[PatchClusterStatus],
    cache: StatusCache | None = None,
) -> None:
    await write_status(
        batch=b, kube=api, journal=journal, cache=cache or StatusCache(10), writer="w1"
    )


async def test_a_batch_becomes_one_uid_guarded_write_recording_every_update() -> None:
    api, journal = FakeApi(), FakeJournal()
    b = batch({"phase": "Pending"}, {"phase": "Ready", "nodeCount": 1})
    await run(api, journal, b)
    assert api.patches == [
        {"status": {"phase": "Ready", "nodeCount": 1}, "metadata": {"uid": "u1"}}
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
