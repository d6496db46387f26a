"""(o) OpenShift Assisted: clusters at once, what the providers ask, step latencies, idle.

The set-up is ``tests/integration/test_assisted.py``'s, on a stack of its own: a second
kube-apiserver plays the workload cluster (``LocalStack.workload()``); the assisted-service,
hive and metal3 host stand-ins run as one process (``python -m standins.assisted``,
``STANDIN_ASSISTED_DELAY=0``); capibus's watcher (the ten kinds the test names), writer and
both providers (``python -m services.baremetal.assisted_bootstrap`` and ``…assisted_
controlplane``) run as processes with default settings (each its own Kubernetes client at
50 requests/s, burst 100); the Cluster API stand-in runs as ``python -m standins --only
capi`` with ``STANDIN_STEP_DELAY=0``, as in (m). The management API server keeps (e)'s audit
log, so requests are told apart by User-Agent (``capibus-assistedbootstrap``,
``capibus-assistedcontrolplane``); each provider serves its ``/metrics`` (a free port each),
which says when it has nothing left to do.

Every moment is a watch event reaching the benchmark process on its monotonic clock
(``bench.observe``): OpenshiftAssistedControlPlanes, OpenshiftAssistedConfigs, Machines,
Metal3Machines, InfraEnvs, Agents and AgentClusterInstalls, each state recorded as it
arrives (a listener: the first moment a field took a value).

- **o1 all ready.** ``clusters`` clusters of ``control_planes`` + ``workers`` hosts
  (``testenv.examples.assisted_cluster``) are created at once at t0 (each cluster's objects
  in template order, the clusters concurrently) on as many seeded BareMetalHosts, all
  ``available`` before t0; the clock stops when every ACP has been seen with
  ``status.ready``. The baseline, measured first in the same run against the same stand-in
  process, is the floor of this work without capibus and without Cluster API: a script in
  this process makes, per cluster, the objects the stand-ins react to (pull secret,
  ClusterImageSet, ClusterDeployment naming its AgentClusterInstall, the ACI, one InfraEnv per
  pool), per host a Machine that names its bootstrap data Secret (and that Secret), then,
  once its pool's InfraEnv has its ISO URL, the Metal3Machine booting it; each Agent that
  appears is matched by MAC to its BareMetalHost and so to its Metal3Machine, and approved
  with its role (one PATCH), as the bootstrap provider does. Everything it needs to know
  comes from its own watches (no GET, no LIST). Its clock stops when every ACI is
  ``adding-hosts`` (the moment capibus's control plane may call itself ready), so the ratio
  says how much capibus, the Cluster API stand-in and their extra objects (Cluster,
  Metal3Cluster, templates, ACP, OACs, MachineDeployment and MachineSet) add. It runs in a
  namespace of its own, which is deleted (and waited for) before any capibus process starts,
  so none of them ever sees its objects.
- **o2 requests per host** by each provider, from the audit log, from before t0 until both
  providers were quiet (``capibus_consumer_lag`` 0 and nothing handled for ``QUIET`` s), by
  verb and resource (WATCH left out; a refused request, 409 or 404, a row of its own), against
  the writes the flow needs (``minimum``: upstream v0.2.0's writes, one each, accepted).
  Reads are counted beside them; the minimum has none (the baseline needs none: a watch says
  everything), so they are capibus's reading fresh state before acting. A write above its
  minimum is a miss (work done twice, or a conflict retried). Status goes through the writer
  (``capibus-writer``), which is not counted here; its requests are in the details.
- **o3 prerequisite → next step**, p50/p99, target p99 < 1 s:
  (a) per Metal3Machine the provider writes the image into: the later of its InfraEnv's first
  state with ``status.isoDownloadURL``, its own first state, and its OAC's first state with
  an owner Machine (the config reconciles only then) → its first state with ``spec.image.url``
  (Metal3Machines cloned from a template that had the image already need no write: counted
  apart); (b) per Agent, its first state → its first state with ``spec.approved``; (c) per
  cluster, its ACI's first ``adding-hosts`` → its ACP's first ``status.ready``.
- **o4 idle**: once both providers are quiet, a window of ``window`` s: their requests to the
  API server (audit log, every verb but WATCH) per idle cluster per minute, target 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import CONCURRENCY, PARTITIONS, Clients, new_namespace
from bench.deployment import LEASE_TTL, load_average, mib, start_module, vm_hwm, wait_for_count
from bench.lifecycle import Figure, Section, Verdict, latency_figure, spread
from bench.metalstack import ProviderMetrics, delta
from bench.observe import Key, Observer
from bench.procs import Child, Children, CpuSnapshot, labels_for
from bench.status import AUDIT_LOG, client_of
from shared.errors import KubeConflict, KubeNotFound, KubeUnavailable
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CLUSTER_DEPLOYMENT,
    CLUSTER_IMAGE_SET,
    INFRA_ENV,
    MACHINE,
    METAL3_MACHINE,
    NAMESPACE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)
from testenv.examples import assisted_cluster, assisted_kind, bare_metal_hosts, pull_secret
from testenv.harness import LocalStack, free_ports

Json = dict[str, Any]
READY_TIMEOUT = 300.0
HOSTS_TIMEOUT = 60.0
CLEANUP_TIMEOUT = 60.0
#: The kinds the stand-ins put finalizers on.
HELD = (METAL3_MACHINE, CLUSTER_DEPLOYMENT, AGENT_CLUSTER_INSTALL, AGENT, BARE_METAL_HOST)
STEP_LIMIT = 1.0
ADDING_HOSTS = "adding-hosts"
AVAILABLE = "available"
CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
BOOTSTRAP = "capibus-assistedbootstrap"
CONTROLPLANE = "capibus-assistedcontrolplane"
PROVIDERS = {BOOTSTRAP: "bootstrap", CONTROLPLANE: "control plane"}
WRITER = "capibus-writer"
WATCHED_KINDS = [
    "openshiftassistedconfig",
    "openshiftassistedcontrolplane",
    "infraenv",
    "agent",
    "clusterdeployment",
    "agentclusterinstall",
    "baremetalhost",
    "capicluster",
    "machine",
    "secret",
]
KINDS = (
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    OPENSHIFT_ASSISTED_CONFIG,
    MACHINE,
    METAL3_MACHINE,
    INFRA_ENV,
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
)
WRITES = ("create", "patch", "update", "delete", "deletecollection")
BEFORE_IDLE = "idle"


@dataclass(frozen=True)
class AssistedSizes:
    clusters: int
    control_planes: int
    workers: int
    #: the idle window, seconds
    window: float

    @property
    def per_cluster(self) -> int:
        return self.control_planes + self.workers

    @property
    def hosts(self) -> int:
        return self.clusters * self.per_cluster

    @property
    def pools(self) -> int:
        return 2 if self.workers else 1


def minimum(sizes: AssistedSizes) -> dict[str, Counter[str]]:
    """The writes creating ``sizes`` (every cluster in one namespace) needs of each provider
    (upstream v0.2.0's, each once and accepted): "verb resource" → count."""
    n, c, h, p = sizes.clusters, sizes.control_planes, sizes.hosts, sizes.pools
    controlplane = Counter(
        {
            # finalizer; the placeholder pull secret's reference in the spec
            "patch openshiftassistedcontrolplanes": 2 * n,
            # the placeholder pull secret, one per namespace (every cluster here shares one);
            # <cluster>-kubeconfig
            "create secrets": 1 + n,
            # the admin kubeconfig labelled with its cluster; every other ACP added as an owner
            # of the shared placeholder (upstream v0.2.0 refused a second ACP there instead)
            "patch secrets": n + (n - 1),
            # server-side apply; spec.clusterInstallRef once the ACI exists
            "patch clusterdeployments": 2 * n,
            "patch clusterimagesets": n,  # server-side apply
            "create agentclusterinstalls": n,
            # per control-plane replica: the infrastructure clone, its OAC, its Machine
            "create metal3machines": c * n,
            "create openshiftassistedconfigs": c * n,
            "create machines": c * n,
        }
    )
    bootstrap = Counter(
        {
            "patch openshiftassistedconfigs": h,  # finalizer
            "patch infraenvs": p * n,  # server-side apply, one per pool
            "patch metal3machinetemplates": p * n,  # the ISO URL into the pool's template
            "patch metal3machines": h,  # the ISO URL into the host's Metal3Machine
            "create secrets": h,  # the empty bootstrap data
            "patch agents": h,  # approved, role, bound
        }
    )
    return {BOOTSTRAP: bootstrap, CONTROLPLANE: controlplane}


# -- what the benchmark sees --------------------------------------------------------------------


def _status(obj: Json) -> Json:
    return dict(obj.get("status") or {})


def _spec(obj: Json) -> Json:
    return dict(obj.get("spec") or {})


def _state(obj: Json) -> str:
    return str((_status(obj).get("debugInfo") or {}).get("state") or "")


def _macs(agent: Json) -> list[str]:
    interfaces = (_status(agent).get("inventory") or {}).get("interfaces") or []
    return [str(i.get("macAddress") or "").lower() for i in interfaces if i.get("macAddress")]


@dataclass
class Moments:
    """First moments, per object name, as the states arrive (an ``Observer`` listener)."""

    acp_ready: dict[str, float] = field(default_factory=dict)
    aci_seen: dict[str, float] = field(default_factory=dict)
    aci_adding: dict[str, float] = field(default_factory=dict)
    aci_walk: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    iso: dict[str, float] = field(default_factory=dict)  # InfraEnv has isoDownloadURL
    iso_of: dict[str, str] = field(default_factory=dict)  # URL -> InfraEnv
    m3m_seen: dict[str, float] = field(default_factory=dict)
    m3m_image: dict[str, float] = field(default_factory=dict)  # spec.image.url
    m3m_url: dict[str, str] = field(default_factory=dict)
    born_with_image: set[str] = field(default_factory=set)
    oac_of: dict[str, str] = field(default_factory=dict)  # Metal3Machine -> OAC (its Machine)
    oac_owned: dict[str, float] = field(default_factory=dict)  # OAC has an owner Machine
    agent_seen: dict[str, float] = field(default_factory=dict)
    agent_inventory: dict[str, float] = field(default_factory=dict)
    agent_approved: dict[str, float] = field(default_factory=dict)
    #: woken with every Agent state (the baseline approves from it)
    on_agent: list[Any] = field(default_factory=list)

    def listen(self, key: Key, obj: Json, now: float) -> None:
        token, name = key
        handlers = {
            OPENSHIFT_ASSISTED_CONTROL_PLANE.token: self._acp,
            AGENT_CLUSTER_INSTALL.token: self._aci,
            INFRA_ENV.token: self._infraenv,
            METAL3_MACHINE.token: self._m3m,
            MACHINE.token: self._machine,
            OPENSHIFT_ASSISTED_CONFIG.token: self._oac,
            AGENT.token: self._agent,
        }
        if (handler := handlers.get(token)) is not None:
            handler(name, obj, now)

    def _acp(self, name: str, obj: Json, now: float) -> None:
        if _status(obj).get("ready"):
            self.acp_ready.setdefault(name, now)

    def _infraenv(self, name: str, obj: Json, now: float) -> None:
        url = _status(obj).get("isoDownloadURL")
        if url:
            self.iso.setdefault(name, now)
            self.iso_of[str(url)] = name

    def _machine(self, name: str, obj: Json, now: float) -> None:
        spec = _spec(obj)
        infra = (spec.get("infrastructureRef") or {}).get("name")
        config = ((spec.get("bootstrap") or {}).get("configRef") or {}).get("name")
        if infra and config:
            self.oac_of[str(infra)] = str(config)

    def _oac(self, name: str, obj: Json, now: float) -> None:
        owners = obj["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Machine" for o in owners):
            self.oac_owned.setdefault(name, now)

    def _aci(self, name: str, obj: Json, now: float) -> None:
        self.aci_seen.setdefault(name, now)
        state = _state(obj)
        walk = self.aci_walk.setdefault(name, [])
        if state and (not walk or walk[-1][0] != state):
            walk.append((state, now))
        if state == ADDING_HOSTS:
            self.aci_adding.setdefault(name, now)

    def _m3m(self, name: str, obj: Json, now: float) -> None:
        url = (_spec(obj).get("image") or {}).get("url")
        if name not in self.m3m_seen and url:
            self.born_with_image.add(name)
        self.m3m_seen.setdefault(name, now)
        if url:
            self.m3m_image.setdefault(name, now)
            self.m3m_url.setdefault(name, str(url))

    def _agent(self, name: str, obj: Json, now: float) -> None:
        self.agent_seen.setdefault(name, now)
        if _status(obj).get("inventory"):
            self.agent_inventory.setdefault(name, now)
        if _spec(obj).get("approved"):
            self.agent_approved.setdefault(name, now)
        for wake in self.on_agent:
            wake(name, obj)

    # -- o3 ------------------------------------------------------------------------------------

    def image_prerequisite(self, m3m: str) -> float | None:
        """When the provider could first write ``m3m``'s image: its InfraEnv has the ISO, it
        exists, and its OAC has an owner Machine (None: one of them was never seen)."""
        infraenv = self.iso_of.get(self.m3m_url.get(m3m, ""))
        oac = self.oac_of.get(m3m)
        if infraenv is None or oac is None or oac not in self.oac_owned:
            return None
        return max(self.iso[infraenv], self.m3m_seen[m3m], self.oac_owned[oac])

    def image_lags(self) -> list[float]:
        lags = []
        for m3m, written in self.m3m_image.items():
            if m3m in self.born_with_image:
                continue
            ready = self.image_prerequisite(m3m)
            if ready is not None:
                lags.append(written - ready)
        return lags

    def approval_lags(self, *, since_inventory: bool = False) -> list[float]:
        start = self.agent_inventory if since_inventory else self.agent_seen
        return [t - start[a] for a, t in self.agent_approved.items() if a in start]

    def ready_lags(self) -> list[float]:
        return [
            t - self.aci_adding[acp] for acp, t in self.acp_ready.items() if acp in self.aci_adding
        ]


# -- the audit log ------------------------------------------------------------------------------


def audit_requests(log: Path, start_wall: float, end_wall: float) -> Counter[str]:
    """Requests that finished in the window, WATCH left out, by "client verb
    resource[/subresource]" (the client: ``bench.status.client_of`` of the User-Agent), and
    " <code>" after it when the API server refused it."""
    found: Counter[str] = Counter()
    if not log.exists():
        return found
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("verb") == "watch" or event.get("stage") != "ResponseComplete":
                continue
            if not start_wall <= datetime.fromisoformat(event["stageTimestamp"]).timestamp():
                continue
            if datetime.fromisoformat(event["stageTimestamp"]).timestamp() > end_wall:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "?")
            if ref.get("subresource"):
                resource += f"/{ref['subresource']}"
            key = f"{client_of(event.get('userAgent', ''))} {event['verb']} {resource}"
            code = int((event.get("responseStatus") or {}).get("code") or 0)
            # A refused request (409 conflict, 404 not found) is its own row.
            found[f"{key} {code}" if code >= 400 else key] += 1
    return found


