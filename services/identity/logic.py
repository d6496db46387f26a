"""Pure decisions of the identity service: which Realm, which documents, what to report.

The service converges one Cluster at a time from what it observes (``Observed``):
``next_step`` answers either "apply this document" or "this is the verdict", and the handler
applies and asks again until it gets a verdict. Upstream's order is kept (``on_cluster_create``
in azimuth-cloud/azimuth-capi-operator ``azimuth_capi/operator.py``, with OIDC on): Realm
Ready, then the OIDCClient with an issuer and a client id, then the Platform with a root group.
Every wait is a verdict, not an exception: the object waited for sends an event when it
changes, and that event runs the Cluster again.

**Which Realm.** ``spec.zenithIdentityRealmName`` when set. Otherwise the Realm named like the
namespace, the Azimuth portal's convention (one Realm per tenancy, name = namespace), and
failing that the alphabetically first Realm of the namespace. Upstream's ``find_realm`` takes
the first one listed, which depends on storage order; a rule that only depends on the names
gives every replica, every restart and the Realm fan-out the same answer.

**When a document is current.** We own only the fields we apply: our label, our ownerReference
and our spec keys must be there with our values; anything others or the API server add
(defaults, other labels, other owners, status) is not ours to compare. ``zenithServices`` is
left out when a Cluster has no services, as upstream does, so an absent or empty map matches.

**Without OIDC.** Upstream keeps Platforms whether or not OIDC is on
(``on_cluster_services_updated`` runs regardless): Zenith's services authenticate through
them. So with Zenith on and OIDC off, ``next_step`` keeps the Platform only; there is no
OIDCClient, and its verdict is not reported, because the helm service does not wait for
identity then and a Platform must not hold up the release.

**The Platform's services follow on their own.** Upstream's ``on_cluster_services_updated``
re-applies the Platform on every change of ``status.services``, independently of the create
order. Creating the Platform still waits for the Realm and, with OIDC on, for the OIDCClient's
issuer and client id; but once it exists, a Platform whose ``zenithServices`` (or Realm) no
longer match is applied whatever the OIDCClient says, so a re-created or slow OIDCClient never
strands the services.

**Paused.** A paused Cluster's own reconcile stops (upstream's ``on_cluster_create`` returns
early): no OIDCClient, no new Platform, nothing reported. Derived data keeps following what
runs, as upstream's handlers of the user kubeconfig, the services and the apps, which never
look at ``paused``: an existing Platform keeps its services current (discovery keeps
``status.services`` current while paused), and the app Platforms and the user kubeconfig
(``handlers``) are kept too. Only a deleting Cluster stops all of it.

**What is reported** (``report``). A verdict becomes an ``IdentityReady`` condition and a
``PrerequisiteChanged`` for the helm service. The last ``PrerequisiteChanged`` on the Cluster's
subject is the record of what was said: nothing is published when the new one would say the
same, and the condition only when its part (ready, reason, message) changed. The
prerequisite's id is derived from its content *and* the id of the one it supersedes: a
redelivered run publishes the same id and JetStream drops the copy, while a state that returns
(Ready, NotReady, Ready) still gets a new id and is not swallowed by the duplicate window. The
condition goes through ``shared.status.StatusReporter``, whose ids follow the cause: the same
handled message reports once, the next one anew.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shared import resources, subjects
from shared.kube import ResourceKind
from shared.messages import (
    Condition,
    ObjectRef,
    PrerequisiteChanged,
    ResourceChanged,
    stable_id,
)
from shared.resources import AZIMUTH, CLUSTER, OIDC_CLIENT, PLATFORM, ref_to
from shared.status import story_of

Json = dict[str, Any]

STEP = "identity"
CONDITION_TYPE = "IdentityReady"
#: The portal and upstream tooling recognise the objects of a Cluster by this value.
MANAGED_BY = {"app.kubernetes.io/managed-by": "azimuth-capi-operator"}
#: Spec keys we leave out when empty; the object then matches when they are absent or empty.
OMITTED_WHEN_EMPTY = ("zenithServices",)
#: Longest server message carried into a condition; the rest is in the dead letter.
MAX_MESSAGE = 1000


class Reason:
    REALM_NOT_FOUND = "RealmNotFound"
    REALM_NOT_READY = "RealmNotReady"
    PAUSED = "Paused"
    WAITING_FOR_OIDC_CLIENT = "WaitingForOIDCClient"
    WAITING_FOR_PLATFORM = "WaitingForPlatform"
    READY = "Ready"
    INVALID = "Invalid"


@dataclass(frozen=True)
class Names:
    """The names of one Cluster's identity objects."""

    oidc_client: str
    platform: str


