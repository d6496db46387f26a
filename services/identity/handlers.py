"""The identity service's work: converge one Cluster, its user kubeconfig and its apps'
Platforms, and point Realm changes at Clusters.

``reconcile_cluster`` is level-triggered and idempotent. Under the Cluster's lock it reads the
Cluster, the namespace's Realms, the OIDCClient and the Platform, then lets ``logic.next_step``
choose between applying a document (server-side apply, ``force``, our field manager) and a
verdict. A document that is already current is not applied, so a replayed or redelivered event
costs reads only; an applied one comes back as an event that runs the Cluster again, which is
how waiting works without a timer. The same apply re-adopts an OIDCClient that lost its
ownerReference (a Velero restore, capi-operator.md H7 step 1).

- 404 on the Cluster, or a deleting Cluster: nothing to do (garbage collection removes the
  OIDCClient and Platform through their ownerReference).
- A paused Cluster: only an existing Platform is refreshed, nothing is reported
  (``logic`` module docstring, "Paused").
- 422 on an apply (e.g. a Realm name the Platform schema refuses): the condition says
  ``Invalid`` first, then ``PermanentError`` dead-letters the event with the reason.
- ``TemporaryError`` (429, 5xx, 409, NATS down) passes through: the consumer retries.

With OIDC off (Zenith on) the same run keeps the Platform only and reports nothing: the helm
service does not wait for identity then.

``reconcile_user_kubeconfig`` (OIDC on) writes ``<cluster>-kubeconfig-user`` from the admin
kubeconfig and the OIDCClient (``kubeconfig``); it runs on their events, not on every Cluster
event, so status writes cost it nothing. It is derived data, as upstream's H16 which ignores
``paused``: a paused Cluster's users still get a kubeconfig that matches its API server and
issuer. ``reconcile_app`` keeps one app's Platform (``apps``); ``reconcile_cluster_apps``
re-checks all apps of a Cluster that appeared or was nudged, which is how a Cluster created
after its apps, or a Realm that appears, reaches apps that were waiting for it. Neither writes
what is already there, and both check the apply's answer: a server that keeps changing what we
apply dead-letters the event instead of looping through our own events.

``nudge_realm_users`` runs in the Realm's own partition (a Realm belongs to no Cluster) and
sends ``ReconcileCluster`` into the partition of each Cluster that uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from services.identity import apps, kubeconfig, logic
from shared import subjects
from shared.bus import Published
from shared.errors import BadMessage, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import Message, PrerequisiteChanged, ResourceChanged, decode
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET, ref_to

log = logging.getLogger(__name__)

Json = dict[str, Any]

#: Applies one run may make: the OIDCClient, then the Platform.
MAX_APPLIES = 2


class KubeApi(Protocol):
    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json: ...

    async def list(
        self, kind: ResourceKind, *, namespace: str | None = None, label_selector: str | None = None
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
    app_platform_name_template: str = "kubeapp-{app_name}"
    oidc_enabled: bool = True

    def names(self, cluster_name: str) -> logic.Names:
        return logic.Names(
            oidc_client=self.oidc_client_name_template.format(cluster_name=cluster_name),
            platform=self.platform_name_template.format(cluster_name=cluster_name),
        )

    def app_platform(self, app_name: str) -> str:
        return self.app_platform_name_template.format(app_name=app_name)


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
        # Without OIDC the helm service does not wait for identity; a paused Cluster says nothing.
        report = config.oidc_enabled and not logic.is_paused(observed.cluster)
        for _ in range(MAX_APPLIES + 1):
            step = logic.next_step(observed, config.names(name), oidc=config.oidc_enabled)
            if isinstance(step, logic.Verdict):
                if report:
                    await _report(step, observed.cluster, cause=cause, bus=bus, config=config)
                return
            applied = await _apply_for(
                step,
                observed.cluster,
                cause=cause,
                kube=kube,
                bus=bus,
                config=config,
                report=report,
            )
            observed = observed.with_applied(step.kind, applied)
        raise PermanentError(
            f"{namespace}/{name}: applied documents do not stay as applied", reason="NotConverging"
        )


async def _observe(
    namespace: str, name: str, *, kube: KubeApi, config: Config
) -> logic.Observed | None:
    cluster = await _get(kube, CLUSTER, namespace, name)
    if cluster is None or logic.is_deleting(cluster):
        return None
    names = config.names(name)
    client = None
    if config.oidc_enabled and not logic.is_paused(cluster):
        client = await _get(kube, OIDC_CLIENT, namespace, names.oidc_client)
    return logic.Observed(
        cluster=cluster,
        realms=await _realms(kube, namespace),
        oidc_client=client,
        platform=await _get(kube, PLATFORM, namespace, names.platform),
    )


async def _realms(kube: KubeApi, namespace: str) -> list[Json]:
    try:
        realms, _ = await kube.list(REALM, namespace=namespace)
    except KubeNotFound:
        return []  # the Realm kind is not installed: as good as no Realm, until one appears
    return realms


async def _get(kube: KubeApi, kind: ResourceKind, namespace: str, name: str) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def _apply_for(
    step: logic.Apply,
    cluster: Json,
    *,
    cause: Message,
    kube: KubeApi,
    bus: Publisher,
    config: Config,
    report: bool,
) -> Json:
    """Apply one of a Cluster's documents; a rejection is said in its condition first."""
    try:
        return await _apply(step.kind, step.document, kube=kube, config=config)
    except KubeInvalid as exc:
        if report:
            verdict = logic.rejected(step.kind, step.document["metadata"]["name"], exc)
            await _report(verdict, cluster, cause=cause, bus=bus, config=config)
        raise _invalid(exc) from exc


