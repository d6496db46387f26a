"""RFC 7386 JSON merge patches: applying and composing them.

Applying ``a`` then ``b`` equals applying ``compose(a, b)``: nested objects merge, later
scalars win, and ``None`` (delete) is kept so it still deletes on the server; except where
``a`` removes or replaces an object that ``b`` sets again: applied in turn, ``b``'s object is
all that is left, while one merge patch can only merge into what is there. So a writer that
knows the document (the writer, the discovery service) applies patches in turn and sends
``diff(before, after)``, which is exact; ``compose`` is for patches nobody applies here. The
monitor uses ``apply`` to predict the status its patches produce.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]


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


def diff(current: Json, wanted: Json) -> Json:
    """The merge patch that turns ``current`` into exactly ``wanted`` (``{}`` when equal)."""
    patch: Json = dict.fromkeys((k for k in current if k not in wanted), None)
    for key, want in wanted.items():
        have = current.get(key)
        if isinstance(want, dict) and isinstance(have, dict):
            nested = diff(have, want)
            if nested:
                patch[key] = nested
        elif want != have:
            patch[key] = want
    return patch


def compose(first: Json, second: Json) -> Json:
    """One merge patch with the effect of applying ``first`` then ``second``."""
    result = dict(first)
    for key, value in second.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = compose(result[key], value)
        else:
            result[key] = value
    return result
