"""(m) metal-stack: machines at once, what they cost metal-api, the Node lag, idle, deletion.

The set-up is ``tests/integration/test_metalstack.py``'s, on a stack of its own: a second
kube-apiserver plays the workload cluster (``LocalStack.workload()``); the metal-api stand-in
runs as a process (``python -m standins.metalapi``, HMAC on, provisioning and reboot delays
0, so an allocation is answered already provisioned and a freed machine is ``Waiting`` at
once) and registers a Node in the workload API server for every machine that phones home;
capibus's watcher (the six metal-stack kinds), writer and ``python -m
services.baremetal.metalstack`` run as processes with default settings (so the API rate
limit of a deployment, 50 requests/s, burst 100); the Cluster API stand-in runs as ``python
-m standins --only capi`` with ``STANDIN_STEP_DELAY=0`` and ``STANDIN_CAPI_KUBECONFIG``
naming the workload kubeconfig. The test runs the same controllers inside its own process;
here they get one of their own, as in (d) and (e), so their work does not delay the
benchmark's watch events, which are its clock. The management API server keeps (e)'s audit
log, so requests are told apart by their client's User-Agent; the provider serves its
``/metrics`` (on a free port), which says when it has nothing left to do.

Every moment is a watch event reaching the benchmark process on its monotonic clock
(``bench.observe``): MetalStackMachines, firewalls and MetalStackClusters in the management
API server, Nodes in the workload API server, each state recorded as it arrives.

- **m1 all ready.** ``clusters`` clusters of one control plane and ``workers`` workers each
  (``testenv.examples.metalstack_cluster``) are created at once at t0 (each cluster's objects
  in template order, the clusters concurrently); the clock stops when every MetalStackMachine
  and every firewall has been seen with ``status.ready``. The baseline, measured first on
  the same stand-in and workload API server, is the floor of this work without capibus:
  through ``shared.metalapi.MetalApiClient``, with the provider's own request builders
  (``services.baremetal.metalstack.logic``), per cluster its network and control-plane IP
  (each looked up by its labels or tags, then allocated), then per firewall find + allocate
  + get and per machine find + allocate, ``CONCURRENCY`` at a time, each machine then waiting
  for its Node (the stand-in's registrar writes it) and writing the Node's
  ``spec.providerID``. No object in the management cluster, no Cluster API, no status: what
  is left is metal-api's and the workload API server's part, so the ratio says how much time
  capibus, the Cluster API stand-in and the management API server add to it.
- **m2 metal-api requests** by route (the stand-in's ``GET /_standin/requests``) from before
  the first create until the provider was quiet, against the minimum the flow needs: per
  machine one find and one allocate; per cluster network find + allocate, IP find + allocate,
  firewall find + allocate + get (one look: it is running when allocated). More than the
  minimum on any route is a miss: a poll, or work done twice.
- **m3 Node → ready**: per machine, from the moment the provider can first tell its Node is
  there, the later of the Node's first state with ``status.nodeInfo.systemUUID`` (the
  registrar's status write) and the MetalStackMachine's first with ``spec.providerID`` (its
  machine allocated and recorded: before that, no Node names the machine it will get), → the
  MetalStackMachine's first state with ``status.ready``, matched by name (Node = machine
  hostname = MetalStackMachine). The two watches are separate streams from separate API
  servers. The stand-in registers a Node the moment its machine is allocated, which a real
  machine does minutes later, once booted; from the Node alone the figure would time the
  allocation queue, which m1 covers (the details keep that split too).
- **Quiet.** After all are ready the provider may still work through events queued behind
  its rate limit. The idle window starts when it is quiet: its ``capibus_consumer_lag`` is 0
  and its ``capibus_messages_handled_total`` has not moved for ``QUIET`` s. How long that
  took, and what the provider asked for meanwhile, is in the details.
- **m4/m5 idle**: the window of ``window`` s that follows. m4 = metal-api requests in it;
  m5 = the provider's Kubernetes requests in it: in the management API server those with
  User-Agent ``capibus-metalstack`` in the audit log (every verb but WATCH), in the workload
  API server (no audit log there) every non-WATCH request on ``nodes`` from its
  ``apiserver_request_total`` (Nodes are all the provider touches there, and nobody else asks
  for them while nothing changes: the registrar writes only on an allocation or a free, the
  benchmark only watches). Both per idle machine per minute, target 0. The Node watches open
  in the workload API server are given beside it (the provider holds one only while a
  machine waits for its Node).
- **m6 deletion**: the CAPI Clusters are deleted at once; the clock stops when the stand-in's
  state shows every machine ``Waiting`` (none allocated or rebooting) and no IP and no network
  beyond those it had before the run (its two seeded networks). That state is read every
  ``STATE_POLL`` s (a stand-in endpoint, not a metal-api route). The baseline's own clean-up
  (free every machine, then the IPs, then the networks) is the reference.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import CONCURRENCY, PARTITIONS, Clients, new_namespace, run_pool
from bench.deployment import LEASE_TTL, load_average, mib, start_module, vm_hwm, wait_for_count
from bench.lifecycle import Figure, Section, Verdict, latency_figure, spread
from bench.observe import Key, Observer
from bench.procs import Child, Children, CpuSnapshot, labels_for
from bench.status import AUDIT_LOG, Series, apiserver_requests, by_request, client_of
from services.baremetal.metalstack import logic
from services.baremetal.metalstack.logic import ClusterPlace
from shared.kube import KubeClient, KubeConfig
from shared.metalapi import MetalApiClient, MetalApiConfig
from shared.resources import (
    CAPI_CLUSTER,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    NODE,
)
from testenv.examples import (
    METALSTACK_FIREWALL_IMAGE,
    METALSTACK_IMAGE,
    METALSTACK_PARTITION,
    METALSTACK_PROJECT,
    METALSTACK_PUBLIC_NETWORK,
    METALSTACK_SIZE,
    metalstack_cluster,
    metalstack_kind,
)
from testenv.harness import LocalStack, free_ports

Json = dict[str, Any]
READY_TIMEOUT = 300.0
DELETE_TIMEOUT = 300.0
QUIET = 3.0
QUIET_TIMEOUT = 120.0
STATE_POLL = 0.1
NODE_READY_LIMIT = 1.0
PROVIDER = "capibus-metalstack"
WATCHED_KINDS = [
    "metalstackcluster",
    "metalstackmachine",
    "metalstackfirewall",
    "capicluster",
    "machine",
    "secret",
]
KINDS = (METALSTACK_CLUSTER, METALSTACK_MACHINE, METALSTACK_FIREWALL)
#: What the flow needs of metal-api: per machine, and per cluster (its network, its
#: control-plane IP, its firewall, which is running when allocated, so one look).
PER_MACHINE = {"machine-find": 1, "machine-allocate": 1}
PER_CLUSTER = {
    "network-find": 1,
    "network-allocate": 1,
    "ip-find": 1,
    "ip-allocate": 1,
    "firewall-find": 1,
    "firewall-allocate": 1,
    "firewall-get": 1,
}
#: The bare side's user data: a short cloud-config, as a bootstrap Secret's value is.
USER_DATA = "#cloud-config\nruncmd:\n  - kubeadm join --config /run/kubeadm/kubeadm.yaml\n"
LONGRUNNING = "apiserver_longrunning_requests"
HANDLED = "capibus_messages_handled_total"
LAG = "capibus_consumer_lag"
RETRIES = "capibus_handler_retries_total"
ERRORS = "capibus_handler_errors_total"
BEFORE = "before creation"
IDLE_END = "at the idle window's end"


@dataclass(frozen=True)
class MetalSizes:
    clusters: int
    #: workers per cluster, besides its one control plane
    workers: int
    #: the idle window, seconds
    window: float

    @property
    def machines(self) -> int:
        return self.clusters * (1 + self.workers)

    @property
    def pool(self) -> int:
        """Every machine and firewall at once, and some to spare (at least 60)."""
        return max(60, self.machines + self.clusters + 5)


def minimum(sizes: MetalSizes) -> Counter[str]:
    """metal-api requests by route that creating ``sizes`` cannot do without."""
    need: Counter[str] = Counter()
    for route, n in PER_MACHINE.items():
        need[route] += n * sizes.machines
    for route, n in PER_CLUSTER.items():
        need[route] += n * sizes.clusters
    return need


# -- the metal-api stand-in -------------------------------------------------------------------


@dataclass
class StandIn:
    """The stand-in process and its test endpoints (no HMAC, not counted as metal-api routes)."""

    child: Child
    url: str
    http: httpx.AsyncClient

    async def requests(self) -> Counter[str]:
        response = await self.http.get("/_standin/requests")
        response.raise_for_status()
        return Counter({str(k): int(v) for k, v in response.json().items()})

    async def state(self) -> Json:
        response = await self.http.get("/_standin/state")
        response.raise_for_status()
        found: Json = response.json()
        return found


@dataclass(frozen=True)
class Seed:
    """What the stand-in holds before any allocation: the state a clean-up returns to."""

    pool: int
    ips: frozenset[str]
    networks: frozenset[str]

    @classmethod
    def of(cls, state: Json) -> Seed:
        return cls(
            pool=len(state["machines"]["waiting"]),
            ips=frozenset(i["ipaddress"] for i in state["ips"]),
            networks=frozenset(n["id"] for n in state["networks"]),
        )

    def clean(self, state: Json) -> bool:
        machines = state["machines"]
        return (
            not machines["allocated"]
            and not machines["rebooting"]
            and len(machines["waiting"]) == self.pool
            and frozenset(i["ipaddress"] for i in state["ips"]) == self.ips
            and frozenset(n["id"] for n in state["networks"]) == self.networks
        )


async def until_clean(standin: StandIn, seed: Seed, within: float) -> float | None:
    """Seconds until the stand-in's state is ``seed``'s again (None after ``within``)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if seed.clean(await standin.state()):
            return time.monotonic() - started
        await asyncio.sleep(STATE_POLL)
    return None


