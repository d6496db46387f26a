"""What the writer derives for each kind it writes: one rule per kind.

The writer applies status patches to every kind in ``shared.status.WRITTEN`` the same way
(compose, merge conditions, skip what changes nothing, guard with uid and resourceVersion).
What differs per kind is only what it *derives* from the status it is about to write, so a
publisher never has to know those rules:

* ``facts`` picks what of the object, besides its status, the derivation needs (read from
  the same snapshot the patch is computed from, so both agree);
* ``derive`` returns the keys it owns for the status that would result;
* ``deadline`` says when the derived status would change by time alone, so the writer can
  arm one timer for that moment instead of anyone re-deriving on a schedule.

The Azimuth ``Cluster``'s rule is upstream's phase derivation (``shared.phase``: phase, node
and addon counts, ``lastUpdated`` and the timeout into Unhealthy). A kind without a rule of
its own gets ``plain``: nothing derived. A new provider whose status has derived fields adds
its rule to ``rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared import phase
from shared.kube import ResourceKind
from shared.messages import ObjectRef
from shared.resources import CLUSTER
from shared.status import WRITTEN, UnknownKind

Json = dict[str, Any]
Facts = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    kind: ResourceKind
    facts: Callable[[Json], Facts] = lambda obj: {}
    derive: Callable[[Json, Facts, datetime], Json] = lambda status, facts, now: {}
    deadline: Callable[[Json], datetime | None] = lambda status: None


def plain(kind: ResourceKind) -> Rule:
    return Rule(kind)


def azimuth_cluster(timeout_seconds: float) -> Rule:
    """Upstream's phase rules, and the timeout after ``timeout_seconds``."""

    def facts(obj: Json) -> Facts:
        return {
            "lease_name": (obj.get("spec") or {}).get("leaseName"),
            "deleting": bool(obj["metadata"].get("deletionTimestamp")),
        }

    def derive(status: Json, facts: Facts, now: datetime) -> Json:
        return phase.derive(
            status,
            lease_name=facts.get("lease_name"),
            now=now,
            timeout_seconds=timeout_seconds,
            deleting=bool(facts.get("deleting")),
        )

    return Rule(
        CLUSTER,
        facts=facts,
        derive=derive,
        deadline=lambda status: phase.deadline(status, timeout_seconds),
    )


class Rules:
    """The rule of every kind the writer writes, found by an update's reference."""

    def __init__(self, *rules: Rule) -> None:
        own = {(r.kind.api_version, r.kind.kind): r for r in rules}
        self._by_ref = {
            (k.api_version, k.kind): own.get((k.api_version, k.kind)) or plain(k) for k in WRITTEN
        }

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._by_ref.values())

    def of(self, ref: ObjectRef) -> Rule:
        rule = self._by_ref.get((ref.api_version, ref.kind))
        if rule is None:
            raise UnknownKind(ref)
        return rule


def rules(*, cluster_timeout_seconds: float) -> Rules:
    return Rules(azimuth_cluster(cluster_timeout_seconds))