async def _apply(kind: ResourceKind, document: Json, *, kube: KubeApi, config: Config) -> Json:
    meta = document["metadata"]
    applied = await kube.apply(kind, document, field_manager=config.field_manager, force=True)
    log.info("%s/%s: applied %s", meta["namespace"], meta["name"], kind.kind)
    return applied


def _invalid(exc: KubeInvalid) -> PermanentError:
    return PermanentError(str(exc), reason=logic.Reason.INVALID)


async def _apply_until_current(
    kind: ResourceKind,
    document: Json,
    current: Callable[[Json | None, Json], bool],
    *,
    kube: KubeApi,
    config: Config,
) -> None:
    """Apply ``document``; its answer must be ``current``, or the next event would apply again."""
    try:
        applied = await _apply(kind, document, kube=kube, config=config)
    except KubeInvalid as exc:
        raise _invalid(exc) from exc
    if not current(applied, document):
        meta = document["metadata"]
        raise PermanentError(
            f"{kind.kind} {meta['namespace']}/{meta['name']} does not stay as applied",
            reason="NotConverging",
        )


async def _report(
    verdict: logic.Verdict, cluster: Json, *, cause: Message, bus: Publisher, config: Config
) -> None:
    ref = ref_to(CLUSTER, cluster)
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


# --- the user kubeconfig ------------------------------------------------------------------


async def reconcile_user_kubeconfig(
    *, namespace: str, name: str, kube: KubeApi, locks: KeyedLocks, config: Config
) -> None:
    """Write ``<name>-kubeconfig-user`` when it is missing or differs (``kubeconfig``).

    Paused or not (derived data, as upstream's H16); a deleting Cluster is left alone.
    """
    async with locks(f"{namespace}/{name}"):
        cluster = await _get(kube, CLUSTER, namespace, name)
        if cluster is None or logic.is_deleting(cluster):
            return
        client = await _get(kube, OIDC_CLIENT, namespace, config.names(name).oidc_client)
        login = kubeconfig.oidc_login(client)
        if login is None:
            return  # the OIDCClient's event brings us back once it has both
        admin = await _get(kube, SECRET, namespace, kubeconfig.admin_secret_name(name))
        if admin is None:
            return  # CAPI's Secret event brings us back
        issuer, client_id = login
        source = kubeconfig.read(admin) or {}
        rendered = kubeconfig.render(name, source, issuer=issuer, client_id=client_id)
        if rendered is None:
            log.warning("%s/%s: the admin kubeconfig names no cluster", namespace, name)
            return
        desired = kubeconfig.desired_secret(cluster, admin, rendered)
        current = await _get(kube, SECRET, namespace, kubeconfig.user_secret_name(name))
        if not kubeconfig.is_current(current, desired):
            await _apply_until_current(
                SECRET, desired, kubeconfig.is_current, kube=kube, config=config
            )


# --- the apps -----------------------------------------------------------------------------


async def reconcile_app(
    *, namespace: str, name: str, kube: KubeApi, locks: KeyedLocks, config: Config
) -> None:
    """Keep the Platform of app HelmRelease ``name`` (``apps``)."""
    release = await _get(kube, HELM_RELEASE, namespace, name)
    cluster_name = apps.app_cluster(release) if release else None
    if release is None or cluster_name is None:
        return
    cluster = await _get(kube, CLUSTER, namespace, cluster_name)
    if cluster is None:
        log.info("%s/%s: waiting for Cluster %s", namespace, name, cluster_name)
        return
    realms = await _realms(kube, namespace)
    await _converge_app(release, cluster, realms, kube=kube, locks=locks, config=config)


async def reconcile_cluster_apps(
    *, namespace: str, name: str, kube: KubeApi, locks: KeyedLocks, config: Config
) -> None:
    """Look at every app of Cluster ``name`` again (it appeared, or a nudge: a new Realm)."""
    releases, _ = await kube.list(
        HELM_RELEASE, namespace=namespace, label_selector=apps.app_selector(name)
    )
    if not releases:
        return
    cluster = await _get(kube, CLUSTER, namespace, name)
    if cluster is None:
        return
    realms = await _realms(kube, namespace)
    for release in releases:
        await _converge_app(release, cluster, realms, kube=kube, locks=locks, config=config)


async def _converge_app(
    release: Json,
    cluster: Json,
    realms: list[Json],
    *,
    kube: KubeApi,
    locks: KeyedLocks,
    config: Config,
) -> None:
    namespace, name = release["metadata"]["namespace"], release["metadata"]["name"]
    if not apps.is_active(release) or logic.is_deleting(cluster):
        return  # garbage collection removes the Platform; paused is no reason (``apps``)
    found = apps.zenith_services(release)
    if found.problem:
        log.warning("%s/%s: %s; left out of the Platform", namespace, name, found.problem)
    platform_name = config.app_platform(name)
    async with locks(f"app:{namespace}/{name}"):
        step = apps.next_step(
            release,
            cluster=cluster,
            realms=realms,
            platform=await _get(kube, PLATFORM, namespace, platform_name),
            name=platform_name,
            services=found.services,
        )
        if isinstance(step, logic.Apply):
            await _apply_until_current(
                step.kind, step.document, logic.is_current, kube=kube, config=config
            )
        elif not step.ready:
            # No retry: the Realm's event nudges the Cluster, which looks at its apps again.
            log.info("%s/%s: Platform waits: %s", namespace, name, step.message)
