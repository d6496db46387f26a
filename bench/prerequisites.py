"""(c) Prerequisite latency: from a prerequisite becoming ready to capibus's next step.

Upstream's operator notices a prerequisite that became ready on its next retry, every 15 s.
capibus reacts to the event instead; this measures how long that takes end to end.

The services run with OIDC on (no Zenith); no stand-in runs. The benchmark process plays the
identity and schedule operators itself, so it knows the moment each prerequisite becomes
ready: it writes the status with its own client, and that moment is when the PATCH of the
status subresource was answered (the API server has committed it by then; the PATCH round
trip is listed so the uncertainty is visible). The next step is observed through the
benchmark's own watches (``bench.observe``); a latency is *next step seen - status written*.

Per Cluster ``cNNN`` (its own Realm ``rNNN``, named by ``spec.zenithIdentityRealmName``, and a
Lease ``kube-cNNN`` owned by it, as the portal makes it):

1. create the Realm (no status), the credentials Secret, the Cluster and the Lease; wait until
   capibus has said what it waits for (Cluster conditions ``IdentityReady`` RealmNotReady,
   ``LeaseReady`` LeaseNotActive, ``Reconciled`` WaitingForIdentity), so every measured step
   starts from a Cluster capibus is idle on;
2. even Clusters: Lease ``Active`` first (wait for ``LeaseReady`` True), so the Platform is
   the last prerequisite; odd Clusters: the Lease goes last;
3. Realm ``Ready`` → **c1** until the OIDCClient is ADDED;
4. (after ``IdentityReady`` says WaitingForOIDCClient) OIDCClient ``issuerUrl`` + ``clientId``
   → **c2** until the Platform is ADDED;
5. (after WaitingForPlatform) Platform ``rootGroup`` → for even Clusters **c3** until the
   Helm release starts: its Secret ``sh.helm.release.v1.cNNN.v1`` is ADDED (helm writes it,
   ``pending-install``, before it creates any object); the CAPI Cluster, the first object of
   the chart, is listed as well;
6. odd Clusters: (after ``IdentityReady`` True) Lease ``Active`` → **c4**, the same.

Each wait for capibus's "I am waiting" condition is followed by ``SETTLE`` seconds, so the
services have finished the run that wrote it. ``in_flight`` Clusters go through this at once,
after one unmeasured Cluster has warmed the services up (first helm run, connections). A
release started before its last prerequisite was written would be a bug; it is checked.

c3/c4 are also split at the helm commands the helm service logged (``helm_breakdown``): how
much is capibus deciding, how much helm's own checks and start-up.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import deployment, helmlog
from bench.common import Clients, new_namespace, p50_p99, percentile, run_pool
from bench.deployment import condition, load_average
from bench.lifecycle import Section, latency_figure, spread
from bench.observe import Json, Observer
from bench.procs import Children, CpuSnapshot
from shared.kube import KubeClient, ResourceKind
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET
from testenv.harness import LocalStack

STEP_TIMEOUT = 60.0
SETTLE = 0.2
LIMIT = 1.0
WARM_UP = 999  # the index of the Cluster that warms the services up
FLAVORS = ("f-small", "f-medium")
LEASE_ACTIVE = {
    "phase": "Active",
    "sizeMap": {f: f for f in FLAVORS},
    "sizeNameMap": {"m1.small": "m1.small", "m1.medium": "m1.medium"},
}


@dataclass(frozen=True)
class PrerequisiteSizes:
    clusters: int
    in_flight: int


#: The measured steps: key -> what it measures.
STEPS = {
    "realm": "c1 Realm Ready → OIDCClient ADDED",
    "client": "c2 OIDCClient issuerUrl+clientId → Platform ADDED",
    "platform": "c3 Platform rootGroup (last) → release Secret ADDED",
    "platform-capi": "c3 Platform rootGroup (last) → CAPI Cluster ADDED",
    "lease": "c4 Lease Active (last) → release Secret ADDED",
    "lease-capi": "c4 Lease Active (last) → CAPI Cluster ADDED",
}


@dataclass
class Samples:
    """Per step, per Cluster: seconds from the status written to the next object seen."""

    steps: dict[str, dict[str, float]] = field(default_factory=lambda: {k: {} for k in STEPS})
    round_trips: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: per Cluster: (step, monotonic moment its last prerequisite was written)
    triggers: dict[str, tuple[str, float]] = field(default_factory=dict)

    def values(self, step: str) -> list[float]:
        return list(self.steps[step].values())

    def slowest(self, step: str, count: int = 3) -> str:
        worst = sorted(self.steps[step].items(), key=lambda item: -item[1])[:count]
        return ", ".join(f"{name} {value * 1000:.0f}" for name, value in worst)


class StepTimeout(Exception):
    """capibus did not take the next step within ``STEP_TIMEOUT``."""


@dataclass
class Run:
    """One Cluster's walk through its prerequisites, as the identity/schedule operators."""

    kube: KubeClient
    obs: Observer
    namespace: str
    template: str
    samples: Samples

    async def cluster(self, index: int) -> None:
        name = f"c{index:03d}"
        try:
            await self._walk(name, realm=f"r{index:03d}", lease_last=index % 2 == 1)
        except StepTimeout as exc:
            self.samples.failures.append(f"{name}: {exc}")

    async def _walk(self, name: str, *, realm: str, lease_last: bool) -> None:
        await self._create(name, realm)
        await self._settled(name, IdentityReady="RealmNotReady", LeaseReady="LeaseNotActive")
        if not lease_last:
            await self._ready(LEASE, f"kube-{name}", LEASE_ACTIVE)
            await self._settled(name, LeaseReady="Active")
        written = await self._ready(REALM, realm, _realm_status(self.namespace, realm))
        self.samples.steps["realm"][name] = await self._next(OIDC_CLIENT, f"kube-{name}", written)
        await self._settled(name, IdentityReady="WaitingForOIDCClient")
        written = await self._ready(OIDC_CLIENT, f"kube-{name}", _client_status(name, realm))
        self.samples.steps["client"][name] = await self._next(PLATFORM, f"kube-{name}", written)
        await self._settled(name, IdentityReady="WaitingForPlatform")
        platform = {"phase": "Ready", "rootGroup": f"/kube-{name}"}
        last = await self._ready(PLATFORM, f"kube-{name}", platform)
        if lease_last:
            await self._settled(name, IdentityReady="Ready", Reconciled="WaitingForLease")
            last = await self._ready(LEASE, f"kube-{name}", LEASE_ACTIVE)
        step = "lease" if lease_last else "platform"
        self.samples.triggers[name] = (step, last)
        release = await self._next(SECRET, f"sh.helm.release.v1.{name}.v1", last)
        capi = await self._next(CAPI_CLUSTER, name, last)
        self.samples.steps[step][name] = release
        self.samples.steps[f"{step}-capi"][name] = capi

    async def _create(self, name: str, realm: str) -> None:
        await self.kube.create(REALM, _realm(self.namespace, realm))
        await deployment.create_credentials(self.kube, self.namespace, name)
        cluster = await deployment.create_cluster(
            self.kube,
            self.namespace,
            name,
            self.template,
            zenithIdentityRealmName=realm,
            leaseName=f"kube-{name}",
        )
        await self.kube.create(LEASE, deployment.lease_object(cluster, FLAVORS))

    async def _settled(self, name: str, **reasons: str) -> None:
        """Until the Cluster's conditions give these reasons, then ``SETTLE`` more seconds."""
        wanted = {"Reconciled": "WaitingForIdentity", **reasons}

        def check() -> bool:
            cluster = self.obs.get(CLUSTER, name)
            return all(condition(cluster, t).get("reason") == r for t, r in wanted.items())

        if not await self.obs.until(check, STEP_TIMEOUT):
            conditions = (self.obs.get(CLUSTER, name) or {}).get("status", {}).get("conditions")
            raise StepTimeout(f"conditions {wanted} not reached; last: {conditions}")
        await asyncio.sleep(SETTLE)

    async def _ready(self, kind: ResourceKind, name: str, status: Json) -> float:
        """Write ``status`` as that object's operator would; the moment it was answered."""
        sent = time.monotonic()
        patch = {"status": status}
        await self.kube.patch_merge(kind, self.namespace, name, patch, subresource="status")
        answered = time.monotonic()
        self.samples.round_trips.append(answered - sent)
        return answered

    async def _next(self, kind: ResourceKind, name: str, written: float) -> float:
        """Seconds from ``written`` until ``name`` was first seen."""
        if not await self.obs.until(lambda: self.obs.seen(kind, name) is not None, STEP_TIMEOUT):
            raise StepTimeout(f"{kind.kind} {name} did not appear")
        seen = self.obs.seen(kind, name) or 0.0
        if seen < written:
            self.samples.failures.append(f"{kind.kind} {name} appeared before it was due")
        return seen - written