@dataclass(frozen=True)
class Observed:
    """What the API server said about one Cluster and its identity objects."""

    cluster: Json
    realms: list[Json]
    oidc_client: Json | None = None
    platform: Json | None = None

    def with_applied(self, kind: ResourceKind, obj: Json) -> Observed:
        if kind == OIDC_CLIENT:
            return replace(self, oidc_client=obj)
        return replace(self, platform=obj)


@dataclass(frozen=True)
class Apply:
    """Server-side apply ``document`` (of ``kind``), then decide again."""

    kind: ResourceKind
    document: Json


@dataclass(frozen=True)
class Verdict:
    """Where the Cluster's identity stands; what the condition and the prerequisite say."""

    ready: bool
    reason: str
    message: str
    outputs: Json = field(default_factory=dict)


# --- the Cluster --------------------------------------------------------------------------


def is_deleting(cluster: Json) -> bool:
    """Deleting Clusters are left to garbage collection, with everything they own."""
    return bool(cluster["metadata"].get("deletionTimestamp"))


def is_paused(cluster: Json) -> bool:
    return bool((cluster.get("spec") or {}).get("paused", False))


def owner_reference(cluster: Json) -> Json:
    """What makes the Cluster the controller of its identity objects and user kubeconfig."""
    return resources.owner_reference(CLUSTER, cluster, controller=True)


def owning_cluster(obj: Json) -> str | None:
    """The name of the Azimuth Cluster that controls ``obj``, if any."""
    for owner in obj.get("metadata", {}).get("ownerReferences") or []:
        if (
            owner.get("controller")
            and owner.get("kind") == CLUSTER.kind
            and str(owner.get("apiVersion", "")).startswith(f"{AZIMUTH}/")
        ):
            return str(owner["name"])
    return None


def clusters_touched(messages: Sequence[ResourceChanged]) -> list[tuple[str, str]]:
    """(namespace, name) of each Cluster these events concern, once each, in order.

    A Cluster event concerns that Cluster; an OIDCClient or Platform event the Cluster that
    controls it. Objects without such an owner are not ours (or lost it in a restore, which the
    restored Cluster's own event repairs).
    """
    found: dict[tuple[str, str], None] = {}
    for message in messages:
        ref = message.ref
        name = ref.name if ref.kind == CLUSTER.kind else owning_cluster(message.object)
        if ref.namespace and name:
            found[(ref.namespace, name)] = None
    return list(found)


def clusters_appeared(messages: Sequence[ResourceChanged]) -> list[tuple[str, str]]:
    """(namespace, name) of each Cluster these events show appearing (``ADDED``), once each.

    An app created before its Cluster waited for it; the Cluster's appearance is the cue to
    look at its apps again. Later Cluster events (mostly status writes) do not list the apps:
    neither pausing nor resuming changes what an app's Platform should be.
    """
    found: dict[tuple[str, str], None] = {}
    for message in messages:
        ref = message.ref
        if ref.kind == CLUSTER.kind and message.event == "ADDED" and ref.namespace:
            found[(ref.namespace, ref.name)] = None
    return list(found)


# --- the Realm ----------------------------------------------------------------------------


def default_realm_name(namespace: str, names: Iterable[str]) -> str | None:
    """The Realm a Cluster without ``zenithIdentityRealmName`` uses (module docstring)."""
    candidates = set(names)
    if namespace in candidates:
        return namespace
    return min(candidates, default=None)


def wanted_realm_name(cluster: Json, realm_names: Iterable[str]) -> str | None:
    requested = (cluster.get("spec") or {}).get("zenithIdentityRealmName")
    if requested:
        return str(requested)
    return default_realm_name(cluster["metadata"]["namespace"], realm_names)


def uses_realm(cluster: Json, realm: str, realm_names: Iterable[str]) -> bool:
    """Whether ``cluster`` uses (or, for a deleted Realm, used) the Realm named ``realm``."""
    return wanted_realm_name(cluster, {*realm_names, realm}) == realm


def _name(obj: Json) -> str:
    return str(obj["metadata"]["name"])


