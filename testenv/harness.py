"""A real control plane and message bus on loopback: etcd, kube-apiserver,
kube-controller-manager, nats-server (JetStream) and redis-server.

Used by the pytest ``stack`` fixture and by ``python -m testenv up``. Nothing is faked and
nothing runs in Docker: the programs are the pinned binaries ``build.sh`` produces, plus the
distribution's ``redis-server``.

Design decisions:

* **Process groups.** Every program starts in its own session (``start_new_session=True``), so
  a Ctrl-C in the terminal reaches only the harness, which then tears the stack down in a
  deliberate order (clients before servers, etcd last) instead of everything dying at once,
  and ``killpg`` reaches anything a program may have forked. Teardown also runs from
  ``atexit``, so a crashed test session leaves no orphans behind.
* **Token authentication.** The API server gets a static token file: a random admin token in
  ``system:masters`` plus any ``extra_tokens``. A bearer token works the same for httpx, for
  child processes reading the kubeconfig and for least-privilege RBAC users, with no client
  certificates or CSR signing to manage. The serving certificate is the one kube-apiserver
  generates itself in ``--cert-dir``; its ``apiserver.crt`` holds the serving certificate
  followed by its CA, so the file doubles as the clients' CA bundle.
* **Free ports, retried.** A port is found by binding port 0 and closing the socket, then
  handing the number to the program. Between close and the program's own bind, someone else
  may take it, so a program that exits saying "address already in use" is started again on
  new ports. Restarts keep the old ports, because clients already hold the URLs.
* **Readiness, not sleeps.** Each program counts as started only when it answers the way
  clients will use it (etcd ``/health``, ``/readyz`` with the admin token, JetStream health,
  a Redis ``PING``). A failure or timeout raises ``StackError`` carrying the log tail.
* **Least privilege on the bus.** nats-server and redis-server run with the authorization
  every service declares (``services/<svc>/access.py``, ``shared.access``), rendered here as
  in the chart: a user per service with a random password per start, written under
  ``credentials/<user>/`` (``nats-password``, ``redis-password``). ``env()`` points services
  there (``CAPIBUS_CREDENTIALS__DIR``), so each logs in as itself; ``endpoints`` carry the
  operator user (``admin``) in their URLs, so tests, the CLI and the bench keep full access.
  Rendering allows ``ACCESS_PARTITIONS`` partitions, more than any test configures.
* **TLS on demand.** ``LocalStack(tls=True)`` serves NATS and Redis over TLS only, with a CA
  and a certificate for ``127.0.0.1`` made at start (``testenv.certs``): URLs are ``tls://`` and
  ``rediss://``, ``endpoints.bus_tls()`` is the clients' context and ``env()`` names the CA for
  the services (``CAPIBUS_TLS__*``). It is not the default: the tests' own clients, the bench
  and the demo keep plaintext on loopback, and the TLS path is proven by the tests that ask
  for it (``tests/integration/test_bus_tls.py``) and by the soak.
* **External stack.** When ``KUBECONFIG``, ``NATS_URL`` and ``REDIS_URL`` are all set, nothing
  is started and the endpoints come from them, so tests can run against ``testenv up`` or a
  real cluster; ``restart`` and friends then refuse, since there is no process to control.
* **A workload cluster on demand.** ``workload()`` starts a second kube-apiserver, the API of
  a cluster that Cluster API "provisioned", only when a test asks for it (the others never pay
  for it). It shares etcd under its own key prefix (``--etcd-prefix=/workload``): two API
  servers on one etcd see nothing of each other's objects, and one etcd less to manage. It has
  its own certificates and admin token, and its kubeconfig is self-contained (CA data and
  token inline) because it is meant to be stored in a ``<cluster>-kubeconfig`` Secret and read
  by another process. On an external stack there is no etcd to share: the management API
  server doubles as the workload one (as ``STANDIN_CAPI_KUBECONFIG`` defaults to), written
  self-contained the same way; tests that need the two apart check ``managed``.
* **A JetStream cluster on demand.** ``LocalStack(nats_cluster=3)`` runs three nats-server
  processes clustered over routes on loopback (``nats-0``..``nats-2``, each with its own
  ``server_name`` and store directory) instead of the one ``nats``. They start together, since
  none is healthy before a meta leader is elected, which needs a quorum; the cluster, and
  each node started again, counts as ready once the node's full ``/healthz`` passes (it has
  caught up with its streams) and the meta leader sees every node current (until then a
  stream with a replica per node cannot be placed). Clients get every
  node's URL, comma-separated, and ``env()`` sets ``CAPIBUS_RETENTION__REPLICAS`` so the
  services declare their streams with a replica on every node (up to three).
  ``stream_leader`` names the node leading a stream, to kill exactly that one. The default
  (``nats_cluster=1``) is the single ``nats`` as before.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import nats
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from shared import access
from shared.access import ADMIN, with_login
from testenv import certs

BUILD_SCRIPT = Path(__file__).with_name("build.sh")
LOOPBACK = "127.0.0.1"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.1
PORT_ATTEMPTS = 5
KCM_SETTLE = 1.0
# kube-apiserver writes its self-signed serving certificate here, CA appended (under its home).
API_CA_FILE = Path("certs") / "apiserver.crt"
LOG_TAIL_LINES = 40
ENV_VARS = ("KUBECONFIG", "NATS_URL", "REDIS_URL")
GO_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
    "nats-server",
    "helm",
)

ETCD = "etcd"
APISERVER = "kube-apiserver"
WORKLOAD_APISERVER = "kube-apiserver-workload"
WORKLOAD_ETCD_PREFIX = "/workload"
CONTROLLER_MANAGER = "kube-controller-manager"
NATS = "nats"
#: A clustered node's component (and JetStream ``server_name``): ``nats-0``, ``nats-1``, ...
NATS_NODE = "nats-{}"
NATS_CLUSTER_NAME = "capibus"
#: JetStream keeps at most this many replicas of a stream, however many nodes there are.
MAX_STREAM_REPLICAS = 3
REDIS = "redis"
#: the partition count the stack's NATS authorization allows durables for
ACCESS_PARTITIONS = 32
# In start order; WORKLOAD_APISERVER joins them only when asked for (``workload()``).
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, NATS, REDIS)


class StackError(RuntimeError):
    """A program of the local stack could not be built, started, reached or controlled."""


class _PortTakenError(Exception):
    """The program lost the race for its port; start it again on fresh ports."""


@dataclass(frozen=True)
class Endpoints:
    """How clients reach the stack."""

    kubeconfig: Path
    api_url: str
    token: str
    ca_file: Path
    nats_url: str
    redis_url: str
    #: the CA NATS and Redis present certificates of, when they serve TLS (``LocalStack(tls=True)``)
    bus_ca_file: Path | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the API server's CA (httpx deprecates ``verify=<path>``)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def bus_tls(self) -> ssl.SSLContext | None:
        """TLS context for NATS and Redis: None when they speak plaintext."""
        if self.bus_ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.bus_ca_file))


def ensure_binaries() -> Path:
    """Build or reuse the pinned binaries and return their directory.

    Progress from ``build.sh`` goes straight to our stderr: a cold build takes many minutes
    and should visibly be alive. ``redis-server`` is looked up on PATH when the stack starts;
    ``/usr/sbin/sshd`` (Debian's openssh-server, also installed by ``build.sh``) is run by
    ``standins.sshnodes``, never by the stack.
    """
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise StackError(f"{BUILD_SCRIPT} failed with status {result.returncode}")
    bin_dir = Path(lines[-1])
    missing = [name for name in GO_BINARIES if not (bin_dir / name).is_file()]
    if missing:
        raise StackError(f"{BUILD_SCRIPT} left no {', '.join(missing)} in {bin_dir}")
    return bin_dir


def kubectl_line(bin_dir: Path, kubeconfig: Path, *args: str) -> str:
    """A shell line running the pinned kubectl against the stack of ``kubeconfig``.

    The full path: kubectl is supported within one minor version of the API server, and one
    found on PATH, if any, may be further off.
    """
    kubectl = shlex.quote(str(bin_dir / "kubectl"))
    return f"export KUBECONFIG={shlex.quote(str(kubeconfig))}; {kubectl} {shlex.join(args)}"


def external_stack_configured() -> bool:
    """True when the environment names a running stack (all of ``ENV_VARS`` set)."""
    return all(os.environ.get(name) for name in ENV_VARS)


def write_kubeconfig(
    path: Path, server: str, ca_file: Path, token: str, *, inline: bool = False, name: str = ""
) -> None:
    """Write a single-context kubeconfig authenticating with a bearer token.

    ``inline``: the CA goes in as ``certificate-authority-data``, so the text alone reaches
    the server (as a CAPI ``<cluster>-kubeconfig`` Secret must).
    """
    name = name or "capibus"
    cluster: dict[str, str] = {"server": server}
    if inline:
        cluster["certificate-authority-data"] = base64.b64encode(ca_file.read_bytes()).decode()
    else:
        cluster["certificate-authority"] = str(ca_file)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)  # it holds a cluster-admin token


#: the kernel's ephemeral ports (``net.ipv4.ip_local_port_range``), Linux's default if unread
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10000


def free_ports(count: int) -> list[int]:
    """Ports free right now for a program to listen on; all are held until the end so the
    numbers differ.

    They come from below the kernel's ephemeral range. A port the kernel picked (``bind`` to
    port 0) is an ephemeral one, which it may hand to any outgoing connection in the moment
    before the program meant to listen on it starts: a service whose metrics port a client
    connection took exited with "address already in use" (the outage test). Below the range
    nothing takes a port unasked."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        first, last = LISTEN_PORTS_FROM, _ephemeral_start() - 1
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            port = first + secrets.randbelow(last - first + 1) if last > first else 0
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port() -> int:
    return free_ports(1)[0]


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass
class _Component:
    """One program: how to run it, how to tell it is ready, and its current process."""

    name: str
    home: Path
    port_names: tuple[str, ...]
    command: Callable[[_Component], list[str]]
    probe: Callable[[_Component], bool]
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0
    started_at: float = 0.0

    def url(self, port_name: str, scheme: str = "http") -> str:
        return f"{scheme}://{LOOPBACK}:{self.ports[port_name]}"


