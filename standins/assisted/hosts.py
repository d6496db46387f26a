"""The metal3 host stand-in: the BareMetal Operator and CAPM3, as OpenShift Assisted sees them.

The hardware is a set of ``BareMetalHost``\\ s that tests and demos seed
(``testenv.examples.bare_metal_hosts``). Booting the discovery ISO is what turns a host into an
assisted-service ``Agent``, so the stand-in plays both metal3 (cluster-api-provider-metal3,
``baremetal-operator``) and the host's first boot:

- a ``Metal3Machine`` whose owner Machine names its bootstrap data and whose
  ``spec.image.url`` is some InfraEnv's ``status.isoDownloadURL`` claims a free host of its
  namespace, as CAPM3's ``chooseHost`` does (``baremetal/metal3machine_manager.go``): the host
  gets the Metal3Machine as ownerReference and ``spec.consumerRef``, the image copied to
  ``spec.image``, and ``status.provisioning.state: provisioned``; the Metal3Machine gets the
  finalizer ``metal3machine.infrastructure.cluster.x-k8s.io`` first (so its deletion always
  finds the host to release) and the annotation ``metal3.io/BareMetalHost: <ns>/<host>``;
- a step (``STANDIN_ASSISTED_DELAY``) later the host "boots": an ``Agent`` appears in the
  InfraEnv's namespace, labelled with the InfraEnv, unapproved and without a role, bound to
  the InfraEnv's ClusterDeployment, with the host's boot MAC in its inventory and state
  ``known``. Its name is a UUID, as assisted-service names Agents after the host's id, and that
  id is derived from the host (its uid), as a real host's comes from its hardware: the same
  host boots as the same Agent, so a stand-in restarted half-way finds the Agent it created
  and never makes a second one. A host annotated ``standins.capibus.dev/fault: mac-mismatch``
  reports a MAC no BareMetalHost has (``06:…``; seeded hosts use ``02:…``);
- once that Agent is ``installed`` or ``added-to-existing-cluster`` (the install reactor's
  doing), the Metal3Machine gets ``spec.providerID: metal3://<ns>/<host>/<m3m>``,
  ``status.ready`` and an InternalIP, as CAPM3 does once the host is provisioned;
- a Metal3Machine being deleted releases its host (consumerRef, image and ownerReference
  cleared, ``available`` again), deletes the Agent booted from it, then drops its finalizer;
- a ``Metal3Cluster`` is ``status.ready`` once ``spec.controlPlaneEndpoint.host`` is set: for
  OpenShift the endpoint is the API VIP the user chose, so there is nothing to provision.

Every step reads its objects fresh; watch events (Machines naming bootstrap data, InfraEnvs
getting their ISO, hosts freed, Agents installed) only offer the Metal3Machine they concern
again. Claims race between Metal3Machines; each writes the host with its resourceVersion as
a precondition, and a loser tries the next free host.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared.errors import KubeConflict, KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    AGENT,
    BARE_METAL_HOST,
    INFRA_ENV,
    MACHINE,
    METAL3_CLUSTER,
    METAL3_MACHINE,
)
from standins.assisted.knobs import HOST_FAULT, MAC_MISMATCH, AssistedKnobs
from standins.base import Controller, Json, key_of

HOST_ANNOTATION = "metal3.io/BareMetalHost"
M3M_FINALIZER = "metal3machine.infrastructure.cluster.x-k8s.io"
INFRAENV_LABEL = "infraenvs.agent-install.openshift.io"
BOOTED = frozenset({"installed", "added-to-existing-cluster"})
FREE_STATES = frozenset({"", "available", "ready"})
RETRY = 0.05  # seconds: a lost claim race tries again almost at once

# The namespace of the Agents' name-based UUIDs (any fixed UUID would do).
_AGENT_IDS = uuid.UUID("5f0c6c8e-4f0b-4c57-9d52-2a3c5e0b7a11")

Handler = Callable[["Hosts", Json], Awaitable[None]]


@dataclass
class Hosts:
    kube: KubeClient
    knobs: AssistedKnobs
    namespace: str | None = None
    controllers: dict[str, Controller] = field(default_factory=dict)

    def controller(
        self, kind: ResourceKind, reconcile: Handler, on_delete: Handler | None = None
    ) -> Controller:
        async def run(obj: Json) -> None:
            await reconcile(self, obj)

        async def gone(obj: Json) -> None:
            if on_delete is not None:
                await on_delete(self, obj)

        built = Controller(
            self.kube,
            kind,
            run,
            on_delete=gone if on_delete else None,
            namespace=self.namespace,
            name=f"hosts-{kind.plural}",
        )
        self.controllers[kind.token] = built
        return built

    def known(self, kind: ResourceKind) -> list[Json]:
        return self.controllers[kind.token].known()

    def offer_machines(self, namespace: str, wanted: Callable[[Json], bool]) -> None:
        """Offer every known Metal3Machine of ``namespace`` that ``wanted`` picks again."""
        controller = self.controllers[METAL3_MACHINE.token]
        for m3m in controller.known():
            if m3m["metadata"].get("namespace") == namespace and wanted(m3m):
                controller.offer(m3m)

    def requeue(self, kind: ResourceKind, obj: Json, after: float) -> None:
        self.controllers[kind.token].requeue(obj, after)

    async def get(self, kind: ResourceKind, namespace: str, name: str) -> Json | None:
        try:
            return await self.kube.get(kind, namespace, name)
        except KubeNotFound:
            return None

    async def patch(self, kind: ResourceKind, obj: Json, patch: Json) -> Json:
        """Merge ``patch`` into ``obj`` if nobody changed it since we read it."""
        meta = obj["metadata"]
        precondition = {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}
        return await self.kube.patch_merge(
            kind, meta["namespace"], meta["name"], {**patch, "metadata": precondition}
        )

    async def write_status(self, kind: ResourceKind, obj: Json, status: Json) -> Json:
        meta = obj["metadata"]
        return await self.kube.patch_merge(
            kind, meta["namespace"], meta["name"], {"status": status}, subresource="status"
        )


def controllers(
    kube: KubeClient, *, knobs: AssistedKnobs, namespace: str | None = None
) -> list[Controller]:
    """The host stand-in's controllers; ``namespace`` confines them to one (tests)."""
    hosts = Hosts(kube, knobs, namespace)
    return [
        hosts.controller(METAL3_MACHINE, reconcile_machine),
        hosts.controller(METAL3_CLUSTER, reconcile_cluster),
        hosts.controller(BARE_METAL_HOST, reconcile_host),
        hosts.controller(MACHINE, machine_changed),
        hosts.controller(INFRA_ENV, infraenv_changed),
        hosts.controller(AGENT, agent_changed, on_delete=agent_changed),
    ]


