"""The identity service's work: converge one Cluster, and point Realm changes at Clusters.

``reconcile_cluster`` is level-triggered and idempotent. Under the Cluster's lock it reads the
Cluster, the namespace's Realms, the OIDCClient and the Platform, then lets ``logic.next_step``
choose between applying a document (server-side apply, ``force``, our field manager) and a
verdict. A document that is already current is not applied, so a replayed or redelivered event
costs reads only; an applied one comes back as an event that runs the Cluster again, which is
how waiting works without a timer. The same apply re-adopts an OIDCClient that lost its
ownerReference (a Velero restore, capi-operator.md H7 step 1).

- 404 on the Cluster, or a deleting or paused Cluster: nothing to do (garbage collection
  removes the OIDCClient and Platform through their ownerReference).
- 422 on an apply (e.g. a Realm name the Platform schema refuses): the condition says
  ``Invalid`` first, then ``PermanentError`` dead-letters the event with the reason.
- ``TemporaryError`` (429, 5xx, 409, NATS down) passes through: the consumer retries.

``nudge_realm_users`` runs in the Realm's own partition (a Realm belongs to no Cluster) and
sends ``ReconcileCluster`` into the partition of each Cluster that uses it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from services.identity import logic
from shared import subjects
from shared.bus import Published
from shared.errors import BadMessage, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import Message, PrerequisiteChanged, ResourceChanged, decode
from shared.resources import CLUSTER, OIDC_CLIENT, PLATFORM, REALM

log = logging.getLogger(__name__)

Json = dict[str, Any]

#: Applies one run may make: the OIDCClient, then the Platform.
MAX_APPLIES = 2


class KubeApi(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def list(
        self, kind: ResourceKind, *, namespace: str | None = None
    ) -> tuple[list[Json], str]: ...

    async def apply(
        self, kind: ResourceKind, obj: Json, *, field_manager: str, force: bool = True
    ) -> Json: ...


class Publisher(Protocol):
    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None = None
    ) -> Published: ...

    async def last_message(self, stream: str, subject: str) -> bytes | None: ...


@dataclass(frozen=True)
class Config:
    source: str
    partitions: int
    field_manager: str
    oidc_client_name_template: str
    platform_name_template: str

    def names(self, cluster_name: str) -> logic.Names:
        return logic.Names(
            oidc_client=self.oidc_client_name_template.format(cluster_name=cluster_name),
            platform=self.platform_name_template.format(cluster_name=cluster_name),
        )


async def reconcile_cluster(
    *,
    namespace: str,
    name: str,
    cause: Message,
    kube: KubeApi,
    bus: Publisher,
    locks: KeyedLocks,
    config: Config,
) -> None:
    async with locks(f"{namespace}/{name}"):
        observed = await _observe(namespace, name, kube=kube, config=config)
        if observed is None:
            return
        for _ in range(MAX_APPLIES + 1):
            step = logic.next_step(observed, config.names(name))
            if isinstance(step, logic.Verdict):
                await _report(step, observed.cluster, cause=cause, bus=bus, config=config)
                return
            applied = await _apply(
                step, observed.cluster, cause=cause, kube=kube, bus=bus, config=config
            )
            observed = observed.with_applied(step.kind, applied)
        raise PermanentError(
            f"{namespace}/{name}: applied documents do not stay as applied", reason="NotConverging"
        )


async def _observe(
    namespace: str, name: str, *, kube: KubeApi, config: Config
) -> logic.Observed | None:
    cluster = await _get(kube, CLUSTER, namespace, name)
    if cluster is None or not logic.is_active(cluster):
        return None
    names = config.names(name)
    try:
        realms, _ = await kube.list(REALM, namespace=namespace)
    except KubeNotFound:
        realms = []  # the Realm kind is not installed: as good as no Realm, until one appears
    return logic.Observed(
        cluster=cluster,
        realms=realms,
        oidc_client=await _get(kube, OIDC_CLIENT, namespace, names.oidc_client),
        platform=await _get(kube, PLATFORM, namespace, names.platform),
    )


async def _get(kube: KubeApi, kind: ResourceKind, namespace: str, name: str) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def _apply(
    step: logic.Apply,
    cluster: Json,
    *,
    cause: Message,
    kube: KubeApi,
    bus: Publisher,
    config: Config,
) -> Json:
    name = step.document["metadata"]["name"]
    try:
        applied = await kube.apply(
            step.kind, step.document, field_manager=config.field_manager, force=True
        )
    except KubeInvalid as exc:
        await _report(
            logic.rejected(step.kind, name, exc), cluster, cause=cause, bus=bus, config=config
        )
        raise PermanentError(str(exc), reason=logic.Reason.INVALID) from exc
    log.info("%s: applied %s %s", logic.cluster_ref(cluster).key, step.kind.kind, name)
    return applied


async def _report(
    verdict: logic.Verdict, cluster: Json, *, cause: Message, bus: Publisher, config: Config
) -> None:
    ref = logic.cluster_ref(cluster)
    partition = subjects.partition_of(ref.key, config.partitions)
    last = await _last_prerequisite(bus, logic.prerequisite_subject(ref, partition))
    envelope = logic.Envelope(source=config.source, causation_id=cause.id)
    messages = logic.publications(
        verdict, cluster=cluster, partition=partition, last=last, envelope=envelope
    )
    for subject, message in messages:
        await bus.publish(subject, message)
    if messages:
        log.info("%s: identity %s: %s", ref.key, verdict.reason, verdict.message)


async def _last_prerequisite(bus: Publisher, subject: str) -> PrerequisiteChanged | None:
    body = await bus.last_message(subjects.LIFECYCLE.name, subject)
    if body is None:
        return None
    try:
        return decode(body, PrerequisiteChanged)
    except BadMessage:
        return None  # not something we said; say it again


async def nudge_realm_users(
    *, realm: ResourceChanged, kube: KubeApi, bus: Publisher, config: Config
) -> None:
    namespace, name = realm.ref.namespace, realm.ref.name
    if not namespace:
        return
    clusters, _ = await kube.list(CLUSTER, namespace=namespace)
    realms, _ = await kube.list(REALM, namespace=namespace)
    names = [r["metadata"]["name"] for r in realms]
    reason = f"Realm {name} {realm.event.lower()}"
    for cluster in clusters:
        if not logic.uses_realm(cluster, name, names):
            continue
        subject, message = logic.nudge(
            cluster, reason=reason, partitions=config.partitions, cause=realm, source=config.source
        )
        await bus.publish(subject, message)
