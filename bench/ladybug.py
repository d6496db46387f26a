"""(l) CB-Ladybug: clusters created at once through the REST API, on real sshd nodes.

The set-up is ``tests/integration/test_ladybug.py``'s, on a stack of its own: the CB-Tumblebug
stand-in runs as a process (``python -m standins.tumblebug``) whose VMs are real OpenSSH
``sshd`` processes on loopback addresses (``standins.sshnodes``: ForceCommand = the node
emulator, which answers upstream's command table and keeps a command log per node); joined
nodes become Nodes in a second kube-apiserver (``LocalStack.workload()``). capibus's watcher
(LadybugCluster only), writer, ``python -m services.ladybug.provisioner`` and ``python -m
services.ladybug.api`` run as processes with a deployment's defaults (the provisioner's SSH
retry pause of 2 s, 10 nodes bootstrapped at once per cluster, the API rate limit of 50/s).
The VM addresses start at ``ADDRESS_START``, away from the stand-in's default range, so a test
run elsewhere on the machine cannot take them.

- **l0 a cold namespace.** First, ``clusters`` clusters are created at once in the Tumblebug
  namespace while none of its MCIR (vNet, security group, sshKey, image, spec of the
  connection) exists yet: every cluster gets-or-creates the same five, as upstream does.
  Figure: how many end Provisioned (and why the others failed); then all are deleted. This
  round also leaves the MCIR in place, as any namespace has them after its first cluster.
- **l1 all Provisioned.** Then ``clusters`` new clusters of one control plane and ``workers``
  workers (the default Kubernetes config: kilo, haproxy, local etcd) are created at once at t0
  with ``POST /ladybug/ns/{ns}/clusters?async=true`` (202 at once); the clock stops when the
  last LadybugCluster is seen, by the benchmark's own watch, with ``status.phase`` Provisioned.
  **The bare floor**, run first in the same process against the same stand-in (its own
  Tumblebug namespace ``bare``), is the same work without capibus: a script straight over
  ``shared.tumblebug.TumblebugClient`` and ``shared.ssh.SshClient`` with the provisioner's own
  request and command builders (``services.ladybug.provisioner.rules``): the connection, region
  and spec looked up once, the five MCIR created once, then every cluster at once: one MCIS
  create, one SSH connection per node for all its commands, upload + ``bootstrap.sh`` on every
  node in parallel, haproxy (render, run), ``kubeadm init``, ``cat admin.conf`` on the leader,
  the workers' joins (+ ``systemctl restart mcks-bootstrap``) in parallel, then from the leader
  each node's labels and kilo annotations and the three CNI manifests. No resource, no bus,
  no status, no checks of what exists: the floor of what the nodes and Tumblebug themselves
  take here. The floor runs again after the measured round (the machine is shared and its
  load moves); ratio = capibus / the faster of the two.
- **l2 SSH and Tumblebug per node.** SSH: from each node's own files (the farm's node
  directory): connections = ``Accepted publickey`` lines of its sshd's log (LogLevel VERBOSE),
  commands = lines of the emulator's ``commands.log`` (every exec, the scp sink included).
  The minimum is the bare script's own count (one connection per node; the commands the flow
  cannot do without). Tumblebug: the stand-in's ``GET /_standin/requests`` from before the
  first POST until all were Provisioned, by route, against the minimum of upstream's flow with
  nothing asked twice: per cluster its namespace check (the API's), the MCIS get (is the name
  free?) and create, its connection, region and spec lookups and the five MCIR gets (the MCIR
  exist: no creates), plus one namespace check per REST GET of l3 (upstream's
  ``verifyNamespace`` on every call; the l3 loop runs while the clusters provision, so its
  checks cannot be told apart from the creates' and are counted with them). More than the
  minimum on any route is a miss.
- **l3 REST GET latency while provisioning.** One client loops ``GET
  /ladybug/ns/{ns}/clusters/{name}`` over the clusters, one request at a time, from the last
  create's 202 until all are Provisioned; p50/p99 of every answer (non-200 counted apart).
  The same loop for ``IDLE_LOOP`` s once all are Provisioned is the reference.
- **l4 deletion**: every cluster deleted at once (``DELETE …?async=true``) → every
  LadybugCluster gone and no MCIS left in the stand-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import PARTITIONS, Clients, new_namespace, percentile
from bench.deployment import LEASE_TTL, load_average, mib, start_module, vm_hwm, wait_for_count
from bench.lifecycle import Figure, Section, Verdict, spread
from bench.observe import Key, Observer
from bench.procs import Child, Children, CpuSnapshot, labels_for
from services.ladybug.provisioner import rules
from services.ladybug.provisioner.bootstrap import scripts
from shared.models.ladybug import KubernetesConfig
from shared.resources import LADYBUG_CLUSTER
from shared.ssh import MemoryHostKeys, SshClient, SshSession
from shared.tumblebug import TumblebugClient
from standins.tumblebug import spider_url
from testenv.harness import LocalStack, free_ports

Json = dict[str, Any]

TBNS = "ns-1"
BARE_NS = "bare"
CONNECTION = "aws-ap-northeast-2"
SPEC = "t3.medium"
TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADDRESS_START = "127.0.77.2"
READY_TIMEOUT = 900.0
DELETE_TIMEOUT = 300.0
START_TIMEOUT = 60.0
#: after all are Provisioned: how long the benchmark waits for stray requests
SETTLE = 5.0
#: the reference GET loop once all are Provisioned, seconds
IDLE_LOOP = 10.0
MCIR_KINDS = ("vnet", "securitygroup", "sshkey", "image", "spec")
PROVISIONED = "Provisioned"
FAILED = "Failed"


@dataclass(frozen=True)
class LadybugSizes:
    clusters: int
    #: workers per cluster, besides its one control plane
    workers: int

    @property
    def nodes(self) -> int:
        return self.clusters * (1 + self.workers)


def minimum(sizes: LadybugSizes, gets: int = 0) -> Counter[str]:
    """Tumblebug requests by route that creating ``sizes`` through upstream's flow cannot do
    without (nothing asked twice) when the namespace's MCIR exist, with ``gets`` REST GETs
    answered meanwhile (one namespace check each, as upstream)."""
    need: Counter[str] = Counter()
    per_cluster = ["ns-get", "mcis-get", "mcis-create", "connconfig-get", "region-get"]
    per_cluster += ["lookup-spec", *(f"{kind}-get" for kind in MCIR_KINDS)]
    for route in per_cluster:
        need[route] += sizes.clusters
    need["ns-get"] += gets
    return need


# -- the nodes' own records ---------------------------------------------------------------------


@dataclass
class SshCounts:
    """What the nodes of one side saw: connections and commands, per node and by program."""

    nodes: int = 0
    connections: list[int] = field(default_factory=list)
    commands: list[int] = field(default_factory=list)
    programs: Counter[str] = field(default_factory=Counter)
    failed_commands: int = 0

    @classmethod
    def read(cls, nodes_dir: Path, addresses: list[str]) -> SshCounts:
        counts = cls(nodes=len(addresses))
        for address in addresses:
            directory = nodes_dir / "nodes" / address
            log = directory / "sshd.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            counts.connections.append(text.count("Accepted publickey"))
            lines = (directory / "commands.log").read_text().splitlines()
            entries = [json.loads(line) for line in lines if line.strip()]
            counts.commands.append(len(entries))
            counts.failed_commands += sum(1 for e in entries if e.get("exit") != 0)
            counts.programs.update(program(str(e["command"])) for e in entries)
        return counts

    def per_node(self, values: list[int]) -> str:
        return f"{sum(values) / max(self.nodes, 1):.2f} (min {min(values)}, max {max(values)})"


def program(command: str) -> str:
    """A command's shape without its arguments' values, so counts can be grouped."""
    words = command.split()
    shapes: list[tuple[bool, Callable[[], str]]] = [
        (command.startswith("sudo kubectl"), lambda: "kubectl " + words[2]),
        ("kubeadm join" in command, lambda: "kubeadm join"),
        (command.startswith("cd /tmp;./"), lambda: words[1].removeprefix("/tmp;./")),
        (command.startswith("sudo sed"), lambda: "sed haproxy.sh"),
        (
            command.startswith("scp "),
            lambda: " ".join(w for w in words if w == "scp" or w.startswith("-")),
        ),
        ("\n" in command, lambda: "a rendered script"),
        (command.startswith("sudo "), lambda: " ".join(words[:3])),
        (command.startswith("/"), lambda: words[0]),
    ]
    return next((shape() for match, shape in shapes if match), " ".join(words[:2]))


def addresses_of(state: Json, namespace: str) -> list[str]:
    """The public IPs of every VM in ``namespace``'s MCISes (the stand-in's state)."""
    return sorted(
        str(vm["publicIP"])
        for mcis in state["mcis"].get(namespace, [])
        for vm in mcis["vms"]
        if vm.get("publicIP")
    )


# -- the stand-in -------------------------------------------------------------------------------


@dataclass
class StandIn:
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


# -- the bare floor -----------------------------------------------------------------------------


@dataclass
class Bare:
    elapsed: float = 0.0
    mcir: float = 0.0
    clusters: list[float] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    ssh: SshCounts | None = None
    cleanup: float | None = None
    load: str = ""


@dataclass
class BareRun:
    """The floor: the flow's essential Tumblebug calls and SSH commands, nothing else."""

    tb: TumblebugClient
    sizes: LadybugSizes
    files: dict[str, bytes]
    k8s: KubernetesConfig = field(default_factory=KubernetesConfig)
    ssh: SshClient = field(default_factory=lambda: SshClient(MemoryHostKeys()))
    login: tuple[str, str] = ("", "")
    names: rules.McirNames = field(default_factory=lambda: rules.McirNames(CONNECTION, SPEC))
    csp: str = ""
    subnet: str = ""

    @property
    def version(self) -> str:
        return f"{self.k8s.version}-00"

    async def mcir(self) -> None:
        """Connection, region, spec, then the five MCIR, each created once."""
        tb, ns, names = self.tb, BARE_NS, self.names
        config = await tb.get_connection_config(CONNECTION)
        assert config is not None
        self.csp = str(config.get("ProviderName") or "").lower()
        region_data = await tb.get_region(str(config.get("RegionName") or ""))
        assert region_data is not None
        region, _ = rules.region_and_zone(region_data)
        spec = await tb.lookup_spec(CONNECTION, SPEC)
        assert spec is not None
        vnet = await tb.create_resource(
            ns, "vNet", rules.vnet_body(names, self.csp, rules.cidr_block(self.csp))
        )
        self.subnet = rules.subnet_of(vnet, names)
        await tb.create_resource(ns, "securityGroup", rules.security_group_body(names, self.csp))
        key = await tb.create_resource(ns, "sshKey", rules.ssh_key_body(names))
        self.login = (str(key.get("username") or rules.USERNAME), str(key["privateKey"]))
        image = rules.image_id(self.csp, region, CONNECTION)
        assert image is not None
        await tb.register_image(ns, rules.image_body(names, image))
        await tb.create_resource(ns, "spec", rules.spec_body(names))

    async def cluster(self, name: str) -> None:
        suffix = secrets.token_hex(3)[:5]
        groups = [f"c-1-{suffix}", *(f"w-{i}-{suffix}" for i in range(1, self.sizes.workers + 1))]
        vms = [
            rules.vm_request(
                self.names,
                name=group,
                count=1,
                subnet=self.subnet,
                disk_type="default",
                disk_size="default",
                description=name,
            )
            for group in groups
        ]
        body = rules.mcis_body(name, uid=str(uuid.uuid4()), install_mon_agent="no", vms=vms)
        mcis = await self.tb.create_mcis(BARE_NS, body)
        made = rules.vms_of(mcis)
        leader = next(vm for vm in made if rules.subgroup(vm) == groups[0])
        workers = [vm for vm in made if vm is not leader]
        user, key = self.login
        async with contextlib.AsyncExitStack() as stack:
            opened = await asyncio.gather(
                *(
                    stack.enter_async_context(
                        self.ssh.session(str(vm["publicIP"]), username=user, private_key=key)
                    )
                    for vm in made
                )
            )
            sessions: dict[str, SshSession] = {
                str(vm["name"]): session for vm, session in zip(made, opened, strict=True)
            }
            await asyncio.gather(*(self._bootstrap(sessions[vm["name"]], vm) for vm in made))
            lead = sessions[leader["name"]]
            join = await self._init(lead, leader)
            await asyncio.gather(*(self._join(sessions[vm["name"]], join) for vm in workers))
            for vm in made:
                await lead.run(rules.label_command(vm["name"], self._labels(vm, name)))
                if self.k8s.network_cni.value == "kilo":
                    annotations = {
                        "kilo.squat.ai/location": vm["name"],
                        "kilo.squat.ai/persistent-keepalive": "25",
                    }
                    await lead.run(rules.annotate_command(vm["name"], annotations))
            for command in rules.cni_commands(self.k8s.network_cni.value):
                await lead.run(command)

    async def _bootstrap(self, session: SshSession, vm: Json) -> None:
        names = ["bootstrap.sh"]
        if str(vm.get("name", "")).startswith("c-"):
            names += ["haproxy.sh", "k8s-init.sh"]
        await session.upload({f"{rules.REMOTE_DIR}/{n}": self.files[n] for n in names})
        await session.run(
            rules.bootstrap_command(
                version=self.version,
                csp=self.csp,
                hostname=str(vm["name"]),
                public_ip=str(vm["publicIP"]),
                cni=self.k8s.network_cni.value,
                service_type="multi",
            )
        )

    async def _init(self, lead: SshSession, leader: Json) -> rules.Join:
        script = await lead.run(
            rules.haproxy_render([(str(leader["name"]), str(leader["privateIP"]))])
        )
        await lead.run(script)
        output = await lead.run(
            rules.init_command(
                script="k8s-init.sh",
                pod_cidr=self.k8s.pod_cidr,
                service_cidr=self.k8s.service_cidr,
                dns_domain=self.k8s.service_dns_domain,
                public_ip=str(leader["publicIP"]),
                private_ip=str(leader["privateIP"]),
                port=rules.HAPROXY_PORT,
                service_type="multi",
            )
        )
        join = rules.parse_join(output)
        if rules.INIT_SUCCESS not in output or join is None:
            raise RuntimeError(f"bare: kubeadm init on {leader['name']} did not succeed")
        await lead.run(rules.CAT_ADMIN_CONF)
        return join

    async def _join(self, session: SshSession, join: rules.Join) -> None:
        output = await session.run(f"sudo {join.worker}")
        if rules.JOIN_SUCCESS not in output:
            raise RuntimeError(f"bare: join on {session.address} did not succeed")
        await session.run(rules.RESTART_BOOTSTRAP)

    def _labels(self, vm: Json, cluster: str) -> dict[str, str]:
        region, zone = rules.vm_region(vm)
        return {
            rules.LABEL_CSP: self.csp,
            rules.LABEL_REGION: region,
            rules.LABEL_ZONE: zone,
            rules.LABEL_CLUSTER: cluster,
        }

    async def cleanup(self, names: list[str]) -> None:
        async def one(name: str) -> None:
            await self.tb.control_mcis(BARE_NS, name, "terminate")
            await self.tb.delete_mcis(BARE_NS, name)

        await asyncio.gather(*(one(n) for n in names))