# -- what the benchmark sees ------------------------------------------------------------------


@dataclass
class Moments:
    """First moments, per object name, as the states arrive (``Observer`` listeners)."""

    nodes: dict[str, float] = field(default_factory=dict)  # Node has nodeInfo.systemUUID
    allocated: dict[str, float] = field(default_factory=dict)  # MSM has spec.providerID
    ready: dict[str, float] = field(default_factory=dict)  # MSM status.ready
    firewalls: dict[str, float] = field(default_factory=dict)  # firewall status.ready
    clusters: dict[str, float] = field(default_factory=dict)  # MSC status.ready
    machines: set[str] = field(default_factory=set)

    def management(self, key: Key, obj: Json, now: float) -> None:
        token, name = key
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        if token == METALSTACK_MACHINE.token:
            self.machines.add(name)
            if spec.get("providerID"):
                self.allocated.setdefault(name, now)
            if status.get("ready"):
                self.ready.setdefault(name, now)
        elif token == METALSTACK_FIREWALL.token and status.get("ready"):
            self.firewalls.setdefault(name, now)
        elif token == METALSTACK_CLUSTER.token and status.get("ready"):
            self.clusters.setdefault(name, now)

    def workload(self, key: Key, obj: Json, now: float) -> None:
        if ((obj.get("status") or {}).get("nodeInfo") or {}).get("systemUUID"):
            self.nodes.setdefault(key[1], now)

    def reaction_lags(self) -> list[float]:
        """Per machine: the later of its Node's systemUUID and its providerID → ready."""
        return [
            self.ready[x] - max(self.nodes[x], self.allocated[x])
            for x in self.machines
            if x in self.ready and x in self.nodes and x in self.allocated
        ]

    def node_lags(self, *, before: bool | None = None) -> list[float]:
        """Node → ready per machine; ``before``: only those whose Node came before (True) or
        after (False) the MetalStackMachine was seen with its providerID."""
        return [
            self.ready[x] - self.nodes[x]
            for x in self.machines
            if x in self.ready
            and x in self.nodes
            and (before is None or (self.nodes[x] <= self.allocated.get(x, 0.0)) == before)
        ]