# --- pure pieces ---------------------------------------------------------------------------


def _ns_name(obj: Json) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _deleting(obj: Json) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _annotations(obj: Json) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def _finalizers(obj: Json) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


def host_of(m3m: Json) -> str:
    """The host a Metal3Machine records as its own (``<ns>/<name>``), or ""."""
    return _annotations(m3m).get(HOST_ANNOTATION, "")


def agent_name(host: Json) -> str:
    """The Agent a host boots as: the same host, the same name (see the module docstring)."""
    return str(uuid.uuid5(_AGENT_IDS, str(host["metadata"]["uid"])))


def reported_mac(host: Json) -> str:
    """The MAC the booted host reports: its boot MAC, or under the fault one nobody has."""
    if _annotations(host).get(HOST_FAULT) != MAC_MISMATCH:
        return str(host["spec"].get("bootMACAddress") or "")
    digest = hashlib.sha256(str(host["metadata"]["uid"]).encode()).digest()
    return ":".join(["06", *(f"{b:02x}" for b in digest[:5])])


def host_address(host: Json) -> str:
    """An address on the provisioning network of metal3-dev-env (192.168.111.0/24's
    neighbourhood), stable per host."""
    value = zlib.crc32(key_of(host).encode())
    return f"192.168.{111 + (value >> 8) % 16}.{value % 250 + 2}"


