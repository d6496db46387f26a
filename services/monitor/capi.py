"""Reading Cluster API objects whichever API version served them.

Upstream pins ``v1beta1``, which current Cluster API serves only as a deprecated, converted
view of ``v1beta2``; a later release will stop serving it. Everything the monitor reads from
a CAPI object therefore goes through these functions, which accept both shapes, decided by
the object's own ``apiVersion`` (absent: v1beta1, the version ``shared.resources`` watches):

=====================  ==========================================  ==============================
what                   v1beta1                                     v1beta2
=====================  ==========================================  ==============================
legacy conditions      ``status.conditions``                       ``status.deprecated.v1beta1
                                                                   .conditions``
metav1 conditions      ``status.v1beta2.conditions``               ``status.conditions``
infrastructure ref     ``{apiVersion, kind, name, namespace}``     ``{apiGroup, kind, name}``
=====================  ==========================================  ==============================

``phase``, ``version`` and ``addresses`` sit at the same paths in both. Legacy conditions are
preferred where both exist: upstream's mappings were written against their types and reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]


def is_v1beta2(obj: Json) -> bool:
    return str(obj.get("apiVersion", "")).endswith("/v1beta2")


def _status(obj: Json) -> Json:
    status = obj.get("status")
    return status if isinstance(status, dict) else {}


def _list(value: Any) -> list[Json]:
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


def legacy_conditions(obj: Json) -> list[Json]:
    """The v1beta1 conditions (``type``, ``status``, ``reason``, ``severity``)."""
    status = _status(obj)
    if is_v1beta2(obj):
        deprecated = (status.get("deprecated") or {}).get("v1beta1") or {}
        return _list(deprecated.get("conditions"))
    return _list(status.get("conditions"))


def new_conditions(obj: Json) -> list[Json]:
    """The v1beta2 conditions (``metav1.Condition``)."""
    status = _status(obj)
    if is_v1beta2(obj):
        return _list(status.get("conditions"))
    return _list((status.get("v1beta2") or {}).get("conditions"))


def find(conditions: list[Json], kind: str) -> Json | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(condition: Json | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def condition(obj: Json, kind: str) -> Json | None:
    """Condition ``kind`` from the legacy list, else from the v1beta2 list."""
    return find(legacy_conditions(obj), kind) or find(new_conditions(obj), kind)


def phase(obj: Json) -> str | None:
    value = _status(obj).get("phase")
    return value if isinstance(value, str) and value else None


def without_v(version: Any) -> str | None:
    """``v1.31.2`` → ``1.31.2``; None for anything that is not a non-empty string."""
    return (version.lstrip("v") or None) if isinstance(version, str) else None


def control_plane_version(obj: Json) -> str | None:
    """The version the control plane runs (``status.version``), else the one it aims at."""
    spec = obj.get("spec") or {}
    return without_v(_status(obj).get("version")) or without_v(spec.get("version"))


def machine_version(obj: Json) -> str | None:
    return without_v((obj.get("spec") or {}).get("version"))


def internal_ips(obj: Json) -> list[str]:
    addresses = _list(_status(obj).get("addresses"))
    return [
        str(a["address"]) for a in addresses if a.get("type") == "InternalIP" and a.get("address")
    ]


@dataclass(frozen=True)
class Reference:
    """An object reference of either shape; ``version`` is None for v1beta2 (group only)."""

    group: str
    version: str | None
    kind: str
    name: str
    namespace: str


def infrastructure_ref(obj: Json) -> Reference | None:
    """The infrastructure machine a Machine points at (always in the Machine's namespace)."""
    ref = (obj.get("spec") or {}).get("infrastructureRef")
    if not isinstance(ref, dict) or not ref.get("kind") or not ref.get("name"):
        return None
    namespace = ref.get("namespace") or (obj.get("metadata") or {}).get("namespace") or ""
    if ref.get("apiVersion"):
        group, _, version = str(ref["apiVersion"]).rpartition("/")
        return Reference(group, version, ref["kind"], ref["name"], namespace)
    if ref.get("apiGroup"):
        return Reference(ref["apiGroup"], None, ref["kind"], ref["name"], namespace)
    return None
