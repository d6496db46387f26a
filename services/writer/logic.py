"""Pure rules of the writer: composing JSON merge patches and spotting writes that change nothing.

RFC 7386 merge patches compose: applying ``a`` then ``b`` equals applying ``compose(a, b)``,
where nested objects merge, later scalars win, and ``None`` (delete) is kept so it still
deletes on the server. That is what lets N close patches become one PATCH with the same result.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, TypeVar

from shared.messages import PatchClusterStatus

Json = dict[str, Any]
M = TypeVar("M", bound=PatchClusterStatus)


def compose(first: Json, second: Json) -> Json:
    """One merge patch with the effect of applying ``first`` then ``second``."""
    result = dict(first)
    for key, value in second.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = compose(result[key], value)
        else:
            result[key] = value
    return result


def compose_all(patches: list[Json]) -> Json:
    result: Json = {}
    for patch in patches:
        result = compose(result, patch)
    return result


def apply(target: Any, patch: Any) -> Any:
    """RFC 7386 ``MergePatch(target, patch)``."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply(result.get(key), value)
    return result


def changes_nothing(current: Json, patch: Json) -> bool:
    return bool(apply(current, patch) == current)


def split_incarnations(messages: list[M]) -> tuple[list[M], list[M]]:
    """(patches for the newest Cluster incarnation, patches for older ones), in order.

    A Cluster deleted and created again under the same name is a different object: patches
    addressed to the old uid must not land on the new one even when they share a batch.
    """
    newest = messages[-1].ref.uid
    current = [m for m in messages if m.ref.uid in (None, newest)]
    stale = [m for m in messages if m.ref.uid not in (None, newest)]
    return current, stale


class StatusCache:
    """The status we last wrote per Cluster incarnation, to skip writes that change nothing.

    Sound because the writer is the only writer of Cluster status (principle 4); bounded, so
    the oldest entries fall out and merely cost one PATCH that the server turns into a no-op.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[str, Json]] = OrderedDict()

    def get(self, key: str, uid: str | None) -> Json | None:
        entry = self._entries.get(key)
        if entry is None or (uid is not None and entry[0] != uid):
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: str, uid: str, status: Json) -> None:
        if self.size == 0:
            return
        self._entries[key] = (uid, status)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