def of_client(counts: Counter[str], client: str) -> Counter[str]:
    """``counts`` of one client, keyed "verb resource"."""
    prefix = f"{client} "
    return Counter({k.removeprefix(prefix): n for k, n in counts.items() if k.startswith(prefix)})


def writes(counts: Counter[str]) -> Counter[str]:
    return Counter({k: n for k, n in counts.items() if k.split(" ", 1)[0] in WRITES})


def reads(counts: Counter[str]) -> Counter[str]:
    return Counter({k: n for k, n in counts.items() if k.split(" ", 1)[0] not in WRITES})


# -- the benchmark's own writes -------------------------------------------------------------------

#: Requests of the benchmark's own that lost their connection and were sent again, by verb.
#: On this machine the API server now and then drops a connection mid-request (every client
#: sees it: the stand-ins log ``ReadError`` and try again); the benchmark tries again too
#: rather than losing the run, and says how often it had to.
DROPPED: Counter[str] = Counter()
ATTEMPTS = 5


async def create(kube: KubeClient, kind: ResourceKind, obj: Json) -> Json:
    """``kube.create``, sent again after a dropped connection; a conflict on a later attempt
    means an earlier one landed."""
    for attempt in range(ATTEMPTS):
        try:
            return await kube.create(kind, obj)
        except KubeUnavailable:
            DROPPED["create"] += 1
            if attempt == ATTEMPTS - 1:
                raise
        except KubeConflict:
            if attempt == 0:
                raise
            meta = obj["metadata"]
            return await kube.get(kind, meta.get("namespace"), meta["name"])
        await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