async def measure_bare(
    run: BareRun, standin: StandIn, nodes_dir: Path, sizes: LadybugSizes, *, first: bool
) -> Bare:
    """One round of the floor; the first also makes the namespace's MCIR (timed with it)."""
    bare = Bare(load=load_average())
    names = [f"bare{i}" for i in range(sizes.clusters)]
    # new VMs on the same addresses are new machines with new host keys
    run.ssh = SshClient(MemoryHostKeys())
    before = await standin.requests()
    t0 = time.monotonic()
    if first:
        await run.mcir()
        bare.mcir = time.monotonic() - t0

    async def timed(name: str) -> None:
        await run.cluster(name)
        bare.clusters.append(time.monotonic() - t0)

    await asyncio.gather(*(timed(n) for n in names))
    bare.elapsed = time.monotonic() - t0
    bare.requests = await standin.requests() - before
    bare.ssh = SshCounts.read(nodes_dir, addresses_of(await standin.state(), BARE_NS))
    started = time.monotonic()
    await run.cleanup(names)
    bare.cleanup = time.monotonic() - started
    return bare


# -- capibus's side -----------------------------------------------------------------------------


@dataclass
class Moments:
    provisioning: dict[str, float] = field(default_factory=dict)
    provisioned: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def listen(self, key: Key, obj: Json, now: float) -> None:
        status = obj.get("status") or {}
        phase, name = status.get("phase"), key[1]
        if phase == "Provisioning":
            self.provisioning.setdefault(name, now)
        elif phase == PROVISIONED:
            self.provisioned.setdefault(name, now)
        elif phase == FAILED:
            self.failed[name] = f"{status.get('reason')}: {status.get('message')}"