# -- the bare floor ---------------------------------------------------------------------------


@dataclass
class Bare:
    """The baseline's timings (seconds after its start) and what it asked of metal-api."""

    elapsed: float = 0.0
    networks_done: float = 0.0
    allocated: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)
    node_waits: list[float] = field(default_factory=list)
    patches: list[float] = field(default_factory=list)
    cleanup: float | None = None
    cleanup_requests: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class BarePlan:
    """One bare cluster: where its things live, its firewall, its machines (0: the control
    plane), each shaped as the provider's request builders read them."""

    place: ClusterPlace
    firewall: Json
    machines: list[Json]


def bare_plans(sizes: MetalSizes) -> list[BarePlan]:
    def obj(name: str, image: str) -> Json:
        meta = {"name": name, "uid": str(uuid.uuid4())}
        return {"metadata": meta, "spec": {"image": image, "machineType": METALSTACK_SIZE}}

    plans = []
    for index in range(sizes.clusters):
        name = f"bare-{index}"
        place = ClusterPlace(
            name=name,
            uid=str(uuid.uuid4()),
            project=METALSTACK_PROJECT,
            partition=METALSTACK_PARTITION,
            public_network=METALSTACK_PUBLIC_NETWORK,
        )
        machines = [obj(f"{name}-m{m}", METALSTACK_IMAGE) for m in range(1 + sizes.workers)]
        plans.append(BarePlan(place, obj(name, METALSTACK_FIREWALL_IMAGE), machines))
    return plans


@dataclass
class BareRun:
    """The baseline's clients and what it has allocated so far."""

    metal: MetalApiClient
    workload: KubeClient
    nodes: Observer
    moments: Moments
    kubeconfig: str
    networks: dict[str, str] = field(default_factory=dict)
    api_ips: dict[str, str] = field(default_factory=dict)

    async def run(self, plans: list[BarePlan]) -> Bare:
        bare = Bare()
        t0 = time.monotonic()
        await run_pool(len(plans), lambda i: self.cluster(plans[i].place))
        bare.networks_done = time.monotonic() - t0
        # Every firewall and machine, one work item each, ``CONCURRENCY`` at a time.
        items: list[tuple[BarePlan, int | None]] = [(plan, None) for plan in plans]
        items += [(plan, index) for plan in plans for index in range(len(plan.machines))]

        async def one(index: int) -> None:
            plan, machine = items[index]
            if machine is None:
                await self.firewall(plan)
                return
            allocated = await self.machine(plan, machine)
            bare.allocated = max(bare.allocated, time.monotonic() - t0)
            await self.node(bare, plan.machines[machine], allocated)

        await run_pool(len(items), one)
        bare.elapsed = time.monotonic() - t0
        return bare

    async def cluster(self, place: ClusterPlace) -> None:
        metal = self.metal
        found = await metal.find_networks(
            project_id=place.project, partition_id=place.partition, labels=place.network_labels
        )
        network = found[0] if found else await metal.allocate_network(
            name=place.partition,
            description=place.name,
            partition_id=place.partition,
            project_id=place.project,
            labels=place.network_labels,
        )  # fmt: skip
        self.networks[place.name] = network["id"]
        ips = await metal.find_ips(project_id=place.project, tags=place.ip_tags)
        ip = ips[0] if ips else await metal.allocate_ip(
            network_id=place.public_network,
            project_id=place.project,
            name=f"{place.name}-api-server-IP",
            tags=place.ip_tags,
            static=True,
        )  # fmt: skip
        self.api_ips[place.name] = ip["ipaddress"]

    async def firewall(self, plan: BarePlan) -> None:
        place, uid = plan.place, plan.firewall["metadata"]["uid"]
        tags = [place.cluster_tag, logic.tag(logic.FIREWALL_RESOURCE, uid)]
        if await self.metal.find_firewalls(project_id=place.project, tags=tags):
            return
        request = logic.firewall_request(
            plan.firewall,
            place,
            private_network=self.networks[place.name],
            kubeconfig=self.kubeconfig,
        )
        firewall = await self.metal.allocate_firewall(request)
        if not logic.phoned_home(await self.metal.get_firewall(firewall["id"])):
            raise RuntimeError(f"bare firewall {firewall['id']} not running when allocated")

    async def machine(self, plan: BarePlan, index: int) -> Json:
        place, machine = plan.place, plan.machines[index]
        resource = logic.tag(logic.MACHINE_RESOURCE, machine["metadata"]["uid"])
        tags = [place.cluster_tag, resource]
        found = await self.metal.find_machines(project_id=place.project, tags=tags)
        if found:
            return found[0]
        request = logic.machine_request(
            machine,
            place,
            private_network=self.networks[place.name],
            user_data=USER_DATA,
            control_plane=index == 0,
            control_plane_ip=self.api_ips[place.name],
        )
        return await self.metal.allocate_machine(request)

    async def node(self, bare: Bare, machine: Json, allocated: Json) -> None:
        """Wait for the machine's Node (the registrar writes it), then set its providerID."""
        hostname = machine["metadata"]["name"]
        waited = time.monotonic()
        if not await self.nodes.until(lambda: hostname in self.moments.nodes, READY_TIMEOUT):
            raise TimeoutError(f"bare: no Node {hostname} after {READY_TIMEOUT:.0f} s")
        patched = time.monotonic()
        bare.node_waits.append(patched - waited)
        patch = {"spec": {"providerID": logic.provider_id(allocated["id"])}}
        await self.workload.patch_merge(NODE, None, hostname, patch)
        bare.patches.append(time.monotonic() - patched)

    async def cleanup(self, plans: list[BarePlan], standin: StandIn, seed: Seed) -> float | None:
        """Free what the baseline allocated (machines and firewalls, then IPs, then networks);
        seconds until the stand-in is back to ``seed`` (the reference for m6)."""
        metal = self.metal
        started = time.monotonic()
        mine: set[str] = set()
        for plan in plans:
            # metal-api's machine find returns firewalls too; a set frees each once.
            mine |= {m["id"] for m in await metal.find_machines(tags=[plan.place.cluster_tag])}
        ids = sorted(mine)
        await run_pool(len(ids), lambda i: self._free(ids[i]))
        ips = [i["ipaddress"] for p in plans for i in await metal.find_ips(tags=p.place.ip_tags)]
        await run_pool(len(ips), lambda i: metal.free_ip(ips[i]))
        networks = [
            n["id"] for p in plans for n in await metal.find_networks(labels=p.place.network_labels)
        ]
        await run_pool(len(networks), lambda i: metal.free_network(networks[i]))
        if await until_clean(standin, seed, DELETE_TIMEOUT) is None:
            return None
        return time.monotonic() - started

    async def _free(self, machine: str) -> None:
        await self.metal.free_machine(machine)