def _realm(namespace: str, name: str) -> dict[str, object]:
    return {
        "apiVersion": REALM.api_version,
        "kind": REALM.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tenancyId": "tenancy-1234"},
    }


def _realm_status(namespace: str, name: str) -> dict[str, object]:
    base = f"https://keycloak.example.test/realms/{namespace}-{name}"
    return {
        "phase": "Ready",
        "oidcIssuerUrl": base,
        "adminUrl": f"{base}/console",
        "platformUsersGroup": "/platform-users",
    }


def _client_status(cluster: str, realm: str) -> dict[str, object]:
    issuer = f"https://keycloak.example.test/realms/{realm}"
    return {"phase": "Ready", "issuerUrl": issuer, "clientId": f"kube-{cluster}"}


# -- the benchmark ---------------------------------------------------------------------------


KINDS = (CLUSTER, OIDC_CLIENT, PLATFORM, SECRET, CAPI_CLUSTER, LEASE)


async def measure(
    clients: Clients, stack: LocalStack, children: Children, helm: Path, sizes: PrerequisiteSizes
) -> Section:
    kube = clients.kube
    namespace = await new_namespace(kube, "bench-pre")
    template = f"bench-tpl-{uuid.uuid4().hex[:6]}"
    await deployment.create_template(kube, template)
    section = _section(sizes)
    running = await deployment.start(children, stack, helm=helm, oidc=True, prefix="pre")
    obs = await Observer(kube, namespace, KINDS).start()
    try:
        # One Cluster first, not measured: the first helm run, connections, caches.
        warm = Run(kube=kube, obs=obs, namespace=namespace, template=template, samples=Samples())
        await warm.cluster(WARM_UP)
        samples = Samples()
        run = Run(kube=kube, obs=obs, namespace=namespace, template=template, samples=samples)
        labels = running.labels()
        load, helm_cpu = load_average(), running.helm_cpu()
        before = CpuSnapshot.take(labels)
        started = time.monotonic()
        await run_pool(sizes.clusters, run.cluster, concurrency=sizes.in_flight)
        took = time.monotonic() - started
        after = CpuSnapshot.take(labels)
        helm_cores = (running.helm_cpu() - helm_cpu) / took
        _fill(section, samples, sizes)
        section.details += helm_breakdown(samples, obs, running.services["helm"].log())
        section.details += [
            f"{sizes.clusters} Clusters, {sizes.in_flight} at a time, in {took:.0f} s; "
            f"load average before (1/5/15 min): {load}, after: {load_average()}",
            after.cpu_line(before),
            f"helm processes of the helm service (in 'other processes' above): "
            f"{helm_cores:.2f} cores",
        ]
        section.details.append(await _clean_up(kube, obs, namespace, _gone_check(obs)))
    finally:
        await obs.stop()
        running.stop(children)
    return section