async def patch(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str, body: Json
) -> None:
    """``kube.patch_merge`` (idempotent here), sent again after a dropped connection."""
    for attempt in range(ATTEMPTS):
        try:
            await kube.patch_merge(kind, namespace, name, body)
            return
        except KubeUnavailable:
            DROPPED["patch"] += 1
            if attempt == ATTEMPTS - 1:
                raise
        await asyncio.sleep(0.1)


# -- the bare floor -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BareHost:
    cluster: str
    pool: str  # its InfraEnv
    role: str
    name: str  # its Machine, bootstrap Secret and Metal3Machine


@dataclass
class Bare:
    """The baseline's timings (seconds after its start) and what it asked for."""

    elapsed: float | None = None
    isos: float = 0.0
    agents: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)
    approvals: list[float] = field(default_factory=list)  # Agent first seen → approved
    clusters: int = 0
    cleanup: float | None = None
    stuck: list[str] = field(default_factory=list)  # finalizers the benchmark removed
    moments: Moments = field(default_factory=Moments)


def bare_hosts(sizes: AssistedSizes) -> list[BareHost]:
    hosts = []
    for index in range(sizes.clusters):
        name = f"b{index}"
        for k in range(sizes.control_planes):
            hosts.append(BareHost(name, f"{name}-control-plane", "master", f"{name}-cp-{k}"))
        for k in range(sizes.workers):
            hosts.append(BareHost(name, f"{name}-workers", "worker", f"{name}-w-{k}"))
    return hosts


def _manifest(kind: Any, namespace: str | None, name: str, spec: Json, **meta: Any) -> Json:
    metadata: Json = {"name": name, **meta}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata, "spec": spec}


