"""What a tenant cluster's Zenith Reservations say, as pure functions (upstream: the
``monitor_cluster_services`` daemon of azimuth-cloud/azimuth-capi-operator
``azimuth_capi/operator.py``).

A **service** is a Reservation whose ``status.phase`` is ``Ready``:

- its name is the Reservation's name if that starts with its namespace, else
  ``<namespace>-<name>`` (``monitoring-system`` + ``kube-prometheus-stack-client``);
- its status is ``{subdomain, fqdn, label, iconUrl, description}`` in camelCase with absent
  fields left out; the label comes from ``azimuth.stackhpc.com/service-label``, else from the
  Reservation's name, each ``-``-separated word capitalised (upstream's rule).

A service belongs to the addon that released it: the Reservation's Helm annotations name a
release, and the addon is the first HelmRelease, else the first Manifests, labelled with the
Cluster and that release. Each addon's ``azimuth.stackhpc.com/services`` annotation is kept
*equal* to its services, and ``status.services`` to the services of chart addons (labelled
``capi.stackhpc.com/cluster``); app services live in their HelmRelease's annotation only.

Beating upstream: everything is recomputed from the whole set of Reservations, so a
Reservation that leaves Ready or disappears loses its entry everywhere (upstream kept it when
it left Ready), and the status change is one RFC 7386 merge patch with removed keys as null
(``shared.mergepatch.diff``) instead of JSON-patch operations that fail when a key is absent.

An ``iconUrl`` that is not an http(s) URL is left out rather than sent: the CRD declares
``format: uri``, and one bad annotation would otherwise sink the writer's whole status write.

**Which id a status patch has** (``report_id``). A recompute is not caused by a message, so
there is no cause to derive it from; what causes it is the state it saw: the tenant's
Reservations as of a resourceVersion, and the addons as of theirs once annotated. The id is
derived from that state and the patch: a recompute retried on the same state (its report was
stored but not acknowledged, say) reports one message, while a service that comes, goes and
comes back is a new state every time, so its patch is never dropped as a duplicate of the
first one.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from shared.kube import ResourceKind
from shared.mergepatch import apply
from shared.messages import ObjectRef, stable_id
from shared.resources import cluster_ref

Json = dict[str, Any]
Release = tuple[str, str]

RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
SERVICE_LABEL = "azimuth.stackhpc.com/service-label"
SERVICE_ICON_URL = "azimuth.stackhpc.com/service-icon-url"
SERVICE_DESCRIPTION = "azimuth.stackhpc.com/service-description"
SERVICES_ANNOTATION = "azimuth.stackhpc.com/services"
ADDON_CLUSTER = "addons.stackhpc.com/cluster"
ADDON_RELEASE_NAMESPACE = "addons.stackhpc.com/release-namespace"
ADDON_RELEASE_NAME = "addons.stackhpc.com/release-name"
CHART_ADDON = "capi.stackhpc.com/cluster"
CAPI_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
KUBECONFIG_SUFFIX = "-kubeconfig"


def _meta(obj: Json) -> Json:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _strings(value: Any) -> dict[str, str]:
    return {k: v for k, v in value.items() if isinstance(v, str)} if isinstance(value, dict) else {}


def labels_of(obj: Json) -> dict[str, str]:
    return _strings(_meta(obj).get("labels"))


def annotations_of(obj: Json) -> dict[str, str]:
    return _strings(_meta(obj).get("annotations"))


def is_deleting(obj: Json) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


# --- the tenant's Reservations -------------------------------------------------------------


def service_name(reservation: Json) -> str:
    name = str(_meta(reservation).get("name", ""))
    namespace = str(_meta(reservation).get("namespace", ""))
    return name if name.startswith(namespace) else f"{namespace}-{name}"


def service_label(reservation: Json) -> str:
    given = annotations_of(reservation).get(SERVICE_LABEL, "").strip()
    if given:
        return given
    name = str(_meta(reservation).get("name", ""))
    return " ".join(word.capitalize() for word in name.split("-")).strip()


def _http_url(value: str | None) -> str | None:
    if not value:
        return None
    parsed = urlparse(value.strip())
    return value.strip() if parsed.scheme in ("http", "https") and parsed.netloc else None


def service_status(reservation: Json) -> Json | None:
    """The ServiceStatus of a Ready Reservation; None for any other."""
    status = reservation.get("status")
    if not isinstance(status, dict) or status.get("phase") != "Ready":
        return None
    subdomain, fqdn = status.get("subdomain"), status.get("fqdn")
    if not (isinstance(subdomain, str) and subdomain and isinstance(fqdn, str) and fqdn):
        return None
    notes = annotations_of(reservation)
    found = {
        "subdomain": subdomain,
        "fqdn": fqdn,
        "label": service_label(reservation) or service_name(reservation),
        "iconUrl": _http_url(notes.get(SERVICE_ICON_URL)),
        "description": notes.get(SERVICE_DESCRIPTION),
    }
    return {k: v for k, v in found.items() if v is not None}


def release_of(reservation: Json) -> Release | None:
    """(namespace, name) of the Helm release that made the Reservation, if both are known."""
    notes = annotations_of(reservation)
    namespace, name = notes.get(RELEASE_NAMESPACE), notes.get(RELEASE_NAME)
    return (namespace, name) if namespace and name else None


@dataclass(frozen=True)
class Service:
    name: str
    status: Json
    release: Release


def services(reservations: Iterable[Json]) -> list[Service]:
    """The services of the Ready Reservations that came from a Helm release.

    In (namespace, name) order, so two Reservations that map to one service name resolve
    the same way on every recompute.
    """
    found: list[Service] = []
    for reservation in sorted(reservations, key=_position):
        status = service_status(reservation)
        release = release_of(reservation)
        if status is not None and release is not None:
            found.append(Service(service_name(reservation), status, release))
    return found


def _position(obj: Json) -> tuple[str, str]:
    return str(_meta(obj).get("namespace", "")), str(_meta(obj).get("name", ""))


# --- the management cluster's addons -------------------------------------------------------


@dataclass(frozen=True)
class Addon:
    """A HelmRelease or Manifests addon of one Cluster, as far as discovery cares."""

    kind: ResourceKind
    namespace: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    #: its resourceVersion as listed
    version: str = ""

    @classmethod
    def of(cls, kind: ResourceKind, obj: Json) -> Addon:
        meta = _meta(obj)
        return cls(
            kind,
            str(meta.get("namespace", "")),
            str(meta["name"]),
            labels_of(obj),
            annotations_of(obj),
            str(meta.get("resourceVersion", "")),
        )

    @property
    def key(self) -> str:
        return f"{self.kind.token}/{self.namespace}/{self.name}"

    @property
    def release(self) -> Release | None:
        namespace = self.labels.get(ADDON_RELEASE_NAMESPACE)
        name = self.labels.get(ADDON_RELEASE_NAME)
        return (namespace, name) if namespace and name else None

    @property
    def chart_managed(self) -> bool:
        """A cluster addon from the openstack-cluster chart, not a user's app."""
        return CHART_ADDON in self.labels

    def announced(self) -> Json | None:
        """The services its annotation lists: {} when absent, None when unreadable."""
        raw = self.annotations.get(SERVICES_ANNOTATION)
        if raw is None:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def annotation_patch(addon: Addon, wanted: Json) -> Json | None:
    """The merge patch that makes ``addon`` announce exactly ``wanted``; None if it does."""
    if addon.announced() == wanted:
        return None
    value = json.dumps(wanted, sort_keys=True)
    return {"metadata": {"annotations": {SERVICES_ANNOTATION: value}}}