@dataclass
class GetLoop:
    """One client asking for one cluster after another until told to stop."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[int] = field(default_factory=Counter)

    @property
    def sent(self) -> int:
        return len(self.latencies) + sum(self.errors.values())

    async def run(self, client: httpx.AsyncClient, paths: list[str], stop: asyncio.Event) -> None:
        index = 0
        while not stop.is_set():
            path = paths[index % len(paths)]
            index += 1
            started = time.monotonic()
            response = await client.get(path)
            if response.status_code == 200:
                self.latencies.append(time.monotonic() - started)
            else:
                self.errors[response.status_code] += 1


@dataclass
class Cold:
    """The first round, in a Tumblebug namespace without MCIR: not timed against the floor."""

    codes: Counter[int] = field(default_factory=Counter)
    settled: float | None = None
    provisioned: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    deleted: float | None = None


@dataclass
class Outcome:
    sizes: LadybugSizes
    bare: Bare | None = None
    bare_after: Bare | None = None
    cold: Cold = field(default_factory=Cold)
    wanted: set[str] = field(default_factory=set)
    moments: Moments = field(default_factory=Moments)
    t0: float = 0.0
    accepted: float = 0.0
    accepted_codes: Counter[int] = field(default_factory=Counter)
    all_provisioned: float | None = None
    requests: Counter[str] = field(default_factory=Counter)
    settled_requests: Counter[str] = field(default_factory=Counter)
    ssh: SshCounts | None = None
    busy: GetLoop = field(default_factory=GetLoop)
    idle: GetLoop = field(default_factory=GetLoop)
    cpu: str = ""
    deleted: float | None = None
    memory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Running:
    standin: StandIn
    nodes_dir: Path
    services: dict[str, Child]
    api_url: str

    def labels(self) -> dict[int, str]:
        found = labels_for(*self.services.values())
        found[self.standin.child.proc.pid] = "tumblebug (stand-in, its sshds apart)"
        return found


async def start(children: Children, stack: LocalStack, workdir: Path, namespace: str) -> Running:
    workload = await asyncio.to_thread(stack.workload)
    nodes_dir = workdir / "ladybug-nodes"
    url_file = workdir / "tumblebug.url"
    env = {
        **stack.env(),
        "STANDIN_TUMBLEBUG_URL_FILE": str(url_file),
        "STANDIN_TUMBLEBUG_NAMESPACES": f"{TBNS},{BARE_NS}",
        "STANDIN_TUMBLEBUG_ADDRESS_START": ADDRESS_START,
        "STANDIN_TUMBLEBUG_ADDRESS_COUNT": "200",
    }
    args = ["--port", "0", "--nodes-dir", str(nodes_dir), "--workload-kubeconfig", str(workload)]
    tumblebug = start_module(children, "standins.tumblebug", env, "lb-tumblebug", args)
    await wait_for_count(tumblebug, "tumblebug listening on", 1)
    url = tumblebug.log().split("tumblebug listening on ", 1)[1].split()[0]
    standin = StandIn(tumblebug, url, httpx.AsyncClient(base_url=url, timeout=30))
    port = free_ports(1)[0]
    base = stack.env()
    ladybug = {
        "CAPIBUS_LADYBUG__NAMESPACE": namespace,
        "TUMBLEBUG_URL": url,
        "SPIDER_URL": spider_url(url),
    }
    api_env = {
        **base,
        **ladybug,
        "CAPIBUS_LADYBUG__API_HOST": "127.0.0.1",
        "CAPIBUS_LADYBUG__API_PORT": str(port),
        "CAPIBUS_LADYBUG__API_TOKEN": TOKEN,
    }
    watcher_env = {**base, "CAPIBUS_WATCHER__KINDS": json.dumps(["ladybugcluster"])}
    services = {
        "watcher": children.start("watcher", watcher_env, "lb-watcher"),
        "writer": children.start("writer", base, "lb-writer"),
        "provisioner": children.start("ladybug.provisioner", {**base, **ladybug}, "lb-provisioner"),
        "api": children.start("ladybug.api", api_env, "lb-api"),
    }
    api_url = f"http://127.0.0.1:{port}"
    await asyncio.gather(
        wait_for_count(services["watcher"], "listed at", 1),
        wait_for_count(services["writer"], "owns partition", PARTITIONS),
        wait_for_count(services["provisioner"], "owns partition", PARTITIONS),
        _healthy(api_url, services["api"]),
    )
    # A freshly claimed partition is fenced for one lease TTL before its consumers fetch.
    await asyncio.sleep(LEASE_TTL + 0.5)
    return Running(standin, nodes_dir, services, api_url)


async def _healthy(url: str, api: Child) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    async with httpx.AsyncClient(base_url=url, timeout=2) as client:
        while time.monotonic() < deadline:
            if not api.alive():
                raise RuntimeError(f"the Ladybug API exited:\n{api.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/ladybug/healthy")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the Ladybug API did not answer:\n{api.log_tail()}")


def cluster_request(name: str, workers: int) -> Json:
    return {
        "name": name,
        "controlPlane": [{"connection": CONNECTION, "count": 1, "spec": SPEC}],
        "worker": [{"connection": CONNECTION, "count": workers, "spec": SPEC}],
    }


async def measure(
    clients: Clients, stack: LocalStack, children: Children, sizes: LadybugSizes
) -> Section:
    outcome = Outcome(sizes)
    namespace = await new_namespace(clients.kube, "lb")
    running = await start(children, stack, children.log_dir, namespace)
    standin, nodes = running.standin, running.nodes_dir
    try:
        async with TumblebugClient(standin.url, provision_timeout=READY_TIMEOUT) as tb:
            floor = BareRun(tb, sizes, scripts())
            outcome.bare = await measure_bare(floor, standin, nodes, sizes, first=True)
            await _capibus(clients, running, namespace, outcome)
            # the floor again: the machine is shared, and its load moves between rounds
            try:
                outcome.bare_after = await measure_bare(floor, standin, nodes, sizes, first=False)
            except Exception as exc:  # the figures so far still count
                outcome.notes.append(f"the second bare round failed: {type(exc).__name__}: {exc}")
    finally:
        outcome.memory = {
            c.label: vm_hwm(c.proc.pid) for c in running.services.values() if c.alive()
        }
        await running.standin.http.aclose()
    return section(outcome)


async def _capibus(clients: Clients, running: Running, namespace: str, o: Outcome) -> None:
    objects = Observer(clients.kube, namespace, [LADYBUG_CLUSTER], listeners=[o.moments.listen])
    await objects.start()
    try:
        async with httpx.AsyncClient(base_url=running.api_url, headers=AUTH, timeout=60) as api:
            await _cold(api, objects, running.standin, o)
            await _warm(api, objects, running, o)
    finally:
        await objects.stop()


def _names(sizes: LadybugSizes) -> list[str]:
    return [f"c{secrets.token_hex(2)}{i}" for i in range(sizes.clusters)]


async def _post_all(api: httpx.AsyncClient, names: list[str], o: Outcome) -> Counter[int]:
    """Every create at once, asynchronous mode; the answers' status codes."""
    codes: Counter[int] = Counter()

    async def create(name: str) -> None:
        response = await api.post(
            f"/ladybug/ns/{TBNS}/clusters",
            params={"async": "true"},
            json=cluster_request(name, o.sizes.workers),
        )
        codes[response.status_code] += 1
        if response.status_code != 202:
            o.notes.append(f"create {name}: {response.status_code} {response.text[:300]}")

    await asyncio.gather(*(create(n) for n in names))
    return codes


