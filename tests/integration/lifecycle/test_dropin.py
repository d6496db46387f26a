"""Drop-in: capibus takes over the Clusters azimuth-capi-operator left, with no new Helm
revision and no status flapping.

The world is prepared as the upstream operator leaves it, with no capibus service running
(``world(services=False)``: the stand-ins alone), from upstream's code rather than capibus's
(``upstream.py`` says what and from where): OIDC on, Zenith off, a Ready Realm, and two
Clusters, ``plain`` and ``leased`` (with a Lease), each Ready with its release at revision 1,
installed by the real helm binary with the values upstream's template renders.

Then the services start, and once each Cluster says capibus handled it (``Reconciled``,
``IdentityReady`` and for ``leased`` ``LeaseReady`` True) and nothing new about the test's
namespace has been stored on the streams for a few seconds (its objects' events, patches,
nudges and journal entries: the services are done with them; the consumers as a whole are not
looked at, since on the session's shared NATS they also hold other tests' leftovers):

* each release still has exactly its revision 1: capibus computed upstream's values;
* every version of each Cluster that a watch started before the services saw carries every
  key upstream wrote with the value upstream wrote (phase Ready included), so the portal saw
  no flapping and nothing rewritten;
* the one key capibus adds is ``conditions`` (``Reconciled`` from helm, ``IdentityReady`` from
  identity, ``LeaseReady`` from lease: ``docs/lifecycle.md``, "Conditions"); the portal ignores
  it. ``Reconciled`` may say ``WaitingForIdentity`` or ``WaitingForLease`` for a moment, until
  those services have answered for the Cluster; the phase does not depend on it;
* the Cluster's finalizers, labels and annotations are upstream's, kopf's diff-base included;
  the Lease has its finalizer once and one ownerReference to its Cluster; the OIDCClients,
  Platforms, user kubeconfigs and etcd keys are the same objects (same uid), none added.

After that capibus manages them: a node-group count change is exactly revision 2, and
deleting the Clusters as the portal does leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import subjects
from shared.bus import Bus
from shared.errors import CapibusError
from shared.kube import KubeClient
from shared.resources import CLUSTER, LEASE, OIDC_CLIENT, PLATFORM, SECRET
from testenv.harness import LocalStack
from tests.integration.lifecycle.conftest import World
from tests.integration.lifecycle.test_lifecycle import condition, delete_like_the_portal, leftovers
from tests.integration.lifecycle.upstream import (
    LEASE_FINALIZER,
    Helm,
    Left,
    differences,
    left_by_upstream,
)
from tests.integration.support import eventually

Json = dict[str, Any]


async def test_capibus_takes_over_what_upstream_left(
    world: Callable[..., Any], bus: Bus, stack: LocalStack, tools_bin: Path | None, tmp_path: Path
) -> None:
    w: World = await world(
        oidc=True, standin_env={"STANDIN_SCHEDULE_BLAZAR": "1"}, services=False, together=True
    )
    helm = Helm.private(tools_bin, stack, tmp_path)
    await w.create_realm()
    plain, leased = await asyncio.gather(
        left_by_upstream(w, helm, "plain"),
        left_by_upstream(w, helm, "leased", leaseName="kube-leased"),
    )
    left = {"plain": plain, "leased": leased}
    owned = await identity_objects(w)
    async with watched(w.kube, w.namespace) as seen:
        w.start_services()
        await handled(w, bus)
    assert seen.gaps == 0, "the watch missed versions: flapping cannot be ruled out"
    for name, upstream in left.items():
        stored = await revisions(w.kube, w.namespace, name)
        assert stored == [f"sh.helm.release.v1.{name}.v1"], helm.changed(name, w.namespace)
        assert rewritten(seen.of(name), upstream) == []
        cluster = await w.cluster(name)
        assert set(cluster["status"]) - set(upstream.status) == {"conditions"}
        assert {k: cluster["metadata"].get(k) for k in upstream.metadata} == upstream.metadata
    lease = await w.kube.get(LEASE, w.namespace, "kube-leased")
    assert lease["metadata"]["finalizers"].count(LEASE_FINALIZER) == 1
    leased_uid = (await w.cluster("leased"))["metadata"]["uid"]
    assert [o["uid"] for o in lease["metadata"]["ownerReferences"]] == [leased_uid]
    assert await identity_objects(w) == owned
    # From here on capibus manages them: one spec change is one revision, deletion as usual.
    await scaled(w, "plain", 3)
    assert await revisions(w.kube, w.namespace, "plain") == [
        "sh.helm.release.v1.plain.v1",
        "sh.helm.release.v1.plain.v2",
    ]
    for name in left:
        await delete_like_the_portal(w.kube, w.namespace, name)
    await eventually(lambda: leftovers(w), lambda f: not f, timeout=90, what="nothing left")


# --- watching the takeover -------------------------------------------------------------------


@dataclass
class Seen:
    """Every version of the namespace's Clusters from a watch; ``gaps`` counts re-lists,
    after which a version may have been missed."""

    versions: list[Json] = field(default_factory=list)
    gaps: int = 0

    def of(self, name: str) -> list[Json]:
        return [c for c in self.versions if c["metadata"]["name"] == name]


@contextlib.asynccontextmanager
async def watched(kube: KubeClient, namespace: str) -> AsyncIterator[Seen]:
    seen = Seen()
    items, version = await kube.list(CLUSTER, namespace=namespace)
    seen.versions += items

    async def follow(version: str) -> None:
        while True:
            try:
                async for event in kube.watch(
                    CLUSTER, namespace=namespace, resource_version=version
                ):
                    version = event.resource_version or version
                    if event.type in ("ADDED", "MODIFIED"):
                        seen.versions.append(event.object)
            except CapibusError:
                seen.gaps += 1
                items, version = await kube.list(CLUSTER, namespace=namespace)
                seen.versions += items

    task = asyncio.create_task(follow(version))
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def rewritten(versions: list[Json], upstream: Left) -> list[str]:
    """Where any of ``versions`` differs from what upstream wrote, for the keys it wrote (a
    phase other than Ready, a key gone, a value rewritten), by resourceVersion."""
    found = []
    for version in versions:
        status = version.get("status") or {}
        ours = {key: status.get(key) for key in upstream.status}
        rv = version["metadata"]["resourceVersion"]
        found += [f"{rv}: {path}" for path in differences(upstream.status, ours)]
    return found


async def handled(w: World, bus: Bus) -> None:
    """capibus's positive signal for each Cluster, then nothing new about them for a while."""
    for name in ("plain", "leased"):
        await _conditions_true(w, name, "Reconciled", "IdentityReady")
    await _conditions_true(w, "leased", "LeaseReady")
    await settled(bus, w.namespace)