# -- what the provider and the API servers say ---------------------------------------------------


def provider_requests(log: Path, start_wall: float, end_wall: float) -> Counter[str]:
    """The provider's requests to the management API server that finished in the window, by
    "verb resource[/subresource]" (the audit log; WATCH left out, as in (e))."""
    found: Counter[str] = Counter()
    if not log.exists():
        return found
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("verb") == "watch" or event.get("stage") != "ResponseComplete":
                continue
            if client_of(event.get("userAgent", "")) != PROVIDER:
                continue
            if (
                start_wall
                <= datetime.fromisoformat(event["stageTimestamp"]).timestamp()
                <= end_wall
            ):
                ref = event.get("objectRef") or {}
                resource = ref.get("resource", "?")
                if ref.get("subresource"):
                    resource += f"/{ref['subresource']}"
                found[f"{event['verb']} {resource}"] += 1
    return found


def node_requests(counts: Counter[Series]) -> Counter[str]:
    """Non-WATCH requests on Nodes (``nodes``, ``nodes/status``) by "VERB resource"."""
    found = by_request(counts, watches=False)
    return Counter({k: n for k, n in found.items() if k.split(" ")[1].startswith("nodes") and n})


async def open_watches(kube: KubeClient, resource: str) -> int:
    """Watches of ``resource`` the API server holds open now (its longrunning gauge)."""
    response = await kube.http.get("/metrics")
    response.raise_for_status()
    text = "\n".join(x for x in response.text.splitlines() if x.startswith(LONGRUNNING)) + "\n"
    total = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("verb") == "WATCH" and labels.get("resource") == resource:
                total += int(sample.value)
    return total


@dataclass
class ProviderMetrics:
    """The provider's own ``/metrics``: messages handled, retries, errors, consumer lag."""

    url: str
    http: httpx.AsyncClient

    async def read(self) -> Counter[str]:
        """``handled <subscription> <outcome>``, ``retries <subscription>``, ``errors
        <subscription> <kind>`` and ``lag`` (summed over partitions)."""
        response = await self.http.get(self.url)
        response.raise_for_status()
        found: Counter[str] = Counter()
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                labels, value = sample.labels, int(sample.value)
                if sample.name == HANDLED:
                    found[f"handled {labels['subscription']} {labels['outcome']}"] += value
                elif sample.name == RETRIES:
                    found[f"retries {labels['subscription']}"] += value
                elif sample.name == ERRORS:
                    found[f"errors {labels['subscription']} {labels['kind']}"] += value
                elif sample.name == LAG:
                    found["lag"] += value
        return found

    async def quiet(self) -> float | None:
        """Until the provider has nothing left to do (lag 0, no message handled for ``QUIET``
        s); the moment it handled its last one (within 0.25 s), or None after a timeout."""
        deadline = time.monotonic() + QUIET_TIMEOUT
        handled, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            found = await self.read()
            now_handled = sum(v for k, v in found.items() if k.startswith("handled "))
            if found["lag"] or now_handled != handled:
                handled, since = now_handled, time.monotonic()
            elif time.monotonic() - since >= QUIET:
                return since
            await asyncio.sleep(0.25)
        return None


def delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    """``after - before`` for counters, the gauge ``lag`` as it is now."""
    found = Counter({k: v - before[k] for k, v in after.items() if k != "lag" and v > before[k]})
    if after["lag"]:
        found["lag"] = after["lag"]
    return found


@dataclass
class Window:
    """One span of the run: what metal-api, both API servers and the provider saw in it."""

    start: float
    end: float
    metal: Counter[str] = field(default_factory=Counter)
    provider: Counter[str] = field(default_factory=Counter)  # management, from the audit log
    workload: Counter[Series] = field(default_factory=Counter)  # apiserver_request_total
    handled: Counter[str] = field(default_factory=Counter)  # the provider's own metrics
    cpu: str = ""
    load: str = ""

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def minutes(self) -> float:
        return self.seconds / 60.0

    @property
    def nodes(self) -> Counter[str]:
        return node_requests(self.workload)


