"""The helm service's subscriptions: everything that can end a Cluster's wait.

Each subscription only translates its message into the Cluster it concerns and calls a
handler; the handlers serialise per Cluster.
"""

from __future__ import annotations

from typing import Any

from services.helm import handlers, logic
from services.helm.handlers import Context
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.messages import PrerequisiteChanged, ReconcileCluster, ResourceChanged
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, SECRET

def events(kind: str) -> Any:
    return lambda p: [subjects.resource_events_in_partition(kind, p)]


def subscriptions(ctx: Context) -> list[Subscription[Any]]:
    async def on_cluster(batch: Batch[ResourceChanged]) -> None:
        if batch.latest.event != "DELETED":
            await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)

    async def on_capi_cluster(batch: Batch[ResourceChanged]) -> None:
        # Only its disappearance matters here: it is what a deleting Cluster waits for.
        if batch.latest.event == "DELETED":
            await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)

    async def on_prerequisite(batch: Batch[PrerequisiteChanged]) -> None:
        await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)

    async def on_nudge(batch: Batch[ReconcileCluster]) -> None:
        await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)

    async def on_template(batch: Batch[ResourceChanged]) -> None:
        if batch.latest.event != "DELETED":
            await handlers.nudge_users_of_template(
                name=batch.latest.ref.name, cause=batch.latest, ctx=ctx
            )

    async def on_secret(batch: Batch[ResourceChanged]) -> None:
        event = batch.latest
        if event.event == "ADDED" and logic.may_be_credentials(event.object):
            await handlers.nudge_users_of_secret(
                namespace=event.ref.namespace or "", name=event.ref.name, cause=event, ctx=ctx
            )

    coalesce = ctx.tuning.coalesce_seconds
    return [
        Subscription(
            "clusters",
            subjects.EVENTS,
            events(CLUSTER.token),
            ResourceChanged,
            on_cluster,
            coalesce,
        ),
        Subscription(
            "capiclusters",
            subjects.EVENTS,
            events(CAPI_CLUSTER.token),
            ResourceChanged,
            on_capi_cluster,
        ),
        Subscription(
            "prerequisites",
            subjects.LIFECYCLE,
            lambda p: [subjects.prerequisites_in_partition(p)],
            PrerequisiteChanged,
            on_prerequisite,
            coalesce,
        ),
        Subscription(
            "nudges",
            subjects.LIFECYCLE,
            lambda p: [subjects.reconciles_in_partition(p)],
            ReconcileCluster,
            on_nudge,
            coalesce,
        ),
        Subscription(
            "templates",
            subjects.EVENTS,
            events(CLUSTER_TEMPLATE.token),
            ResourceChanged,
            on_template,
        ),
        Subscription("secrets", subjects.EVENTS, events(SECRET.token), ResourceChanged, on_secret),
    ]