async def _until_settled(objects: Observer, moments: Moments, wanted: set[str]) -> bool:
    def settled() -> bool:
        return wanted <= set(moments.provisioned) | set(moments.failed)

    return await objects.until(settled, READY_TIMEOUT)


async def _cold(api: httpx.AsyncClient, objects: Observer, standin: StandIn, o: Outcome) -> None:
    """The namespace's first clusters, all at once: none of its MCIR exists yet."""
    names = _names(o.sizes)
    wanted = {f"{TBNS}.{n}" for n in names}
    started = time.monotonic()
    o.cold.codes = await _post_all(api, names, o)
    if await _until_settled(objects, o.moments, wanted):
        o.cold.settled = time.monotonic() - started
    o.cold.provisioned = len(wanted & set(o.moments.provisioned))
    o.cold.failed = {n: r for n, r in o.moments.failed.items() if n in wanted}
    o.cold.deleted = await _delete(api, objects, standin, names, o.notes)


async def _warm(api: httpx.AsyncClient, objects: Observer, running: Running, o: Outcome) -> None:
    """The measured round: the namespace's MCIR exist (made by the cold round)."""
    standin = running.standin
    names = _names(o.sizes)
    o.wanted = {f"{TBNS}.{n}" for n in names}
    paths = [f"/ladybug/ns/{TBNS}/clusters/{n}" for n in names]
    before, cpu_before = await standin.requests(), CpuSnapshot.take(running.labels())
    stop = asyncio.Event()
    o.t0 = time.monotonic()
    o.accepted_codes = await _post_all(api, names, o)
    o.accepted = time.monotonic() - o.t0
    # from the last 202 on: a GET before its create was answered would be a 404
    async with httpx.AsyncClient(base_url=running.api_url, headers=AUTH, timeout=60) as getter:
        loop = asyncio.create_task(o.busy.run(getter, paths, stop))
        finished = await _until_settled(objects, o.moments, o.wanted)
        stop.set()
        await loop
    o.cpu = CpuSnapshot.take(running.labels()).cpu_line(cpu_before)
    o.notes.append(f"load average at all settled: {load_average()}")
    o.requests = await standin.requests() - before
    failed = {n: r for n, r in o.moments.failed.items() if n in o.wanted}
    if not finished or failed:
        o.notes.append(f"measured round, not all Provisioned: failed {failed}")
        return
    o.all_provisioned = max(o.moments.provisioned[n] for n in o.wanted) - o.t0
    o.ssh = SshCounts.read(running.nodes_dir, addresses_of(await standin.state(), TBNS))
    await asyncio.sleep(SETTLE)
    o.settled_requests = await standin.requests() - before
    idle_stop = asyncio.Event()
    idle = asyncio.create_task(o.idle.run(api, paths, idle_stop))
    await asyncio.sleep(IDLE_LOOP)
    idle_stop.set()
    await idle
    o.deleted = await _delete(api, objects, standin, names, o.notes)