async def settled(bus: Bus, namespace: str, *, quiet: float = 5.0, timeout: float = 90) -> None:
    """Until the streams have stored nothing new about ``namespace`` for ``quiet`` seconds (a
    helm upgrade, were there one, writes its release Secret first: an event, so not quiet)."""
    last, since = -1, time.monotonic()
    deadline = since + timeout
    while True:
        count = await stored(bus, namespace)
        now = time.monotonic()
        if count != last:
            last, since = count, now
        elif now - since >= quiet:
            return
        if now > deadline:
            raise AssertionError(f"still storing messages about {namespace} after {timeout}s")
        await asyncio.sleep(0.25)


async def stored(bus: Bus, namespace: str) -> int:
    """How many messages the streams hold about the objects of ``namespace``."""
    obj = f"{subjects.namespace_token(namespace)}.*"
    p = subjects.PREFIX
    filters = {
        subjects.EVENTS.name: [f"{p}.evt.*.*.{obj}"],
        subjects.STATUS.name: [f"{p}.status.*.*.*.{obj}"],
        subjects.LIFECYCLE.name: [f"{p}.lifecycle.*.*.{obj}", f"{p}.lifecycle.*.*.*.{obj}"],
        subjects.JOURNAL.name: [f"{p}.journal.*.*.{obj}"],
    }
    total = 0
    for stream, wanted in filters.items():
        for subject_filter in wanted:
            info = await bus.js.stream_info(stream, subjects_filter=subject_filter)
            total += sum((info.state.subjects or {}).values())
    return total


async def _conditions_true(w: World, name: str, *types: str) -> None:
    await eventually(
        lambda: w.cluster(name),
        lambda c: all(condition(c, t).get("status") == "True" for t in types),
        timeout=60,
        what=f"{name}: {', '.join(types)} True",
    )


# --- what must not change --------------------------------------------------------------------


async def revisions(kube: KubeClient, namespace: str, name: str) -> list[str]:
    """The names of the release's storage Secrets, one per revision Helm keeps."""
    selector = f"owner=helm,name={name}"
    items, _ = await kube.list(SECRET, namespace=namespace, label_selector=selector)
    return sorted(s["metadata"]["name"] for s in items)


async def identity_objects(w: World) -> dict[str, list[tuple[str, str]]]:
    """The identity objects, user kubeconfigs and etcd keys in the namespace, by name and uid."""
    found = {}
    for kind in (OIDC_CLIENT, PLATFORM):
        items, _ = await w.kube.list(kind, namespace=w.namespace)
        found[kind.plural] = sorted((i["metadata"]["name"], i["metadata"]["uid"]) for i in items)
    items, _ = await w.kube.list(SECRET, namespace=w.namespace)
    found["secrets"] = sorted(
        (s["metadata"]["name"], s["metadata"]["uid"])
        for s in items
        if s["metadata"]["name"].endswith(("-kubeconfig-user", "-etcd-key"))
    )
    return found


async def scaled(w: World, name: str, count: int) -> None:
    cluster = await w.cluster(name)
    nodes = cluster["status"]["nodeCount"]
    groups = cluster["spec"]["nodeGroups"]
    more = count - groups[0]["count"]
    groups[0]["count"] = count
    await w.kube.patch_merge(CLUSTER, w.namespace, name, {"spec": {"nodeGroups": groups}})
    await eventually(
        lambda: w.cluster(name),
        lambda c: c["status"].get("phase") == "Ready" and c["status"]["nodeCount"] == nodes + more,
        timeout=60,
        what=f"{name} scaled to {count}",
    )
