"""The steps every flow shares, each converging from what exists and skipping what is done.

A ``Run`` is one reconcile of one LadybugCluster: the object as read, its spec parsed, the
nodes known so far (from the status, then from the MCIS), and the logins per connection. Each
step asks the world before it acts:

* MCIR: get, then create, by the deterministic names (``rules.McirNames``). The sshKey's
  private key goes into the Secret ``ladybug-sshkey.<tbns>.<connection>`` the moment
  Tumblebug returns it, and is read back from there on every later run: it never reaches the
  bus, a status or a log line.
* Bootstrap: ``systemctl is-enabled mcks-bootstrap`` on the node says whether it already ran
  (and is the SSH reachability probe at once, retried ``ssh_attempts`` times); a node whose
  status already says ``bootstrapped`` is not asked at all, nor is a VM this run made (its
  upload is the first command, retried the same way).
* Init: ``test -f /etc/kubernetes/admin.conf`` on the leader says whether kubeadm init ran
  (not asked when this run made the leader's VM); it never runs twice. Join commands come
  from the init output, or on a resumed run from ``kubeadm token create
  --print-join-command`` (plus ``kubeadm init phase upload-certs`` for the certificate key a
  control plane needs).
* Joins: ``kubectl get nodes -o name`` on the leader says who is in (not asked when init ran
  in this run: nobody can be in yet); only the others join.

Bootstrap (and worker joins) run in parallel, at most ``bootstrap_parallel`` nodes at a time
per cluster; control planes join one after the other, as etcd adds one member at a time. A
step that fails for good raises ``Failure`` with upstream's reason and message; temporary
trouble (Tumblebug down, a node dropping the connection mid-command) propagates as a
``TemporaryError`` and the consumer runs the whole reconcile again, which skips what is done.
Progress (nodes bound, bootstrapped, joined) is reported as it happens, so a replica that
takes over mid-way starts from it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.ladybug.provisioner import cloud, rules
from services.ladybug.provisioner.ports import Deps, Json, Login
from shared.errors import KubeNotFound, PermanentError
from shared.messages import Condition, Message
from shared.models.ladybug import (
    CLUSTER_LABEL,
    KUBECONFIG_KEY,
    NAMESPACE_LABEL,
    PRIVATE_KEY_KEY,
    USERNAME_KEY,
    LadybugClusterSpec,
    LadybugNode,
    LadybugReason,
    NodeRole,
    NodeSet,
    kubeconfig_secret_name,
    sshkey_secret_name,
)
from shared.reconcile import report
from shared.resources import LADYBUG_CLUSTER, SECRET
from shared.ssh import (
    MemoryHostKeys,
    Ssh,
    SshCommandFailed,
    SshDenied,
    SshHostKeyChanged,
    SshSession,
    SshUnreachable,
)
from shared.tumblebug import McirType, TumblebugError

log = logging.getLogger(__name__)

T = TypeVar("T")
FIELD_MANAGER = "capibus-ladybug"
#: a Tumblebug namespace that does not exist (capibus's reason; upstream answered before
#: it had an entity to fail)
NAMESPACE_NOT_FOUND = "NamespaceNotFoundReason"


class Failure(Exception):
    """A step failed for good: the cluster (or the nodes being added) fail with ``reason``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Mcir:
    """One connection's resources in the namespace, as the VM requests name them."""

    names: rules.McirNames
    csp: str
    region: str
    zone: str
    subnet: str


@dataclass(frozen=True)
class Place:
    """Where a connection's VMs are: the CSP and region (from Tumblebug's connection)."""

    csp: str
    region: str
    zone: str
    region_name: str