def usable_realm(cluster: Json, realms: list[Json]) -> Json | Verdict:
    """The Realm ``cluster`` uses if it is Ready, else the verdict saying why not."""
    namespace = cluster["metadata"]["namespace"]
    wanted = wanted_realm_name(cluster, (_name(r) for r in realms))
    realm = next((r for r in realms if _name(r) == wanted), None)
    if realm is None:
        what = f"Realm {wanted}" if wanted else "Realm"
        return Verdict(False, Reason.REALM_NOT_FOUND, f"no {what} in namespace {namespace}")
    # Azimuth's operators write status without its defaults: no phase is Unknown, as upstream.
    phase = (realm.get("status") or {}).get("phase") or "Unknown"
    if phase != "Ready":
        return Verdict(False, Reason.REALM_NOT_READY, f"Realm {wanted} is {phase}, not Ready")
    return realm


# --- the documents ------------------------------------------------------------------------


def document(
    kind: ResourceKind,
    *,
    owner: Json,
    namespace: str,
    name: str,
    spec: Json,
    labels: dict[str, str] | None = None,
) -> Json:
    """A document of ours: our label (and ``labels``), a controller ``owner``, ``spec``."""
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**MANAGED_BY, **(labels or {})},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def _document(kind: ResourceKind, cluster: Json, name: str, spec: Json) -> Json:
    namespace = cluster["metadata"]["namespace"]
    owner = owner_reference(cluster)
    return document(kind, owner=owner, namespace=namespace, name=name, spec=spec)


def desired_oidc_client(cluster: Json, *, realm_name: str, name: str) -> Json:
    spec = {"realmName": realm_name, "public": True, "grantTypes": ["DeviceCode"]}
    return _document(OIDC_CLIENT, cluster, name, spec)


def zenith_services(cluster: Json) -> Json:
    services = (cluster.get("status") or {}).get("services") or {}
    return {
        key: {"subdomain": service["subdomain"], "fqdn": service["fqdn"]}
        for key, service in sorted(services.items())
    }


def platform_spec(realm_name: str, services: Json) -> Json:
    """Upstream's ``ensure_platform`` sets ``zenithServices`` only when there are services."""
    spec: Json = {"realmName": realm_name}
    if services:
        spec["zenithServices"] = services
    return spec


def desired_platform(cluster: Json, *, realm_name: str, name: str) -> Json:
    return _document(PLATFORM, cluster, name, platform_spec(realm_name, zenith_services(cluster)))


def metadata_current(actual: Json, desired: Json) -> bool:
    """Whether ``actual`` carries the labels and ownerReferences ``desired`` applies."""
    meta, want = actual.get("metadata") or {}, desired["metadata"]
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in want.get("labels", {}).items()):
        return False
    owners = meta.get("ownerReferences") or []
    return all(any(_covers(o, ref) for o in owners) for ref in want.get("ownerReferences", []))


def is_current(actual: Json | None, desired: Json) -> bool:
    """Whether ``actual`` already has every field ``desired`` applies (module docstring)."""
    if actual is None or not metadata_current(actual, desired):
        return False
    spec = actual.get("spec") or {}
    if not _covers(spec, desired["spec"]):
        return False
    return all(not spec.get(k) for k in OMITTED_WHEN_EMPTY if k not in desired["spec"])


def _covers(actual: Json, wanted: Json) -> bool:
    return all(actual.get(k) == v for k, v in wanted.items())


# --- the decision -------------------------------------------------------------------------


def next_step(observed: Observed, names: Names, *, oidc: bool = True) -> Apply | Verdict:
    """The one thing to do next for a Cluster that is not deleting (module docstring).

    Without ``oidc`` only the Platform is kept (for Zenith's service auth): no OIDCClient, and
    the verdict gates nothing. A paused Cluster only gets an existing Platform refreshed; its
    verdict (``Paused``) is not reported.
    """
    cluster = observed.cluster
    realm = usable_realm(cluster, observed.realms)
    if isinstance(realm, Verdict):
        return realm
    platform = desired_platform(cluster, realm_name=_name(realm), name=names.platform)
    if is_paused(cluster):
        paused = Verdict(False, Reason.PAUSED, "the Cluster is paused")
        return _refresh(observed.platform, platform) or paused
    if not oidc:
        return _platform_only(observed.platform, platform)
    return _with_oidc(observed, realm, platform, names.oidc_client)


def _with_oidc(
    observed: Observed, realm: Json, platform: Json, client_name: str
) -> Apply | Verdict:
    """Upstream's order: the OIDCClient, its issuer and client id, then the Platform."""
    client = desired_oidc_client(observed.cluster, realm_name=_name(realm), name=client_name)
    if not is_current(observed.oidc_client, client):
        return Apply(OIDC_CLIENT, client)
    waiting = _client_wait(observed.oidc_client or {}, client_name)
    if waiting:
        return _refresh(observed.platform, platform) or waiting
    if not is_current(observed.platform, platform):
        return Apply(PLATFORM, platform)
    return _platform_verdict(realm, observed.oidc_client or {}, observed.platform or {})


