"""Where VMs get their sshd: the node farm, behind a Protocol.

``standins.sshnodes.farm.NodeFarm`` (its own package) runs one real sshd per VM on the VM's
loopback address, port 22, with the node emulator as ForceCommand. This module only names the
calls the Tumblebug stand-in makes, so tests can put a recorder in its place (``--no-ssh``
uses ``NullFarm`` too). A node fault armed for a VM (``NodeKnobs``: bootstrap or join
failure, init without the success line, unreachable for N connections) goes to the farm when
the VM boots, or at once to a VM already running. ``NullFarm`` also
records what it was asked, which the unit tests read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from standins.sshnodes.farm import NodeFarm
from standins.sshnodes.node import NodeKnobs


class Farm(Protocol):
    async def start(
        self,
        vm_name: str,
        address: str,
        authorized_public_key: str,
        *,
        knobs: NodeKnobs | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None: ...

    async def stop(self, address: str) -> None: ...

    async def set_knobs(self, address: str, knobs: NodeKnobs) -> None: ...

    async def close(self) -> None: ...


class NullFarm:
    """No sshd: VMs exist only as records. Remembers the running set for tests."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[str, str]] = {}
        self.knobs: dict[str, NodeKnobs] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.closed = False

    async def start(
        self,
        vm_name: str,
        address: str,
        authorized_public_key: str,
        *,
        knobs: NodeKnobs | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.running[address] = (vm_name, authorized_public_key)
        self.metadata[address] = dict(metadata or {})
        if knobs is not None:
            self.knobs[address] = knobs

    async def stop(self, address: str) -> None:
        self.running.pop(address, None)
        self.knobs.pop(address, None)

    async def set_knobs(self, address: str, knobs: NodeKnobs) -> None:
        self.knobs[address] = knobs

    async def close(self) -> None:
        self.running.clear()
        self.closed = True


def node_farm(root_dir: Path, workload_kubeconfig: str | None) -> Farm:
    """The real farm: ``standins.sshnodes.farm.NodeFarm``."""
    kubeconfig = Path(workload_kubeconfig) if workload_kubeconfig else None
    return NodeFarm(root_dir, kubeconfig)