@dataclass
class Run:
    deps: Deps
    obj: Json
    spec: LadybugClusterSpec
    cause: Message
    #: the nodes known so far, by VM name, control plane first
    nodes: dict[str, LadybugNode] = field(default_factory=dict)
    logins: dict[str, Login] = field(default_factory=dict)
    places: dict[str, Place] = field(default_factory=dict)
    mcirs: dict[tuple[str, str], Mcir] = field(default_factory=dict)
    host_keys: ClusterHostKeys | None = None
    #: the VMs this run made: nothing ran on them yet, so nothing on them is asked about
    fresh: set[str] = field(default_factory=set)
    client: Ssh | None = None
    sessions: dict[str, SshSession] = field(default_factory=dict)
    exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @classmethod
    def of(cls, deps: Deps, obj: Json, cause: Message) -> Run:
        spec = LadybugClusterSpec.model_validate(obj.get("spec") or {})
        run = cls(deps=deps, obj=obj, spec=spec, cause=cause)
        for raw in status(obj).get("nodes") or []:
            node = LadybugNode.model_validate(raw)
            run.nodes[node.name] = node
        return run

    # --- identity -----------------------------------------------------------------------

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"].get("uid") or "")

    @property
    def generation(self) -> int:
        return int(self.obj["metadata"].get("generation") or 0)

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def tbns(self) -> str:
        return self.spec.namespace

    @property
    def cluster(self) -> str:
        return self.spec.name

    @property
    def cp_group(self) -> str:
        return self.spec.control_plane[0].id if self.spec.control_plane else ""

    @property
    def k8s_version(self) -> str:
        return f"{self.spec.config.kubernetes.version}-00"

    @property
    def multi(self) -> bool:
        return self.spec.service_type.value == "multi"

    @property
    def status(self) -> Json:
        return status(self.obj)

    @property
    def leader(self) -> str | None:
        recorded = self.status.get("cpLeader")
        if recorded and recorded in self.nodes:
            return str(recorded)
        return rules.leader_of(self.cp_group, self.nodes)

    def leader_node(self) -> LadybugNode:
        leader = self.leader
        if leader is None:
            raise Failure(
                LadybugReason.INIT_CONTROL_PLANE_FAILED.value,
                f"No control-plane node in subgroup '{self.cp_group}'",
            )
        return self.nodes[leader]

    def nodeset(self, group: str) -> NodeSet | None:
        for nodeset in [*self.spec.control_plane, *self.spec.worker]:
            if nodeset.id == group:
                return nodeset
        return None

    def control_planes(self) -> list[LadybugNode]:
        return [n for n in self.nodes.values() if n.role == NodeRole.CONTROL_PLANE]

    def workers(self) -> list[LadybugNode]:
        return [n for n in self.nodes.values() if n.role == NodeRole.WORKER]

    # --- reporting ----------------------------------------------------------------------

    def node_list(self) -> list[Json]:
        ordered = sorted(
            self.nodes.values(),
            key=lambda n: (n.role != NodeRole.CONTROL_PLANE, n.sub_group, rules.vm_index(n.name)),
        )
        return [n.model_dump(mode="json", exclude_none=True) for n in ordered]

    async def report(self, *, conditions: Iterable[Condition] = (), **fields: Any) -> None:
        await report(
            self.deps, LADYBUG_CLUSTER, self.obj, self.cause, conditions=conditions, **fields
        )

    async def report_nodes(self) -> None:
        await self.report(nodes=self.node_list())

    def mark(self, name: str, **flags: bool) -> None:
        self.nodes[name] = self.nodes[name].model_copy(update=flags)


def status(obj: Json) -> Json:
    return dict(obj.get("status") or {})


def kube_name(node: LadybugNode) -> str:
    """``node``'s Node name in Kubernetes: its cloud hostname (single-cloud), else its VM name."""
    return node.hostname or node.name


# --- Tumblebug: namespace, connections, MCIR --------------------------------------------------


async def verify_namespace(run: Run) -> None:
    found = await refusal_as(
        NAMESPACE_NOT_FOUND,
        "Failed to get a namespace.",
        run.deps.tumblebug.get_namespace(run.tbns),
    )
    if found is None:
        raise Failure(
            NAMESPACE_NOT_FOUND, f"Could not be found a namespace. (namespace={run.tbns})"
        )


async def place(run: Run, connection: str) -> Place:
    """The connection's CSP, region and zone (``InvalidMCIRReason`` when unusable)."""
    if connection in run.places:
        return run.places[connection]
    invalid = LadybugReason.INVALID_MCIR.value
    tb = run.deps.tumblebug
    config = await refusal_as(
        invalid, "Failed to get a connection info.", tb.get_connection_config(connection)
    )
    if config is None:
        raise Failure(invalid, f"Connection does not exist. ({connection})")
    provider = str(config.get("ProviderName") or config.get("providerName") or "")
    csp = provider.lower()
    if csp not in rules.CSPS:
        raise Failure(invalid, f"The CSP '{provider}' is not supported")
    region_name = str(config.get("RegionName") or config.get("regionName") or "")
    region = await refusal_as(invalid, "Failed to get a region data.", tb.get_region(region_name))
    if region is None:
        raise Failure(invalid, f"Region does not exist ({region_name})")
    found = Place(csp, *rules.region_and_zone(region), region_name=region_name)
    run.places[connection] = found
    return found


async def ensure_mcir(run: Run, nodeset: NodeSet, *, control_plane: bool) -> Mcir:
    """Get or create the NodeSet's vNet, security group, sshKey, image and spec."""
    key = (nodeset.connection, nodeset.spec)
    if key in run.mcirs:
        return run.mcirs[key]
    # The MCIR is shared by every cluster of the namespace and connection: clusters created
    # together would each find it missing and each create it, and all but one be refused.
    async with run.deps.locks(f"mcir/{run.tbns}/{nodeset.connection}"):
        found = await _ensure_mcir(run, nodeset, control_plane=control_plane)
    run.mcirs[key] = found
    return found


