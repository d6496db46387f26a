"""Fields a provider owns outside ``status``: its finalizer and the ``spec`` fields it fills in.

The writer is the one writer of status; but a provider also owns a few fields in ``spec``
(metal-stack's ``privateNetworkID``, ``controlPlaneEndpoint.host``, ``providerID``) and its
finalizer, and it must know they are written before it takes the next step (a finalizer
before it allocates anything, an allocated id before it forgets it). So it writes them itself,
at once, as a JSON merge patch preconditioned on the ``resourceVersion`` it decided from: if
anyone changed the object since, the API server answers 409 (``KubeConflict``, temporary), the
run is retried against a fresh read, and nothing is overwritten from a stale decision. Each
function returns the object as written, so the caller carries on from the new version.
"""

from __future__ import annotations

from typing import Any

from shared.kube import ResourceKind
from shared.ports import KubeMergePatcher

Json = dict[str, Any]


async def patch_owned(kube: KubeMergePatcher, kind: ResourceKind, obj: Json, patch: Json) -> Json:
    """Merge ``patch`` into ``obj`` if it is still at the version it was read at."""
    meta = obj["metadata"]
    guarded = {
        **patch,
        "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]},
    }
    return await kube.patch_merge(kind, meta.get("namespace"), meta["name"], guarded)


async def add_finalizer(
    kube: KubeMergePatcher, kind: ResourceKind, obj: Json, finalizer: str
) -> Json:
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if finalizer in finalizers:
        return obj
    return await patch_owned(
        kube, kind, obj, {"metadata": {"finalizers": [*finalizers, finalizer]}}
    )


async def remove_finalizer(
    kube: KubeMergePatcher, kind: ResourceKind, obj: Json, finalizer: str
) -> Json:
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if finalizer not in finalizers:
        return obj
    kept = [f for f in finalizers if f != finalizer]
    return await patch_owned(kube, kind, obj, {"metadata": {"finalizers": kept}})


async def set_spec(kube: KubeMergePatcher, kind: ResourceKind, obj: Json, fields: Json) -> Json:
    """Set ``spec`` fields the provider owns; a no-op when they already hold these values."""
    current = obj.get("spec") or {}
    if all(_holds(current, key, value) for key, value in fields.items()):
        return obj
    return await patch_owned(kube, kind, obj, {"spec": fields})


def _holds(current: Json, key: str, value: Any) -> bool:
    if isinstance(value, dict):
        inner = current.get(key)
        return isinstance(inner, dict) and all(_holds(inner, k, v) for k, v in value.items())
    return bool(current.get(key) == value)