def _refresh(actual: Json | None, desired: Json) -> Apply | None:
    """Re-apply a Platform that exists but is out of date; creating one is not a refresh."""
    if actual is None or is_current(actual, desired):
        return None
    return Apply(PLATFORM, desired)


def _platform_only(actual: Json | None, desired: Json) -> Apply | Verdict:
    if not is_current(actual, desired):
        return Apply(PLATFORM, desired)
    return Verdict(True, Reason.READY, f"Platform {_name(desired)} is current")


def _client_wait(client: Json, name: str) -> Verdict | None:
    if client.get("metadata", {}).get("deletionTimestamp"):
        return Verdict(False, Reason.WAITING_FOR_OIDC_CLIENT, f"OIDCClient {name} is deleting")
    status = client.get("status") or {}
    missing = [key for key in ("issuerUrl", "clientId") if not status.get(key)]
    if missing:
        message = f"OIDCClient {name} has no {' or '.join(missing)} yet"
        return Verdict(False, Reason.WAITING_FOR_OIDC_CLIENT, message)
    return None


def _platform_verdict(realm: Json, client: Json, platform: Json) -> Verdict:
    root_group = (platform.get("status") or {}).get("rootGroup")
    if not root_group:
        message = f"Platform {_name(platform)} has no rootGroup yet"
        return Verdict(False, Reason.WAITING_FOR_PLATFORM, message)
    client_status = client["status"]
    outputs = {
        "realmName": _name(realm),
        "issuerUrl": client_status["issuerUrl"],
        "clientId": client_status["clientId"],
        "rootGroup": root_group,
        "platformUsersGroup": (realm.get("status") or {}).get("platformUsersGroup"),
    }
    return Verdict(True, Reason.READY, "OIDCClient and Platform are ready", outputs)


def rejected(kind: ResourceKind, name: str, error: Exception) -> Verdict:
    message = f"the API server rejected {kind.kind} {name}: {error}"[:MAX_MESSAGE]
    return Verdict(False, Reason.INVALID, message)


# --- what to report -----------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """What a verdict needs said: the condition when its part changed, and the prerequisite."""

    condition: Condition | None
    prerequisite: PrerequisiteChanged


def report(
    verdict: Verdict,
    *,
    cluster: Json,
    last: PrerequisiteChanged | None,
    source: str,
    causation_id: str | None,
) -> Report | None:
    """What ``verdict`` needs said, given what was ``last`` said; None when nothing is new.

    The prerequisite's id is derived from its content and the id of the one it supersedes
    (module docstring, "What is reported").
    """
    ref = ref_to(CLUSTER, cluster)
    generation = int(cluster["metadata"].get("generation") or 0)
    previous = last.id if last is not None else ""
    content = json.dumps(
        [verdict.ready, verdict.reason, verdict.message, verdict.outputs], sort_keys=True
    )
    prerequisite = PrerequisiteChanged(
        id=stable_id(ref.uid or "", STEP, str(generation), content, previous),
        source=source,
        correlation_id=story_of(ref),
        causation_id=causation_id,
        ref=ref,
        step=STEP,
        generation=generation,
        ready=verdict.ready,
        reason=verdict.reason,
        detail=verdict.message,
        outputs=verdict.outputs,
    )
    if last is not None and _fact(last) == _fact(prerequisite):
        return None
    changed = last is None or _said(last) != _said(prerequisite)
    return Report(condition(verdict) if changed else None, prerequisite)


def _fact(message: PrerequisiteChanged) -> tuple[Any, ...]:
    return (*_said(message), message.generation, json.dumps(message.outputs, sort_keys=True))


def _said(message: PrerequisiteChanged) -> tuple[Any, ...]:
    """What the condition repeats of a prerequisite."""
    return message.ref.uid, message.released, message.ready, message.reason, message.detail


def prerequisite_subject(ref: ObjectRef, partition: int) -> str:
    assert ref.namespace, "Azimuth Clusters are namespaced"
    return subjects.prerequisite(STEP, partition, ref.namespace, ref.name)


def condition(verdict: Verdict) -> Condition:
    status = "True" if verdict.ready else "False"
    return Condition(
        type=CONDITION_TYPE, status=status, reason=verdict.reason, message=verdict.message
    )