def consumer_of(host: Json) -> str:
    """The Metal3Machine (``<ns>/<name>``) that consumes ``host``, or ""."""
    ref = host.get("spec", {}).get("consumerRef") or {}
    if ref.get("kind") != METAL3_MACHINE.kind:
        return ""
    return f"{ref.get('namespace') or host['metadata']['namespace']}/{ref.get('name')}"


def is_free(host: Json) -> bool:
    state = ((host.get("status") or {}).get("provisioning") or {}).get("state") or ""
    return (
        not _deleting(host)
        and not host.get("spec", {}).get("consumerRef")
        and (state in FREE_STATES)
    )


def _ref(obj: Json) -> Json:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"]["namespace"],
    }


def _owner_ref(obj: Json) -> Json:
    # Not the controller: CAPM3 links the host to its consumer; BMO owns the host's life.
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }


def _rotated(hosts: list[Json], seed: str) -> list[Json]:
    """The hosts by name, starting at a place ``seed`` picks: Metal3Machines claiming at once
    mostly try different hosts first instead of all racing for the first."""
    ordered = sorted(hosts, key=lambda h: str(h["metadata"]["name"]))
    if not ordered:
        return ordered
    start = zlib.crc32(seed.encode()) % len(ordered)
    return ordered[start:] + ordered[:start]


def agent_manifest(host: Json, infraenv: Json) -> Json:
    namespace, name = _ns_name(infraenv)
    spec: Json = {"approved": False, "role": ""}
    cluster_ref = infraenv.get("spec", {}).get("clusterRef") or {}
    if cluster_ref.get("name"):
        spec["clusterDeploymentName"] = {
            "name": cluster_ref["name"],
            "namespace": cluster_ref.get("namespace") or namespace,
        }
    return {
        "apiVersion": AGENT.api_version,
        "kind": AGENT.kind,
        "metadata": {
            "name": agent_name(host),
            "namespace": namespace,
            "labels": {INFRAENV_LABEL: name},
        },
        "spec": spec,
    }


def agent_status(host: Json) -> Json:
    return {
        "inventory": {
            "hostname": host["metadata"]["name"],
            "interfaces": [
                {
                    "name": "eth0",
                    "macAddress": reported_mac(host),
                    "ipV4Addresses": [f"{host_address(host)}/24"],
                }
            ],
        },
        "debugInfo": {"state": "known", "stateInfo": "Host is ready to be installed"},
    }


# --- Metal3Machine -------------------------------------------------------------------------


async def reconcile_machine(hosts: Hosts, seen: Json) -> None:
    m3m = await hosts.kube.get(METAL3_MACHINE, *_ns_name(seen))
    if _deleting(m3m):
        await _release(hosts, m3m)
        return
    host = await _claimed(hosts, m3m)
    if host is None:
        if await _infraenv(hosts, m3m, require_owner=True) is None:
            return  # a Machine, InfraEnv or host event offers it again
        host = await _claim(hosts, m3m)
        if host is None:
            return
        await hosts.knobs.step()  # the host boots the ISO
    agent = await _boot(hosts, m3m, host)
    if agent is not None:
        await _ready(hosts, m3m, host, agent)


async def _claimed(hosts: Hosts, m3m: Json) -> Json | None:
    """The host this Metal3Machine consumes: by its annotation, else (a claim cut short before
    the annotation) by the host's consumerRef, then recorded."""
    namespace, name = _ns_name(m3m)
    recorded = host_of(m3m)
    if recorded:
        host_ns, _, host_name = recorded.partition("/")
        host = await hosts.get(BARE_METAL_HOST, host_ns, host_name)
        if host is not None and consumer_of(host) == f"{namespace}/{name}":
            return host
    found, _ = await hosts.kube.list(BARE_METAL_HOST, namespace=namespace)
    for host in found:
        if consumer_of(host) == f"{namespace}/{name}":
            await _record(hosts, m3m, host)
            return host
    return None