@dataclass
class BareRun:
    """The script that plays both providers' essential writes against the stand-ins."""

    kube: KubeClient
    namespace: str
    sizes: AssistedSizes
    objects: Observer
    moments: Moments
    hosts: list[BareHost]
    agents: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    approved: set[str] = field(default_factory=set)

    def wake(self, name: str, agent: Json) -> None:
        """An Agent with its inventory and no approval yet: queue it (a listener: no await)."""
        if _macs(agent) and not _spec(agent).get("approved") and name not in self.approved:
            self.approved.add(name)
            self.agents.put_nowait(name)

    async def cluster(self, name: str) -> None:
        ns, secret = self.namespace, f"{name}-pull-secret"
        image_set = f"{ns}-{name}"
        label = {CLUSTER_NAME: name}
        await create(self.kube, SECRET, pull_secret(ns, secret))
        await create(
            self.kube,
            CLUSTER_IMAGE_SET,
            _manifest(CLUSTER_IMAGE_SET, None, image_set, {"releaseImage": "quay.io/x:4.16"}),
        )
        cd_spec = {
            "clusterName": name,
            "baseDomain": "example.test",
            "platform": {"agentBareMetal": {"agentSelector": {}}},
            "pullSecretRef": {"name": secret},
            "clusterInstallRef": {
                "group": AGENT_CLUSTER_INSTALL.group,
                "version": AGENT_CLUSTER_INSTALL.version,
                "kind": AGENT_CLUSTER_INSTALL.kind,
                "name": name,
            },
        }
        await create(
            self.kube,
            CLUSTER_DEPLOYMENT,
            _manifest(CLUSTER_DEPLOYMENT, ns, name, cd_spec, labels=label),
        )
        aci_spec = {
            "clusterDeploymentRef": {"name": name},
            "platformType": "None",
            "provisionRequirements": {
                "controlPlaneAgents": self.sizes.control_planes,
                "workerAgents": self.sizes.workers,
            },
            "imageSetRef": {"name": image_set},
        }
        await create(
            self.kube,
            AGENT_CLUSTER_INSTALL,
            _manifest(AGENT_CLUSTER_INSTALL, ns, name, aci_spec, labels=label),
        )
        mine = [h for h in self.hosts if h.cluster == name]
        pools = sorted({h.pool for h in mine})
        for pool in pools:
            infraenv = {
                "clusterRef": {"name": name, "namespace": ns},
                "pullSecretRef": {"name": secret},
                "cpuArchitecture": "x86_64",
            }
            await create(
                self.kube, INFRA_ENV, _manifest(INFRA_ENV, ns, pool, infraenv, labels=label)
            )
        machines = {h.name: await self.machine(h) for h in mine}
        await asyncio.gather(*(self.boot(pool, mine, machines) for pool in pools))

    async def machine(self, host: BareHost) -> Json:
        """The Machine naming its bootstrap data (and that empty Secret): what CAPM3 and the
        host stand-in wait for before a Metal3Machine may boot."""
        ns = self.namespace
        data = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": host.name, "namespace": ns},
        }
        await create(self.kube, SECRET, {**data, "data": {"value": ""}})
        spec = {
            "clusterName": host.cluster,
            "bootstrap": {"dataSecretName": host.name},
            "infrastructureRef": {
                "apiVersion": METAL3_MACHINE.api_version,
                "kind": METAL3_MACHINE.kind,
                "name": host.name,
            },
        }
        labels = {CLUSTER_NAME: host.cluster}
        return await create(
            self.kube, MACHINE, _manifest(MACHINE, ns, host.name, spec, labels=labels)
        )

    async def boot(self, pool: str, mine: list[BareHost], machines: dict[str, Json]) -> None:
        """Once the pool's ISO is there, its hosts' Metal3Machines with the image."""
        moments = self.moments
        if not await self.objects.until(lambda: pool in moments.iso, READY_TIMEOUT):
            raise TimeoutError(f"bare: InfraEnv {pool} has no ISO after {READY_TIMEOUT:.0f} s")
        infraenv = self.objects.get(INFRA_ENV, pool) or {}
        url = str(_status(infraenv)["isoDownloadURL"])
        for host in (h for h in mine if h.pool == pool):
            machine = machines[host.name]
            owner = {
                "apiVersion": MACHINE.api_version,
                "kind": MACHINE.kind,
                "name": host.name,
                "uid": machine["metadata"]["uid"],
            }
            spec = {"image": {"url": url, "format": "live-iso"}}
            m3m = _manifest(
                METAL3_MACHINE, self.namespace, host.name, spec, ownerReferences=[owner]
            )
            await create(self.kube, METAL3_MACHINE, m3m)

    async def approve(self) -> None:
        """Each queued Agent: its host by MAC, the host's Metal3Machine, that host's role."""
        roles = {h.name: h.role for h in self.hosts}
        while True:
            name = await self.agents.get()
            agent = self.objects.get(AGENT, name) or {}
            macs = set(_macs(agent))
            host: list[Json] = []

            def claimed(macs: set[str] = macs, host: list[Json] = host) -> bool:
                for bmh in (
                    self.objects.get(BARE_METAL_HOST, n)
                    for n in self.objects.names(BARE_METAL_HOST)
                ):
                    if bmh is None or str(_spec(bmh).get("bootMACAddress", "")).lower() not in macs:
                        continue
                    if (_spec(bmh).get("consumerRef") or {}).get("name"):
                        host.append(bmh)
                        return True
                return False

            if not await self.objects.until(claimed, READY_TIMEOUT):
                raise TimeoutError(f"bare: no claimed host for Agent {name} ({macs})")
            m3m = str(_spec(host[0])["consumerRef"]["name"])
            body = {
                "spec": {
                    "approved": True,
                    "role": roles[m3m],
                    "nodeLabels": {"metal3.io/uuid": host[0]["metadata"]["uid"]},
                }
            }
            await patch(self.kube, AGENT, self.namespace, name, body)


async def seed_hosts(kube: KubeClient, namespace: str, count: int, prefix: str) -> None:
    """``count`` BareMetalHosts (and their credentials Secret), ``CONCURRENCY`` at a time."""
    manifests = bare_metal_hosts(namespace, count, prefix=prefix)
    await create(kube, SECRET, manifests[0])
    hosts = manifests[1:]
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(manifest: Json) -> None:
        async with sem:
            await create(kube, assisted_kind(manifest), manifest)

    await asyncio.gather(*(one(m) for m in hosts))


