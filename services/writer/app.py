"""The writer's subscriptions: status patches and metadata commands, per Cluster, in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.writer import handlers
from services.writer.logic import StatusCache
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.messages import PatchClusterMetadata, PatchClusterStatus


@dataclass(frozen=True)
class Deps:
    kube: handlers.StatusApi
    journal: handlers.Journal
    cache: StatusCache
    writer: str
    derive: handlers.DeriveStatus
    deadlines: handlers.Deadlines | None = None
    conflict_retries: int = 3
    coalesce_seconds: float = 0.02


def subscriptions(deps: Deps) -> list[Subscription[Any]]:
    async def on_status_patches(batch: Batch[PatchClusterStatus]) -> None:
        await handlers.write_status(
            batch=batch,
            kube=deps.kube,
            journal=deps.journal,
            cache=deps.cache,
            writer=deps.writer,
            derive=deps.derive,
            deadlines=deps.deadlines,
            conflict_retries=deps.conflict_retries,
        )

    async def on_metadata_commands(batch: Batch[PatchClusterMetadata]) -> None:
        await handlers.write_metadata(
            batch=batch,
            kube=deps.kube,
            journal=deps.journal,
            writer=deps.writer,
            conflict_retries=deps.conflict_retries,
        )

    return [
        Subscription(
            name="status",
            stream=subjects.STATUS,
            filters=lambda p: [subjects.cluster_status_in_partition(p)],
            model=PatchClusterStatus,
            handle=on_status_patches,
            coalesce_seconds=deps.coalesce_seconds,
        ),
        Subscription(
            name="meta",
            stream=subjects.STATUS,
            filters=lambda p: [subjects.cluster_metadata_in_partition(p)],
            model=PatchClusterMetadata,
            handle=on_metadata_commands,
        ),
    ]