async def _infraenv(hosts: Hosts, m3m: Json, *, require_owner: bool) -> Json | None:
    """The InfraEnv whose ISO the Metal3Machine boots, if it may boot yet: its owner Machine
    names bootstrap data (``require_owner``) and its image is an InfraEnv's ISO."""
    namespace, _ = _ns_name(m3m)
    url = (m3m.get("spec", {}).get("image") or {}).get("url")
    if not url:
        return None
    if require_owner and not await _bootstrapped(hosts, m3m):
        return None
    infraenvs, _ = await hosts.kube.list(INFRA_ENV, namespace=namespace)
    for infraenv in infraenvs:
        if (infraenv.get("status") or {}).get("isoDownloadURL") == url:
            return infraenv
    return None


async def _bootstrapped(hosts: Hosts, m3m: Json) -> bool:
    namespace, _ = _ns_name(m3m)
    for ref in m3m["metadata"].get("ownerReferences") or []:
        if ref.get("kind") != MACHINE.kind:
            continue
        machine = await hosts.get(MACHINE, namespace, str(ref["name"]))
        if machine and (machine.get("spec", {}).get("bootstrap") or {}).get("dataSecretName"):
            return True
    return False


async def _claim(hosts: Hosts, m3m: Json) -> Json | None:
    """Finalizer first, then a free host; None: none free (a host event offers it again)."""
    if M3M_FINALIZER not in _finalizers(m3m):
        m3m = await hosts.patch(
            METAL3_MACHINE, m3m, {"metadata": {"finalizers": [*_finalizers(m3m), M3M_FINALIZER]}}
        )
    namespace, _ = _ns_name(m3m)
    found, _ = await hosts.kube.list(BARE_METAL_HOST, namespace=namespace)
    free = [h for h in found if is_free(h)]
    image = m3m.get("spec", {}).get("image") or {}
    for candidate in _rotated(free, str(m3m["metadata"]["uid"])):
        owners = [*(candidate["metadata"].get("ownerReferences") or []), _owner_ref(m3m)]
        patch = {
            "metadata": {"ownerReferences": owners},
            "spec": {"consumerRef": _ref(m3m), "image": image},
        }
        try:
            taken = await hosts.patch(BARE_METAL_HOST, candidate, patch)
        except KubeConflict:
            continue  # another Metal3Machine took it first
        provisioning = {"state": "provisioned", "image": image}
        taken = await hosts.write_status(BARE_METAL_HOST, taken, {"provisioning": provisioning})
        await _record(hosts, m3m, taken)
        return taken
    if free:  # every free host was taken under us: there may be others by now
        hosts.requeue(METAL3_MACHINE, m3m, RETRY)
    return None


async def _record(hosts: Hosts, m3m: Json, host: Json) -> None:
    annotations = {HOST_ANNOTATION: key_of(host)}
    meta = m3m["metadata"]
    await hosts.kube.patch_merge(
        METAL3_MACHINE, meta["namespace"], meta["name"], {"metadata": {"annotations": annotations}}
    )


async def _boot(hosts: Hosts, m3m: Json, host: Json) -> Json | None:
    """The Agent the host booted as, created once; None: not (yet) bootable."""
    namespace, _ = _ns_name(m3m)
    agent = await hosts.get(AGENT, namespace, agent_name(host))
    if agent is not None and _deleting(agent):
        hosts.requeue(METAL3_MACHINE, m3m, 1.0)  # the previous boot's Agent is still going
        return None
    if agent is None:
        infraenv = await _infraenv(hosts, m3m, require_owner=False)
        if infraenv is None:
            return None
        agent = await hosts.kube.create(AGENT, agent_manifest(host, infraenv))
    if not (agent.get("status") or {}).get("inventory"):
        agent = await hosts.write_status(AGENT, agent, agent_status(host))
    return agent


async def _ready(hosts: Hosts, m3m: Json, host: Json, agent: Json) -> None:
    state = ((agent.get("status") or {}).get("debugInfo") or {}).get("state")
    if state not in BOOTED or (m3m.get("status") or {}).get("ready"):
        return
    namespace, name = _ns_name(m3m)
    m3m = await hosts.kube.get(METAL3_MACHINE, namespace, name)  # the claim changed it
    provider_id = f"metal3://{namespace}/{host['metadata']['name']}/{name}"
    if m3m.get("spec", {}).get("providerID") != provider_id:
        m3m = await hosts.patch(METAL3_MACHINE, m3m, {"spec": {"providerID": provider_id}})
    addresses = [
        {"type": "InternalIP", "address": host_address(host)},
        {"type": "Hostname", "address": host["metadata"]["name"]},
    ]
    await hosts.write_status(METAL3_MACHINE, m3m, {"ready": True, "addresses": addresses})


