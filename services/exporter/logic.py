"""Upstream's ``azimuth_kube_*`` series, computed per object when the object changes.

The names, labels and value conventions are upstream's (``azimuth_capi/metrics.py``), so its
Grafana dashboards and alerts keep working: info-style series have the value 1 and carry the
fact in a label (``phase``, ``kube_version``, ``version``); a missing phase reads ``Unknown``,
a missing role ``Unknown``, a missing node group or version the empty string. Two deviations,
both where upstream fails: a field upstream indexes without a default (``spec.clusterName``,
``spec.values.kubernetesVersion``...) reads as the empty string instead of failing the whole
scrape, and an unparseable ``lastSync`` reads as 0.

Upstream lists every object of four kinds on every scrape. Here ``Series.baseline`` takes one
list per kind, once, at start-up, and ``Series.apply`` turns one ``ResourceChanged`` into that
object's samples, replacing what the object had before (a DELETED event removes them); a
scrape only concatenates what is stored: its cost is the number of series, with no API call.

**Ordering.** The list and the event stream overlap: replaying the stream from the newest
event of each object brings events the list already reflects, and an object deleted before the
list may still have its last MODIFIED event on the stream (its DELETED aged out). Every state
therefore carries the ``resourceVersion`` it was seen at, and an event is applied only if it
is newer than both the list of its kind and the object's last applied state (deletions leave a
tombstone, so an older event cannot bring an object back). Tombstones are the newest
``TOMBSTONES`` deletions only: an older event can only come from the watchers' race around the
deletion (two replicas publishing the same moments), seconds later, not after thousands of other
deletions, and kept all they grew with every object ever deleted. Kubernetes calls resourceVersions
opaque, but every kind here is served from one etcd, whose revisions are integers that only
grow; one that does not parse as an integer is applied in stream order, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.kube import ResourceKind
from shared.messages import ResourceChanged
from shared.metrics import Family
from shared.resources import APP_TEMPLATE, CLUSTER, CLUSTER_TEMPLATE, HELM_RELEASE

Json = dict[str, Any]
Labels = dict[str, str]
Sample = tuple[Labels, float]

#: Only HelmReleases with this label are Azimuth apps (the rest are cluster addons).
APP_TEMPLATE_LABEL = "azimuth.stackhpc.com/app-template"

#: The kinds the exporter follows, in upstream's order.
KINDS: tuple[ResourceKind, ...] = (CLUSTER_TEMPLATE, APP_TEMPLATE, CLUSTER, HELM_RELEASE)


@dataclass(frozen=True)
class Spec:
    """One family: which kind feeds it and the ``(extra labels, value)`` pairs per object."""

    name: str
    documentation: str
    kind: ResourceKind
    samples: Callable[[Json], Iterable[tuple[Labels, float]]]
    type: Literal["gauge", "info"] = "gauge"


def _get(obj: Json, *path: str) -> Any:
    """``obj[path...]``, or None where any step is missing or not an object."""
    value: Any = obj
    for step in path:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def _text(obj: Json, *path: str, default: str = "") -> str:
    value = _get(obj, *path)
    return default if value is None else str(value)


def _number(obj: Json, *path: str) -> float:
    value = _get(obj, *path)
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _timestamp(value: Any) -> float:
    try:
        return float(round(datetime.fromisoformat(str(value)).timestamp()))
    except ValueError:
        return 0.0


def _items(obj: Json, *path: str) -> list[tuple[str, Json]]:
    value = _get(obj, *path)
    if not isinstance(value, dict):
        return []
    return [(str(k), v if isinstance(v, dict) else {}) for k, v in value.items()]


def _once(labels: Labels, value: float = 1.0) -> list[tuple[Labels, float]]:
    return [(labels, value)]


# --- per-family samples (extra labels beyond the kind's common ones) -------------------------


def _versions(obj: Json) -> list[str]:
    versions = _get(obj, "status", "versions")
    if not isinstance(versions, list):
        return []
    return [str(v.get("name", "")) for v in versions if isinstance(v, dict)]


def _last_sync(obj: Json) -> list[tuple[Labels, float]]:
    last_sync = _get(obj, "status", "lastSync")
    return _once({}, _timestamp(last_sync) if last_sync else 0.0)


def _nodes(obj: Json, key: str, field: str, default: str) -> list[tuple[Labels, float]]:
    return [
        (
            {
                "node": name,
                "role": _text(node, "role", default="Unknown"),
                "group": _text(node, "nodeGroup"),
                key: _text(node, field, default=default),
            },
            1.0,
        )
        for name, node in _items(obj, "status", "nodes")
    ]


def _addons(obj: Json) -> list[tuple[Labels, float]]:
    return [
        ({"addon": name, "phase": _text(addon, "phase", default="Unknown")}, 1.0)
        for name, addon in _items(obj, "status", "addons")
    ]


def _phase(field: str) -> Callable[[Json], list[tuple[Labels, float]]]:
    return lambda obj: _once({"phase": _text(obj, "status", field, default="Unknown")})


SPECS: tuple[Spec, ...] = (
    Spec(
        "azimuth_kube_clustertemplate_kube_version",
        "Kubernetes version for the template",
        CLUSTER_TEMPLATE,
        lambda o: _once({"kube_version": _text(o, "spec", "values", "kubernetesVersion")}),
    ),
    Spec(
        "azimuth_kube_clustertemplate_deprecated",
        "Indicates whether the template is deprecated",
        CLUSTER_TEMPLATE,
        lambda o: _once({}, 1.0 if _get(o, "spec", "deprecated") else 0.0),
    ),
    Spec(
        "azimuth_kube_apptemplate_info",
        "Basic info for the app template",
        APP_TEMPLATE,
        lambda o: _once(
            {
                "chart_repo": _text(o, "spec", "chart", "repo"),
                "chart_name": _text(o, "spec", "chart", "name"),
            }
        ),
        type="info",
    ),
    Spec(
        "azimuth_kube_apptemplate_last_sync",
        "The time of the last sync for the app template",
        APP_TEMPLATE,
        _last_sync,
    ),
    Spec(
        "azimuth_kube_apptemplate_latest_version",
        "The latest version for the template",
        APP_TEMPLATE,
        lambda o: _once({"version": (_versions(o) or ["0.0.0"])[0]}),
    ),
    Spec(
        "azimuth_kube_apptemplate_version",
        "The versions supported by each template",
        APP_TEMPLATE,
        lambda o: [({"version": v}, 1.0) for v in _versions(o)],
    ),
    Spec(
        "azimuth_kube_cluster_template",
        "Cluster template",
        CLUSTER,
        lambda o: _once({"template": _text(o, "spec", "templateName")}),
    ),
    Spec(
        "azimuth_kube_cluster_kube_version",
        "The Kubernetes version of the cluster",
        CLUSTER,
        lambda o: _once({"kube_version": _text(o, "status", "kubernetesVersion")}),
    ),
    Spec("azimuth_kube_cluster_phase", "Cluster phase", CLUSTER, _phase("phase")),
    Spec(
        "azimuth_kube_cluster_networking_phase",
        "Cluster networking phase",
        CLUSTER,
        _phase("networkingPhase"),
    ),
    Spec(
        "azimuth_kube_cluster_control_plane_phase",
        "Cluster control plane phase",
        CLUSTER,
        _phase("controlPlanePhase"),
    ),
    Spec(
        "azimuth_kube_cluster_node_count",
        "Cluster node count",
        CLUSTER,
        lambda o: _once({}, _number(o, "status", "nodeCount")),
    ),
    Spec(
        "azimuth_kube_cluster_node_phase",
        "Cluster node phase",
        CLUSTER,
        lambda o: _nodes(o, "phase", "phase", "Unknown"),
    ),
    Spec(
        "azimuth_kube_cluster_node_kubelet_version",
        "Cluster node kubelet version",
        CLUSTER,
        lambda o: _nodes(o, "kubelet_version", "kubeletVersion", ""),
    ),
    Spec(
        "azimuth_kube_cluster_addon_count",
        "Cluster addon count",
        CLUSTER,
        lambda o: _once({}, _number(o, "status", "addonCount")),
    ),
    Spec("azimuth_kube_cluster_addon_phase", "Cluster addon phase", CLUSTER, _addons),
    Spec(
        "azimuth_kube_app_info",
        "Information about the app",
        HELM_RELEASE,
        lambda o: _once(
            {
                "target_namespace": _text(o, "spec", "targetNamespace"),
                "release_name": _text(o, "spec", "releaseName"),
                "chart_repo": _text(o, "spec", "chart", "repo"),
                "chart_name": _text(o, "spec", "chart", "name"),
                "chart_version": _text(o, "spec", "chart", "version"),
            }
        ),
        type="info",
    ),
    Spec("azimuth_kube_app_phase", "App phase", HELM_RELEASE, _phase("phase")),
)


def common_labels(kind: ResourceKind, obj: Json) -> Labels | None:
    """The labels every series of ``obj`` carries, or None if ``obj`` is not exported."""
    meta = obj.get("metadata") or {}
    if kind in (CLUSTER_TEMPLATE, APP_TEMPLATE):
        return {"template_name": str(meta.get("name", ""))}
    if kind == CLUSTER:
        return {
            "cluster_namespace": str(meta.get("namespace", "")),
            "cluster_name": str(meta.get("name", "")),
        }
    template = (meta.get("labels") or {}).get(APP_TEMPLATE_LABEL)
    if kind != HELM_RELEASE or template is None:
        return None
    return {
        "app_namespace": str(meta.get("namespace", "")),
        "app_name": str(meta.get("name", "")),
        "app_template": str(template),
        "target_cluster": _text(obj, "spec", "clusterName"),
    }


def _version(text: object) -> int | None:
    return int(text) if isinstance(text, str) and text.isdigit() else None


def samples_of(kind: ResourceKind, obj: Json) -> dict[str, list[Sample]]:
    """Every sample ``obj`` contributes, by family name; empty if it is not exported."""
    common = common_labels(kind, obj)
    if common is None:
        return {}
    return {
        spec.name: [({**common, **extra}, value) for extra, value in spec.samples(obj)]
        for spec in SPECS
        if spec.kind == kind
    }


#: how many deletions are remembered as tombstones (the newest)
TOMBSTONES = 10_000
_KIND_OF = {(k.api_version, k.kind): k for k in KINDS}
ObjectKey = tuple[str, str, str]


class Series:
    """The samples of every followed object, by family, as the list and later events say."""

    def __init__(self) -> None:
        self._by_family: dict[str, dict[ObjectKey, list[Sample]]] = {s.name: {} for s in SPECS}
        #: the resourceVersion each live object's samples were seen at
        self._versions: dict[ObjectKey, int] = {}
        #: the resourceVersion of the newest ``TOMBSTONES`` deletions, oldest first
        self._tombstones: OrderedDict[ObjectKey, int] = OrderedDict()
        #: the resourceVersion of each kind's list: older events are already in it
        self._listed: dict[str, int] = {}

    def baseline(self, kind: ResourceKind, items: Iterable[Json], resource_version: str) -> None:
        """Every object of ``kind`` as a list taken at ``resource_version`` shows them."""
        for objects in self._by_family.values():
            for key in [k for k in objects if k[0] == kind.token]:
                del objects[key]
        for versions in (self._versions, self._tombstones):
            for key in [k for k in versions if k[0] == kind.token]:
                del versions[key]
        listed = _version(resource_version)
        if listed is not None:
            self._listed[kind.token] = listed
        for obj in items:
            meta = obj.get("metadata") or {}
            key = (kind.token, str(meta.get("namespace") or ""), str(meta.get("name", "")))
            self._store(kind, key, samples_of(kind, obj), _version(meta.get("resourceVersion")))

    def apply(self, change: ResourceChanged) -> bool:
        """Apply one event unless what is stored is newer; returns whether it was applied."""
        kind = _KIND_OF.get((change.ref.api_version, change.ref.kind))
        if kind is None:
            return False
        key = (kind.token, change.ref.namespace or "", change.ref.name)
        version = _version(change.resource_version)
        if version is not None and version <= self._newest(kind, key):
            return False
        if change.event == "DELETED":
            self._store(kind, key, {}, None)
            self._bury(key, version)
        else:
            self._store(kind, key, samples_of(kind, change.object), version)
        return True

    def _newest(self, kind: ResourceKind, key: ObjectKey) -> int:
        seen = self._versions.get(key, self._tombstones.get(key, -1))
        return max(self._listed.get(kind.token, -1), seen)

    def _bury(self, key: ObjectKey, version: int | None) -> None:
        self._versions.pop(key, None)
        if version is None:
            return
        self._tombstones[key] = version
        self._tombstones.move_to_end(key)
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _store(
        self,
        kind: ResourceKind,
        key: ObjectKey,
        fresh: dict[str, list[Sample]],
        version: int | None,
    ) -> None:
        if version is not None:
            self._versions[key] = version
            self._tombstones.pop(key, None)
        for spec in SPECS:
            if spec.kind != kind:
                continue
            samples = fresh.get(spec.name)
            if samples:
                self._by_family[spec.name][key] = samples
            else:
                self._by_family[spec.name].pop(key, None)

    def families(self) -> list[Family]:
        return [
            Family(
                spec.name,
                spec.documentation,
                [s for samples in self._by_family[spec.name].values() for s in samples],
                spec.type,
            )
            for spec in SPECS
        ]

    def remembered(self) -> int:
        """How many objects a version is kept for, live or deleted (bounded by the live ones
        and ``TOMBSTONES``)."""
        return len(self._versions) + len(self._tombstones)

    def __len__(self) -> int:
        """How many objects have at least one series."""
        return len({key for objects in self._by_family.values() for key in objects})
