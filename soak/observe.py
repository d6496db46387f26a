"""Reading the system from outside: the objects, the registrar, Helm's storage, the streams.

Two uses. ``problems`` answers "is the system quiet and back at the expected state?" and is
polled after every fault, so it reads only what that needs (eight namespace lists and the
durable consumers' counters; the many Secrets as metadata only). ``gather`` reads everything
the final check needs into ``soak.checks.Facts``.

*Quiet* means no durable consumer of any stream has a message waiting or delivered and not
yet acknowledged: nothing is in flight anywhere. *Expected state* is
``soak.checks.cluster_problems`` and ``status_problems`` for every Cluster, and nothing left
of the deleted ones.

The status the stand-ins' objects imply is computed with the monitor's own mapping
(``services.monitor.logic.fragment``, folded with ``shared.mergepatch``): what is checked is
that no update was lost on the way through the bus, the writer and the API server, not the
mapping itself (its unit tests do that).

Helm keeps a release's revisions in Secrets ``sh.helm.release.v1.<release>.v<N>`` labelled
``owner=helm``: ``data.release`` is the release as gzipped JSON, base64-encoded by Helm
before the API's own base64 (``pkg/storage/driver/util.go`` in helm/helm).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.monitor import logic as monitor
from shared import mergepatch, subjects
from shared.bus import NATS_ERRORS, Bus
from shared.errors import CapibusError, KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.messages import MessageDeadLettered, MetadataChanged, StatusWritten, decode_any
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CLUSTER_TEMPLATE,
    CONTROL_PLANE,
    HELM_RELEASE,
    LEASE,
    MACHINE,
    MANIFESTS,
    OIDC_CLIENT,
    PLATFORM,
    SECRET,
    cluster_key,
)
from soak.checks import (
    LEASE_FINALIZER,
    DeadLetter,
    Facts,
    Intent,
    Revision,
    cluster_problems,
    status_problems,
)
from soak.world import NAMESPACE_NAME
from testenv.examples import CLUSTER_LIFE_KINDS

Json = dict[str, Any]

METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
SUBDOMAIN = "azimuth.stackhpc.com/zenith-subdomain"
SERVICE_ACCOUNT = ResourceKind("serviceaccount", "", "v1", "ServiceAccount", "serviceaccounts")
#: the kinds the monitor maps to a Cluster's status, as the stand-ins leave them
BACKING = (CAPI_CLUSTER, CONTROL_PLANE, MACHINE, HELM_RELEASE, MANIFESTS)
#: every kind a Cluster's life creates (``testenv.examples``), ServiceAccounts too
LEFTOVER_KINDS = (*CLUSTER_LIFE_KINDS, SERVICE_ACCOUNT)


async def listed(kube: KubeClient, kind: ResourceKind, *, metadata: bool = False) -> list[Json]:
    """Every ``kind`` in the soak's namespace (``metadata``: without data or spec)."""
    if not metadata:
        items, _ = await kube.list(kind, namespace=NAMESPACE_NAME)
        return items
    page = await kube.request("GET", kind.path(NAMESPACE_NAME), accept=METADATA_LIST)
    return list(page.get("items") or [])


def owner_of(kind: ResourceKind, obj: Json) -> str:
    """The Azimuth Cluster (name) an object belongs to, by the labels and owners capibus reads."""
    return cluster_key(kind, obj).split("/", 1)[1]


# --- the expected state -------------------------------------------------------------------


class Observer:
    """Reads for the convergence check; remembers deleted Clusters already found clean."""

    def __init__(self, kube: KubeClient, bus: Bus, versions: dict[str, str]) -> None:
        self.kube = kube
        self.bus = bus
        self.versions = versions
        self.clean: set[str] = set()

    async def problems(self, intents: Sequence[Intent], *, thorough: bool = False) -> list[str]:
        """Everything standing between now and "quiet, at the expected state".

        The costlier reads (the objects behind each status, what is left of deleted Clusters)
        are made only once the cheap ones find nothing, unless ``thorough``: then every
        problem is named (to say why a wait timed out)."""
        try:
            found = await lag(self.bus)
            clusters = {c["metadata"]["name"]: c for c in await listed(self.kube, CLUSTER)}
            for intent in intents:
                found += cluster_problems(intent, clusters.get(intent.name), self.versions)
            if thorough or not found:
                found += await self._status(intents, clusters)
            if thorough or not found:
                found += await self._leftovers(intents)
        except CapibusError as exc:
            return [f"unreadable: {exc!r}"]
        except NATS_ERRORS as exc:
            return [f"unreadable: {exc!r}"]
        return found

    async def _status(self, intents: Sequence[Intent], clusters: dict[str, Json]) -> list[str]:
        implied = await implied_statuses(self.kube)
        found: list[str] = []
        for intent in intents:
            cluster = clusters.get(intent.name)
            if intent.live and cluster is not None:
                status = cluster.get("status") or {}
                found += status_problems(intent.name, status, implied.get(intent.name, {}))
        return found

    async def _leftovers(self, intents: Sequence[Intent]) -> list[str]:
        wanted = [i.name for i in intents if i.deleted and i.name not in self.clean]
        if not wanted:
            return []
        left = await leftovers(self.kube, wanted)
        self.clean |= {name for name in wanted if not left.get(name)}
        return [f"{name}: left {', '.join(things)}" for name, things in left.items() if things]


