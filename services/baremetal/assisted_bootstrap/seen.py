"""What the bootstrap provider remembers beyond ``shared.seen``'s memories.

``shared.seen`` says why a replica keeps the newest version of each object, its decisions and
its marks, and why none of it lets a stale view write unchecked. This provider's mappings wake
the configs of a cluster, and its runs read Machines that never change what they say; it
keeps three memories more, lost like the others when partitions move
(``shared.seen.Forgetting``):

* **Listings.** A cluster's configs and ClusterDeployments, listed once, are found among the
  newest versions from then on (``kept``, ``listed``): their events keep every entry (each is
  noted, its DELETED one too), and an entry in doubt is woken to be read. So a distrusted
  object's last view stays here, in doubt, for ``kept`` to name it; it is never a run's view
  (``current`` and ``get`` read it again).
* **Runs in flight.** A mapping that wakes the configs waiting for something reads their wait
  from their status; a run that has read its inputs and not yet had its report written is not
  there yet. ``is_running`` and the base's ``decided_reason`` let the mapping wake such a
  config anyway (``handlers._in_doubt``). This is what the writer's own event used to do,
  and why that event may now be dropped. A run stays in flight across a forgetting: it is
  still running.
* **Facts.** The parts of a Machine that never change for its uid (cluster, role, pool,
  infrastructure reference, owners) and the template it was made from, kept while it lives
  (``recall``; ``handlers`` learns them from the Machine's events, and forgets them when it
  goes).
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from collections.abc import Iterator

import shared.seen
from shared.kube import ResourceKind
from shared.seen import Json, key_of


class Seen(shared.seen.Seen):
    def __init__(self) -> None:
        super().__init__()
        self._listed: set[str] = set()
        self._running: Counter[str] = Counter()
        self._facts: dict[str, Json] = {}

    def clear(self) -> None:
        """Forget everything but the runs in flight (partitions moved: see ``Forgetting``)."""
        super().clear()
        self._listed.clear()
        self._facts.clear()

    # --- listings -------------------------------------------------------------------------

    def distrust(self, key: str) -> None:
        """``shared.seen.Seen.distrust``; what was kept of the object stays, for ``kept`` to
        name it, in doubt."""
        self._doubt(key)

    def kept(self, kind: ResourceKind, namespace: str) -> list[tuple[Json, bool]]:
        """Every object of ``kind`` in ``namespace`` kept here, each with whether it is
        current (False: in doubt, to be read)."""
        prefix = key_of(kind, namespace, "")
        return [
            (copy.deepcopy(obj), key not in self._untrusted)
            for key, obj in self._latest.items()
            if key.startswith(prefix)
        ]

    def listed(self, index: str) -> bool:
        """Whether the objects ``index`` names were listed since this replica last forgot:
        from then on their events keep ``kept`` complete (each is noted, its DELETED one too)."""
        return index in self._listed

    def list_done(self, index: str) -> None:
        self._listed.add(index)

    # --- runs in flight -------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, key: str) -> Iterator[None]:
        self._running[key] += 1
        try:
            yield
        finally:
            self._running[key] -= 1
            if self._running[key] <= 0:
                del self._running[key]

    def is_running(self, key: str) -> bool:
        return key in self._running

    # --- facts ----------------------------------------------------------------------------

    def remember(self, key: str | None, obj: Json) -> None:
        if key:
            self._facts[key] = copy.deepcopy(obj)

    def recall(self, key: str | None) -> Json | None:
        found = self._facts.get(key) if key else None
        return copy.deepcopy(found) if found is not None else None

    def drop(self, key: str | None) -> None:
        if key:
            self._facts.pop(key, None)
