"""The node registrar: a workload cluster's kubelet joining when its machine phones home.

cluster-api-provider-metalstack finds a machine's Node by ``status.nodeInfo.systemUUID``
(the machine id, as the hardware reports it) and patches its ``spec.providerID``. Without
real machines nothing would ever register, so when a machine (not a firewall) reaches
``Phoned Home`` this creates a ``Node`` named after the allocation hostname, with an empty
``spec`` (no providerID), then writes ``status.nodeInfo`` (every field the API requires,
``systemUUID`` the machine id) and the addresses through the ``status`` subresource, as a
kubelet does. Freeing the machine deletes the Node (a kubelet stops, someone cleans up).

Work is level-triggered per hostname: the newest wish (present with a machine, or absent)
is what gets applied, so a free that overtakes a pending create just deletes. An
unreachable workload API server is retried with capped exponential backoff; a permanent
refusal (RBAC, an invalid object) is logged and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from shared.errors import CapibusError, KubeConflict, KubeNotFound, TemporaryError
from shared.kube import KubeClient
from shared.resources import NODE
from standins.metalapi.model import Json, Machine

log = logging.getLogger("standins.metalapi.registrar")

KUBELET_VERSION = "v1.30.0"


@dataclass(frozen=True)
class Wish:
    machine_id: str
    present: bool
    address: str = ""


class NodeRegistrar:
    def __init__(
        self, kube: KubeClient, *, first_backoff: float = 0.2, max_backoff: float = 5.0
    ) -> None:
        self.kube = kube
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self._wishes: dict[str, Wish] = {}
        self._owner: dict[str, str] = {}  # hostname -> machine id of its newest Node
        self._wake = asyncio.Event()

    def phoned_home(self, machine: Machine) -> None:
        allocation = machine.allocation
        if allocation is None:
            return
        private = [ip for n in allocation.networks if n.private for ip in n.ips]
        self._owner[allocation.hostname] = machine.id
        self._wish(allocation.hostname, Wish(machine.id, True, private[0] if private else ""))

    def freed(self, machine_id: str, hostname: str) -> None:
        if self._owner.get(hostname, machine_id) != machine_id:
            return  # another machine took this hostname since; its Node stays
        self._owner.pop(hostname, None)
        self._wish(hostname, Wish(machine_id, False))

    def pending(self) -> dict[str, Wish]:
        return dict(self._wishes)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self.first_backoff
        while not stop.is_set():
            await _first(self._wake.wait(), stop.wait())
            self._wake.clear()
            if await self.converge():
                backoff = self.first_backoff
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, self.max_backoff)
            self._wake.set()

    async def converge(self) -> bool:
        """Apply every pending wish once; False if some must be tried again."""
        healthy = True
        for hostname, wish in list(self._wishes.items()):
            try:
                await (self._register(hostname, wish) if wish.present else self._drop(hostname))
            except TemporaryError as exc:
                log.info("node %s: workload API not ready (%s); retrying", hostname, exc)
                healthy = False
                continue
            except CapibusError as exc:
                log.warning("node %s: refused (%s); giving up on it", hostname, exc)
            if self._wishes.get(hostname) is wish:
                del self._wishes[hostname]
        return healthy

    def _wish(self, hostname: str, wish: Wish) -> None:
        self._wishes[hostname] = wish
        self._wake.set()

    async def _register(self, hostname: str, wish: Wish) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": hostname,
                "labels": {
                    "kubernetes.io/hostname": hostname,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "spec": {},
        }
        with contextlib.suppress(KubeConflict):  # already there: a retry, or a reused name
            await self.kube.create(NODE, node)
        await self.kube.patch_merge(
            NODE, None, hostname, {"status": _status(hostname, wish)}, subresource="status"
        )
        log.info("node %s registered (systemUUID %s)", hostname, wish.machine_id)

    async def _drop(self, hostname: str) -> None:
        with contextlib.suppress(KubeNotFound):
            await self.kube.delete(NODE, None, hostname)
        log.info("node %s deleted", hostname)


def _status(hostname: str, wish: Wish) -> Json:
    addresses = [{"type": "Hostname", "address": hostname}]
    if wish.address:
        addresses.insert(0, {"type": "InternalIP", "address": wish.address})
    return {
        "nodeInfo": {
            "machineID": wish.machine_id.replace("-", ""),
            "systemUUID": wish.machine_id,
            "bootID": str(uuid.uuid4()),
            "kernelVersion": "5.15.0-metal",
            "osImage": "Ubuntu 20.04 LTS (capibus metal-api stand-in)",
            "containerRuntimeVersion": "containerd://1.7.0",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "addresses": addresses,
    }


async def _first(*waits: Coroutine[Any, Any, object]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
