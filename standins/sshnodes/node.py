"""One fake node's directory: identity, knobs, state and its fake filesystem.

Layout of ``<farm root>/nodes/<address>/``, written by the farm (``node.json``, ``knobs.json``,
the sshd files) and by the emulator (``state.json``, ``fs/``, ``commands.log``)::

    node.json      {"vm", "address", "hostname", "root", "kubeconfig", "metadata"}
                   (metadata: what the CSP's instance-metadata service tells, key by key)
    knobs.json     NodeKnobs as JSON, read by the emulator on every command
    state.json     {"hostname", "bootstrapped", "bootstrapArgs", "mcksBootstrap", "haproxy", ...}
    fs/            the node's "/" as far as commands touch it: fs/tmp holds what scp sent
    commands.log   one JSON line per command: {"command", "exit"}
    node.lock      the emulator holds it for a whole command, so one node's commands are
                   serialised as if they raced on one machine's files

Paths the node sees are mapped under ``fs/`` after normalisation, so ``..`` never leaves it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

Json = dict[str, Any]
HOME = "/home/cb-user"


@dataclass(frozen=True)
class NodeKnobs:
    """Faults a node plays; ``unreachable`` is the farm's (connections dropped before sshd)."""

    bootstrap_fail: bool = False
    init_without_success: bool = False
    join_fail: bool = False
    unreachable: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeKnobs:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeKnobs:
        """``STANDIN_SSHNODES_<KNOB>`` (``1``/``true`` for the flags, a count for unreachable)."""

        def flag(name: str) -> bool:
            return env.get(f"STANDIN_SSHNODES_{name}", "").lower() in ("1", "true", "yes")

        return cls(
            bootstrap_fail=flag("BOOTSTRAP_FAIL"),
            init_without_success=flag("INIT_WITHOUT_SUCCESS"),
            join_fail=flag("JOIN_FAIL"),
            unreachable=int(env.get("STANDIN_SSHNODES_UNREACHABLE", "0") or 0),
        )

    def to_json(self) -> Json:
        return asdict(self)


class Node:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.info: Json = json.loads((directory / "node.json").read_text())
        self.fs = directory / "fs"

    @property
    def vm(self) -> str:
        return str(self.info["vm"])

    @property
    def address(self) -> str:
        return str(self.info["address"])

    @property
    def root(self) -> Path:
        """The farm's root, where the shared cluster state lives."""
        return Path(self.info["root"])

    @property
    def kubeconfig(self) -> Path | None:
        value = self.info.get("kubeconfig")
        return Path(value) if value else None

    def knobs(self) -> NodeKnobs:
        path = self.dir / "knobs.json"
        return NodeKnobs.from_json(json.loads(path.read_text())) if path.exists() else NodeKnobs()

    def state(self) -> Json:
        path = self.dir / "state.json"
        state: Json = json.loads(path.read_text()) if path.exists() else {}
        state.setdefault("hostname", self.info.get("hostname") or self.vm)
        return state

    def save(self, state: Json) -> None:
        _write(self.dir / "state.json", json.dumps(state, indent=1, sort_keys=True))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with (self.dir / "node.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def local(self, path: str, cwd: str = HOME) -> Path:
        """Where the node's ``path`` lives on the host (always inside ``fs/``)."""
        absolute = posixpath.normpath(posixpath.join(cwd, path))
        return self.fs / absolute.lstrip("/")

    def log(self, command: str, status: int) -> None:
        line = json.dumps({"command": command, "exit": status}) + "\n"
        with (self.dir / "commands.log").open("a") as out:
            out.write(line)


def create(
    directory: Path,
    *,
    vm: str,
    address: str,
    hostname: str | None,
    root: Path,
    kubeconfig: Path | None,
    knobs: NodeKnobs,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """A fresh node directory (what was there before belonged to a VM that is gone)."""
    directory.mkdir(parents=True, exist_ok=True)
    info = {
        "vm": vm,
        "address": address,
        "hostname": hostname or vm,
        "root": str(root),
        "kubeconfig": str(kubeconfig) if kubeconfig else None,
        "metadata": dict(metadata or {}),
    }
    _write(directory / "node.json", json.dumps(info, indent=1))
    write_knobs(directory, knobs)
    for path in ("tmp", HOME.lstrip("/")):
        (directory / "fs" / path).mkdir(parents=True, exist_ok=True)


def write_knobs(directory: Path, knobs: NodeKnobs) -> None:
    _write(directory / "knobs.json", json.dumps(knobs.to_json()))


def commands(directory: Path) -> list[Json]:
    path = directory / "commands.log"
    if not path.exists():
        return []
    return [cast(Json, json.loads(line)) for line in path.read_text().splitlines() if line]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