async def _ensure_mcir(run: Run, nodeset: NodeSet, *, control_plane: bool) -> Mcir:
    where = await place(run, nodeset.connection)
    names = rules.McirNames(nodeset.connection, nodeset.spec)
    await _verify_spec(run, names, where, control_plane=control_plane)
    subnet = await _vnet(run, names, where)
    await _get_or_create(
        run,
        "securityGroup",
        names.security_group,
        rules.security_group_body(names, where.csp),
        reason=LadybugReason.CREATE_SECURITY_GROUP_FAILED.value,
        what="Failed to create a Firewall Rules.",
    )
    await _ssh_key(run, names)
    await _image(run, names, where)
    await _get_or_create(
        run,
        "spec",
        names.vm_spec,
        rules.spec_body(names),
        reason=LadybugReason.CREATE_VM_SPEC_FAILED.value,
        what="Failed to create a VM Spec.",
    )
    return Mcir(names, where.csp, where.region, where.zone, subnet)


async def _verify_spec(
    run: Run, names: rules.McirNames, where: Place, *, control_plane: bool
) -> None:
    invalid = LadybugReason.INVALID_MCIR.value
    spec = await refusal_as(
        invalid,
        f"Failed to lookup spec. (csp={where.csp}, spec={names.spec})",
        run.deps.tumblebug.lookup_spec(names.connection, names.spec),
    )
    if spec is None:
        raise Failure(
            invalid,
            f"Could not be found a spec '{names.spec}'. "
            f"(connection={names.connection}, csp={where.csp})",
        )
    problem = rules.spec_problem(spec, csp=where.csp, name=names.spec, control_plane=control_plane)
    if problem:
        raise Failure(invalid, problem)


async def _vnet(run: Run, names: rules.McirNames, where: Place) -> str:
    vnet = await _get_or_create(
        run,
        "vNet",
        names.vnet,
        rules.vnet_body(names, where.csp, rules.cidr_block(where.csp)),
        reason=LadybugReason.CREATE_VPC_FAILED.value,
        what="Failed to create a VPC.",
    )
    return rules.subnet_of(vnet, names)


async def _image(run: Run, names: rules.McirNames, where: Place) -> None:
    reason = LadybugReason.CREATE_VM_IMAGE_FAILED.value
    tb = run.deps.tumblebug
    what = "Failed to create a Image."
    if await refusal_as(reason, what, tb.get_resource(run.tbns, "image", names.image)) is not None:
        return
    if where.csp == "openstack":
        images = await refusal_as(
            LadybugReason.INVALID_MCIR.value,
            f"Failed to lookup a images on openstack. (connection={names.connection})",
            tb.lookup_images(names.connection),
        )
        image = rules.openstack_image(images)
    else:
        image = rules.image_id(where.csp, where.region, names.connection)
    if not image:
        raise Failure(
            LadybugReason.INVALID_MCIR.value,
            f"Could not be found a image map. (connection={names.connection}, "
            f"region={where.region})",
        )
    body = rules.image_body(names, image)
    try:
        await refusal_as(reason, what, tb.register_image(run.tbns, body))
    except Failure:
        # registered by another replica meanwhile, as in ``_get_or_create``
        if await refusal_as(reason, what, tb.get_resource(run.tbns, "image", names.image)) is None:
            raise


async def _get_or_create(
    run: Run, kind: McirType, name: str, body: Json, *, reason: str, what: str
) -> Json:
    tb = run.deps.tumblebug
    found = await refusal_as(reason, what, tb.get_resource(run.tbns, kind, name))
    if found is not None:
        return found
    try:
        return await refusal_as(reason, what, tb.create_resource(run.tbns, kind, body))
    except Failure:
        # Another replica may have made it between our look and our create (Tumblebug
        # refuses a taken name): what it made is the same resource, by its name.
        again = await refusal_as(reason, what, tb.get_resource(run.tbns, kind, name))
        if again is None:
            raise
        return again


async def refusal_as(reason: str, what: str, call: Awaitable[T]) -> T:
    """``call``'s answer; Tumblebug refusing it is a ``Failure`` with ``reason`` and
    Tumblebug's words; not reaching it propagates (the consumer tries again)."""
    try:
        return await call
    except TumblebugError as exc:
        if not refused(exc):
            raise
        raise Failure(reason, f"{what} (cause='{exc.message}')") from exc


def refused(exc: TumblebugError) -> bool:
    """Whether Tumblebug said no, rather than could not answer. Tumblebug answers most
    refusals with 500 and its reason (an MCIS naming MCIR that does not exist, a CSP error),
    so a 500 is a refusal too; no answer, 502-504, 408 and 429 are not."""
    return isinstance(exc, PermanentError) or exc.status == 500


# --- the sshKey's private key, kept in a Secret -----------------------------------------------