def _fill(section: Section, s: Samples, sizes: PrerequisiteSizes) -> None:
    n = sizes.clusters
    figures = (
        ("c1", "realm", "Realm Ready → OIDCClient created", n),
        ("c2", "client", "OIDCClient issuerUrl+clientId → Platform created", n),
        ("c3", "platform", "Platform rootGroup (last) → Helm release started", (n + 1) // 2),
        ("c4", "lease", "Lease Active (last) → Helm release started", n // 2),
    )
    for key, step, title, expected in figures:
        section.figures.append(
            latency_figure(key, title, s.values(step), expected=expected, limit=LIMIT)
        )
    for key, title in STEPS.items():
        section.details.append(f"{title}: {spread(s.values(key))}; slowest (ms): {s.slowest(key)}")
    section.details.append(
        f"status PATCH round trip of the benchmark (uncertainty of 'written'): "
        f"{p50_p99(s.round_trips)}"
    )
    if s.failures:
        section.details.append("failures: " + "; ".join(s.failures[:20]))
    else:
        section.details.append("no release started before its last prerequisite was written")


def helm_breakdown(s: Samples, obs: Observer, log: str) -> list[str]:
    """c3/c4 split at the helm commands (the helm service's log; one install at a time).

    capibus = prerequisite written → the helm service's first helm command of that install
    started (the prerequisite service's run, the helm service's run up to ``ensure_release``);
    helm checks = ``show chart`` + ``get metadata`` (before ``upgrade --install`` starts);
    helm install = ``upgrade --install`` started → its release Secret seen.
    """
    runs = helmlog.runs(log)
    offset = time.time() - time.monotonic()
    parts: dict[str, dict[str, list[float]]] = {}
    for name, (step, written) in s.triggers.items():
        seen = obs.seen(SECRET, f"sh.helm.release.v1.{name}.v1")
        meta = next((r for r in runs if r.verb == "get metadata" and r.release == name), None)
        upgrade = next(
            (r for r in runs if r.verb == "upgrade --install" and r.release == name), None
        )
        if seen is None or meta is None or upgrade is None:
            continue
        chart = [r for r in runs if r.verb == "show chart" and r.ended <= meta.started + 0.005]
        first = chart[-1].started if chart else meta.started
        split = parts.setdefault(step, {"capibus": [], "helm checks": [], "helm install": []})
        split["capibus"].append(first - (written + offset))
        split["helm checks"].append(upgrade.started - first)
        split["helm install"].append(seen + offset - upgrade.started)
    key = {"platform": "c3", "lease": "c4"}
    return [
        f"{key[step]} split: "
        + "; ".join(f"{part} p50 {percentile(v, 50) * 1000:.0f} / max {max(v) * 1000:.0f} ms"
                    for part, v in split.items())
        for step, split in sorted(parts.items(), key=lambda item: key[item[0]])
    ]  # fmt: skip


def _gone_check(obs: Observer) -> Callable[[], bool]:
    kinds = (CLUSTER, CAPI_CLUSTER, OIDC_CLIENT, PLATFORM, LEASE)
    return lambda: not any(obs.names(kind) for kind in kinds)


async def _clean_up(
    kube: KubeClient, obs: Observer, namespace: str, gone: Callable[[], bool]
) -> str:
    """Delete every Cluster as the portal does; how long until their objects were gone."""
    started = time.monotonic()
    for name in obs.names(CLUSTER):
        await deployment.delete_like_the_portal(kube, namespace, name)
    if await obs.until(gone, 180.0):
        return (
            f"clean-up (not a target): all Clusters deleted (Foreground) and their Cluster, CAPI "
            f"Cluster, OIDCClient, Platform and Lease gone in {time.monotonic() - started:.1f} s"
        )
    left = {k.plural: obs.names(k) for k in (CLUSTER, CAPI_CLUSTER, LEASE) if obs.names(k)}
    return f"clean-up INCOMPLETE after 180 s: left {left}"


def _section(sizes: PrerequisiteSizes) -> Section:
    return Section(
        key="c",
        title=f"prerequisite latency, {sizes.clusters} Clusters, {sizes.in_flight} at a time",
        method=METHOD,
    )


METHOD = (
    "Services: all six with OIDC on, Zenith off, no stand-in: the benchmark process plays the "
    "identity and schedule operators and writes each prerequisite's status itself, at a known "
    "moment (its PATCH answered). The next step is the first watch event in the benchmark "
    "process for the object capibus creates next: c1 the OIDCClient, c2 the Platform, c3/c4 "
    "the Helm release Secret `sh.helm.release.v1.<cluster>.v1` (the CAPI Cluster, the first "
    "object the chart renders, is listed too). Even Clusters make the Platform the last "
    "prerequisite (c3), odd ones the Lease (c4). Each step starts after capibus has reported "
    f"what it waits for on the Cluster's conditions, plus {SETTLE} s. Upstream retries a "
    "waiting Cluster every 15 s; the target is p99 < 1 s. What each latency includes: "
    "`bench/ANALYSIS.md`."
)