async def _delete(
    api: httpx.AsyncClient, objects: Observer, standin: StandIn, names: list[str], notes: list[str]
) -> float | None:
    """Every cluster of ``names`` deleted at once: seconds until they and their MCIS are gone."""
    started = time.monotonic()
    answers = await asyncio.gather(
        *(api.delete(f"/ladybug/ns/{TBNS}/clusters/{n}", params={"async": "true"}) for n in names)
    )
    codes = dict(Counter(a.status_code for a in answers))
    notes.append(f"deletion of {', '.join(names)}: answers {codes}")

    def gone() -> bool:
        return not any((LADYBUG_CLUSTER.token, f"{TBNS}.{n}") in objects.live for n in names)

    if not await objects.until(gone, DELETE_TIMEOUT):
        notes.append(f"not every LadybugCluster gone after {DELETE_TIMEOUT:.0f} s")
        return None
    while time.monotonic() - started < DELETE_TIMEOUT:
        if not (await standin.state())["mcis"].get(TBNS):
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    notes.append(f"MCIS left in the stand-in after {DELETE_TIMEOUT:.0f} s")
    return None


# -- the figures --------------------------------------------------------------------------------


def section(o: Outcome) -> Section:
    s = o.sizes
    title = f"CB-Ladybug, {s.clusters} clusters of 1 + {s.workers} nodes at once ({s.nodes} sshd)"
    sec = Section(key="l", title=title, method=METHOD)
    sec.figures += [
        _cold_figure(o),
        _all_provisioned(o),
        _ssh(o),
        _tumblebug(o),
        _latency(o),
        _deletion(o),
    ]
    sec.details += [*_details(o), *o.notes]
    return sec


