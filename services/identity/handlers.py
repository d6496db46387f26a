"""The identity service's work: converge one Cluster, its user kubeconfig and its apps'
Platforms, and point Realm changes at Clusters.

Every function takes the service's ``Deps``, built once by the composition root; the batch
handlers (``user_kubeconfigs``, ``app_platforms``, ``nudge_realm_users``) are routed to
directly, and ``app`` dispatches the batches that concern several kinds of work.

``reconcile_cluster`` is level-triggered and idempotent. Under the Cluster's lock it reads the
Cluster, the namespace's Realms, the OIDCClient and the Platform, then lets ``logic.next_step``
choose between applying a document (server-side apply, ``force``, our field manager) and a
verdict. A document that is already current is not applied, so a replayed or redelivered event
costs reads only; an applied one comes back as an event that runs the Cluster again, which is
how waiting works without a timer. The same apply re-adopts an OIDCClient that lost its
ownerReference (after a Velero restore; upstream's ``adopt_oidc_client`` does it on resume).

- 404 on the Cluster, or a deleting Cluster: nothing to do (garbage collection removes the
  OIDCClient and Platform through their ownerReference).
- A paused Cluster: only an existing Platform is refreshed, nothing is reported
  (``logic`` module docstring, "Paused").
- 422 on an apply (e.g. a Realm name the Platform schema refuses): the condition says
  ``Invalid`` first, then ``PermanentError`` dead-letters the event with the reason.
- ``TemporaryError`` (429, 5xx, 409, NATS down) passes through: the consumer retries.

With OIDC off (Zenith on) the same run keeps the Platform only and reports nothing: the helm
service does not wait for identity then.

**What is reported.** The ``IdentityReady`` condition goes to the writer through the
``StatusReporter`` (its addressing and ids, with the handled message as cause); the
``PrerequisiteChanged`` for the helm service is published here, on the subject the Cluster's
partition gives (``Deps.prerequisite_subject``), since the last one stored there is the record
of what was said (``logic.report``).

``reconcile_user_kubeconfig`` (OIDC on) writes ``<cluster>-kubeconfig-user`` from the admin
kubeconfig and the OIDCClient (``kubeconfig``); it runs on their events, not on every Cluster
event, so status writes cost it nothing. It is derived data, and upstream's
``on_cluster_secret_event`` ignores ``paused``: a paused Cluster's users still get a kubeconfig
that matches its API server and issuer. ``reconcile_app`` keeps one app's Platform (``apps``);
``reconcile_cluster_apps`` re-checks all apps of a Cluster that appeared or was nudged, which
is how a Cluster created after its apps, or a Realm that appears, reaches apps that were
waiting for it. Neither writes what is already there, and both check the apply's answer: a
server that keeps changing what we apply dead-letters the event instead of looping through
our own events.

``nudge_realm_users`` runs in the Realm's own partition (a Realm belongs to no Cluster) and
nudges each Cluster that uses it, in the Cluster's partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from services.identity import apps, kubeconfig, logic
from shared import subjects
from shared.consumer import Batch
from shared.errors import BadMessage, KubeInvalid, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.locks import KeyedLocks
from shared.messages import Message, ObjectRef, PrerequisiteChanged, ResourceChanged, decode
from shared.ports import KubeReader, KubeWriter, Publisher, StreamReader
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET, ref_to
from shared.status import StatusReporter

log = logging.getLogger(__name__)

Json = dict[str, Any]

#: Applies one run may make: the OIDCClient, then the Platform.
MAX_APPLIES = 2


class KubeApi(KubeReader, KubeWriter, Protocol): ...


class Prerequisites(Publisher, StreamReader, Protocol):
    """Where a prerequisite is said, and the last one said is read back."""


@dataclass(frozen=True)
class Config:
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


@dataclass(frozen=True)
class Deps:
    kube: KubeApi
    prerequisites: Prerequisites
    reporter: StatusReporter
    config: Config
    #: Whether Platforms are kept at all (OIDC or Zenith on); ``oidc`` says whether the rest
    #: of identity is.
    active: bool
    locks: KeyedLocks

    @property
    def oidc(self) -> bool:
        return self.active and self.config.oidc_enabled

    def prerequisite_subject(self, ref: ObjectRef) -> str:
        return logic.prerequisite_subject(ref, self.reporter.partition(ref))


# --- the Cluster --------------------------------------------------------------------------


async def reconcile_cluster(namespace: str, name: str, *, cause: Message, deps: Deps) -> None:
    async with deps.locks(f"{namespace}/{name}"):
        observed = await _observe(namespace, name, deps)
        if observed is None:
            return
        # Without OIDC the helm service does not wait for identity; a paused Cluster says nothing.
        report = deps.config.oidc_enabled and not logic.is_paused(observed.cluster)
        cluster, names, oidc = observed.cluster, deps.config.names(name), deps.config.oidc_enabled
        for _ in range(MAX_APPLIES + 1):
            step = logic.next_step(observed, names, oidc=oidc)
            if isinstance(step, logic.Verdict):
                if report:
                    await _report(step, cluster, cause=cause, deps=deps)
                return
            applied = await _apply_for(step, cluster, cause=cause, deps=deps, report=report)
            observed = observed.with_applied(step.kind, applied)
        raise PermanentError(
            f"{namespace}/{name}: applied documents do not stay as applied", reason="NotConverging"
        )


async def _observe(namespace: str, name: str, deps: Deps) -> logic.Observed | None:
    cluster = await _get(deps.kube, CLUSTER, namespace, name)
    if cluster is None or logic.is_deleting(cluster):
        return None
    names = deps.config.names(name)
    client = None
    if deps.config.oidc_enabled and not logic.is_paused(cluster):
        client = await _get(deps.kube, OIDC_CLIENT, namespace, names.oidc_client)
    return logic.Observed(
        cluster=cluster,
        realms=await _realms(deps.kube, namespace),
        oidc_client=client,
        platform=await _get(deps.kube, PLATFORM, namespace, names.platform),
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
    step: logic.Apply, cluster: Json, *, cause: Message, deps: Deps, report: bool
) -> Json:
    """Apply one of a Cluster's documents; a rejection is said in its condition first."""
    try:
        return await _apply(step.kind, step.document, deps)
    except KubeInvalid as exc:
        if report:
            verdict = logic.rejected(step.kind, step.document["metadata"]["name"], exc)
            await _report(verdict, cluster, cause=cause, deps=deps)
        raise _invalid(exc) from exc