@dataclass(frozen=True)
class Plan:
    """What one recompute wants: addon annotation patches and ``status.services``."""

    annotations: list[tuple[Addon, Json]]
    cluster_services: Json


def plan(found: list[Service], addons: list[Addon]) -> Plan:
    """Map ``found`` onto ``addons`` (HelmReleases listed before Manifests)."""
    owners: dict[Release, Addon] = {}
    for addon in addons:
        if addon.release is not None:
            owners.setdefault(addon.release, addon)
    per_addon: dict[tuple[str, str], Json] = {}
    cluster: Json = {}
    for service in found:
        owner = owners.get(service.release)
        if owner is None:
            continue
        per_addon.setdefault((owner.kind.token, owner.name), {})[service.name] = service.status
        if owner.chart_managed:
            cluster[service.name] = service.status
    patches = []
    for addon in addons:
        patch = annotation_patch(addon, per_addon.get((addon.kind.token, addon.name), {}))
        if patch is not None:
            patches.append((addon, patch))
    return Plan(patches, cluster)


@dataclass
class Belief:
    """What ``status.services`` of one Cluster says, as far as its watch knows.

    A patch travels through the bus and the writer before it lands, so a Cluster read just
    after publishing may not show it yet; concluding "already removed" from such a read would
    leave a stale entry forever. A read therefore gets the patches of the last ``replay``
    seconds folded in again (idempotent: discovery alone writes ``status.services``).
    """

    replay: float
    services: Json | None = None
    sent: list[tuple[float, Json]] = field(default_factory=list)

    def read(self, status: Json, now: float) -> None:
        services = status.get("services")
        current: Json = dict(services) if isinstance(services, dict) else {}
        self.sent = [(at, patch) for at, patch in self.sent if now - at < self.replay]
        for _, patch in self.sent:
            current = apply(current, patch)
        self.services = current

    def record(self, patch: Json, now: float) -> None:
        self.services = apply(self.services or {}, patch)
        self.sent.append((now, patch))


# --- the management cluster's Clusters and kubeconfig Secrets ------------------------------


@dataclass(frozen=True)
class Target:
    """One Cluster incarnation to watch, and the kubeconfig version the watch was built from."""

    namespace: str
    name: str
    uid: str
    partition: int
    secret_version: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> ObjectRef:
        return cluster_ref(self.namespace, self.name, self.uid)


def report_id(
    target: Target, *, tenant_version: str, addons: Mapping[str, str], patch: Json
) -> str:
    """The id of the status patch ``patch`` of ``target`` (module docstring); ``addons`` maps
    each addon's ``key`` to its resourceVersion as the recompute leaves it (annotated)."""
    seen = sorted(f"{key}@{version}" for key, version in addons.items())
    content = json.dumps(patch, sort_keys=True)
    return stable_id("discovery", target.uid, tenant_version, *seen, content)


def kubeconfig_owner(secret: Json) -> str | None:
    """The Cluster whose admin kubeconfig ``secret`` is (``<cluster>-kubeconfig``), if any."""
    cluster = labels_of(secret).get(CAPI_CLUSTER_NAME)
    if not cluster or _meta(secret).get("name") != f"{cluster}{KUBECONFIG_SUFFIX}":
        return None
    return cluster


def kubeconfig_text(secret: Json) -> str | None:
    """The kubeconfig in the Secret's ``value`` key, if it is there and readable."""
    encoded = (secret.get("data") or {}).get("value")
    if not isinstance(encoded, str) or not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def addon_cluster(obj: Json) -> str | None:
    """The Cluster an addon object belongs to, by the addon provider's label."""
    return labels_of(obj).get(ADDON_CLUSTER) or None