async def _ssh_key(run: Run, names: rules.McirNames) -> None:
    reason = LadybugReason.CREATE_SSH_KEY_FAILED.value
    what = "Failed to create a SSH-Key."
    tb = run.deps.tumblebug
    found = await refusal_as(reason, what, tb.get_resource(run.tbns, "sshKey", names.ssh_key))
    if found is None:
        created = await _get_or_create(
            run, "sshKey", names.ssh_key, rules.ssh_key_body(names), reason=reason, what=what
        )
        await _keep_key(run, names.connection, created)
    elif await _stored_login(run, names.connection) is None:
        # made before capibus knew it (or its Secret was deleted): Tumblebug still has it
        await _keep_key(run, names.connection, found)
    if await login(run, names.connection) is None:
        raise Failure(
            reason,
            f"{what} (cause='the private key of sshKey {names.ssh_key} is not known')",
        )


async def _keep_key(run: Run, connection: str, key: Json) -> None:
    private = str(key.get("privateKey") or "")
    if not private:
        return
    username = str(key.get("username") or rules.USERNAME)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": sshkey_secret_name(run.tbns, connection),
            "namespace": run.deps.tuning.namespace,
            # one key per namespace and connection, shared by its clusters: no cluster label
            "labels": {NAMESPACE_LABEL: run.tbns},
        },
        "type": "Opaque",
        "data": {PRIVATE_KEY_KEY: _b64(private), USERNAME_KEY: _b64(username)},
    }
    await run.deps.kube.apply(SECRET, secret, field_manager=FIELD_MANAGER)
    run.logins[connection] = Login(username, private)


async def _stored_login(run: Run, connection: str) -> Login | None:
    name = sshkey_secret_name(run.tbns, connection)
    try:
        secret = await run.deps.kube.get(SECRET, run.deps.tuning.namespace, name)
    except KubeNotFound:
        return None
    data = secret.get("data") or {}
    if not data.get(PRIVATE_KEY_KEY):
        return None
    username = _unb64(data[USERNAME_KEY]) if data.get(USERNAME_KEY) else rules.USERNAME
    return Login(username, _unb64(data[PRIVATE_KEY_KEY]))


async def login(run: Run, connection: str) -> Login | None:
    """The login for ``connection``'s VMs, from its Secret (read once per run)."""
    if connection not in run.logins:
        found = await _stored_login(run, connection)
        if found is None:
            return None
        run.logins[connection] = found
    return run.logins[connection]


async def login_of(run: Run, node: LadybugNode) -> Login:
    """The login of ``node``; a key that vanished is recovered from Tumblebug's sshKey."""
    nodeset = run.nodeset(node.sub_group)
    if nodeset is None:
        raise Failure(
            LadybugReason.ADD_NODE_ENTITY_FAILED.value,
            f"Can't be found node by name '{node.name}'",
        )
    found = await login(run, nodeset.connection)
    if found is None:
        await _ssh_key(run, rules.McirNames(nodeset.connection, nodeset.spec))
        found = await login(run, nodeset.connection)
    assert found is not None
    return found


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


# --- VMs into nodes ---------------------------------------------------------------------------


async def vm_requests(run: Run, nodesets: Sequence[NodeSet], *, control_plane: bool) -> list[Json]:
    requests = []
    for nodeset in nodesets:
        mcir = await ensure_mcir(run, nodeset, control_plane=control_plane)
        requests.append(
            rules.vm_request(
                mcir.names,
                name=nodeset.id,
                count=nodeset.count,
                subnet=mcir.subnet,
                disk_type=nodeset.root_disk.type,
                disk_size=nodeset.root_disk.size,
                description=f"{run.cluster} {'control-plane' if control_plane else 'worker'}",
            )
        )
    return requests


async def bind(run: Run, vms: Iterable[Json]) -> list[str]:
    """Nodes for the cluster's VMs (``AddNodeEntityFailedReason`` for one that failed or has
    no address); returns the names of the nodes not known before."""
    added = []
    for vm in vms:
        name = str(vm.get("name") or "")
        group = rules.subgroup(vm)
        nodeset = run.nodeset(group)
        if nodeset is None or name in run.spec.remove_nodes:
            continue
        problem = rules.vm_problem(vm, service_type=run.spec.service_type.value)
        if problem:
            raise Failure(LadybugReason.ADD_NODE_ENTITY_FAILED.value, problem)
        known = run.nodes.get(name)
        where = await place(run, nodeset.connection)
        region, zone = rules.vm_region(vm)
        region, zone = region or where.region, zone or where.zone
        node = LadybugNode(
            name=name,
            public_ip=str(vm.get("publicIP") or ""),
            private_ip=str(vm.get("privateIP") or ""),
            role=NodeRole.CONTROL_PLANE if group == run.cp_group else NodeRole.WORKER,
            spec=rules.vm_spec(vm) or nodeset.spec,
            csp=where.csp,
            created_time=known.created_time if known else run.deps.clock(),
            csp_label=f"{rules.LABEL_CSP}={where.csp}",
            region_label=f"{rules.LABEL_REGION}={region}",
            zone_label=f"{rules.LABEL_ZONE}={zone}",
            sub_group=group,
            bootstrapped=bool(known and known.bootstrapped),
            joined=bool(known and known.joined),
            hostname=known.hostname if known else "",
            cloud_prepared=bool(known and known.cloud_prepared),
        )
        if known is None:
            added.append(name)
        run.nodes[name] = node
    return added