@dataclass
class Probe:
    """The counters a window is the difference of, read at one moment."""

    metal: Counter[str]
    workload: Counter[Series]
    handled: Counter[str]
    cpu: CpuSnapshot
    at: float
    wall: float

    @classmethod
    async def take(cls, running: Running, workload: KubeClient) -> Probe:
        return cls(
            metal=await running.standin.requests(),
            workload=await apiserver_requests(workload),
            handled=await running.metrics.read(),
            cpu=CpuSnapshot.take(running.labels()),
            at=time.monotonic(),
            wall=time.time(),
        )

    def window(self, after: Probe, audit: Path) -> Window:
        return Window(
            start=self.at,
            end=after.at,
            metal=after.metal - self.metal,
            provider=provider_requests(audit, self.wall, after.wall),
            workload=after.workload - self.workload,
            handled=delta(after.handled, self.handled),
            cpu=after.cpu.cpu_line(self.cpu),
            load=load_average(),
        )


# -- the processes ------------------------------------------------------------------------------


@dataclass
class Running:
    """The processes of this benchmark and the clients of their endpoints."""

    standin: StandIn
    capi: Child
    services: dict[str, Child]
    metrics: ProviderMetrics

    def all(self) -> list[Child]:
        return [self.standin.child, self.capi, *self.services.values()]

    def labels(self) -> dict[int, str]:
        labels = labels_for(*self.services.values())
        labels[self.standin.child.proc.pid] = "metal-api (stand-in)"
        labels[self.capi.proc.pid] = "capi (stand-in)"
        if (pid := _workload_apiserver()) is not None:
            labels[pid] = "kube-apiserver (workload)"
        return labels

    def peak_memory(self) -> dict[str, int]:
        return {c.label: vm_hwm(c.proc.pid) for c in self.all() if c.alive()}

    async def aclose(self) -> None:
        await self.standin.http.aclose()


def _workload_apiserver() -> int | None:
    """The workload API server's pid (a child of this process, as the management one is)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"kube-apiserver" in cmdline and b"--etcd-prefix=" in cmdline:
            return int(entry.name)
    return None


async def start(
    children: Children, stack: LocalStack, workload: Path, sizes: MetalSizes, hmac: str
) -> Running:
    """The metal-api stand-in, the CAPI stand-in, the watcher, the writer and the provider,
    each waited for until it serves."""
    env = {
        **stack.env(),
        "STANDIN_METALAPI_HMAC": hmac,
        "STANDIN_METALAPI_PROVISIONING_DELAY": "0",
        "STANDIN_METALAPI_REBOOT_DELAY": "0",
        "STANDIN_METALAPI_POOL_SIZE": str(sizes.pool),
    }
    args = ["--workload-kubeconfig", str(workload)]
    metalapi = start_module(children, "standins.metalapi", env, "ms-metalapi", args)
    await wait_for_count(metalapi, "metal-api listening on", 1)
    url = metalapi.log().split("metal-api listening on ", 1)[1].split()[0]
    http = httpx.AsyncClient(base_url=url, timeout=30)
    capi_env = {**stack.env(), "STANDIN_STEP_DELAY": "0", "STANDIN_CAPI_KUBECONFIG": str(workload)}
    capi = start_module(children, "standins", capi_env, "ms-capi", ["--only", "capi"])
    base = stack.env()
    port = free_ports(1)[0]
    provider_env = {
        **base,
        "METALCTL_URL": url,
        "METALCTL_HMAC": hmac,
        "CAPIBUS_METRICS_PORT": str(port),
        "CAPIBUS_METRICS_HOST": "127.0.0.1",
    }
    watcher_env = {**base, "CAPIBUS_WATCHER__KINDS": json.dumps(WATCHED_KINDS)}
    services = {
        "watcher": children.start("watcher", watcher_env, "ms-watcher"),
        "writer": children.start("writer", base, "ms-writer"),
        "metalstack": children.start("baremetal.metalstack", provider_env, "ms-metalstack"),
    }
    metrics = ProviderMetrics(f"http://127.0.0.1:{port}/metrics", http)
    running = Running(StandIn(metalapi, url, http), capi, services, metrics)
    await asyncio.gather(
        wait_for_count(services["watcher"], "listed at", len(WATCHED_KINDS)),
        wait_for_count(services["writer"], "owns partition", PARTITIONS),
        wait_for_count(services["metalstack"], "owns partition", PARTITIONS),
        wait_for_count(capi, "stand-ins running", 1),
    )
    # A freshly claimed partition is fenced for one lease TTL before its consumers fetch.
    await asyncio.sleep(LEASE_TTL + 0.5)
    return running


# -- the benchmark ------------------------------------------------------------------------------


@dataclass
class Outcome:
    sizes: MetalSizes
    names: list[str]
    moments: Moments = field(default_factory=Moments)
    bare: Bare | None = None
    t0: float = 0.0
    created: float = 0.0
    all_ready: float | None = None
    quiet: float | None = None
    creation: Window | None = None
    tail: Window | None = None  # from all ready until the provider was quiet
    idle: Window | None = None
    watches: dict[str, int] = field(default_factory=dict)
    deletion: Window | None = None
    deleted: float | None = None
    objects_gone: float | None = None
    memory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def provider_watches(self) -> int | None:
        """Node watches open at the idle window's end beyond those before any machine (the
        API server's own informer's and the benchmark's): the provider's."""
        before, end = self.watches.get(BEFORE), self.watches.get(IDLE_END)
        return None if before is None or end is None else end - before


@dataclass
class Scene:
    """One run's clients, watches and processes: what every step below works with."""

    kube: KubeClient
    workload: KubeClient
    workload_path: Path
    namespace: str
    running: Running
    objects: Observer  # the metal-stack kinds in the management API server
    nodes: Observer  # Nodes in the workload API server
    audit: Path
    hmac: str
    seed: Seed
    outcome: Outcome

    async def probe(self) -> Probe:
        return await Probe.take(self.running, self.workload)

    async def node_watches(self, when: str) -> None:
        self.outcome.watches[when] = await open_watches(self.workload, "nodes")


