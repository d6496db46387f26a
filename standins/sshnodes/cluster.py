"""The fake Kubernetes clusters the SSH nodes form, shared by every node of a farm.

Each command a node answers is a separate short-lived emulator process (sshd's
``ForceCommand``), so what the nodes know together lives in one JSON file,
``<farm root>/cluster.json``, read and written under an exclusive ``flock`` on
``cluster.lock``: a join on one node sees the token an init on another node made.

A cluster is keyed by its control-plane endpoint (``<leader public IP>:<port>``, what
``kubeadm join`` names), with the tokens that may join it, the CA hash and certificate key of
its ``kubeadm init``, the nodes that joined (name, role, address), the addresses holding its
``/etc/kubernetes/admin.conf`` and what ``kubectl`` was asked to apply or create.

**The workload API server.** A node that inits or joins becomes a ``Node`` there (name = its
hostname, the VM name; ``Ready``; the control-plane role label for control planes), and
``kubectl label/annotate/drain/delete node`` on a leader act on it, so the cluster a test
provisions is observable through a real API server. Writes are small synchronous HTTPS calls
(urllib: the emulator lives for one command and needs no event loop) authenticated with the
farm's self-contained workload kubeconfig. All clusters of a farm share that one API server,
which is fine as VM names are unique.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import json
import ssl
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import yaml

Json = dict[str, Any]
STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
KUBELET_VERSION = "v1.23.13"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


class WorkloadError(Exception):
    """The workload API server refused or could not be reached."""


@contextlib.contextmanager
def locked(root: Path) -> Iterator[Json]:
    """The farm's cluster state, exclusively, saved on a clean exit of the block."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read(root)
        yield state
        _write_atomic(root / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def read(root: Path) -> Json:
    """A snapshot without the lock (for tests and the farm's state endpoint)."""
    path = root / STATE_FILE
    if not path.exists():
        return {"clusters": {}}
    return cast(Json, json.loads(path.read_text()))


def cluster_of(state: Json, address: str) -> tuple[str, Json] | None:
    """The cluster ``address`` belongs to (joined, or inited), with its endpoint."""
    for endpoint, cluster in state["clusters"].items():
        if any(n["address"] == address for n in cluster["nodes"].values()):
            return endpoint, cast(Json, cluster)
    return None


def cluster_administered_by(state: Json, address: str) -> tuple[str, Json] | None:
    """The cluster whose ``admin.conf`` ``address`` holds."""
    for endpoint, cluster in state["clusters"].items():
        if address in cluster["admins"]:
            return endpoint, cast(Json, cluster)
    return None


def node_named(cluster: Json, name: str) -> Json | None:
    return cast(Json | None, cluster["nodes"].get(name))


def forget_address(state: Json, address: str) -> list[str]:
    """A VM is gone: it holds no admin.conf; a cluster left with no VM at all goes too.

    Returns the names of the Nodes of clusters that went, for the workload API server.
    """
    gone: list[str] = []
    for endpoint, cluster in list(state["clusters"].items()):
        if address in cluster["admins"]:
            cluster["admins"].remove(address)
        for node in cluster["nodes"].values():
            if node["address"] == address:
                node["vmGone"] = True
        if all(n.get("vmGone") for n in cluster["nodes"].values()):
            gone += list(cluster["nodes"])
            del state["clusters"][endpoint]
    return gone


class Workload:
    """A tiny synchronous client of the workload API server's Node API."""

    def __init__(self, kubeconfig: Path, *, timeout: float = 10.0) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = _named(config, "contexts", config["current-context"])["context"]
        cluster = _named(config, "clusters", context["cluster"])["cluster"]
        user = _named(config, "users", context["user"])["user"]
        self.server = str(cluster["server"]).rstrip("/")
        self.token = str(user.get("token", ""))
        ca = cluster.get("certificate-authority-data")
        self.ssl = ssl.create_default_context(
            cadata=base64.b64decode(ca).decode() if ca else None,
            cafile=cluster.get("certificate-authority"),
        )
        self.timeout = timeout

    def register(self, name: str, *, address: str, control_plane: bool) -> None:
        """Create (or keep) the Node, then report it Ready, as a kubelet does."""
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        if control_plane:
            labels[CONTROL_PLANE_LABEL] = ""
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        with contextlib.suppress(Conflict):
            self._call("POST", "/api/v1/nodes", node)
        self._call("PATCH", f"/api/v1/nodes/{name}/status", {"status": _status(name, address)})

    def patch(self, name: str, patch: Json) -> None:
        self._call("PATCH", f"/api/v1/nodes/{name}", patch)

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self._call("DELETE", f"/api/v1/nodes/{name}")

    def _call(self, method: str, path: str, body: Json | None = None) -> Json:
        data = None if body is None else json.dumps(body).encode()
        kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
        request = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": kind},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.ssl) as r:
                return cast(Json, json.loads(r.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                raise Conflict(path) from exc
            if exc.code == 404:
                raise NotFound(path) from exc
            raise WorkloadError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from exc
        except (OSError, ValueError) as exc:
            raise WorkloadError(f"{method} {path}: {exc}") from exc


class Conflict(WorkloadError):
    pass


class NotFound(WorkloadError):
    pass


def _status(name: str, address: str) -> Json:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    machine = uuid.uuid5(uuid.NAMESPACE_DNS, name)
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
        "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": name},
        ],
        "nodeInfo": {
            "machineID": machine.hex,
            "systemUUID": str(machine),
            "bootID": str(uuid.uuid4()),
            "kernelVersion": "5.4.0-1045-aws",
            "osImage": "Ubuntu 18.04.6 LTS (capibus sshnodes stand-in)",
            "containerRuntimeVersion": "containerd://1.6.8",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def _named(config: Json, section: str, name: object) -> Json:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return cast(Json, entry)
    raise WorkloadError(f"kubeconfig: no {section} entry named {name!r}")


def _write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
        tmp.write(text)
    Path(tmp.name).replace(path)