# --- SSH ---------------------------------------------------------------------------------------


class ClusterHostKeys(MemoryHostKeys):
    """The host keys of one cluster's nodes, kept in the Secret ``<object>.hostkeys`` (one
    ``known_hosts`` key, OpenSSH's format): recorded on first contact, checked after."""

    def __init__(self, lines: str = "") -> None:
        keys = {}
        for line in lines.splitlines():
            address, _, key = line.strip().partition(" ")
            if address and key:
                keys[address] = key
        super().__init__(keys)
        self.saved = dict(keys)

    def text(self) -> str:
        return "".join(f"{address} {key}\n" for address, key in sorted(self.keys.items()))

    def forget(self, address: str) -> None:
        self.keys.pop(address, None)

    @property
    def changed(self) -> bool:
        return self.keys != self.saved


def host_keys_secret_name(name: str) -> str:
    return f"{name}.hostkeys"


HOST_KEYS_KEY = "known_hosts"


async def shell(run: Run) -> Ssh:
    """This run's SSH client, remembering host keys in the cluster's Secret."""
    if run.client is None:
        run.host_keys = ClusterHostKeys(await _secret_text(run, host_keys_secret_name(run.name)))
        run.client = run.deps.connect(run.host_keys)
    return run.client


async def save_host_keys(run: Run) -> None:
    keys = run.host_keys
    if keys is None or not keys.changed:
        return
    await _keep_secret(run, host_keys_secret_name(run.name), {HOST_KEYS_KEY: keys.text()})
    keys.saved = dict(keys.keys)


async def _secret_text(run: Run, name: str, key: str = HOST_KEYS_KEY) -> str:
    try:
        secret = await run.deps.kube.get(SECRET, run.deps.tuning.namespace, name)
    except KubeNotFound:
        return ""
    value = (secret.get("data") or {}).get(key)
    return _unb64(value) if value else ""


async def _keep_secret(run: Run, name: str, values: dict[str, str]) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": run.deps.tuning.namespace,
            "labels": {NAMESPACE_LABEL: run.tbns, CLUSTER_LABEL: run.cluster},
        },
        "type": "Opaque",
        "data": {k: _b64(v) for k, v in values.items()},
    }
    await run.deps.kube.apply(SECRET, secret, field_manager=FIELD_MANAGER)


async def ssh(run: Run, node: LadybugNode, command: str) -> str:
    """``command``'s stdout on ``node``. A node that refuses our key or shows another host
    key than the one first seen fails the step that reached it first: bootstrap."""
    return await _on(run, node, lambda session: session.run(command))


async def upload(run: Run, node: LadybugNode, files: dict[str, bytes], *, mode: int) -> None:
    await _on(run, node, lambda session: session.upload(files, mode=mode))


async def _on(run: Run, node: LadybugNode, work: Callable[[SshSession], Awaitable[T]]) -> T:
    try:
        return await work(await _session(run, node))
    except SshUnreachable:
        run.sessions.pop(node.public_ip, None)  # the next command connects again
        raise
    except (SshDenied, SshHostKeyChanged) as exc:
        raise Failure(
            LadybugReason.SETUP_BOOTSTRAP_FAILED.value, f"Bootstrap failed. (cause='{exc}')"
        ) from exc


async def _session(run: Run, node: LadybugNode) -> SshSession:
    """One SSH connection per node and run, for all its commands (upstream opened one per
    command); closed by ``close_sessions`` when the run ends."""
    found = run.sessions.get(node.public_ip)
    if found is None:
        login = await login_of(run, node)
        client = await shell(run)
        found = await run.exits.enter_async_context(
            client.session(
                node.public_ip,
                username=login.username,
                private_key=login.private_key,
                port=run.deps.tuning.ssh_port,
            )
        )
        run.sessions[node.public_ip] = found
    return found


async def close_sessions(run: Run) -> None:
    run.sessions.clear()
    await run.exits.aclose()