async def measure(
    clients: Clients, stack: LocalStack, children: Children, sizes: MetalSizes
) -> Section:
    kube = clients.kube
    # Starting the workload API server blocks for seconds; nothing else runs yet.
    workload_path = await asyncio.to_thread(stack.workload)
    workload = KubeClient.from_config(
        KubeConfig.load(workload_path), qps=None, user_agent="capibus-bench"
    )
    namespace = await new_namespace(kube, "bench-metal")
    outcome = Outcome(sizes=sizes, names=[f"m{i}" for i in range(sizes.clusters)])
    hmac = secrets.token_hex(16)
    running: Running | None = None
    nodes = Observer(workload, "", (NODE,), listeners=[outcome.moments.workload])
    objects = Observer(kube, namespace, KINDS, listeners=[outcome.moments.management])
    try:
        running = await start(children, stack, workload_path, sizes, hmac)
        scene = Scene(
            kube=kube,
            workload=workload,
            workload_path=workload_path,
            namespace=namespace,
            running=running,
            objects=await objects.start(),
            nodes=await nodes.start(),
            audit=children.log_dir / AUDIT_LOG,
            hmac=hmac,
            seed=Seed.of(await running.standin.state()),
            outcome=outcome,
        )
        outcome.notes.append(f"load average before (1/5/15 min): {load_average()}")
        outcome.bare = await _bare(scene)
        await scene.node_watches(BEFORE)
        await _create(scene)
        await _idle(scene)
        await _delete(scene)
        outcome.memory = running.peak_memory()
    finally:
        await objects.stop()
        await nodes.stop()
        if running is not None:
            await running.aclose()
            for child in running.all():
                children.stop(child)
        await workload.aclose()
    return section(outcome)


async def _bare(scene: Scene) -> Bare:
    standin, nodes = scene.running.standin, scene.nodes
    plans = bare_plans(scene.outcome.sizes)
    kubeconfig = await asyncio.to_thread(scene.workload_path.read_text)
    async with MetalApiClient(MetalApiConfig(url=standin.url, hmac=scene.hmac)) as metal:
        run = BareRun(metal, scene.workload, nodes, scene.outcome.moments, kubeconfig)
        before = await standin.requests()
        bare = await run.run(plans)
        after = await standin.requests()
        bare.requests = after - before
        bare.cleanup = await run.cleanup(plans, standin, scene.seed)
        bare.cleanup_requests = await standin.requests() - after
    if bare.cleanup is None:
        raise RuntimeError(f"the baseline's clean-up did not finish: {await standin.state()}")

    # Its Nodes go with its machines (the registrar): none may be taken for capibus's.
    def gone() -> bool:
        return not any(name.startswith("bare-") for name in nodes.names(NODE))

    if not await nodes.until(gone, DELETE_TIMEOUT):
        raise RuntimeError("the baseline's Nodes are still there")
    return bare


async def _create(scene: Scene) -> None:
    outcome = scene.outcome
    sizes, moments = outcome.sizes, outcome.moments
    before = await scene.probe()
    outcome.t0 = time.monotonic()

    async def create(index: int) -> None:
        for manifest in metalstack_cluster(
            scene.namespace, outcome.names[index], workers=sizes.workers
        ):
            await scene.kube.create(metalstack_kind(manifest), manifest)

    await asyncio.gather(*(create(i) for i in range(sizes.clusters)))
    outcome.created = time.monotonic() - outcome.t0

    def all_ready() -> bool:
        return len(moments.ready) == sizes.machines and len(moments.firewalls) == sizes.clusters

    if not await scene.objects.until(all_ready, READY_TIMEOUT):
        raise TimeoutError(
            f"after {READY_TIMEOUT:.0f} s: {len(moments.ready)}/{sizes.machines} machines, "
            f"{len(moments.firewalls)}/{sizes.clusters} firewalls ready"
        )
    at_ready = await scene.probe()
    outcome.all_ready = max([*moments.ready.values(), *moments.firewalls.values()]) - outcome.t0
    outcome.notes.append(f"load average at all ready: {load_average()}")
    await scene.node_watches("at all ready")
    quiet = await scene.running.metrics.quiet()
    if quiet is not None:
        outcome.quiet = quiet - outcome.t0
    settled = await scene.probe()
    outcome.creation = before.window(settled, scene.audit)
    outcome.tail = at_ready.window(settled, scene.audit)


async def _idle(scene: Scene) -> None:
    before = await scene.probe()
    await asyncio.sleep(scene.outcome.sizes.window)
    after = await scene.probe()
    # The audit backend writes each event as its request finishes: wait out the last ones.
    await asyncio.sleep(1.0)
    scene.outcome.idle = before.window(after, scene.audit)
    await scene.node_watches(IDLE_END)


async def _delete(scene: Scene) -> None:
    outcome, objects, standin = scene.outcome, scene.objects, scene.running.standin
    before = await scene.probe()
    started = time.monotonic()
    names = outcome.names
    await asyncio.gather(*(scene.kube.delete(CAPI_CLUSTER, scene.namespace, n) for n in names))
    outcome.deleted = await until_clean(standin, scene.seed, DELETE_TIMEOUT)
    if await objects.until(lambda: not objects.live, DELETE_TIMEOUT):
        outcome.objects_gone = max(objects.gone_at.values(), default=started) - started
    await asyncio.sleep(1.0)
    outcome.deletion = before.window(await scene.probe(), scene.audit)
    if outcome.deleted is None:
        state = await standin.state()
        outcome.notes.append(f"stand-in not clean after {DELETE_TIMEOUT:.0f} s: {state}")


# -- the figures --------------------------------------------------------------------------------


def section(o: Outcome) -> Section:
    s = o.sizes
    title = f"metal-stack, {s.machines} machines over {s.clusters} clusters"
    sec = Section(key="m", title=title, method=METHOD)
    sec.figures += [
        _all_ready(o),
        _metal_requests(o),
        _node_lag(o),
        _idle_metal(o),
        _idle_kube(o),
        _deletion(o),
    ]
    sec.details += [
        *_timings(o),
        *_bare_details(o),
        *_creation_details(o),
        *_idle_details(o),
        *_deletion_details(o),
        *_memory(o),
        *o.notes,
    ]
    return sec