def _cold_figure(o: Outcome) -> Figure:
    s, c = o.sizes, o.cold
    title = (
        f"{s.clusters} clusters (1 + {s.workers}) at once in a Tumblebug namespace without "
        "MCIR yet (its first clusters) → all Provisioned"
    )
    value = f"{c.provisioned}/{s.clusters} Provisioned"
    if c.settled is not None:
        value += f", all settled after {c.settled:.1f} s"
    if c.failed:
        reasons = Counter(r.split(" (cause=")[0] for r in c.failed.values())
        value += f"; {len(c.failed)} Failed: " + ", ".join(f"{r} x{n}" for r, n in reasons.items())
    verdict: Verdict = "pass" if c.provisioned == s.clusters else "MISSED"
    return Figure("l0", title, value, "all Provisioned", verdict)


def _all_provisioned(o: Outcome) -> Figure:
    s = o.sizes
    title = (
        f"{s.clusters} clusters (1 + {s.workers}) created at once through the REST API "
        "(async, 202), the namespace's MCIR present → all Provisioned"
    )
    if o.all_provisioned is None:
        got = len(o.moments.provisioned)
        return Figure("l1", title, f"{got}/{s.clusters} Provisioned", verdict="INCOMPLETE")
    value = f"all Provisioned after {o.all_provisioned:.1f} s"
    floors = [b.elapsed for b in (o.bare, o.bare_after) if b is not None and b.elapsed]
    if floors:
        rounds = " before, ".join(f"{f:.1f} s" for f in floors)
        value += (
            f"; bare floor (a script over shared.tumblebug + shared.ssh): {rounds}"
            f"{' after' if len(floors) > 1 else ''}; ratio to the faster "
            f"{o.all_provisioned / min(floors):.2f}"
        )
    return Figure("l1", title, value, "— (ratio: lower is better)")