class LocalStack:
    """Start, control and stop the local stack; a sync context manager.

    ``extra_tokens`` maps a bearer token to ``(user name, groups)`` for additional API users
    (e.g. least-privilege service identities bound by RBAC in a test). When
    ``use_env_stack`` is true and ``KUBECONFIG``, ``NATS_URL`` and ``REDIS_URL`` are all set,
    no program is started and the endpoints come from those variables. ``apiserver_args`` are
    appended to kube-apiserver's command line. ``nats_cluster`` above 1 runs that many
    clustered nats-servers instead of one (the module docstring).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        etcd_compaction_interval: str = "5m",
        extra_tokens: Mapping[str, tuple[str, list[str]]] | None = None,
        bin_dir: Path | None = None,
        use_env_stack: bool = True,
        apiserver_args: Sequence[str] = (),
        nats_cluster: int = 1,
        tls: bool = False,
    ) -> None:
        if nats_cluster < 1:
            raise StackError(f"nats_cluster must be at least 1, not {nats_cluster}")
        self.workdir = Path(workdir).resolve()
        self.nats_cluster = nats_cluster
        self.tls = tls
        self.apiserver_args = list(apiserver_args)
        self.etcd_compaction_interval = etcd_compaction_interval
        self.extra_tokens = dict(extra_tokens or {})
        self._bin_dir = bin_dir
        self._use_env_stack = use_env_stack
        self._components: dict[str, _Component] = {}
        self._endpoints: Endpoints | None = None
        self._admin_token = secrets.token_urlsafe(32)
        self._workload_token = secrets.token_urlsafe(32)
        self._workload_kubeconfig: Path | None = None
        self._passwords: dict[str, str] = {}
        self._certificates: certs.TlsFiles | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every program in dependency order and wait until each is ready."""
        if self._endpoints is not None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._use_env_stack and external_stack_configured():
            self._endpoints = _endpoints_from_env(self.workdir)
            return
        atexit.register(self.stop)
        try:
            self._start_managed()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop all programs, newest first; safe to call any number of times."""
        for component in reversed(list(self._components.values())):
            _terminate(component, graceful=True)
        atexit.unregister(self.stop)
        self._components.clear()
        self._endpoints = None
        self._workload_kubeconfig = None

    @property
    def managed(self) -> bool:
        """True when this harness started the programs (and so can restart them)."""
        return bool(self._components)

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise StackError("the stack is not started")
        return self._endpoints

    @property
    def credentials_dir(self) -> Path:
        """``<user>/nats-password`` and ``<user>/redis-password`` of every user."""
        return self.workdir / "credentials"

    def password(self, user: str) -> str:
        """``user``'s password on this stack's NATS and Redis (``shared.access`` users)."""
        return self._passwords[user]

    def env(self) -> dict[str, str]:
        """Environment variables that point a child process at this stack; a service finds
        its own credentials under ``credentials_dir``."""
        ep = self.endpoints
        env = {
            "KUBECONFIG": str(ep.kubeconfig),
            "NATS_URL": ep.nats_url,
            "REDIS_URL": ep.redis_url,
        }
        if self._passwords:
            env["CAPIBUS_CREDENTIALS__DIR"] = str(self.credentials_dir)
        if ep.bus_ca_file is not None:
            env["CAPIBUS_TLS__NATS_CA_FILE"] = str(ep.bus_ca_file)
            env["CAPIBUS_TLS__REDIS_CA_FILE"] = str(ep.bus_ca_file)
        if self.stream_replicas > 1:
            env["CAPIBUS_RETENTION__REPLICAS"] = str(self.stream_replicas)
        return env

    @property
    def stream_replicas(self) -> int:
        """How many replicas a stream should have on this stack's JetStream."""
        return min(self.nats_cluster, MAX_STREAM_REPLICAS)

    @property
    def nats_nodes(self) -> list[str]:
        """Component names of the nats-servers: ``[NATS]``, or one per clustered node."""
        if self.nats_cluster == 1:
            return [NATS]
        return [NATS_NODE.format(index) for index in range(self.nats_cluster)]

    async def stream_leader(self, stream: str) -> str:
        """The component name of the node leading ``stream`` (JetStream's stream info).

        Asked through ``$JS.API.STREAM.INFO.<stream>``; the answer names the leader by its
        ``server_name``, which is the component's name. A single node leads everything.
        """
        if self.nats_cluster == 1:
            return NATS
        ep = self.endpoints
        nc = await nats.connect(ep.nats_url.split(","), max_reconnect_attempts=2, tls=ep.bus_tls())
        try:
            info = await nc.jetstream(timeout=5.0).stream_info(stream)
        finally:
            await nc.close()
        leader = info.cluster.leader if info.cluster else None
        if leader not in self.nats_nodes:
            raise StackError(f"stream {stream} has no leader among {self.nats_nodes}: {leader!r}")
        return str(leader)

    def nats_monitor_url(self, node: str = NATS) -> str:
        """The HTTP monitoring endpoint (``/connz``, ``/jsz``, ...) of one nats-server."""
        return self._component(node).url("monitor")

    def workload(self) -> Path:
        """The admin kubeconfig of the workload API server, started on the first call.

        The file is self-contained (CA data and token inline), so its text can go into a
        Secret. Starting takes seconds and blocks: call it before starting asynchronous work.
        The server stops with the stack; ``restart``/``stop_component`` take its name,
        ``WORKLOAD_APISERVER``. On an external stack it is the management API server's (see
        the module docstring).
        """
        if self._workload_kubeconfig is not None:
            return self._workload_kubeconfig
        ep = self.endpoints
        path = self.workdir / "workload-kubeconfig"
        if not self.managed:
            write_kubeconfig(path, ep.api_url, ep.ca_file, ep.token, inline=True, name="workload")
        else:
            component = self._apiserver(
                self._tool("kube-apiserver"),
                name=WORKLOAD_APISERVER,
                token=self._workload_token,
                extra_tokens={},
                args=[f"--etcd-prefix={WORKLOAD_ETCD_PREFIX}"],
            )
            self._components[component.name] = component
            self._launch(component, keep_ports=False)
            server, ca_file = component.url("secure", "https"), component.home / API_CA_FILE
            write_kubeconfig(
                path, server, ca_file, self._workload_token, inline=True, name="workload"
            )
        self._workload_kubeconfig = path
        return path

    def log_path(self, name: str) -> Path:
        """Where the program ``name`` writes its stdout and stderr."""
        return self.workdir / f"{name}.log"

    # -- controlling one program ----------------------------------------------------------

    def stop_component(self, name: str, *, graceful: bool = False) -> None:
        """Stop one program (SIGKILL, or SIGTERM when ``graceful``) and leave it down."""
        _terminate(self._component(name), graceful=graceful)

    def start_component(self, name: str) -> None:
        """Start a stopped program again on its old ports and data, and wait until ready."""
        component = self._component(name)
        if component.proc is not None and component.proc.poll() is None:
            raise StackError(f"{name} is already running")
        self._launch(component, keep_ports=True)
        if self.nats_cluster > 1 and name in self.nats_nodes:
            self._await_nats_quorum()

    def restart(self, name: str, *, graceful: bool = False) -> None:
        """Stop and start one program; tested for ``nats`` (JetStream data kept) and ``redis``."""
        self.stop_component(name, graceful=graceful)
        self.start_component(name)

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision now, and return that revision.

        What ``--etcd-compaction-interval`` makes the API server do periodically, on demand: a
        watch resuming from an older resourceVersion then gets 410 Gone (for kinds served from
        etcd rather than the watch cache). Through etcd's JSON gateway (``/v3/kv/...``).
        """
        base = self._component(ETCD).url("client")
        with httpx.Client(timeout=10.0) as client:
            key = base64.b64encode(b"/").decode()
            header = client.post(f"{base}/v3/kv/range", json={"key": key}).json()["header"]
            revision = int(header["revision"])
            body = {"revision": revision, "physical": True}
            client.post(f"{base}/v3/kv/compaction", json=body).raise_for_status()
        return revision

    def _component(self, name: str) -> _Component:
        if not self._components:
            raise StackError(
                "this stack was not started by the harness (external endpoints from "
                f"{', '.join(ENV_VARS)}, or not started), so it cannot control {name!r}"
            )
        if name not in self._components:
            raise StackError(f"unknown component {name!r}; known: {', '.join(self._components)}")
        return self._components[name]

    # -- starting -------------------------------------------------------------------------

    def _tool(self, name: str) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries()
        return self._bin_dir / name

    def _start_managed(self) -> None:
        bin_dir = self._tool("etcd").parent
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise StackError("redis-server is not on PATH; run: bash testenv/build.sh redis")
        self._write_credentials()
        programs: list[tuple[Callable[[Path], _Component], Path]] = [
            (self._etcd, bin_dir / "etcd"),
            (self._apiserver, bin_dir / "kube-apiserver"),
            (self._controller_manager, bin_dir / "kube-controller-manager"),
            (self._nats, bin_dir / "nats-server"),
            (self._redis, Path(redis_server)),
        ]
        for make, binary in programs:
            if make == self._nats and self.nats_cluster > 1:
                self._start_nats_cluster(binary)
                continue
            component = make(binary)
            self._components[component.name] = component
            self._launch(component, keep_ports=False)
            if component.name == APISERVER:
                self._write_admin_kubeconfig()
        self._endpoints = self._managed_endpoints()

    def _start_nats_cluster(self, binary: Path) -> None:
        """Every node at once (none is healthy alone), on ports all of them know beforehand."""
        nodes = [self._nats_node(binary, name) for name in self.nats_nodes]
        self._components.update((node.name, node) for node in nodes)
        for _ in range(PORT_ATTEMPTS):
            ports = iter(free_ports(sum(len(node.port_names) for node in nodes)))
            for node in nodes:
                node.ports = {port_name: next(ports) for port_name in node.port_names}
            for node in nodes:
                _spawn(node, self.log_path(node.name))
            try:
                for node in nodes:
                    _await_ready(node, self.log_path(node.name))
            except _PortTakenError:
                for node in nodes:
                    _terminate(node, graceful=False)
                time.sleep(POLL_INTERVAL)
                continue
            self._await_nats_quorum()
            return
        raise StackError(f"nats cluster: ports still taken after {PORT_ATTEMPTS} attempts")

    def _await_nats_quorum(self) -> None:
        """Until the JetStream meta leader sees every other node current: before that, a
        stream with a replica per node cannot be placed ("no suitable peers for placement")."""
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if any(self._leads_every_node(name) for name in self.nats_nodes):
                return
            time.sleep(POLL_INTERVAL)
        raise StackError("nats cluster: no meta leader sees every node current")

    def _leads_every_node(self, name: str) -> bool:
        node = self._components[name]
        if node.proc is None or node.proc.poll() is not None:
            return False
        try:
            meta = _http_get(node.url("monitor") + "/jsz").json().get("meta_cluster") or {}
        except (httpx.HTTPError, OSError, ValueError):
            return False
        peers = meta.get("replicas") or []
        return (
            meta.get("leader") == name
            and len(peers) == self.nats_cluster - 1
            and all(peer.get("current") and not peer.get("offline") for peer in peers)
        )

    def _launch(self, component: _Component, *, keep_ports: bool) -> None:
        for _ in range(PORT_ATTEMPTS):
            if not keep_ports:
                ports = free_ports(len(component.port_names))
                component.ports = dict(zip(component.port_names, ports, strict=True))
            _spawn(component, self.log_path(component.name))
            try:
                _await_ready(component, self.log_path(component.name))
            except _PortTakenError:
                _terminate(component, graceful=False)
                time.sleep(POLL_INTERVAL)
                continue
            return
        raise StackError(f"{component.name}: port still taken after {PORT_ATTEMPTS} attempts")

    def _home(self, name: str) -> Path:
        # A fresh directory per start, so a reused workdir never resumes stale etcd data.
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))

    def _managed_endpoints(self) -> Endpoints:
        api = self._components[APISERVER]
        admin = (ADMIN, self._passwords[ADMIN])
        nats_scheme, redis_scheme = ("tls", "rediss") if self.tls else ("nats", "redis")
        nats_urls = [
            with_login(self._components[name].url("client", nats_scheme), admin)
            for name in self.nats_nodes
        ]
        redis_url = self._components[REDIS].url("client", redis_scheme) + "/0"
        return Endpoints(
            kubeconfig=self.workdir / "kubeconfig",
            api_url=api.url("secure", "https"),
            token=self._admin_token,
            ca_file=api.home / API_CA_FILE,
            nats_url=",".join(nats_urls),
            redis_url=with_login(redis_url, admin),
            bus_ca_file=self._tls_files.ca if self.tls else None,
        )

    def _write_credentials(self) -> None:
        """A password per user, in files as a mounted Secret has them, and the servers'
        authorization rendered from every service's declared access."""
        from services.__main__ import accesses  # noqa: PLC0415 (imports every service)

        declared = accesses()
        self._passwords = {user: secrets.token_urlsafe(24) for user in access.users(declared)}
        for user, password in self._passwords.items():
            home = self.credentials_dir / user
            home.mkdir(parents=True, exist_ok=True)
            for system in ("nats", "redis"):
                (home / f"{system}-password").write_text(password)
        users = access.nats_users(declared, ACCESS_PARTITIONS, self._passwords)
        self._nats_config.write_text(self._nats_tls_block() + access.render_nats(users))
        self._redis_acl.write_text(access.redis_aclfile(declared, self._passwords))

    @property
    def _tls_files(self) -> certs.TlsFiles:
        """The CA and the certificate NATS and Redis serve, made on first use."""
        if self._certificates is None:
            self._certificates = certs.issue(self.workdir / "tls", hosts=(LOOPBACK,))
        return self._certificates

    def _nats_tls_block(self) -> str:
        """Clients must speak TLS (the routes between clustered nodes stay on loopback)."""
        if not self.tls:
            return ""
        files = self._tls_files
        return f'tls {{\n  cert_file: "{files.cert}"\n  key_file: "{files.key}"\n}}\n'

    @property
    def _nats_config(self) -> Path:
        return self.workdir / "nats-authorization.conf"

    @property
    def _redis_acl(self) -> Path:
        return self.workdir / "redis-users.acl"

    def _write_admin_kubeconfig(self) -> None:
        api = self._components[APISERVER]
        ca_file = api.home / API_CA_FILE
        write_kubeconfig(
            self.workdir / "kubeconfig", api.url("secure", "https"), ca_file, self._admin_token
        )

    # -- the programs ---------------------------------------------------------------------

    def _etcd(self, binary: Path) -> _Component:
        def command(c: _Component) -> list[str]:
            client, peer = c.url("client"), c.url("peer")
            return [
                str(binary),
                "--name=default",
                f"--data-dir={c.home / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
            ]

        def probe(c: _Component) -> bool:
            body = _http_get(c.url("client") + "/health").json()
            return isinstance(body, dict) and body.get("health") == "true"

        return _Component(ETCD, self._home(ETCD), ("client", "peer"), command, probe)

    def _apiserver(
        self,
        binary: Path,
        *,
        name: str = APISERVER,
        token: str = "",
        extra_tokens: Mapping[str, tuple[str, list[str]]] | None = None,
        args: Sequence[str] | None = None,
    ) -> _Component:
        """The management API server, or with other arguments the workload one."""
        token = token or self._admin_token
        extra = self.extra_tokens if extra_tokens is None else extra_tokens
        more = self.apiserver_args if args is None else list(args)
        home = self._home(name)
        tokens, sa_key = home / "tokens.csv", home / "service-account.key"
        tokens.write_text(_token_file(token, extra))
        tokens.chmod(0o600)
        _write_rsa_key(sa_key)
        etcd_url = self._components[ETCD].url("client")

        def command(c: _Component) -> list[str]:
            return [
                str(binary),
                f"--etcd-servers={etcd_url}",
                f"--etcd-compaction-interval={self.etcd_compaction_interval}",
                f"--cert-dir={(c.home / API_CA_FILE).parent}",
                f"--secure-port={c.ports['secure']}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                "--authorization-mode=RBAC",
                f"--token-auth-file={tokens}",
                "--disable-admission-plugins=ServiceAccount",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                f"--service-account-issuer={c.url('secure', 'https')}/",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                *more,
            ]

        def probe(c: _Component) -> bool:
            ca_file = c.home / API_CA_FILE
            if not ca_file.exists():
                return False
            context = ssl.create_default_context(cafile=str(ca_file))
            url = c.url("secure", "https") + "/readyz"
            return _http_get(url, verify=context, token=token).status_code == 200

        return _Component(name, home, ("secure",), command, probe)

    def _controller_manager(self, binary: Path) -> _Component:
        kubeconfig = self.workdir / "kubeconfig"

        def command(c: _Component) -> list[str]:
            return [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                "--controllers=garbagecollector,namespace",
                "--leader-elect=false",
                "--secure-port=0",
            ]

        def probe(c: _Component) -> bool:
            # Without a serving port there is nothing to ask; surviving start-up is the signal.
            return time.monotonic() - c.started_at >= KCM_SETTLE

        home = self._home(CONTROLLER_MANAGER)
        return _Component(CONTROLLER_MANAGER, home, (), command, probe)

    def _nats(self, binary: Path) -> _Component:
        def command(c: _Component) -> list[str]:
            client, monitor = str(c.ports["client"]), str(c.ports["monitor"])
            store = str(c.home / "jetstream")
            return [
                *(str(binary), "-c", str(self._nats_config)),
                *("-a", LOOPBACK, "-p", client, "-js", "-sd", store, "-m", monitor),
            ]

        def probe(c: _Component) -> bool:
            url = c.url("monitor") + "/healthz?js-enabled-only=true"
            return _http_get(url).status_code == 200

        return _Component(NATS, self._home(NATS), ("client", "monitor"), command, probe)

    def _nats_node(self, binary: Path, name: str) -> _Component:
        """One clustered nats-server; its routes point at every other node's cluster port."""

        def command(c: _Component) -> list[str]:
            routes = [
                self._components[other].url("cluster", "nats")
                for other in self.nats_nodes
                if other != c.name
            ]
            return [
                *(str(binary), "-c", str(self._nats_config)),
                *("-a", LOOPBACK, "-p", str(c.ports["client"]), "-m", str(c.ports["monitor"])),
                *("-js", "-sd", str(c.home / "jetstream"), "--server_name", c.name),
                *("--cluster_name", NATS_CLUSTER_NAME, "--cluster", c.url("cluster", "nats")),
                *("--routes", ",".join(routes)),
            ]

        def probe(c: _Component) -> bool:
            # The full check: a meta leader is known and this node's streams are current.
            return _http_get(c.url("monitor") + "/healthz").status_code == 200

        ports = ("client", "monitor", "cluster")
        return _Component(name, self._home(name), ports, command, probe)

    def _redis(self, binary: Path) -> _Component:
        def command(c: _Component) -> list[str]:
            port, home = str(c.ports["client"]), str(c.home)
            options = ["--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
            options += self._redis_listener(port)
            return [str(binary), *options, "--dir", home, "--aclfile", str(self._redis_acl)]

        def probe(c: _Component) -> bool:
            tls = self._tls_files.ca if self.tls else None
            return _redis_ping(c.ports["client"], self._passwords[ADMIN], ca=tls)

        return _Component(REDIS, self._home(REDIS), ("client",), command, probe)

    def _redis_listener(self, port: str) -> list[str]:
        """The plaintext port, or with ``tls`` a TLS port only (no client certificates)."""
        if not self.tls:
            return ["--port", port]
        files = self._tls_files
        return [
            *("--port", "0", "--tls-port", port, "--tls-auth-clients", "no"),
            *("--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key)),
            *("--tls-ca-cert-file", str(files.ca)),
        ]


# -- processes ------------------------------------------------------------------------------


def _spawn(component: _Component, log_path: Path) -> None:
    # Append after the first run so a restart keeps the earlier history for post-mortems.
    fresh = component.proc is None
    with log_path.open("wb" if fresh else "ab") as log:
        component.log_offset = 0 if fresh else log_path.stat().st_size
        component.proc = subprocess.Popen(
            component.command(component),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=component.home,
            start_new_session=True,
        )
    component.started_at = time.monotonic()


def _await_ready(component: _Component, log_path: Path) -> None:
    proc = component.proc
    assert proc is not None
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        status = proc.poll()
        if status is not None:
            log = _read_log(log_path, component.log_offset)
            if "address already in use" in log.lower():
                raise _PortTakenError(component.name)
            raise StackError(_failure(component.name, f"exited with status {status}", log))
        if _probe(component):
            return
        time.sleep(POLL_INTERVAL)
    log = _read_log(log_path, component.log_offset)
    _terminate(component, graceful=False)
    raise StackError(_failure(component.name, f"not ready after {READY_TIMEOUT:.0f}s", log))


def _probe(component: _Component) -> bool:
    try:
        return component.probe(component)
    except (httpx.HTTPError, OSError, ValueError):
        # Refused connections, half-written CA files and non-JSON answers all mean "not yet".
        return False


def _terminate(component: _Component, *, graceful: bool) -> None:
    proc = component.proc
    if proc is None or proc.returncode is not None:
        return
    # Signal the group before reaping the leader: once reaped, its pid may be reused.
    _signal_group(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _read_log(log_path: Path, offset: int) -> str:
    try:
        with log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def _failure(name: str, what: str, log: str) -> str:
    tail = "\n".join(log.splitlines()[-LOG_TAIL_LINES:])
    return f"{name} {what}; last lines of its log:\n{tail}"


# -- probes and files -----------------------------------------------------------------------


def _http_get(
    url: str, *, verify: ssl.SSLContext | bool = False, token: str = ""
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(verify=verify, headers=headers, timeout=2.0) as client:
        return client.get(url)


def _redis_ping(port: int, password: str, *, ca: Path | None = None) -> bool:
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((LOOPBACK, port), timeout=2.0))
        if ca is not None:
            context = ssl.create_default_context(cafile=str(ca))
            sock = stack.enter_context(context.wrap_socket(sock, server_hostname=LOOPBACK))
        sock.sendall(f"AUTH {ADMIN} {password}\r\nPING\r\n".encode())
        replies = b""
        while replies.count(b"\r\n") < 2:
            chunk = sock.recv(64)
            if not chunk:
                return False
            replies += chunk
        return replies == b"+OK\r\n+PONG\r\n"


def _token_file(admin_token: str, extra: Mapping[str, tuple[str, list[str]]]) -> str:
    rows = {admin_token: ("admin", ["system:masters"]), **extra}
    lines = []
    for token, (user, groups) in rows.items():
        fields = [token, user, user]
        if any(ch in value for value in (token, user, *groups) for ch in ',"\n'):
            raise StackError(f"token file entries must not contain commas or quotes: {user!r}")
        if groups:
            fields.append('"' + ",".join(groups) + '"')
        lines.append(",".join(fields))
    return "\n".join(lines) + "\n"


def _write_rsa_key(path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)


# -- external stack -------------------------------------------------------------------------


def _endpoints_from_env(workdir: Path) -> Endpoints:
    kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0]).expanduser().resolve()
    server, token, ca_file = _parse_kubeconfig(kubeconfig, workdir)
    return Endpoints(
        kubeconfig=kubeconfig,
        api_url=server,
        token=token,
        ca_file=ca_file,
        nats_url=os.environ["NATS_URL"],
        redis_url=os.environ["REDIS_URL"],
        bus_ca_file=Path(ca) if (ca := os.environ.get("CAPIBUS_TLS__NATS_CA_FILE")) else None,
    )


def _parse_kubeconfig(path: Path, workdir: Path) -> tuple[str, str, Path]:
    """Server, bearer token and CA file of the current context."""
    config: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    context = _named(config, "contexts", config.get("current-context"), path)["context"]
    cluster = _named(config, "clusters", context.get("cluster"), path)["cluster"]
    user = _named(config, "users", context.get("user"), path)["user"]
    token = user.get("token") or _read_token_file(user.get("tokenFile"), path)
    if not token:
        raise StackError(f"{path}: the current user has no bearer token (token or tokenFile)")
    return str(cluster["server"]), str(token), _ca_file(cluster, path, workdir)


def _named(config: dict[str, Any], section: str, name: object, path: Path) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise StackError(f"{path}: no entry {name!r} in {section}")


def _read_token_file(token_file: object, kubeconfig: Path) -> str:
    if not token_file:
        return ""
    return (kubeconfig.parent / str(token_file)).read_text().strip()


def _ca_file(cluster: dict[str, Any], kubeconfig: Path, workdir: Path) -> Path:
    if cluster.get("certificate-authority"):
        return (kubeconfig.parent / str(cluster["certificate-authority"])).resolve()
    if cluster.get("certificate-authority-data"):
        # Clients here want a path, so inline CA data is written out once.
        ca_file = workdir / "external-ca.crt"
        ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        return ca_file
    raise StackError(f"{kubeconfig}: the cluster names no certificate authority")