def _all_ready(o: Outcome) -> Figure:
    s, m = o.sizes, o.moments
    title = (
        f"{s.machines} MetalStackMachines ({s.clusters} clusters) created at once "
        f"→ all ready, and their {s.clusters} firewalls"
    )
    if o.all_ready is None:
        value = f"{len(m.ready)}/{s.machines} machines, {len(m.firewalls)}/{s.clusters} firewalls"
        return Figure("m1", title, f"{value} ready", verdict="INCOMPLETE")
    value = f"all ready after {o.all_ready:.1f} s"
    if o.bare is not None and o.bare.elapsed:
        value += (
            f"; bare floor (metal-api calls, Nodes' providerID): {o.bare.elapsed:.2f} s; "
            f"ratio {o.all_ready / o.bare.elapsed:.1f}"
        )
    return Figure("m1", title, value, "— (ratio: lower is better)")


def by_route(found: Counter[str], need: Counter[str]) -> str:
    """``route made/minimum`` for every route made or needed, most made first."""
    routes = sorted(set(found) | set(need), key=lambda r: (-found[r], r))
    return ", ".join(f"{r} {found[r]}/{need[r]}" for r in routes if found[r] or need[r])


def _metal_requests(o: Outcome) -> Figure:
    title = "metal-api requests per machine, creation → provider quiet (route made/minimum)"
    if o.creation is None:
        return Figure("m2", title, "not measured", verdict="INCOMPLETE")
    need, found, n = minimum(o.sizes), o.creation.metal, o.sizes.machines
    made, least = sum(found.values()), sum(need.values())
    value = f"{made / n:.2f} (minimum {least / n:.2f}): {by_route(found, need)}"
    verdict: Verdict = "MISSED" if any(found[r] > need[r] for r in found) else "pass"
    return Figure("m2", title, value, "the minimum (no polling)", verdict)


def _node_lag(o: Outcome) -> Figure:
    return latency_figure(
        "m3",
        "Node has status.nodeInfo.systemUUID and its MetalStackMachine spec.providerID "
        "(the later of the two) → that MetalStackMachine ready",
        o.moments.reaction_lags(),
        expected=o.sizes.machines,
        limit=NODE_READY_LIMIT,
    )


def _idle_metal(o: Outcome) -> Figure:
    title = f"metal-api requests per idle machine per minute ({o.sizes.window:g} s window)"
    if o.idle is None:
        return Figure("m4", title, "not measured", "0", "INCOMPLETE")
    total = sum(o.idle.metal.values())
    rate = total / o.sizes.machines / o.idle.minutes
    value = f"{rate:.2f} ({total} requests: {_rows(o.idle.metal)})"
    return Figure("m4", title, value, "0", "pass" if total == 0 else "MISSED")


def _idle_kube(o: Outcome) -> Figure:
    title = "Kubernetes API requests by the provider (no WATCH) per idle machine per minute"
    if o.idle is None:
        return Figure("m5", title, "not measured", "0", "INCOMPLETE")
    idle = o.idle
    management, nodes = sum(idle.provider.values()), sum(idle.nodes.values())
    rate = (management + nodes) / o.sizes.machines / idle.minutes
    value = f"{rate:.2f} (management API server: {management}, workload Nodes: {nodes}"
    held = o.provider_watches()
    if held is not None:
        value += f"; Node watches held at the window's end: {held}"
    return Figure("m5", title, value + ")", "0", "pass" if management + nodes == 0 else "MISSED")


def _deletion(o: Outcome) -> Figure:
    title = (
        f"{o.sizes.clusters} clusters deleted at once → every machine Waiting, no IP, "
        "only the seeded networks"
    )
    if o.deleted is None:
        return Figure("m6", title, f"not clean after {DELETE_TIMEOUT:.0f} s", verdict="INCOMPLETE")
    value = f"{o.deleted:.1f} s"
    if o.objects_gone is not None:
        value += f" (every metal-stack object gone after {o.objects_gone:.1f} s)"
    if o.bare is not None and o.bare.cleanup:
        value += f"; bare clean-up: {o.bare.cleanup:.2f} s"
    return Figure("m6", title, value)


def _after(moments: dict[str, float], t0: float) -> str:
    return spread([v - t0 for v in moments.values()], "s", 1, 2)


def _timings(o: Outcome) -> list[str]:
    m, t0 = o.moments, o.t0
    if not m.machines:
        return []
    nodes = {x: m.nodes[x] for x in m.machines if x in m.nodes}
    recorded = [m.nodes[x] - m.allocated[x] for x in nodes if x in m.allocated]
    lines = [
        f"all {o.sizes.clusters} clusters' objects created {o.created:.2f} s after t0",
        f"after t0, MetalStackCluster ready: {_after(m.clusters, t0)}",
        f"after t0, MetalStackMachine seen with spec.providerID: {_after(m.allocated, t0)}",
        f"after t0, its Node has a systemUUID: {_after(nodes, t0)}",
        f"after t0, MetalStackMachine ready: {_after(m.ready, t0)}",
        f"after t0, firewall ready: {_after(m.firewalls, t0)}",
        f"per machine, MetalStackMachine seen with spec.providerID → its Node has a systemUUID "
        f"(negative: the Node came first; the stand-in answers the allocation provisioned and "
        f"registers the Node at once): {spread(recorded)}",
        f"Node has a systemUUID → ready, the allocation included when the Node came first: "
        f"{spread(m.node_lags())}",
        f"m3 split: Node seen before spec.providerID (the provider finds it by a list) "
        f"{spread(m.node_lags(before=True))}; after (its Node watch wakes the machine) "
        f"{spread(m.node_lags(before=False))}",
    ]
    if o.quiet is not None and o.all_ready is not None:
        lines.append(
            f"the provider quiet (consumer lag 0, no message handled for {QUIET:g} s) after its "
            f"last message, {o.quiet:.1f} s after t0, {o.quiet - o.all_ready:.1f} s after all "
            "were ready"
        )
    return lines