def _ssh(o: Outcome) -> Figure:
    title = "SSH connections and commands per node, creation → all Provisioned (made/minimum)"
    if o.ssh is None or o.bare is None or o.bare.ssh is None:
        return Figure("l2a", title, "not measured", verdict="INCOMPLETE")
    ours, floor = o.ssh, o.bare.ssh
    value = (
        f"connections {ours.per_node(ours.connections)} / {floor.per_node(floor.connections)}; "
        f"commands {ours.per_node(ours.commands)} / {floor.per_node(floor.commands)}"
    )
    over = sum(ours.connections) > sum(floor.connections) or sum(ours.commands) > sum(
        floor.commands
    )
    verdict: Verdict = "MISSED" if over else "pass"
    return Figure("l2a", title, value, "the bare script's count", verdict)


def _tumblebug(o: Outcome) -> Figure:
    title = "Tumblebug requests per node, creation → all Provisioned (route made/minimum)"
    if o.all_provisioned is None:
        return Figure("l2b", title, "not measured", verdict="INCOMPLETE")
    need, found, n = minimum(o.sizes, o.busy.sent), Counter(o.requests), o.sizes.nodes
    made, least = sum(found.values()), sum(need.values())
    value = f"{made / n:.2f} (minimum {least / n:.2f}): {by_route(found, need)}"
    verdict: Verdict = "MISSED" if any(found[r] > need[r] for r in found) else "pass"
    return Figure("l2b", title, value, "the minimum", verdict)


def by_route(found: Counter[str], need: Counter[str]) -> str:
    routes = sorted(set(found) | set(need), key=lambda r: (-found[r], r))
    return ", ".join(f"{r} {found[r]}/{need[r]}" for r in routes if found[r] or need[r])


def _latency(o: Outcome) -> Figure:
    title = "REST GET /ladybug/ns/{ns}/clusters/{name}, one client looping while provisioning runs"
    samples = o.busy.latencies
    if not samples:
        return Figure("l3", title, "no samples", verdict="INCOMPLETE")
    value = (
        f"p50 {percentile(samples, 50) * 1000:.0f} ms / p99 {percentile(samples, 99) * 1000:.0f} "
        f"ms (n={len(samples)}"
    )
    if o.busy.errors:
        value += f", non-200: {dict(o.busy.errors)}"
    value += ")"
    if o.idle.latencies:
        idle = o.idle.latencies
        value += (
            f"; idle reference p50 {percentile(idle, 50) * 1000:.0f} ms / p99 "
            f"{percentile(idle, 99) * 1000:.0f} ms (n={len(idle)})"
        )
    return Figure("l3", title, value)