async def in_parallel(
    run: Run, items: Sequence[T], work: Callable[[T], Awaitable[None]]
) -> list[BaseException | None]:
    """``work`` for every item, ``bootstrap_parallel`` at a time; each item's exception."""
    gate = asyncio.Semaphore(run.deps.tuning.bootstrap_parallel)

    async def bounded(item: T) -> None:
        async with gate:
            await work(item)

    results = await asyncio.gather(*(bounded(i) for i in items), return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


def first_error(errors: Iterable[BaseException | None]) -> None:
    """Raise the first ``Failure`` among ``errors``, else the first other exception."""
    found = [e for e in errors if e is not None]
    for error in found:
        if isinstance(error, Failure):
            raise error
    if found:
        raise found[0]


# --- bootstrap --------------------------------------------------------------------------------


async def bootstrap(run: Run, names: Sequence[str]) -> None:
    """Bootstrap every node of ``names`` not yet bootstrapped, in parallel."""
    todo = [run.nodes[n] for n in names if not run.nodes[n].bootstrapped]
    if not todo:
        return
    errors = await in_parallel(run, todo, lambda node: _bootstrap_one(run, node))
    for node, error in zip(todo, errors, strict=True):
        if error is None:
            run.mark(node.name, bootstrapped=True)
    await run.report_nodes()
    first_error(errors)


async def _bootstrap_one(run: Run, node: LadybugNode) -> None:
    if node.name in run.fresh:
        # a VM this run made: nothing ran on it, so its first command is the upload
        await _reaching(run, node, lambda: _upload_files(run, node))
        node = await _hostname(run, node)
    else:
        done = await _reaching(run, node, lambda: _bootstrapped(run, node))
        node = await _hostname(run, node)
        if done:
            return
        await _upload_files(run, node)
    command = rules.bootstrap_command(
        version=run.k8s_version,
        csp=node.csp,
        hostname=kube_name(node),
        public_ip=node.public_ip,
        cni=run.spec.config.kubernetes.network_cni.value,
        service_type=run.spec.service_type.value,
    )
    try:
        await ssh(run, node, command)
    except SshCommandFailed as exc:
        raise Failure(
            LadybugReason.SETUP_BOOTSTRAP_FAILED.value,
            f"Bootstrap failed. (cause='Failed to execute bootstrap.sh (node={node.name})')",
        ) from exc


async def _upload_files(run: Run, node: LadybugNode) -> None:
    try:
        await upload(run, node, _files_for(run, node), mode=0o755)
    except SshCommandFailed as exc:
        raise Failure(
            LadybugReason.SETUP_BOOTSTRAP_FAILED.value,
            f"Bootstrap failed. (cause='Failed to copy bootstrap files. (node={node.name}, "
            f"cause='{exc}')')",
        ) from exc


async def _hostname(run: Run, node: LadybugNode) -> LadybugNode:
    """A single-cloud node with its cloud hostname (``cloud.py``), asked once and kept in the
    status; multi-cloud nodes are named by their VM."""
    if run.multi or node.hostname:
        return node
    command = cloud.metadata_command(node.csp)
    if command is None:
        ids = await run.deps.tumblebug.get_vm_ids(run.tbns, run.cluster, node.name)
        answer = str((ids or {}).get("nameInCsp") or "")
    else:
        try:
            answer = await ssh(run, node, command)
        except SshCommandFailed:
            answer = ""
    name = cloud.hostname(answer)
    if name is None:
        raise Failure(
            LadybugReason.SETUP_BOOTSTRAP_FAILED.value,
            f"Bootstrap failed. (cause='Failed to get the hostname (node={node.name}, "
            f"csp={node.csp})')",
        )
    node = node.model_copy(update={"hostname": name})
    run.nodes[node.name] = node
    return node


async def _reaching(run: Run, node: LadybugNode, first: Callable[[], Awaitable[T]]) -> T:
    """``first``, the node's first command of the run, tried up to ``ssh_attempts`` times while
    the node cannot be reached (a new VM's sshd may not listen yet)."""
    tuning = run.deps.tuning
    for attempt in range(tuning.ssh_attempts):
        try:
            return await first()
        except SshUnreachable as exc:
            log.info("%s: %s unreachable (try %d): %s", run.name, node.name, attempt + 1, exc)
            if attempt + 1 < tuning.ssh_attempts:
                await asyncio.sleep(tuning.ssh_retry_seconds)  # a retry delay, not a poll
    raise Failure(
        LadybugReason.SETUP_BOOTSTRAP_FAILED.value,
        f"Bootstrap failed. (cause='SSH connection retry count has exceeded. "
        f"(node={node.name}, ip={node.public_ip})')",
    )


async def _bootstrapped(run: Run, node: LadybugNode) -> bool:
    """Whether bootstrap.sh ran on ``node`` (its unit is enabled)."""
    try:
        answer = await ssh(run, node, rules.IS_BOOTSTRAPPED)
    except SshCommandFailed:
        return False
    return answer.strip() == "enabled"


def _files_for(run: Run, node: LadybugNode) -> dict[str, bytes]:
    names = ["bootstrap.sh"]
    if node.role == NodeRole.CONTROL_PLANE:
        names.append("haproxy.sh")
        if run.spec.config.kubernetes.etcd.value == "external":
            names += ["etcd-conf.sh", "k8s-init-etcd.sh"]
            if node.name == run.leader:
                names.append("etcd-ca.sh")
        else:
            names.append("k8s-init.sh")
    scripts = run.deps.scripts
    return {f"{rules.REMOTE_DIR}/{name}": scripts[name] for name in names}


# --- the control plane ------------------------------------------------------------------------


async def initialized(run: Run) -> bool:
    leader = run.leader_node()
    if leader.joined:
        return True
    if leader.name in run.fresh:
        return False  # made by this run: nothing ran kubeadm on it
    try:
        await ssh(run, leader, rules.HAS_ADMIN_CONF)
    except SshCommandFailed:
        return False
    return True


async def haproxy(run: Run) -> None:
    leader = run.leader_node()
    servers = [(kube_name(n), n.private_ip) for n in run.control_planes()]
    try:
        script = await ssh(run, leader, rules.haproxy_render(servers))
        await ssh(run, leader, script)
    except SshCommandFailed as exc:
        raise Failure(
            LadybugReason.SETUP_HAPROXY_FAILED.value,
            f"Failed to install haproxy. (cause='{exc}')",
        ) from exc


async def external_etcd(run: Run) -> None:
    leader = run.leader_node()
    planes = run.control_planes()
    login = await login_of(run, leader)
    try:
        # the leader copies the CA to the others over scp with the cluster's own key
        await ssh(run, leader, "mkdir -p .ssh")
        key = {f"/home/{login.username}/.ssh/id_rsa": login.private_key.encode()}
        await upload(run, leader, key, mode=0o600)
        await ssh(
            run, leader, f"{rules.REMOTE_DIR}/etcd-ca.sh " + " ".join(n.private_ip for n in planes)
        )
        members = [(kube_name(n), n.private_ip) for n in planes]
        for node in planes:
            await ssh(run, leader, rules.copy_ca_command(node.public_ip))
            await ssh(run, node, rules.etcd_conf_command(members))
    except SshCommandFailed as exc:
        raise Failure(
            LadybugReason.INIT_EXTERNAL_ETCD_FAILED.value,
            f"Failed to initialize External etcd. (cause='{exc}')",
        ) from exc


async def init(run: Run) -> rules.Join | None:
    """kubeadm init on the leader; the join commands its output prints."""
    leader = run.leader_node()
    k8s = run.spec.config.kubernetes
    external = k8s.etcd.value == "external"
    command = rules.init_command(
        script="k8s-init-etcd.sh" if external else "k8s-init.sh",
        pod_cidr=k8s.pod_cidr,
        service_cidr=k8s.service_cidr,
        dns_domain=k8s.service_dns_domain,
        public_ip=leader.public_ip,
        private_ip=leader.private_ip,
        port=rules.HAPROXY_PORT if k8s.loadbalancer.value == "haproxy" else rules.API_SERVER_PORT,
        service_type=run.spec.service_type.value,
        etcd_ips=[n.private_ip for n in run.control_planes()] if external else (),
    )
    failed = LadybugReason.INIT_CONTROL_PLANE_FAILED.value
    try:
        output = await ssh(run, leader, command)
    except SshCommandFailed as exc:
        raise Failure(failed, f"Fail to initialize Control-plane. (cause='{exc}')") from exc
    if rules.INIT_SUCCESS not in output:
        raise Failure(
            failed,
            f"Fail to initialize Control-plane. (cause='control plane init failed "
            f"(name={leader.name})')",
        )
    run.mark(leader.name, joined=True)
    return rules.parse_join(output)


async def keep_kubeconfig(run: Run, *, fresh: bool) -> None:
    """The leader's admin.conf into the kubeconfig Secret (after init, or when missing)."""
    namespace, name = run.deps.tuning.namespace, kubeconfig_secret_name(run.name)
    if not fresh:
        try:
            await run.deps.kube.get(SECRET, namespace, name)
            return
        except KubeNotFound:
            pass
    config = await ssh(run, run.leader_node(), rules.CAT_ADMIN_CONF)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {NAMESPACE_LABEL: run.tbns, CLUSTER_LABEL: run.cluster},
        },
        "type": "Opaque",
        "data": {KUBECONFIG_KEY: _b64(config)},
    }
    await run.deps.kube.apply(SECRET, secret, field_manager=FIELD_MANAGER)