async def _apply(kind: ResourceKind, document: Json, deps: Deps) -> Json:
    meta = document["metadata"]
    field_manager = deps.config.field_manager
    applied = await deps.kube.apply(kind, document, field_manager=field_manager, force=True)
    log.info("%s/%s: applied %s", meta["namespace"], meta["name"], kind.kind)
    return applied


def _invalid(exc: KubeInvalid) -> PermanentError:
    return PermanentError(str(exc), reason=logic.Reason.INVALID)


async def _apply_until_current(
    kind: ResourceKind, document: Json, current: Callable[[Json | None, Json], bool], deps: Deps
) -> None:
    """Apply ``document``; its answer must be ``current``, or the next event would apply again."""
    try:
        applied = await _apply(kind, document, deps)
    except KubeInvalid as exc:
        raise _invalid(exc) from exc
    if not current(applied, document):
        meta = document["metadata"]
        raise PermanentError(
            f"{kind.kind} {meta['namespace']}/{meta['name']} does not stay as applied",
            reason="NotConverging",
        )


async def _report(verdict: logic.Verdict, cluster: Json, *, cause: Message, deps: Deps) -> None:
    ref = ref_to(CLUSTER, cluster)
    subject = deps.prerequisite_subject(ref)
    last = await _last_prerequisite(deps.prerequisites, subject)
    said = logic.report(
        verdict, cluster=cluster, last=last, source=deps.reporter.source, causation_id=cause.id
    )
    if said is None:
        return
    if said.condition is not None:
        await deps.reporter.report(ref, conditions=[said.condition], cause=cause)
    # Last: once the prerequisite is stored, the verdict counts as reported.
    await deps.prerequisites.publish(subject, said.prerequisite)
    log.info("%s: identity %s: %s", ref.key, verdict.reason, verdict.message)


async def _last_prerequisite(bus: StreamReader, subject: str) -> PrerequisiteChanged | None:
    body = await bus.last_message(subjects.LIFECYCLE.name, subject)
    if body is None:
        return None
    try:
        return decode(body, PrerequisiteChanged)
    except BadMessage:
        return None  # not something we said; say it again


# --- the Realms ---------------------------------------------------------------------------


