"""The helm service's subscriptions: everything that can end a Cluster's wait.

Each translator only picks out the Cluster a message concerns and calls a handler; the
handlers serialise per Cluster.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from services.helm import handlers, logic
from services.helm.handlers import Context
from shared import subjects
from shared.consumer import Batch, Subscription
from shared.messages import PrerequisiteChanged, ReconcileCluster, ResourceChanged
from shared.resources import CAPI_CLUSTER, CLUSTER, CLUSTER_TEMPLATE, SECRET


async def on_cluster(batch: Batch[ResourceChanged], *, ctx: Context) -> None:
    if batch.latest.event != "DELETED":
        await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)


async def on_capi_cluster(batch: Batch[ResourceChanged], *, ctx: Context) -> None:
    # Only its disappearance matters here: it is what a deleting Cluster waits for.
    if batch.latest.event == "DELETED":
        await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)


async def on_cluster_message(
    batch: Batch[PrerequisiteChanged] | Batch[ReconcileCluster], *, ctx: Context
) -> None:
    await handlers.reconcile(key=batch.latest.ref.key, cause=batch.latest, ctx=ctx)


async def on_template(batch: Batch[ResourceChanged], *, ctx: Context) -> None:
    if batch.latest.event != "DELETED":
        await handlers.nudge_users_of_template(
            name=batch.latest.ref.name, cause=batch.latest, ctx=ctx
        )


async def on_secret(batch: Batch[ResourceChanged], *, ctx: Context) -> None:
    event = batch.latest
    if event.event == "ADDED" and logic.may_be_credentials(event.object):
        await handlers.nudge_users_of_secret(
            namespace=event.ref.namespace or "", name=event.ref.name, cause=event, ctx=ctx
        )


def events(kind: str) -> Any:
    return lambda p: [subjects.resource_events_in_partition(kind, p)]


def subscriptions(ctx: Context) -> list[Subscription[Any]]:
    coalesce = ctx.tuning.coalesce_seconds
    lifecycle = subjects.LIFECYCLE
    return [
        Subscription(
            "clusters", subjects.EVENTS, events(CLUSTER.token), ResourceChanged,
            partial(on_cluster, ctx=ctx), coalesce,
        ),
        Subscription(
            "capiclusters", subjects.EVENTS, events(CAPI_CLUSTER.token), ResourceChanged,
            partial(on_capi_cluster, ctx=ctx),
        ),
        Subscription(
            "prerequisites", lifecycle, lambda p: [subjects.prerequisites_in_partition(p)],
            PrerequisiteChanged, partial(on_cluster_message, ctx=ctx), coalesce,
        ),
        Subscription(
            "nudges", lifecycle, lambda p: [subjects.reconciles_in_partition(p)],
            ReconcileCluster, partial(on_cluster_message, ctx=ctx), coalesce,
        ),
        Subscription(
            "templates", subjects.EVENTS, events(CLUSTER_TEMPLATE.token), ResourceChanged,
            partial(on_template, ctx=ctx),
        ),
        Subscription(
            "secrets", subjects.EVENTS, events(SECRET.token), ResourceChanged,
            partial(on_secret, ctx=ctx),
        ),
    ]  # fmt: skip