# --- joins ------------------------------------------------------------------------------------


async def in_cluster(run: Run) -> set[str]:
    """The names of the nodes the workload cluster has (asked on the leader)."""
    return rules.node_names(await ssh(run, run.leader_node(), rules.LIST_NODES))


async def join_commands(run: Run, *, control_planes: bool) -> rules.Join:
    """Fresh join commands from the leader (a resumed run, or nodes added later)."""
    leader = run.leader_node()
    output = await ssh(run, leader, rules.TOKEN_CREATE)
    join = rules.parse_join(output)
    if join is None:
        raise Failure(
            LadybugReason.JOIN_WORKER_FAILED.value,
            "Failed to get a join command. (cause='kubeadm token create printed none')",
        )
    if control_planes:
        key = rules.certificate_key(await ssh(run, leader, rules.UPLOAD_CERTS))
        join = rules.Join(join.endpoint, join.token, join.ca_hash, key)
    return join


async def join_all(run: Run, join: rules.Join | None, names: Sequence[str]) -> list[str]:
    """Join every node of ``names`` that is not in the cluster yet: control planes one by
    one, then workers in parallel. Returns the nodes that joined now."""
    pending = [run.nodes[n] for n in names if not run.nodes[n].joined and n != run.leader]
    if not pending:
        return []
    # init ran in this run (``join`` is its output): nobody can have joined before
    inside = await in_cluster(run) if join is None else set()
    for node in pending:
        if kube_name(node) in inside:
            run.mark(node.name, joined=True)
    pending = [n for n in pending if not run.nodes[n.name].joined]
    if not pending:
        await run.report_nodes()
        return []
    planes = [n for n in pending if n.role == NodeRole.CONTROL_PLANE]
    if join is None or (planes and not join.certificate_key):
        join = await join_commands(run, control_planes=bool(planes))
    joined: list[str] = []
    try:
        for node in planes:
            await _join_one(run, node, join.control_plane, control_plane=True)
            joined.append(node.name)
        workers = [n for n in pending if n.role == NodeRole.WORKER]
        errors = await in_parallel(
            run, workers, lambda node: _join_one(run, node, join.worker, control_plane=False)
        )
        joined += [n.name for n, e in zip(workers, errors, strict=True) if e is None]
        first_error(errors)
    finally:
        for name in joined:
            run.mark(name, joined=True)
        await run.report_nodes()
    return joined