async def _release(hosts: Hosts, m3m: Json) -> None:
    """Host free again, its Agent gone, then the finalizer (see the module docstring)."""
    if M3M_FINALIZER not in _finalizers(m3m):
        return
    namespace, name = _ns_name(m3m)
    host = await _claimed(hosts, m3m)
    if host is not None:
        uid = m3m["metadata"]["uid"]
        owners = [r for r in host["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
        patch = {
            "metadata": {"ownerReferences": owners or None},
            "spec": {"consumerRef": None, "image": None},
        }
        host = await hosts.patch(BARE_METAL_HOST, host, patch)
        provisioning = {"state": "available", "image": None}
        await hosts.write_status(BARE_METAL_HOST, host, {"provisioning": provisioning})
        with contextlib.suppress(KubeNotFound):
            await hosts.kube.delete(AGENT, namespace, agent_name(host))
        m3m = await hosts.kube.get(METAL3_MACHINE, namespace, name)
    remaining = [f for f in _finalizers(m3m) if f != M3M_FINALIZER]
    await hosts.patch(METAL3_MACHINE, m3m, {"metadata": {"finalizers": remaining}})


# --- Metal3Cluster and hosts ---------------------------------------------------------------


async def reconcile_cluster(hosts: Hosts, seen: Json) -> None:
    cluster = await hosts.kube.get(METAL3_CLUSTER, *_ns_name(seen))
    endpoint = cluster.get("spec", {}).get("controlPlaneEndpoint") or {}
    if _deleting(cluster) or not endpoint.get("host"):
        return
    if not (cluster.get("status") or {}).get("ready"):
        await hosts.knobs.step()
        await hosts.write_status(METAL3_CLUSTER, cluster, {"ready": True})


async def reconcile_host(hosts: Hosts, seen: Json) -> None:
    """A new host is registered and inspected (``available``); a free host wakes the
    Metal3Machines still looking for one."""
    host = await hosts.kube.get(BARE_METAL_HOST, *_ns_name(seen))
    state = ((host.get("status") or {}).get("provisioning") or {}).get("state")
    if not state and not host["spec"].get("consumerRef") and not _deleting(host):
        status = {"provisioning": {"state": "available"}, "operationalStatus": "OK"}
        host = await hosts.write_status(BARE_METAL_HOST, host, status)
    if is_free(host):
        hosts.offer_machines(host["metadata"]["namespace"], lambda m: not host_of(m))


# --- watches that offer a Metal3Machine again ----------------------------------------------


async def machine_changed(hosts: Hosts, machine: Json) -> None:
    """A Machine that names its bootstrap data: its unclaimed Metal3Machine may boot now."""
    spec = machine.get("spec") or {}
    ref = spec.get("infrastructureRef") or {}
    if ref.get("kind") != METAL3_MACHINE.kind or not (spec.get("bootstrap") or {}).get(
        "dataSecretName"
    ):
        return
    hosts.offer_machines(
        machine["metadata"]["namespace"],
        lambda m: m["metadata"]["name"] == ref.get("name") and not host_of(m),
    )


async def infraenv_changed(hosts: Hosts, infraenv: Json) -> None:
    url = (infraenv.get("status") or {}).get("isoDownloadURL")
    if not url:
        return
    hosts.offer_machines(
        infraenv["metadata"]["namespace"],
        lambda m: (m.get("spec", {}).get("image") or {}).get("url") == url and not host_of(m),
    )


async def agent_changed(hosts: Hosts, agent: Json) -> None:
    """An Agent installed (or gone): the Metal3Machine of the host it booted from."""
    hostname = ((agent.get("status") or {}).get("inventory") or {}).get("hostname")
    if not hostname:
        return
    namespace = agent["metadata"]["namespace"]
    hosts.offer_machines(namespace, lambda m: host_of(m) == f"{namespace}/{hostname}")
