"""RFC 6902 JSON patch operations applied in memory, as the API server applies them.

For the places that stand in for the API server without one: the replay's recording
Kubernetes port (``services.replay_ports``) and the tests' fake (``tests.fakes``). Supported
are the operations capibus sends: ``test``, ``add`` (``-`` appends to a list), ``replace`` and
``remove``; a failed ``test`` is the server's 409 (``KubeConflict``), anything else it would
refuse is ``KubeInvalid``.
"""

from __future__ import annotations

import copy
from typing import Any

from shared.errors import KubeConflict, KubeInvalid

Json = dict[str, Any]


def apply_op(obj: Json, op: Json) -> None:
    """One operation on ``obj``, in place."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    target: Any = obj
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    if isinstance(target, list):
        _list_op(target, last, op)
    elif op["op"] == "test":
        if target.get(last) != op["value"]:
            raise KubeConflict(f"test of {op['path']} failed")
    elif op["op"] in ("add", "replace"):
        target[last] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        del target[last]
    else:
        raise KubeInvalid(f"unsupported JSON patch op {op['op']!r}")


def _list_op(target: list[Any], last: str, op: Json) -> None:
    index = len(target) if last == "-" else int(last)
    if op["op"] == "add":
        target.insert(index, copy.deepcopy(op["value"]))
    elif op["op"] == "test":
        if index >= len(target) or target[index] != op["value"]:
            raise KubeConflict(f"test of {op['path']} failed")
    elif op["op"] == "replace":
        target[index] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        del target[index]
    else:
        raise KubeInvalid(f"unsupported JSON patch op {op['op']!r}")