def _deletion(o: Outcome) -> Figure:
    title = f"{o.sizes.clusters} clusters deleted at once (async) → all gone, no MCIS left"
    if o.deleted is None:
        return Figure("l4", title, "not measured or not clean", verdict="INCOMPLETE")
    value = f"{o.deleted:.1f} s"
    if o.bare is not None and o.bare.cleanup is not None:
        value += f"; bare terminate + delete: {o.bare.cleanup:.1f} s"
    return Figure("l4", title, value)


def _after(moments: dict[str, float], o: Outcome) -> str:
    return spread([v - o.t0 for k, v in moments.items() if k in o.wanted], "s", 1, 1)


def _details(o: Outcome) -> list[str]:
    lines = [
        f"the {o.sizes.clusters} POSTs answered {dict(o.accepted_codes)} within "
        f"{o.accepted:.2f} s of t0",
        f"after t0, Provisioning first seen: {_after(o.moments.provisioning, o)}",
        f"after t0, Provisioned first seen: {_after(o.moments.provisioned, o)}",
    ]
    for label, round_ in (("before", o.bare), ("after", o.bare_after)):
        if round_ is not None:
            lines.append(
                f"bare floor {label} the measured round: {round_.elapsed:.1f} s, each cluster "
                f"done after {spread(round_.clusters, 's', 1, 1)} from its start; load average "
                f"at its start {round_.load}"
            )
    if (b := o.bare) is not None:
        lines += [
            f"bare floor: MCIR (connection, region, spec, five creates) {b.mcir:.2f} s",
            f"bare floor, Tumblebug requests by route: {_rows(b.requests)}",
        ]
        if b.ssh is not None:
            lines.append(f"bare floor, SSH commands by program: {_rows(b.ssh.programs)}")
    if o.ssh is not None:
        lines.append(
            f"capibus, SSH commands by program (failed, i.e. non-zero exit: "
            f"{o.ssh.failed_commands}): {_rows(o.ssh.programs)}"
        )
    if o.requests:
        lines.append(
            f"capibus, Tumblebug requests by route as counted (the {o.busy.sent} GETs of l3 "
            f"included; the API remembers a namespace it saw for a few seconds): "
            f"{_rows(o.requests)}"
        )
    extra = o.settled_requests - o.requests
    if o.settled_requests:
        lines.append(
            f"Tumblebug requests in the {SETTLE:g} s after all were Provisioned (the idle loop "
            f"not started yet): {_rows(extra)}"
        )
    if o.cpu:
        lines.append(
            f't0 → all Provisioned: {o.cpu} ("other processes" holds the nodes\' sshds and '
            "emulators, the stand-in's children and theirs, besides other tenants)"
        )
    sizes = ", ".join(f"{k.removeprefix('lb-')} {mib(v)}" for k, v in o.memory.items())
    if sizes:
        lines.append(f"peak memory (VmHWM): {sizes}")
    return lines


def _rows(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.most_common()) or "none"


METHOD = (
    "Services: watcher (LadybugCluster), writer, `python -m services.ladybug.provisioner` and "
    "`python -m services.ladybug.api`, a deployment's defaults; the CB-Tumblebug stand-in as a "
    "process, each VM a real sshd on a loopback address with the node emulator as "
    "ForceCommand, joined nodes registered in a second kube-apiserver. l0: the same creates "
    "first in the namespace without MCIR (its first clusters), then all deleted; the measured "
    "round (l1-l4) follows with new clusters, the MCIR present. t0 = the first POST "
    "(`?async=true`); every moment is a watch event reaching the benchmark. l1: the last "
    "LadybugCluster first seen Provisioned. Bare floor, run first on the same stand-in (its "
    "own namespace): the flow's essential Tumblebug calls and SSH commands through "
    "`shared.tumblebug` and `shared.ssh` with the provisioner's builders, MCIR created once, "
    "then every cluster at once, one SSH connection per node; run before the measured round and "
    "again after it (MCIR then present); ratio = capibus / the faster bare round. l2a: "
    "per node, sshd's `Accepted publickey` lines (connections) and the emulator's command log "
    "(commands, scp included) against the bare script's. l2b: the stand-in's request counts, "
    "t0 → all Provisioned, the l3 GETs' included, against upstream's flow "
    "with nothing asked twice (per cluster: ns, MCIS get + create, connection, region, spec "
    "lookup, five MCIR gets; one ns per l3 GET). l3: one client, one GET at a time, "
    "round the clusters, the last 202 → all Provisioned; reference: the same loop for "
    f"{IDLE_LOOP:g} s afterwards. l4: DELETE `?async=true` for all → every LadybugCluster "
    "gone and no MCIS left."
)