async def lag(bus: Bus) -> list[str]:
    """Durable consumers with messages waiting or unacknowledged, one line each."""
    found = []
    for stream in subjects.ALL_STREAMS:
        for info in await consumers(bus, stream.name):
            if not info.config.durable_name:
                continue
            waiting, unacked = int(info.num_pending or 0), int(info.num_ack_pending or 0)
            if waiting or unacked:
                found.append(f"{info.name}: {waiting} waiting, {unacked} unacknowledged")
    return found


async def consumers(bus: Bus, stream: str) -> list[Any]:
    found: list[Any] = []
    while True:
        page = await bus.js.consumers_info(stream, offset=len(found) or None)
        found += page
        if len(page) < 256:
            return found


async def implied_statuses(kube: KubeClient) -> dict[str, Json]:
    """Per Cluster, the status its CAPI, addon, kubeconfig and Lease objects imply."""
    implied: dict[str, Json] = {}
    for kind in BACKING:
        for obj in await listed(kube, kind):
            _fold(implied, kind, obj)
    for secret in await listed(kube, SECRET, metadata=True):
        _fold(implied, SECRET, secret)
    for lease in await listed(kube, LEASE):
        phase = (lease.get("status") or {}).get("phase")
        name = owner_of(LEASE, lease)
        if phase:
            implied.setdefault(name, {})["leasePhase"] = phase
    return implied


def _fold(implied: dict[str, Json], kind: ResourceKind, obj: Json) -> None:
    name = monitor.owner(kind, obj, oidc=True)
    if name is None:
        return
    fragment = monitor.fragment(kind, "MODIFIED", obj)
    implied[name] = mergepatch.apply(implied.get(name, {}), fragment)


async def leftovers(kube: KubeClient, names: Iterable[str]) -> dict[str, list[str]]:
    """For each named (deleted) Cluster, ``kind/name`` of everything still there of it."""
    wanted = set(names)
    found: dict[str, list[str]] = {name: [] for name in wanted}
    for kind in LEFTOVER_KINDS:
        for obj in await listed(kube, kind, metadata=True):
            name = obj["metadata"]["name"]
            if name.endswith("-cloud-credentials"):
                continue  # the portal's, and the portal deletes it (or the Lease's operator)
            cluster = _belongs(kind, obj, wanted)
            if cluster:
                found[cluster].append(f"{kind.plural}/{name}")
    return found


def _belongs(kind: ResourceKind, obj: Json, wanted: set[str]) -> str | None:
    name = obj["metadata"]["name"]
    owner = owner_of(kind, obj)
    if owner in wanted:
        return owner
    for cluster in wanted:
        prefixes = (f"{cluster}-", f"kube-{cluster}", f"sh.helm.release.v1.{cluster}.")
        if name == cluster or name.startswith(prefixes):
            return cluster
    return None


# --- the final facts -----------------------------------------------------------------------


async def revisions(kube: KubeClient, release: str | None = None) -> dict[str, list[Revision]]:
    """Each release's revisions from Helm's storage Secrets (one release, or all)."""
    selector = "owner=helm" + (f",name={release}" if release else "")
    items, _ = await kube.list(SECRET, namespace=NAMESPACE_NAME, label_selector=selector)
    found: dict[str, list[Revision]] = {}
    for secret in items:
        labels = secret["metadata"].get("labels") or {}
        found.setdefault(labels.get("name", "?"), []).append(decode_revision(secret))
    return found


def decode_revision(secret: Json) -> Revision:
    labels = secret["metadata"].get("labels") or {}
    number = int(str(labels.get("version") or 0))
    try:
        release = decode_release(str((secret.get("data") or {})["release"]))
    except (KeyError, ValueError, OSError):
        return Revision(number, labels.get("status", "?"), "undecodable", "")
    info = release.get("info") or {}
    config = json.dumps(release.get("config") or {}, sort_keys=True)
    return Revision(
        number,
        str(info.get("status", labels.get("status", "?"))),
        str(info.get("description", "")),
        hashlib.sha256(config.encode()).hexdigest()[:16],
    )