async def _join_one(run: Run, node: LadybugNode, command: str, *, control_plane: bool) -> None:
    if control_plane:
        reason = LadybugReason.JOIN_CONTROL_PLANE_FAILED.value
        message = f"Fail to control-plane join. (node={node.name})"
    else:
        reason = LadybugReason.JOIN_WORKER_FAILED.value
        message = f"Fail to worker-node join. (node={node.name})"
    try:
        output = await ssh(run, node, f"sudo {command}")
    except SshCommandFailed as exc:
        raise Failure(reason, message) from exc
    if rules.JOIN_SUCCESS not in output:
        raise Failure(reason, message)
    try:
        await ssh(run, node, rules.RESTART_BOOTSTRAP)
    except (SshCommandFailed, SshUnreachable) as exc:
        log.warning("%s: restarting mcks-bootstrap on %s failed: %s", run.name, node.name, exc)


# --- labels, CNI, storage ----------------------------------------------------------------------


async def label(run: Run, names: Iterable[str]) -> None:
    """Topology labels (and kilo's annotations) on the nodes; failures are only logged."""
    leader = run.leader_node()
    kilo = run.spec.config.kubernetes.network_cni.value == "kilo"
    for node in (run.nodes[n] for n in names):
        name = kube_name(node)
        labels = dict(
            pair.split("=", 1) for pair in (node.csp_label, node.region_label, node.zone_label)
        )
        labels[rules.LABEL_CLUSTER] = run.cluster
        commands = [rules.label_command(name, labels)]
        if kilo:
            annotations = {
                "kilo.squat.ai/location": name,
                "kilo.squat.ai/persistent-keepalive": "25",
            }
            commands.append(rules.annotate_command(name, annotations))
        for command in commands:
            try:
                await ssh(run, leader, command)
            except (SshCommandFailed, SshUnreachable) as exc:
                log.warning("%s: labelling %s failed: %s", run.name, name, exc)


async def network_cni(run: Run) -> None:
    cni = run.spec.config.kubernetes.network_cni.value
    for command in rules.cni_commands(cni):
        try:
            await ssh(run, run.leader_node(), command)
        except SshCommandFailed as exc:
            raise Failure(
                LadybugReason.SETUP_NETWORK_CNI_FAILED.value,
                f"Failed to install network-cni. (cni={cni})",
            ) from exc


async def storage_class(run: Run) -> None:
    """The NFS storage class, when the spec names a server and a path."""
    nfs = run.spec.config.kubernetes.storageclass.nfs
    if not (nfs.server and nfs.path):
        return
    leader = run.leader_node()
    script = {f"{rules.NFS_DIR}/{rules.NFS_SCRIPT}": run.deps.scripts[rules.NFS_SCRIPT]}
    try:
        await ssh(run, leader, f"mkdir -p {rules.NFS_DIR}")
        await upload(run, leader, script, mode=0o755)
        await ssh(run, leader, rules.nfs_command(nfs.server, nfs.path))
    except SshCommandFailed as exc:
        raise Failure(
            LadybugReason.SETUP_STORAGE_CLASS_FAILED.value,
            f"Failed to install storageclass. (cause='{exc}')",
        ) from exc
