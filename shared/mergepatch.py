"""RFC 7386 JSON merge patches: applying and composing them.

Applying ``a`` then ``b`` equals applying ``compose(a, b)``: nested objects merge, later
scalars win, and ``None`` (delete) is kept so it still deletes on the server. The writer uses
that to turn N patches into one PATCH; the monitor uses ``apply`` to predict the status its
patches produce.
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


def compose(first: Json, second: Json) -> Json:
    """One merge patch with the effect of applying ``first`` then ``second``."""
    result = dict(first)
    for key, value in second.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = compose(result[key], value)
        else:
            result[key] = value
    return result