async def hosts_available(objects: Observer, count: int) -> None:
    def ready() -> bool:
        found = [objects.get(BARE_METAL_HOST, n) for n in objects.names(BARE_METAL_HOST)]
        states = [
            ((h or {}).get("status") or {}).get("provisioning", {}).get("state") for h in found
        ]
        return sum(1 for s in states if s == AVAILABLE) >= count

    if not await objects.until(ready, HOSTS_TIMEOUT):
        raise TimeoutError(
            f"fewer than {count} BareMetalHosts available after {HOSTS_TIMEOUT:.0f} s"
        )


async def run_bare(clients: Clients, sizes: AssistedSizes, audit: Path) -> Bare:
    """The baseline in a namespace of its own, then that namespace deleted and waited for."""
    kube = clients.kube
    namespace = await new_namespace(kube, "bench-oa-bare")
    bare = Bare(clusters=sizes.clusters)
    objects = Observer(kube, namespace, KINDS, listeners=[bare.moments.listen])
    await objects.start()
    run = BareRun(kube, namespace, sizes, objects, bare.moments, bare_hosts(sizes))
    bare.moments.on_agent.append(run.wake)
    approvers = [asyncio.create_task(run.approve()) for _ in range(CONCURRENCY)]
    try:
        await seed_hosts(kube, namespace, sizes.hosts, "bare")
        await hosts_available(objects, sizes.hosts)
        start_wall, t0 = time.time(), time.monotonic()
        names = sorted({h.cluster for h in run.hosts})
        await asyncio.gather(*(run.cluster(name) for name in names))
        moments = bare.moments

        def done() -> bool:
            return all(n in moments.aci_adding for n in names)

        if await objects.until(done, READY_TIMEOUT):
            bare.elapsed = max(moments.aci_adding[n] for n in names) - t0
            bare.isos = max(moments.iso.values()) - t0
            bare.agents = max(moments.agent_approved.values()) - t0
            bare.approvals = moments.approval_lags()
        end_wall = time.time()
        await asyncio.sleep(1.0)  # the audit backend writes each event as its request ends
        counts = audit_requests(audit, start_wall, end_wall)
        bare.requests = of_client(counts, "capibus-bench")
    finally:
        for task in approvers:
            task.cancel()
        await asyncio.gather(*approvers, return_exceptions=True)
        await objects.stop()
        await _delete_namespace(kube, namespace, bare)
    return bare


async def _delete_namespace(kube: KubeClient, namespace: str, bare: Bare) -> None:
    """Delete the baseline's namespace (and ClusterImageSets) and wait until it is gone. What
    still holds a finalizer after ``CLEANUP_TIMEOUT`` (a stand-in that lost a request and
    never tried again) has it removed by the benchmark, and is named in the details: left
    alone, the namespace controller would keep deleting it all through capibus's run."""
    started = time.monotonic()
    for index in range(bare.clusters):
        with contextlib.suppress(KubeNotFound):
            await kube.delete(CLUSTER_IMAGE_SET, None, f"{namespace}-b{index}")
    await kube.delete(NAMESPACE, None, namespace)
    if await _gone(kube, namespace, CLEANUP_TIMEOUT):
        bare.cleanup = time.monotonic() - started
        return
    for kind in HELD:
        items, _ = await kube.list(kind, namespace=namespace)
        for item in items:
            if item["metadata"].get("finalizers"):
                bare.stuck.append(f"{kind.kind} {item['metadata']['name']}")
                with contextlib.suppress(KubeNotFound):
                    await patch(
                        kube,
                        kind,
                        namespace,
                        item["metadata"]["name"],
                        {"metadata": {"finalizers": None}},
                    )
    if await _gone(kube, namespace, CLEANUP_TIMEOUT):
        bare.cleanup = time.monotonic() - started


