"""What the Azimuth portal does: create a tenancy's objects, and delete a Cluster.

The objects are the YAML files in ``demo/manifests``, server-side applied in file order. Two
things a file cannot say are filled in on the Lease: the uid of the Cluster that owns it (from
the Cluster just applied, as the portal does), and its start, a few seconds from now. A
reservation that has not started yet is the Lease's reason to exist, and it makes the
Cluster's wait for its lease visible: identity is settled by then, the lease is not.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from demo.feed import Feed, within
from demo.style import note
from shared.kube import KubeClient, ResourceKind
from shared.messages import Message, ObjectRef, ResourceChanged
from shared.resources import CLUSTER, KINDS, LEASE, NAMESPACE, ref_to

Json = dict[str, Any]

MANIFESTS = Path(__file__).with_name("manifests")
FIELD_MANAGER = "capibus-demo"
EFFECT_TIMEOUT = 20.0
LEASE_STARTS_IN_SECONDS = 6


async def create_objects(kube: KubeClient, feed: Feed) -> ObjectRef:
    """Apply ``demo/manifests``; returns the Cluster, once the watcher has published them all."""
    applied: list[Json] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for loaded in _load(path):
            doc = _complete_lease(loaded, applied) if loaded["kind"] == LEASE.kind else loaded
            obj = await kube.apply(_kind_of(doc), doc, field_manager=FIELD_MANAGER)
            applied.append(obj)
            meta = obj["metadata"]
            where = f"{meta['namespace']}/" if meta.get("namespace") else ""
            starts = (doc.get("spec") or {}).get("startsAt")
            extra = f", starts at {starts}" if starts else ""
            note(f"applied {doc['kind']} {where}{meta['name']}  ({path.name}{extra})")
    # The watcher does not watch Namespaces, so there is no event to wait for.
    uids = {o["metadata"]["uid"] for o in applied if o["kind"] != NAMESPACE.kind}
    async with within(EFFECT_TIMEOUT, "the watcher publishing every applied object"):
        await feed.wait_until(lambda seen: _added(seen) >= uids or None)
    cluster = next(o for o in applied if o["kind"] == CLUSTER.kind)
    return ref_to(CLUSTER, cluster)


async def delete_cluster(kube: KubeClient, ref: ObjectRef) -> None:
    """Foreground, as the portal (and the schedule operator at the end of a lease) does."""
    body = json.dumps({"propagationPolicy": "Foreground"}).encode()
    await kube.request("DELETE", CLUSTER.path(ref.namespace, ref.name), body=body)


def _complete_lease(lease: Json, applied: list[Json]) -> Json:
    cluster = next(o for o in applied if o["kind"] == CLUSTER.kind)
    owner = {**lease["metadata"]["ownerReferences"][0], "uid": cluster["metadata"]["uid"]}
    starts = datetime.now(UTC) + timedelta(seconds=LEASE_STARTS_IN_SECONDS)
    return {
        **lease,
        "metadata": {**lease["metadata"], "ownerReferences": [owner]},
        "spec": {**lease["spec"], "startsAt": starts.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }


def _load(path: Path) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind_of(doc: Json) -> ResourceKind:
    for kind in (*KINDS.values(), NAMESPACE):
        if (kind.api_version, kind.kind) == (doc["apiVersion"], doc["kind"]):
            return kind
    raise ValueError(f"the demo does not know {doc['apiVersion']} {doc['kind']}")


def _added(seen: list[Message]) -> set[str]:
    return {m.ref.uid or "" for m in seen if isinstance(m, ResourceChanged) and m.event == "ADDED"}