def decode_release(data: str) -> Json:
    raw = base64.b64decode(base64.b64decode(data))
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    release: Json = json.loads(raw)
    return release


async def subdomain(kube: KubeClient, cluster: str) -> str | None:
    """The Cluster's Zenith subdomain, from its ``<cluster>-zenith-apiserver`` Secret."""
    try:
        meta = await kube.get_metadata(SECRET, NAMESPACE_NAME, f"{cluster}-zenith-apiserver")
    except KubeNotFound:
        return None
    value = (meta["metadata"].get("annotations") or {}).get(SUBDOMAIN)
    return str(value) if value else None


async def reservations(registrar_url: str) -> Counter[str]:
    async with httpx.AsyncClient(base_url=registrar_url, timeout=10.0) as client:
        response = await client.get("/admin/reservations")
        response.raise_for_status()
        data = response.json()
    entries = data.values() if isinstance(data, dict) else data
    return Counter(str(entry["subdomain"]) for entry in entries)


async def owned_counts(kube: KubeClient, kind: ResourceKind, live: dict[str, str]) -> Counter[str]:
    """Objects of ``kind`` per live Cluster owning them (by uid); ``""``: no live owner."""
    counts: Counter[str] = Counter()
    for obj in await listed(kube, kind):
        refs = obj["metadata"].get("ownerReferences") or []
        owners = {ref.get("uid") for ref in refs} & set(live)
        counts[live[owners.pop()] if owners else ""] += 1
    return counts


async def lease_finalizers(kube: KubeClient) -> dict[str, int]:
    return {
        owner_of(LEASE, lease): (lease["metadata"].get("finalizers") or []).count(LEASE_FINALIZER)
        for lease in await listed(kube, LEASE)
    }


async def read_all(bus: Bus, stream: str, subject: str) -> list[Any]:
    """Every message on ``subject`` of ``stream``, decoded, oldest first."""
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0
    )
    psub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    try:
        remaining = (await psub.consumer_info()).num_pending or 0
        out: list[Any] = []
        while remaining > 0:
            msgs = await psub.fetch(min(remaining, 500), timeout=10)
            out += [decode_any(m.data) for m in msgs]
            remaining -= len(msgs)
        return out
    finally:
        with contextlib.suppress(*NATS_ERRORS):
            await psub.unsubscribe()


async def dead_letters(bus: Bus) -> list[DeadLetter]:
    found = await read_all(bus, subjects.DEADLETTER.name, "capibus.dlq.>")
    return [
        DeadLetter(m.service, m.original_subject, m.original_id, m.reason, m.error)
        for m in found
        if isinstance(m, MessageDeadLettered)
    ]


async def journaled(bus: Bus) -> set[str]:
    """Ids of the status patches and metadata commands the writer carried out."""
    ids: set[str] = set()
    for entry in await read_all(bus, subjects.JOURNAL.name, "capibus.journal.>"):
        if isinstance(entry, StatusWritten):
            ids.update(entry.update_ids)
        elif isinstance(entry, MetadataChanged) and entry.command.get("id"):
            ids.add(str(entry.command["id"]))
    return ids


async def gather(
    kube: KubeClient,
    bus: Bus,
    registrar_url: str,
    intents: Sequence[Intent],
    recorded: Facts,
) -> Facts:
    """The final facts; ``recorded`` holds what was read of deleted Clusters before their
    delete (revisions, subdomains)."""
    clusters = {c["metadata"]["name"]: c for c in await listed(kube, CLUSTER)}
    live = {c["metadata"]["uid"]: name for name, c in clusters.items()}
    facts = Facts(
        clusters=clusters,
        versions=await template_versions(kube),
        implied=await implied_statuses(kube),
        oidc_clients=dict(await owned_counts(kube, OIDC_CLIENT, live)),
        platforms=dict(await owned_counts(kube, PLATFORM, live)),
        lease_finalizers=await lease_finalizers(kube),
        reservations=dict(await reservations(registrar_url)),
        subdomains=dict(recorded.subdomains),
        revisions={**recorded.revisions, **await revisions(kube)},
        leftovers=await leftovers(kube, [i.name for i in intents if i.deleted]),
        dead_letters=await dead_letters(bus),
        journaled=await journaled(bus),
    )
    for name in clusters:
        found = await subdomain(kube, name)
        if found:
            facts.subdomains[name] = found
    return facts


async def template_versions(kube: KubeClient) -> dict[str, str]:
    items, _ = await kube.list(CLUSTER_TEMPLATE)
    return {
        t["metadata"]["name"]: str(t["spec"]["values"]["kubernetesVersion"])
        for t in items
        if (t.get("spec") or {}).get("values", {}).get("kubernetesVersion")
    }