async def _gone(kube: KubeClient, namespace: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            await kube.get(NAMESPACE, None, namespace)
        except KubeNotFound:
            return True
        except KubeUnavailable:
            DROPPED["get"] += 1
        await asyncio.sleep(0.5)
    return False


# -- the processes ------------------------------------------------------------------------------


@dataclass
class Running:
    standins: Child
    capi: Child
    services: dict[str, Child]
    metrics: dict[str, ProviderMetrics]  # by User-Agent
    http: httpx.AsyncClient

    def all(self) -> list[Child]:
        return [self.standins, self.capi, *self.services.values()]

    def labels(self) -> dict[int, str]:
        labels = labels_for(*self.services.values())
        labels[self.standins.proc.pid] = "assisted (stand-ins)"
        labels[self.capi.proc.pid] = "capi (stand-in)"
        return labels

    def peak_memory(self) -> dict[str, int]:
        return {c.label: vm_hwm(c.proc.pid) for c in self.all() if c.alive()}

    async def handled(self) -> Counter[str]:
        found: Counter[str] = Counter()
        for client, metrics in self.metrics.items():
            for key, n in (await metrics.read()).items():
                found[f"{PROVIDERS[client]}: {key}"] += n
        return found

    async def quiet(self) -> float | None:
        """Until both providers are quiet; the later one's last message (None: timed out)."""
        found = await asyncio.gather(*(m.quiet() for m in self.metrics.values()))
        return None if any(q is None for q in found) else max(q for q in found if q is not None)


def start_standins(children: Children, stack: LocalStack, workload: Path) -> Child:
    env = {**stack.env(), "STANDIN_ASSISTED_DELAY": "0"}
    args = ["--workload-kubeconfig", str(workload)]
    return start_module(children, "standins.assisted", env, "oa-standins", args)


async def start_capibus(
    children: Children, stack: LocalStack, workload: Path, standins: Child
) -> Running:
    """The CAPI stand-in, the watcher, the writer and both providers, each waited for."""
    capi_env = {**stack.env(), "STANDIN_STEP_DELAY": "0", "STANDIN_CAPI_KUBECONFIG": str(workload)}
    capi = start_module(children, "standins", capi_env, "oa-capi", ["--only", "capi"])
    base = stack.env()
    ports = free_ports(2)
    http = httpx.AsyncClient(timeout=30)
    watcher_env = {**base, "CAPIBUS_WATCHER__KINDS": json.dumps(WATCHED_KINDS)}
    services = {
        "watcher": children.start("watcher", watcher_env, "oa-watcher"),
        "writer": children.start("writer", base, "oa-writer"),
    }
    metrics: dict[str, ProviderMetrics] = {}
    for client, port in zip(PROVIDERS, ports, strict=True):
        service = client.removeprefix("capibus-")
        env = {**base, "CAPIBUS_METRICS_PORT": str(port), "CAPIBUS_METRICS_HOST": "127.0.0.1"}
        module = f"baremetal.{service.replace('assisted', 'assisted_')}"
        services[service] = children.start(module, env, f"oa-{service}")
        metrics[client] = ProviderMetrics(f"http://127.0.0.1:{port}/metrics", http)
    running = Running(standins, capi, services, metrics, http)
    await asyncio.gather(
        wait_for_count(services["watcher"], "listed at", len(WATCHED_KINDS)),
        wait_for_count(services["writer"], "owns partition", PARTITIONS),
        *(
            wait_for_count(services[c.removeprefix("capibus-")], "owns partition", PARTITIONS)
            for c in PROVIDERS
        ),
        wait_for_count(capi, "stand-ins running", 1),
    )
    # A freshly claimed partition is fenced for one lease TTL before its consumers fetch.
    await asyncio.sleep(LEASE_TTL + 0.5)
    return running


# -- the benchmark ------------------------------------------------------------------------------


@dataclass
class Window:
    start: float
    end: float
    requests: Counter[str] = field(default_factory=Counter)  # "client verb resource"
    handled: Counter[str] = field(default_factory=Counter)
    cpu: str = ""
    load: str = ""

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def minutes(self) -> float:
        return self.seconds / 60.0

    def of(self, client: str) -> Counter[str]:
        return of_client(self.requests, client)

    def providers(self) -> int:
        return sum(sum(self.of(c).values()) for c in PROVIDERS)


@dataclass
class Probe:
    handled: Counter[str]
    cpu: CpuSnapshot
    at: float
    wall: float

    @classmethod
    async def take(cls, running: Running) -> Probe:
        return cls(
            handled=await running.handled(),
            cpu=CpuSnapshot.take(running.labels()),
            at=time.monotonic(),
            wall=time.time(),
        )

    async def window(self, after: Probe, audit: Path) -> Window:
        # The audit backend writes each event as its request finishes: wait out the last ones.
        await asyncio.sleep(1.0)
        return Window(
            start=self.at,
            end=after.at,
            requests=audit_requests(audit, self.wall, after.wall),
            handled=delta(after.handled, self.handled),
            cpu=after.cpu.cpu_line(self.cpu),
            load=load_average(),
        )


@dataclass
class Outcome:
    sizes: AssistedSizes
    names: list[str]
    moments: Moments = field(default_factory=Moments)
    bare: Bare | None = None
    t0: float = 0.0
    created: float = 0.0
    all_ready: float | None = None
    quiet: float | None = None
    creation: Window | None = None
    tail: Window | None = None
    idle: Window | None = None
    memory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


async def measure(
    clients: Clients, stack: LocalStack, children: Children, sizes: AssistedSizes
) -> Section:
    kube = clients.kube
    workload = await asyncio.to_thread(stack.workload)
    audit = children.log_dir / AUDIT_LOG
    outcome = Outcome(sizes=sizes, names=[f"oa{i}" for i in range(sizes.clusters)])
    outcome.notes.append(f"load average before (1/5/15 min): {load_average()}")
    standins = start_standins(children, stack, workload)
    running: Running | None = None
    objects: Observer | None = None
    try:
        await wait_for_count(standins, "assisted stand-ins running", 1)
        try:
            outcome.bare = await run_bare(clients, sizes, audit)
        except Exception as exc:  # the capibus side is still worth measuring
            outcome.notes.append(f"the baseline failed: {type(exc).__name__}: {exc}")
        if outcome.bare is not None and outcome.bare.cleanup is None:
            outcome.notes.append("the baseline's namespace was not gone in time")
        namespace = await new_namespace(kube, "bench-oa")
        objects = Observer(kube, namespace, KINDS, listeners=[outcome.moments.listen])
        await objects.start()
        await seed_hosts(kube, namespace, sizes.hosts, "host")
        await hosts_available(objects, sizes.hosts)
        running = await start_capibus(children, stack, workload, standins)
        await _create(
            kube=kube,
            namespace=namespace,
            objects=objects,
            running=running,
            audit=audit,
            outcome=outcome,
        )
        await _idle(running, audit, outcome)
        outcome.memory = running.peak_memory()
    finally:
        outcome.notes += _dropped_notes(children.log_dir)
        if objects is not None:
            await objects.stop()
        if running is not None:
            await running.http.aclose()
            for child in running.all():
                children.stop(child)
        else:
            children.stop(standins)
    return section(outcome)


async def _create(
    *,
    kube: KubeClient,
    namespace: str,
    objects: Observer,
    running: Running,
    audit: Path,
    outcome: Outcome,
) -> None:
    sizes, moments = outcome.sizes, outcome.moments
    before = await Probe.take(running)
    outcome.t0 = time.monotonic()

    async def make(name: str) -> None:
        for manifest in assisted_cluster(
            namespace, name, control_planes=sizes.control_planes, workers=sizes.workers
        ):
            await create(kube, assisted_kind(manifest), manifest)

    await asyncio.gather(*(make(name) for name in outcome.names))
    outcome.created = time.monotonic() - outcome.t0
    acps = [f"{name}-control-plane" for name in outcome.names]

    def all_ready() -> bool:
        return all(acp in moments.acp_ready for acp in acps)

    if not await objects.until(all_ready, READY_TIMEOUT):
        raise TimeoutError(
            f"after {READY_TIMEOUT:.0f} s: {len(moments.acp_ready)}/{len(acps)} control planes "
            f"ready; ACI states: { {k: v[-1][0] for k, v in moments.aci_walk.items()} }"
        )
    at_ready = await Probe.take(running)
    outcome.all_ready = max(moments.acp_ready[a] for a in acps) - outcome.t0
    outcome.notes.append(f"load average at all ready: {load_average()}")
    quiet = await running.quiet()
    if quiet is not None:
        outcome.quiet = quiet - outcome.t0
    else:
        outcome.notes.append("a provider was not quiet within the timeout")
    settled = await Probe.take(running)
    outcome.creation = await before.window(settled, audit)
    outcome.tail = await at_ready.window(settled, audit)


async def _idle(running: Running, audit: Path, outcome: Outcome) -> None:
    before = await Probe.take(running)
    await asyncio.sleep(outcome.sizes.window)
    after = await Probe.take(running)
    outcome.idle = await before.window(after, audit)


# -- the figures --------------------------------------------------------------------------------


def section(o: Outcome) -> Section:
    s = o.sizes
    title = (
        f"OpenShift Assisted, {s.clusters} clusters of {s.control_planes} + {s.workers} hosts "
        "at once"
    )
    sec = Section(key="o", title=title, method=METHOD)
    m = o.moments
    sec.figures += [
        _all_ready(o),
        _requests(o),
        latency_figure(
            "o3a",
            "InfraEnv isoDownloadURL set (and its Metal3Machine, its OAC owned) → Metal3Machine "
            "spec.image.url set",
            m.image_lags(),
            expected=len(set(m.m3m_image) - m.born_with_image),
            limit=STEP_LIMIT,
        ),
        latency_figure(
            "o3b",
            "Agent first seen → Agent spec.approved",
            m.approval_lags(),
            expected=s.hosts,
            limit=STEP_LIMIT,
        ),
        latency_figure(
            "o3c",
            "ACI state adding-hosts → ACP status.ready",
            m.ready_lags(),
            expected=s.clusters,
            limit=STEP_LIMIT,
        ),
        _idle_figure(o),
    ]
    sec.details += [
        *_timings(o),
        *_bare_details(o),
        *_creation_details(o),
        *_idle_details(o),
        *_memory(o),
        *o.notes,
    ]
    return sec


def _all_ready(o: Outcome) -> Figure:
    s = o.sizes
    title = f"{s.clusters} clusters ({s.hosts} hosts) created at once → every ACP status.ready"
    if o.all_ready is None:
        value = f"{len(o.moments.acp_ready)}/{s.clusters} ready"
        return Figure("o1", title, value, verdict="INCOMPLETE")
    value = f"all ready after {o.all_ready:.1f} s"
    if o.bare is not None and o.bare.elapsed:
        value += (
            f"; bare floor (the stand-ins driven by a script doing the providers' essential "
            f"writes, until every ACI adding-hosts): {o.bare.elapsed:.2f} s; "
            f"ratio {o.all_ready / o.bare.elapsed:.1f}"
        )
    else:
        value += "; bare floor not measured"
    return Figure("o1", title, value, "— (ratio: lower is better)")


def made_of_minimum(found: Counter[str], need: Counter[str]) -> str:
    rows = sorted(set(found) | set(need), key=lambda r: (-found[r], r))
    return ", ".join(f"{r} {found[r]}/{need[r]}" for r in rows if found[r] or need[r])


def _requests(o: Outcome) -> Figure:
    title = (
        "Kubernetes API requests per host by the two providers, t0 → both quiet (writes by "
        "verb and resource, made/minimum; reads beside)"
    )
    if o.creation is None:
        return Figure("o2", title, "not measured", verdict="INCOMPLETE")
    hosts, need = o.sizes.hosts, minimum(o.sizes)
    parts, over = [], False
    total = least = 0
    for client, short in PROVIDERS.items():
        made = o.creation.of(client)
        w, r = writes(made), reads(made)
        total += sum(made.values())
        least += sum(need[client].values())
        over = over or any(w[k] > need[client][k] for k in w)
        parts.append(
            f"{short}: {sum(made.values()) / hosts:.1f}/host ({sum(w.values())} writes: "
            f"{made_of_minimum(w, need[client])}; {sum(r.values())} reads)"
        )
    value = (
        f"{total / hosts:.1f} per host (minimum {least / hosts:.1f}, writes only); "
        + "; ".join(parts)
    )
    verdict: Verdict = "MISSED" if over else "pass"
    return Figure("o2", title, value, "writes: the minimum", verdict)


def _idle_figure(o: Outcome) -> Figure:
    title = (
        f"Kubernetes API requests by the two providers (no WATCH) per idle cluster per minute "
        f"({o.sizes.window:g} s window)"
    )
    if o.idle is None:
        return Figure("o4", title, "not measured", "0", "INCOMPLETE")
    made = o.idle.providers()
    rate = made / o.sizes.clusters / o.idle.minutes
    rows = "; ".join(f"{PROVIDERS[c]}: {_rows(o.idle.of(c))}" for c in PROVIDERS)
    value = f"{rate:.2f} ({made} requests: {rows})"
    return Figure("o4", title, value, "0", "pass" if made == 0 else "MISSED")


def _after(moments: dict[str, float], t0: float) -> str:
    return spread([v - t0 for v in moments.values()], "s", 1, 2)


def _rows(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.most_common()) or "none"


def _timings(o: Outcome) -> list[str]:
    m, t0 = o.moments, o.t0
    if not m.acp_ready and not m.aci_seen:
        return []
    image = [m.m3m_image[x] for x in m.m3m_image if x not in m.born_with_image]
    counted = len(m.image_lags())
    lines = [
        f"all {o.sizes.clusters} clusters' objects created {o.created:.2f} s after t0",
        f"after t0, ACI first seen: {_after(m.aci_seen, t0)}",
        f"after t0, InfraEnv has isoDownloadURL: {_after(m.iso, t0)}",
        f"after t0, Metal3Machine has spec.image.url: {_after(m.m3m_image, t0)}",
        f"after t0, Agent first seen: {_after(m.agent_seen, t0)}",
        f"after t0, Agent spec.approved: {_after(m.agent_approved, t0)}",
        f"after t0, ACI adding-hosts: {_after(m.aci_adding, t0)}",
        f"after t0, ACP status.ready: {_after(m.acp_ready, t0)}",
        f"o3a counts {counted} of {len(image)} Metal3Machines the provider wrote the image "
        f"into; {len(m.born_with_image)} more were cloned from a template that had it already "
        "(no write needed)",
        f"o3b from the Agent's first state with its inventory (the MAC the binder matches by): "
        f"{spread(m.approval_lags(since_inventory=True))}",
    ]
    walks = Counter(" → ".join(s for s, _ in walk) for walk in m.aci_walk.values())
    lines.append(f"ACI state walks seen: {_rows(walks)}")
    if o.quiet is not None and o.all_ready is not None:
        lines.append(
            f"both providers quiet (consumer lag 0, no message handled for 3 s) after their last "
            f"message, {o.quiet:.1f} s after t0, {o.quiet - o.all_ready:.1f} s after all were ready"
        )
    return lines


def _bare_details(o: Outcome) -> list[str]:
    if (b := o.bare) is None or b.elapsed is None:
        return []
    made = b.requests
    hosts = o.sizes.hosts
    return [
        f"bare floor: every ISO URL {b.isos:.2f} s, every Agent approved {b.agents:.2f} s, "
        f"every ACI adding-hosts {b.elapsed:.2f} s after its start; per Agent, first seen → "
        f"approved {spread(b.approvals)}",
        f"bare floor, its requests (audit log, WATCH left out): {sum(made.values())}, "
        f"{sum(made.values()) / hosts:.1f} per host: {_rows(made)}",
        "bare namespace deleted and gone in "
        + (f"{b.cleanup:.1f} s" if b.cleanup is not None else "(not gone)")
        + (
            f"; after {CLEANUP_TIMEOUT:.0f} s the benchmark removed the finalizers still held "
            f"(a stand-in that never tried again after a dropped connection): {', '.join(b.stuck)}"
            if b.stuck
            else ""
        ),
    ]


def _creation_details(o: Outcome) -> list[str]:
    if (c := o.creation) is None:
        return []
    hosts = o.sizes.hosts
    lines = []
    for client, short in PROVIDERS.items():
        made = c.of(client)
        n = sum(made.values())
        lines.append(
            f"t0 → quiet ({c.seconds:.1f} s), the {short} provider's requests (audit log): {n}, "
            f"{n / hosts:.1f} per host, {n / c.seconds:.0f}/s (its client's limit: 50/s, burst "
            f"100): {_rows(made)}"
        )
    writer = c.of(WRITER)
    lines += [
        f"t0 → quiet, the writer's requests (status of ACPs and OACs): {sum(writer.values())}: "
        f"{_rows(writer)}",
        f"t0 → quiet, every client's non-WATCH requests: {_rows(_by_client(c.requests))}",
        f"t0 → quiet, messages handled (the providers' /metrics): {_rows(c.handled)}",
        f"t0 → quiet: {c.cpu}",
    ]
    if (t := o.tail) is not None:
        lines.append(
            f"all ready → quiet ({t.seconds:.1f} s): the providers' requests "
            f"{t.providers()}: "
            + "; ".join(f"{PROVIDERS[cl]}: {_rows(t.of(cl))}" for cl in PROVIDERS)
            + f"; messages handled: {_rows(t.handled)}"
        )
    return lines


def _by_client(counts: Counter[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for key, n in counts.items():
        found[key.split(" ", 1)[0]] += n
    return found


def _idle_details(o: Outcome) -> list[str]:
    if (idle := o.idle) is None:
        return []
    return [
        f"idle window ({idle.seconds:.1f} s, from both providers quiet): every client's "
        f"non-WATCH requests: {_rows(_by_client(idle.requests))}; messages the providers "
        f"handled: {_rows(idle.handled)}",
        f"idle window: {idle.cpu}; load average at its end: {idle.load}",
    ]


def _dropped_notes(log_dir: Path) -> list[str]:
    """How often a connection to the API server dropped mid-request (see ``DROPPED``)."""
    logs = {
        p.stem.removeprefix("oa-"): p.read_text(errors="replace") for p in log_dir.glob("oa-*.log")
    }
    seen = {name: text.count("ReadError") for name, text in logs.items()}
    mine = ", ".join(f"{verb} {n}" for verb, n in DROPPED.items()) or "none"
    theirs = ", ".join(f"{name} {n}" for name, n in seen.items() if n) or "none"
    return [
        f"connections the API server dropped mid-request: the benchmark's own requests sent "
        f"again {mine}; `ReadError` lines in the logs of: {theirs}"
    ]


def _memory(o: Outcome) -> list[str]:
    sizes = ", ".join(f"{label.removeprefix('oa-')} {mib(v)}" for label, v in o.memory.items())
    return [f"peak memory (VmHWM): {sizes}"] if sizes else []


METHOD = (
    "Services: watcher (the ten OpenShift Assisted and CAPI kinds), writer, `python -m "
    "services.baremetal.assisted_bootstrap` and `python -m "
    "services.baremetal.assisted_controlplane`, default settings (each its own client at 50/s, "
    "burst 100); the assisted-service, hive and metal3 host stand-ins (`python -m "
    "standins.assisted`, `STANDIN_ASSISTED_DELAY=0`) with a second kube-apiserver as the "
    "workload cluster; the CAPI stand-in with `STANDIN_STEP_DELAY=0`. Every host a seeded "
    "BareMetalHost, all `available` before t0. t0 = the first create; every moment is a watch "
    "event reaching the benchmark. o1: the last ACP first seen with `status.ready`. Baseline, "
    "run first against the same stand-in process in a namespace of its own (deleted before "
    "capibus starts): a script makes per cluster the pull secret, ClusterImageSet, "
    "ClusterDeployment (naming its ACI), ACI and one InfraEnv per pool, per host a Machine "
    "naming its (empty) bootstrap Secret, and once the pool's ISO URL is there the host's "
    "Metal3Machine with the image; every Agent is matched by MAC to its host and approved with "
    "its role by one PATCH, from watch state only; its clock stops at the last ACI "
    "`adding-hosts`; ratio = capibus / baseline. o2: audit-log requests of "
    "`capibus-assistedbootstrap` and `capibus-assistedcontrolplane` from t0 until both were "
    "quiet (consumer lag 0, nothing handled for 3 s, their /metrics), WATCH left out; the "
    "minimum is the writes upstream's flow makes once each, accepted (finalizers, the "
    "placeholder pull secret, one for the namespace every cluster shares, each other ACP added "
    "as its owner, and its reference, ClusterDeployment, ClusterImageSet, ACI, "
    "clusterInstallRef, per control plane clone + OAC + Machine, the labelled admin kubeconfig and "
    "`<cluster>-kubeconfig`; per pool the InfraEnv and the template's image; per host the "
    "config's finalizer, the Metal3Machine's image, the bootstrap Secret, the Agent's "
    "approval); a request the API server refused (409, 404) is a row of its own (`verb "
    "resource code`), a refused write's minimum is 0. o3: see the section's bullets in "
    "`bench/assisted.py`; matched by name (a "
    "Metal3Machine to its OAC through its Machine, an ACI to the ACP of the same name). o4: "
    "the providers' audit-log requests in the window after both were quiet."
)