async def nudge_realm_users(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """Nudge each Cluster of the Realm's namespace that uses (or used) the Realm."""
    realm = batch.latest
    namespace, name = realm.ref.namespace, realm.ref.name
    if not (deps.active and namespace):
        return
    clusters, _ = await deps.kube.list(CLUSTER, namespace=namespace)
    realms, _ = await deps.kube.list(REALM, namespace=namespace)
    names = [r["metadata"]["name"] for r in realms]
    reason = f"Realm {name} {realm.event.lower()}"
    for cluster in clusters:
        if logic.uses_realm(cluster, name, names):
            await deps.reporter.nudge(ref_to(CLUSTER, cluster), reason=reason, cause=realm)


# --- the user kubeconfig ------------------------------------------------------------------


async def user_kubeconfigs(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """The user kubeconfigs these Secret or OIDCClient events may change."""
    for namespace, name in kubeconfig.clusters_touched(batch.messages):
        await reconcile_user_kubeconfig(namespace, name, deps)


async def reconcile_user_kubeconfig(namespace: str, name: str, deps: Deps) -> None:
    """With OIDC on, write ``<name>-kubeconfig-user`` when it is missing or differs.

    Paused or not (derived data, module docstring); a deleting Cluster is left alone.
    """
    if not deps.oidc:
        return
    kube = deps.kube
    async with deps.locks(f"{namespace}/{name}"):
        cluster = await _get(kube, CLUSTER, namespace, name)
        if cluster is None or logic.is_deleting(cluster):
            return
        client = await _get(kube, OIDC_CLIENT, namespace, deps.config.names(name).oidc_client)
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
            await _apply_until_current(SECRET, desired, kubeconfig.is_current, deps)


# --- the apps -----------------------------------------------------------------------------


async def app_platforms(batch: Batch[ResourceChanged], deps: Deps) -> None:
    """The app Platforms these HelmRelease or Platform events concern."""
    for namespace, name in apps.releases_touched(batch.messages) if deps.active else []:
        await reconcile_app(namespace, name, deps)


async def reconcile_app(namespace: str, name: str, deps: Deps) -> None:
    """Keep the Platform of app HelmRelease ``name`` (``apps``)."""
    release = await _get(deps.kube, HELM_RELEASE, namespace, name)
    cluster_name = apps.app_cluster(release) if release else None
    if release is None or cluster_name is None:
        return
    cluster = await _get(deps.kube, CLUSTER, namespace, cluster_name)
    if cluster is None:
        log.info("%s/%s: waiting for Cluster %s", namespace, name, cluster_name)
        return
    realms = await _realms(deps.kube, namespace)
    await _converge_app(release, cluster, realms, deps)


async def reconcile_cluster_apps(namespace: str, name: str, deps: Deps) -> None:
    """Look at every app of Cluster ``name`` again (it appeared, or a nudge: a new Realm)."""
    releases, _ = await deps.kube.list(
        HELM_RELEASE, namespace=namespace, label_selector=apps.app_selector(name)
    )
    if not releases:
        return
    cluster = await _get(deps.kube, CLUSTER, namespace, name)
    if cluster is None:
        return
    realms = await _realms(deps.kube, namespace)
    for release in releases:
        await _converge_app(release, cluster, realms, deps)


async def _converge_app(release: Json, cluster: Json, realms: list[Json], deps: Deps) -> None:
    namespace, name = release["metadata"]["namespace"], release["metadata"]["name"]
    if not apps.is_active(release) or logic.is_deleting(cluster):
        return  # garbage collection removes the Platform; paused is no reason (``apps``)
    found = apps.zenith_services(release)
    if found.problem:
        log.warning("%s/%s: %s; left out of the Platform", namespace, name, found.problem)
    platform_name = deps.config.app_platform(name)
    async with deps.locks(f"app:{namespace}/{name}"):
        step = apps.next_step(
            release,
            cluster=cluster,
            realms=realms,
            platform=await _get(deps.kube, PLATFORM, namespace, platform_name),
            name=platform_name,
            services=found.services,
        )
        if isinstance(step, logic.Apply):
            await _apply_until_current(step.kind, step.document, logic.is_current, deps)
        elif not step.ready:
            # No retry: the Realm's event nudges the Cluster, which looks at its apps again.
            log.info("%s/%s: Platform waits: %s", namespace, name, step.message)
