"""The node farm: one real OpenSSH ``sshd`` per fake VM, on the VM's own loopback address.

Upstream CB-Ladybug reaches every VM at ``<publicIP>:22`` as ``cb-user`` with the
connection's sshKey. The Tumblebug stand-in gives each VM an address ``127.0.0.N`` (every
127/8 address is usable on Linux without setup) and calls ``start`` here, so the provisioner
speaks real SSH to a real sshd on the real port, unchanged. Each sshd has:

* its own ed25519 host key (a new one for every ``start``: a VM rebuilt on an address is a
  new machine, and a client that remembered the old key must notice);
* ``AuthorizedKeysFile`` holding only the VM's sshKey public key, ``PasswordAuthentication
  no``, ``AllowUsers cb-user``, no forwarding, ``ListenAddress <address>:22`` only;
* ``ForceCommand`` = ``python -m standins.sshnodes.emulator <node dir>``: every exec, scp
  included, is answered by the emulator (nothing runs on the host).

**The ``cb-user`` account.** sshd authenticates a local account and runs the command as it.
The emulator must read the repository, the Python environment (here under ``/root``, mode
0700), pytest's private temporary directories and the workload kubeconfig, so an ordinary
account cannot run it. The farm runs as root (port 22 needs it anyway) and, once per machine,
creates ``cb-user`` as a second name for uid 0 (``useradd --non-unique --uid 0``, no
password: ``*``, so no password login can ever work, and the system sshd is disabled by
``testenv/build.sh``). Only these sshd processes accept it, and only with a VM's key. On a
real VM ``cb-user`` has password-less sudo, so nothing the provisioner may do differs.

**Knobs** (``NodeKnobs``, per node, from ``STANDIN_SSHNODES_*`` by default or given to
``start``/``set_knobs``): the emulator reads ``bootstrap_fail``, ``init_without_success``,
``join_fail`` from ``knobs.json`` at every command. ``unreachable=N`` is played here: a
plain TCP listener takes the address first and closes the first N connections before the
SSH banner (the client sees the connection lost, as while a VM boots), then gives the port to
sshd. Connections arriving in the instant between the two are refused, so a client may count
a few more failures than N, never fewer.

**Cleanup.** sshd runs in its own process group with ``PR_SET_PDEATHSIG`` = SIGTERM, so a
farm whose process dies takes its sshds with it. ``stop`` (a VM terminated) ends the sshd,
forgets the address in the shared cluster state and, when no VM of a cluster is left,
deletes that cluster's Nodes from the workload API server (the cluster is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from standins.sshnodes import cluster, node
from standins.sshnodes.cluster import Workload, WorkloadError
from standins.sshnodes.node import NodeKnobs

log = logging.getLogger("standins.sshnodes")

SSHD = Path("/usr/sbin/sshd")
USER = "cb-user"
PORT = 22
REPO = Path(__file__).resolve().parents[2]
PR_SET_PDEATHSIG = 1
READY_TIMEOUT = 10.0


class FarmError(RuntimeError):
    pass


@dataclass
class _Running:
    vm: str
    address: str
    directory: Path
    process: asyncio.subprocess.Process | None = None
    gate: asyncio.Server | None = None
    gate_left: int = 0
    handover: asyncio.Task[None] | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


class NodeFarm:
    def __init__(
        self,
        root_dir: Path,
        workload_kubeconfig: Path | None,
        *,
        sshd: Path = SSHD,
        python: str = sys.executable,
        knobs: NodeKnobs | None = None,
        port: int = PORT,
    ) -> None:
        self.root = Path(root_dir).resolve()
        self.workload_kubeconfig = workload_kubeconfig
        self.sshd = sshd
        self.python = python
        self.default_knobs = knobs if knobs is not None else NodeKnobs.from_env(os.environ)
        self.port = port
        self._nodes: dict[str, _Running] = {}
        self._user_checked = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(
        self,
        vm_name: str,
        address: str,
        authorized_public_key: str,
        *,
        hostname: str | None = None,
        knobs: NodeKnobs | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """A VM boots: a fresh node directory and its sshd on ``address``:22."""
        if address in self._nodes:
            await self.stop(address)
        self._prepare()
        knobs = knobs if knobs is not None else self.default_knobs
        directory = self.node_dir(address)
        shutil.rmtree(directory, ignore_errors=True)
        node.create(
            directory,
            vm=vm_name,
            address=address,
            hostname=hostname,
            root=self.root,
            kubeconfig=self.workload_kubeconfig,
            knobs=knobs,
            metadata=metadata,
        )
        self._write_sshd_files(directory, address, authorized_public_key)
        running = _Running(vm_name, address, directory)
        self._nodes[address] = running
        if knobs.unreachable > 0:
            await self._gate(running, knobs.unreachable)
        else:
            await self._start_sshd(running)
        log.info("node %s up on %s:%d", vm_name, address, self.port)

    async def stop(self, address: str) -> None:
        """The VM is terminated: its sshd ends; the shared cluster forgets the address."""
        running = self._nodes.pop(address, None)
        if running is None:
            return
        await self._close_gate(running)
        if running.handover is not None:
            running.handover.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running.handover
        await self._stop_sshd(running)
        with cluster.locked(self.root) as state:
            gone = cluster.forget_address(state, address)
        if gone and self.workload_kubeconfig is not None:
            await asyncio.to_thread(self._delete_nodes, gone)
        log.info("node %s on %s stopped", running.vm, address)

    async def close(self) -> None:
        for address in list(self._nodes):
            await self.stop(address)

    async def set_knobs(self, address: str, knobs: NodeKnobs) -> None:
        """New faults for a running node; ``unreachable`` > 0 restarts its sshd behind a gate."""
        running = self._running(address)
        node.write_knobs(running.directory, knobs)
        if knobs.unreachable > 0:
            await self._close_gate(running)
            await self._stop_sshd(running)
            await self._gate(running, knobs.unreachable)

    # -- reading (tests, the Tumblebug stand-in's state endpoint) -----------------------------

    def node_dir(self, address: str) -> Path:
        return self.root / "nodes" / address

    @property
    def addresses(self) -> list[str]:
        return sorted(self._nodes)

    def host_key(self, address: str) -> str:
        """The node's public host key, an OpenSSH line."""
        text = (self.node_dir(address) / "ssh_host_ed25519_key.pub").read_text()
        return " ".join(text.split()[:2])

    def commands(self, address: str) -> list[dict[str, Any]]:
        return node.commands(self.node_dir(address))

    def node_state(self, address: str) -> dict[str, Any]:
        return node.Node(self.node_dir(address)).state()

    def file(self, address: str, path: str) -> bytes | None:
        local = node.Node(self.node_dir(address)).local(path)
        return local.read_bytes() if local.is_file() else None

    def clusters(self) -> dict[str, Any]:
        return dict(cluster.read(self.root)["clusters"])

    def state(self) -> dict[str, Any]:
        """Everything, JSON-ready: nodes (with their state and knobs) and clusters."""
        nodes = {}
        for address, running in self._nodes.items():
            knobs = json.loads((running.directory / "knobs.json").read_text())
            nodes[address] = {
                "vm": running.vm,
                "sshd": running.process is not None and running.process.returncode is None,
                "gate": running.gate_left,
                "knobs": knobs,
                "state": self.node_state(address),
            }
        return {"nodes": nodes, "clusters": self.clusters()}

    # -- sshd ------------------------------------------------------------------------------

    def _prepare(self) -> None:
        if not self.sshd.is_file():
            raise FarmError(f"{self.sshd} is missing; run: bash testenv/build.sh sshd")
        if os.geteuid() != 0:
            raise FarmError("the node farm must run as root (sshd on port 22, user switch)")
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        (self.root / "nodes").mkdir(parents=True, exist_ok=True)
        if not self._user_checked:
            _ensure_user()
            self._user_checked = True

    def _write_sshd_files(self, directory: Path, address: str, public_key: str) -> None:
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"{USER}@{directory.name}")
        host_key = directory / "ssh_host_ed25519_key"
        key.write_private_key(str(host_key))
        host_key.chmod(0o600)
        key.write_public_key(str(host_key) + ".pub")
        (directory / "authorized_keys").write_text(public_key.strip() + "\n")
        force = (
            f"cd {shlex.quote(str(REPO))} && exec {shlex.quote(self.python)} -m "
            f"standins.sshnodes.emulator {shlex.quote(str(directory))}"
        )
        config = {
            "ListenAddress": f"{address}:{self.port}",
            "AddressFamily": "inet",
            "HostKey": str(host_key),
            "PidFile": str(directory / "sshd.pid"),
            "AuthorizedKeysFile": str(directory / "authorized_keys"),
            "AllowUsers": USER,
            "PermitRootLogin": "prohibit-password",  # cb-user is uid 0 (module docstring)
            "PubkeyAuthentication": "yes",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "UsePAM": "no",
            "StrictModes": "no",
            "AllowTcpForwarding": "no",
            "AllowAgentForwarding": "no",
            "X11Forwarding": "no",
            "PermitTunnel": "no",
            "PermitTTY": "no",
            "PrintMotd": "no",
            "PrintLastLog": "no",
            "UseDNS": "no",
            "MaxStartups": "100:30:200",
            "MaxSessions": "50",
            "LogLevel": "VERBOSE",
            "ForceCommand": force,
        }
        text = "".join(f"{k} {v}\n" for k, v in config.items())
        (directory / "sshd_config").write_text(text)

    async def _start_sshd(self, running: _Running) -> None:
        log_path = running.directory / "sshd.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as out:
            running.process = await asyncio.create_subprocess_exec(
                str(self.sshd),
                "-D",
                "-e",
                "-f",
                str(running.directory / "sshd_config"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        await self._await_listening(running, log_path, offset)

    async def _await_listening(self, running: _Running, log_path: Path, offset: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        assert running.process is not None
        while time.monotonic() < deadline:
            text = _read_from(log_path, offset)
            if "Server listening on" in text:
                return
            if running.process.returncode is not None or "fatal" in text.lower():
                break
            await asyncio.sleep(0.02)
        tail = _read_from(log_path, offset)[-2000:]
        raise FarmError(f"sshd for {running.vm} on {running.address} did not start:\n{tail}")

    async def _stop_sshd(self, running: _Running) -> None:
        process, running.process = running.process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    # -- the unreachable gate ----------------------------------------------------------------

    async def _gate(self, running: _Running, count: int) -> None:
        running.gate_left = count

        def dropped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()
            running.gate_left -= 1
            if running.gate_left == 0 and running.handover is None:
                running.handover = asyncio.create_task(self._hand_over(running))

        running.gate = await asyncio.start_server(
            dropped, running.address, self.port, reuse_address=True
        )

    async def _hand_over(self, running: _Running) -> None:
        await self._close_gate(running)
        running.handover = None
        await self._start_sshd(running)

    async def _close_gate(self, running: _Running) -> None:
        gate, running.gate = running.gate, None
        running.gate_left = 0
        if gate is not None:
            gate.close()
            await gate.wait_closed()

    def _running(self, address: str) -> _Running:
        running = self._nodes.get(address)
        if running is None:
            raise FarmError(f"no node on {address}")
        return running

    def _delete_nodes(self, names: list[str]) -> None:
        assert self.workload_kubeconfig is not None
        workload = Workload(self.workload_kubeconfig)
        for name in names:
            try:
                workload.delete(name)
            except WorkloadError as exc:
                log.warning("node %s: not deleted from the workload API server: %s", name, exc)


def _read_from(path: Path, offset: int) -> str:
    return path.read_bytes()[offset:].decode(errors="replace")


def _ensure_user() -> None:
    """``cb-user`` as a second name of uid 0 (see the module docstring), created once."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--non-unique",
                "--uid",
                "0",
                "--gid",
                "0",
                "--no-create-home",
                "--home-dir",
                "/",
                "--shell",
                "/bin/sh",
                "--password",
                "*",
                USER,
            ],
            check=True,
            capture_output=True,
        )
        return
    if entry.pw_uid != 0:
        raise FarmError(
            f"user {USER} exists with uid {entry.pw_uid}; the farm needs it as uid 0 "
            "(standins/sshnodes/farm.py explains why)"
        )


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the farm's process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