def _bare_details(o: Outcome) -> list[str]:
    if (b := o.bare) is None:
        return []
    return [
        f"bare floor: networks and control-plane IPs {b.networks_done:.2f} s, the last machine "
        f"allocated {b.allocated:.2f} s, the last Node's providerID written {b.elapsed:.2f} s "
        f"after its start; per machine, its Node after its allocation: {spread(b.node_waits)}; "
        f"the Node PATCH: {spread(b.patches)}",
        f"bare floor, metal-api requests (made/minimum): {by_route(b.requests, minimum(o.sizes))}",
    ]


def _creation_details(o: Outcome) -> list[str]:
    if (c := o.creation) is None:
        return []
    n, made = o.sizes.machines, sum(c.provider.values())
    lines = [
        f"t0 → provider quiet ({c.seconds:.1f} s): the provider's requests to the management API "
        f"server (audit log) {made}, {made / n:.1f} per machine, {made / c.seconds:.0f}/s "
        f"(its client's limit: 50/s, burst 100): {_rows(c.provider)}",
        f"t0 → provider quiet, requests on Nodes in the workload API server (every client: the "
        f"registrar creates each Node and writes its status; the provider lists and patches): "
        f"{_rows(c.nodes)}",
        f"t0 → provider quiet, messages the provider handled (its /metrics): {_rows(c.handled)}",
        f"t0 → provider quiet: {c.cpu}",
    ]
    if (t := o.tail) is not None:
        lines.append(
            f"all ready → provider quiet ({t.seconds:.1f} s): metal-api requests "
            f"{sum(t.metal.values())}; the provider's requests to the management API server "
            f"{sum(t.provider.values())}: {_rows(t.provider)}; messages handled: {_rows(t.handled)}"
        )
    return lines


def _rows(counts: Counter[str], per: float = 0.0) -> str:
    if per:
        return ", ".join(f"{k} {v / per:.1f}/min" for k, v in counts.most_common()) or "none"
    return ", ".join(f"{k} {v}" for k, v in counts.most_common()) or "none"


def _idle_details(o: Outcome) -> list[str]:
    if (idle := o.idle) is None:
        return []
    everything = by_request(idle.workload, watches=False)
    watches = ", ".join(f"{k} {v}" for k, v in o.watches.items())
    return [
        f"idle window ({idle.seconds:.1f} s, from the provider quiet): metal-api requests "
        f"{sum(idle.metal.values())}; the provider's requests to the management API server "
        f"(audit log): {_rows(idle.provider)}; to the workload API server on Nodes: "
        f"{_rows(idle.nodes)}; messages the provider handled: {_rows(idle.handled)}",
        f"idle window, every non-WATCH request to the workload API server (every client, its "
        f"own loopback included): {_rows(everything, idle.minutes)}",
        f"Node watches open in the workload API server (before creation: the API server's own "
        f"informer and the benchmark's): {watches}",
        f"idle window: {idle.cpu}; load average at its end: {idle.load}",
    ]


def _deletion_details(o: Outcome) -> list[str]:
    lines: list[str] = []
    if (d := o.deletion) is not None:
        lines += [
            f"deletion, metal-api requests by route: {_rows(d.metal)}",
            f"deletion, the provider's requests to the management API server: {_rows(d.provider)}",
            f"deletion: {d.cpu}",
        ]
    if (b := o.bare) is not None:
        lines.append(f"bare clean-up, metal-api requests by route: {_rows(b.cleanup_requests)}")
    return lines


def _memory(o: Outcome) -> list[str]:
    sizes = ", ".join(f"{label.removeprefix('ms-')} {mib(v)}" for label, v in o.memory.items())
    return [f"peak memory (VmHWM): {sizes}"] if sizes else []


METHOD = (
    "Services: watcher (the six metal-stack kinds), writer and `python -m "
    "services.baremetal.metalstack`, default settings (API rate limit 50/s, burst 100); the "
    "metal-api stand-in with HMAC, `STANDIN_METALAPI_PROVISIONING_DELAY=0` and "
    "`STANDIN_METALAPI_REBOOT_DELAY=0`, registering Nodes in a second kube-apiserver (the "
    "workload cluster); the CAPI stand-in with `STANDIN_STEP_DELAY=0`. t0 = the first create; "
    "every moment is a watch event reaching the benchmark. m1: the last MetalStackMachine or "
    "firewall first seen with `status.ready`. Baseline, run first on the same stand-in and "
    "workload API server: the same metal-api work through `shared.metalapi` with the provider's "
    "request builders (per cluster network and IP find + allocate, per firewall find + allocate "
    f"+ get, per machine find + allocate, {CONCURRENCY} at a time), then each Node's "
    "`spec.providerID` once the registrar has written the Node: the floor of the work without "
    "capibus; ratio = capibus / baseline. m2: the stand-in's request counts from the first "
    f"create until the provider was quiet (consumer lag 0, nothing handled for {QUIET:g} s, "
    "from its /metrics). m3: per machine, Node first seen with `status.nodeInfo.systemUUID` → "
    "MetalStackMachine first seen with `status.ready`, matched by name. m4/m5: the window "
    "after the provider was quiet; its Kubernetes requests are those with User-Agent "
    f"`{PROVIDER}` in the management API server's audit log plus every non-WATCH request on "
    "Nodes in the workload API server (`apiserver_request_total`). m6: every CAPI Cluster "
    "deleted at once → the stand-in's state back to its seed (every machine Waiting, no IP, "
    f"the two seeded networks), read every {STATE_POLL:g} s; reference: the baseline's own "
    "clean-up."
)
