"""The Ladybug provisioner's create flow, through its composition root, with fakes.

Kubernetes and the bus are ``tests.fakes``; Tumblebug is ``FakeTumblebug`` (the
``shared.tumblebug.Tumblebug`` Protocol in memory, refusing as Tumblebug does: a 500 with its
message for an MCIS naming missing MCIR or a delete before terminate); the nodes are a
``Farm`` behind ``FakeSsh`` (the ``shared.ssh.Ssh`` Protocol) that answers the commands the
provisioner sends as the node emulator does, with kubeadm's tokens, hashes and certificate
keys checked. A small "writer" applies the published status patches to the fake objects, so
each run sees what the previous one reported (or, for crash tests, not yet).

A crash is ``Crash`` raised from inside a fake at a chosen call: the run dies there, and a new
``Deps`` (an empty memory, as a new replica has) runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import itertools
import re
import shlex
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from services.ladybug import logic
from services.ladybug.provisioner import handlers, rules
from services.ladybug.provisioner.bootstrap import dependencies
from services.ladybug.provisioner.ports import Deps
from services.ladybug.provisioner.settings import ProvisionerSettings
from shared import spider
from shared.errors import TemporaryError
from shared.kube import ResourceKind
from shared.mergepatch import apply as merge
from shared.messages import ObjectRef, PatchStatus, RecheckObject
from shared.models.ladybug import FINALIZER, kubeconfig_secret_name, sshkey_secret_name
from shared.reconcile import Target
from shared.resources import LADYBUG_CLUSTER, SECRET
from shared.ssh import (
    HostKeys,
    SshCommandFailed,
    SshDenied,
    SshHostKeyChanged,
    SshUnreachable,
)
from shared.tumblebug import TumblebugNotFound, TumblebugRefused, TumblebugUnavailable
from tests.fakes import FakeBus, FakeKube

Json = dict[str, Any]
K8S_NS = "ladybug"
TBNS = "ns01"
CAUSE = RecheckObject(
    source="test",
    correlation_id="t",
    ref=ObjectRef(api_version="v1", kind="Test", name="x"),
    reason="test",
)


class Crash(Exception):
    """The replica running this dies here."""


# --- Tumblebug --------------------------------------------------------------------------------


class FakeTumblebug:
    """Tumblebug v0.7 in memory: seeded connections, regions and specs; MCIR, MCIS, NLB."""

    def __init__(self) -> None:
        self.namespaces = {TBNS}
        self.connections: dict[str, Json] = {
            "aws-conn": {"ConfigName": "aws-conn", "ProviderName": "AWS", "RegionName": "aws-r"},
            "gcp-conn": {"ConfigName": "gcp-conn", "ProviderName": "GCP", "RegionName": "gcp-r"},
            "os-conn": {"ConfigName": "os-conn", "ProviderName": "OPENSTACK", "RegionName": "os-r"},
            "ncp-conn": {"ConfigName": "ncp-conn", "ProviderName": "NCPVPC", "RegionName": "ncp-r"},
        }
        self.regions: dict[str, Json] = {
            "aws-r": {
                "KeyValueInfoList": [
                    {"key": "Region", "value": "ap-northeast-2"},
                    {"key": "Zone", "value": "ap-northeast-2a"},
                ]
            },
            "gcp-r": {
                "KeyValueInfoList": [
                    {"key": "Region", "value": "asia-east1"},
                    {"key": "Zone", "value": "asia-east1-a"},
                ]
            },
            "os-r": {
                "KeyValueInfoList": [
                    {"key": "Region", "value": "RegionOne"},
                    {"key": "Zone", "value": "nova"},
                ]
            },
            "ncp-r": {
                "KeyValueInfoList": [
                    {"key": "Region", "value": "KR"},
                    {"key": "Zone", "value": "KR-1"},
                ]
            },
        }
        self.specs: dict[str, Json] = {
            "t3.medium": {"mem": "4096", "vcpu": {"count": "2"}},
            "t3.small": {"mem": "2048", "vcpu": {"count": "1"}},
            "t3.nano": {"mem": "512", "vcpu": {"count": "2"}},
            "e2-medium": {"mem": "4096", "vcpu": {"count": "2"}},
        }
        self.resources: dict[tuple[str, str, str], Json] = {}
        self.mcis: dict[tuple[str, str], Json] = {}
        self.nlbs: dict[tuple[str, str, str], Json] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.faults: dict[str, list[BaseException]] = defaultdict(list)
        self.crash_after: set[str] = set()
        self.failed_vms: dict[str, str] = {}
        self.without_public_ip: set[str] = set()
        self.farm: Farm | None = None
        self._ips = itertools.count(10)
        self.keys: dict[str, str] = {}

    # the knobs
    def fail(self, method: str, *errors: BaseException) -> None:
        self.faults[method].extend(errors)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if self.faults[method]:
            raise self.faults[method].pop(0)

    def _done(self, method: str) -> None:
        if method in self.crash_after:
            self.crash_after.discard(method)
            raise Crash(method)

    # the Protocol
    async def get_namespace(self, namespace: str) -> Json | None:
        self._call("get_namespace", namespace)
        return {"id": namespace} if namespace in self.namespaces else None

    async def get_connection_config(self, name: str) -> Json | None:
        self._call("get_connection_config", name)
        return copy.deepcopy(self.connections.get(name))

    async def get_region(self, name: str) -> Json | None:
        self._call("get_region", name)
        return copy.deepcopy(self.regions.get(name))

    async def lookup_spec(self, connection: str, csp_spec_name: str) -> Json | None:
        self._call("lookup_spec", connection, csp_spec_name)
        return copy.deepcopy(self.specs.get(csp_spec_name))

    async def lookup_specs(self, connection: str) -> list[Json]:
        raise NotImplementedError

    async def lookup_images(self, connection: str) -> list[Json]:
        return [{"iid": {"nameId": "ubuntu-18.04", "systemId": "img-1"}, "guestOS": "Ubuntu"}]

    async def get_resource(self, namespace: str, kind: str, name: str) -> Json | None:
        self._call("get_resource", namespace, kind, name)
        return copy.deepcopy(self.resources.get((namespace, kind, name)))

    async def create_resource(self, namespace: str, kind: str, body: Json) -> Json:
        self._call(f"create_{kind}", namespace, body)
        stored = copy.deepcopy(body) | {"id": body["name"]}
        if kind == "sshKey":
            key = f"PRIVATE-KEY-{body['name']}-{len(self.keys)}"
            self.keys[body["name"]] = key
            stored["privateKey"] = key
        self.resources[(namespace, kind, body["name"])] = stored
        return copy.deepcopy(stored)

    async def register_image(self, namespace: str, body: Json) -> Json:
        self._call("create_image", namespace, body)
        stored = copy.deepcopy(body) | {"id": body["name"]}
        self.resources[(namespace, "image", body["name"])] = stored
        return copy.deepcopy(stored)

    async def get_mcis(self, namespace: str, mcis: str) -> Json | None:
        self._call("get_mcis", namespace, mcis)
        return copy.deepcopy(self.mcis.get((namespace, mcis)))

    async def create_mcis(self, namespace: str, body: Json) -> Json:
        self._call("create_mcis", namespace, body)
        if (namespace, body["name"]) in self.mcis:
            raise TumblebugUnavailable("exists", status=500, message="MCIS already exists")
        mcis = {
            "id": body["name"],
            "name": body["name"],
            "description": body.get("description", ""),
            "label": body.get("label"),
            "systemLabel": body.get("systemLabel"),
            "status": "Running",
            "vm": [],
        }
        for request in body["vm"]:
            mcis["vm"] += self._vms(namespace, request)
        self.mcis[(namespace, body["name"])] = mcis
        self._done("create_mcis")
        return copy.deepcopy(mcis)

    def _vms(self, namespace: str, request: Json) -> list[Json]:
        for kind, key in (
            ("vNet", "vNetId"),
            ("sshKey", "sshKeyId"),
            ("image", "imageId"),
            ("spec", "specId"),
        ):
            if (namespace, kind, request[key]) not in self.resources:
                raise TumblebugUnavailable(
                    "500", status=500, message=f"Failed to find {kind} {request[key]}"
                )
        size = int(request.get("subGroupSize") or 1)
        vms = []
        for i in range(1, size + 1):
            name = f"{request['name']}-{i}"
            n = next(self._ips)
            vm = {
                "name": name,
                "subGroupId": request["name"].lower(),
                "connectionName": request["connectionName"],
                "status": "Running",
                "publicIP": f"10.0.0.{n}",
                "privateIP": f"192.168.0.{n}",
                "region": {"region": "ap-northeast-2", "zone": "ap-northeast-2a"},
                "cspViewVmDetail": {
                    "vmspecName": "t3.medium",
                    "IId": {"NameId": name, "SystemId": f"i-{n:04d}"},
                    "SubnetIID": {"NameId": "sn", "SystemId": "subnet-1"},
                    "SecurityGroupIIds": [{"NameId": "sg", "SystemId": "sg-1"}],
                },
                "systemMessage": "",
            }
            if name in self.failed_vms:
                vm["status"] = "Failed"
                vm["systemMessage"] = self.failed_vms[name]
            if name in self.without_public_ip:
                vm["publicIP"] = ""
            key = self.keys[request["sshKeyId"]]
            if self.farm is not None:
                dashed = vm["privateIP"].replace(".", "-")
                metadata = {
                    "local-hostname": f"ip-{dashed}.ap-northeast-2.compute.internal",
                    "serverName": f"{namespace}-{name}",
                }
                self.farm.boot(vm["publicIP"], name, key)
                self.farm.nodes[vm["publicIP"]].metadata = metadata
            vms.append(vm)
        return vms

    async def control_mcis(self, namespace: str, mcis: str, action: str) -> Json:
        self._call(f"control_{action}", namespace, mcis)
        found = self.mcis.get((namespace, mcis))
        if found is None:
            raise TumblebugNotFound("404", status=404)
        found["status"] = "Terminated"
        return {"message": f"{action} done"}

    async def delete_mcis(self, namespace: str, mcis: str) -> bool:
        self._call("delete_mcis", namespace, mcis)
        found = self.mcis.get((namespace, mcis))
        if found is None:
            return False
        if found["status"] != "Terminated":
            raise TumblebugUnavailable(
                "500", status=500, message="MCIS is not Terminated; terminate first"
            )
        del self.mcis[(namespace, mcis)]
        if self.farm is not None:
            for vm in found["vm"]:
                self.farm.nodes.pop(vm["publicIP"], None)
        return True

    async def get_vm(self, namespace: str, mcis: str, vm: str) -> Json | None:
        raise NotImplementedError

    async def get_vm_ids(self, namespace: str, mcis: str, vm: str) -> Json | None:
        self._call("get_vm_ids", namespace, mcis, vm)
        return {"idInTb": vm, "nameInCsp": f"{namespace}-{vm}"}

    async def add_vm(self, namespace: str, mcis: str, body: Json) -> Json:
        self._call("add_vm", namespace, mcis, body)
        found = self.mcis.get((namespace, mcis))
        if found is None:
            raise TumblebugNotFound("404", status=404)
        found["vm"] += self._vms(namespace, body)
        self._done("add_vm")
        return copy.deepcopy(found)

    async def delete_vm(self, namespace: str, mcis: str, vm: str) -> bool:
        self._call("delete_vm", namespace, mcis, vm)
        found = self.mcis.get((namespace, mcis))
        if found is None:
            return False
        kept = [v for v in found["vm"] if v["name"] != vm]
        gone = [v for v in found["vm"] if v["name"] == vm]
        found["vm"] = kept
        if self.farm is not None:
            for v in gone:
                self.farm.nodes.pop(v["publicIP"], None)
        return bool(gone)

    async def get_nlb(self, namespace: str, mcis: str, name: str) -> Json | None:
        self._call("get_nlb", namespace, mcis, name)
        return copy.deepcopy(self.nlbs.get((namespace, mcis, name)))

    async def create_nlb(self, namespace: str, mcis: str, body: Json) -> Json:
        self._call("create_nlb", namespace, mcis, body)
        self.nlbs[(namespace, mcis, body["name"])] = copy.deepcopy(body)
        return copy.deepcopy(body)


# --- nodes over SSH ---------------------------------------------------------------------------


@dataclasses.dataclass
class FakeNode:
    ip: str
    name: str
    key: str
    host_key: str
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    bootstrapped: bool = False
    admin: bool = False
    haproxy: list[str] = dataclasses.field(default_factory=list)
    unreachable: int = 0
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    #: what bootstrap.sh named it (its Node name)
    hostname: str = ""

    @property
    def k8s_name(self) -> str:
        return self.hostname or self.name


@dataclasses.dataclass
class FakeCluster:
    endpoint: str
    ca_hash: str
    tokens: set[str]
    certificate_keys: set[str]
    members: dict[str, str]  # node name -> role
    labels: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    applied: list[str] = dataclasses.field(default_factory=list)
    drained: list[str] = dataclasses.field(default_factory=list)
    deleted_all: int = 0
    secrets: list[str] = dataclasses.field(default_factory=list)


INIT_OUTPUT = """[init] Using Kubernetes version: v1.23.13
[certs] Generating "ca" certificate and key
[upload-certs] Using certificate key:
{key}
[addons] Applied essential addon: kube-proxy

Your Kubernetes control-plane has initialized successfully!

To start using your cluster, you need to run the following as a regular user:

  mkdir -p $HOME/.kube

You can now join any number of the control-plane node running the following command on each as root:

  kubeadm join {endpoint} --token {token} \\
\t--discovery-token-ca-cert-hash sha256:{hash} \\
\t--control-plane --certificate-key {key}

Then you can join any number of worker nodes by running the following on each as root:

kubeadm join {endpoint} --token {token} \\
\t--discovery-token-ca-cert-hash sha256:{hash}
"""


class Farm:
    """The VMs' SSH side: per-address nodes and the kubeadm clusters they form."""

    def __init__(self) -> None:
        self.nodes: dict[str, FakeNode] = {}
        self.clusters: list[FakeCluster] = []
        self.log: list[tuple[str, str]] = []
        self.inits: Counter[str] = Counter()
        self.sessions: Counter[str] = Counter()
        self.joins: Counter[str] = Counter()
        self.bootstraps: Counter[str] = Counter()
        self.fail: dict[str, int] = {}  # a command substring -> exit status, once
        self.fail_always: dict[str, int] = {}
        self.init_without_success = False
        self.crash_before: dict[str, int] = {}  # a command substring -> after how many
        self._serial = itertools.count(1)

    def boot(self, ip: str, name: str, key: str) -> None:
        self.nodes[ip] = FakeNode(ip, name, key, host_key=f"ssh-ed25519 HOST-{ip}-{name}")

    def by_name(self, name: str) -> FakeNode:
        return next(n for n in self.nodes.values() if n.name == name)

    def cluster_of(self, node: FakeNode) -> FakeCluster | None:
        return next((c for c in self.clusters if node.k8s_name in c.members), None)

    def commands(self, pattern: str) -> list[tuple[str, str]]:
        return [(ip, c) for ip, c in self.log if pattern in c]

    # --- one command ----------------------------------------------------------------------

    def answer(self, node: FakeNode, command: str) -> str:
        for pattern, after in list(self.crash_before.items()):
            if pattern in command:
                if after == 0:
                    del self.crash_before[pattern]
                    raise Crash(pattern)
                self.crash_before[pattern] = after - 1
        self.log.append((node.ip, command))
        for table in (self.fail, self.fail_always):
            for pattern, status in list(table.items()):
                if matches(pattern, command):
                    if table is self.fail:
                        del self.fail[pattern]
                    raise SshCommandFailed(node.ip, command, status, "", f"{pattern} failed")
        return self._dispatch(node, command)

    def _dispatch(self, node: FakeNode, command: str) -> str:
        if "/etc/haproxy/haproxy.cfg" in command and "sed" not in command:
            node.haproxy = re.findall(r"^\s*server\s+(\S+\s+\S+)", command, re.M)
            return ""
        if command.startswith("cd /tmp;"):
            command = command.removeprefix("cd /tmp;")
        words = shlex.split(command)
        while words[:1] == ["sudo"]:
            words = words[1:]
        program, args = words[0], words[1:]
        handlers = {
            "systemctl": self._systemctl,
            "/tmp/bootstrap.sh": self._bootstrap,
            "sed": self._sed,
            "test": self._test,
            "cat": self._cat,
            "./k8s-init.sh": self._init,
            "./k8s-init-etcd.sh": self._init,
            "kubeadm": self._kubeadm,
            "kubectl": self._kubectl,
            "mkdir": lambda n, a: "",
            "/tmp/etcd-ca.sh": self._script,
            "/tmp/etcd-conf.sh": self._script,
            "./addons/nfs/deploy_v4.0.16.sh": self._script,
            "scp": lambda n, a: "",
            "curl": self._curl,
            "rm": self._rm,
        }
        handler = handlers.get(program)
        if handler is None:
            raise SshCommandFailed(node.ip, command, 127, "", f"{program}: command not found")
        return handler(node, args)

    def _need(self, node: FakeNode, path: str) -> None:
        if path not in node.files:
            raise SshCommandFailed(node.ip, path, 127, "", f"{path}: No such file or directory")

    def _systemctl(self, node: FakeNode, args: list[str]) -> str:
        if not node.bootstrapped:
            raise SshCommandFailed(node.ip, "systemctl", 1, "", "No such file or directory")
        return "enabled" if args[0] == "is-enabled" else ""

    def _bootstrap(self, node: FakeNode, args: list[str]) -> str:
        self._need(node, "/tmp/bootstrap.sh")
        assert len(args) == 6, args
        self.bootstraps[node.name] += 1
        node.bootstrapped = True
        node.hostname = args[2]
        return "kubelet, kubeadm and kubectl installed"

    def _script(self, node: FakeNode, args: list[str]) -> str:
        return ""

    def _curl(self, node: FakeNode, args: list[str]) -> str:
        key = args[-1].rsplit("/", 1)[-1]
        if key not in node.metadata:
            raise SshCommandFailed(node.ip, "curl", 22, "", "The requested URL returned 404")
        return node.metadata[key]

    def _rm(self, node: FakeNode, args: list[str]) -> str:
        for path in (a for a in args if not a.startswith("-")):
            node.files.pop(path, None)
        return ""

    def _sed(self, node: FakeNode, args: list[str]) -> str:
        self._need(node, args[1])
        match = re.fullmatch(r"s/\^\{\{SERVERS\}\}/(.*)/g", args[0], re.S)
        assert match, args[0]
        lines = match.group(1).replace("\\n", "\n")
        return node.files[args[1]].decode().replace("{{SERVERS}}", lines)

    def _test(self, node: FakeNode, args: list[str]) -> str:
        if args == ["-f", rules.ADMIN_CONF] and node.admin:
            return ""
        raise SshCommandFailed(node.ip, "test", 1, "", "")

    def _cat(self, node: FakeNode, args: list[str]) -> str:
        if args == [rules.ADMIN_CONF] and node.admin:
            return f"apiVersion: v1\nkind: Config\nclusters: [{{name: {node.name}}}]\n"
        raise SshCommandFailed(node.ip, "cat", 1, "", "No such file or directory")

    def _init(self, node: FakeNode, args: list[str]) -> str:
        script = "/tmp/k8s-init-etcd.sh" if len(args) > 7 else "/tmp/k8s-init.sh"
        self._need(node, script)
        self.inits[node.name] += 1
        if node.admin:
            raise SshCommandFailed(node.ip, "kubeadm init", 1, "", "admin.conf already exists")
        if self.init_without_success:
            return "[kubelet-check] Initial timeout of 40s passed."
        endpoint = f"{args[3]}:{args[5]}"
        serial = next(self._serial)
        cluster = FakeCluster(
            endpoint=endpoint,
            ca_hash=f"{serial:064x}",
            tokens={f"abcdef.{serial:016d}"},
            certificate_keys={f"{serial + 1000:064x}"},
            members={node.k8s_name: "control-plane"},
        )
        self.clusters.append(cluster)
        node.admin = True
        return INIT_OUTPUT.format(
            endpoint=endpoint,
            token=next(iter(cluster.tokens)),
            hash=cluster.ca_hash,
            key=next(iter(cluster.certificate_keys)),
        )

    def _kubeadm(self, node: FakeNode, args: list[str]) -> str:
        if args[:2] == ["token", "create"]:
            cluster = self._administered(node)
            token = f"fresh0.{next(self._serial):016d}"
            cluster.tokens.add(token)
            return (
                f"kubeadm join {cluster.endpoint} --token {token} "
                f"--discovery-token-ca-cert-hash sha256:{cluster.ca_hash} "
            )
        if args[:3] == ["init", "phase", "upload-certs"]:
            cluster = self._administered(node)
            key = f"{next(self._serial) + 5000:064x}"
            cluster.certificate_keys.add(key)
            return f"[upload-certs] Using certificate key:\n{key}"
        if args[:1] == ["join"]:
            return self._join(node, args[1:])
        raise SshCommandFailed(node.ip, "kubeadm", 1, "", "unsupported")

    def _join(self, node: FakeNode, args: list[str]) -> str:
        endpoint = args[0]
        options = dict(zip(args[1::2], args[2::2], strict=False))
        cluster = next(c for c in self.clusters if c.endpoint == endpoint)
        assert options["--token"] in cluster.tokens, options
        assert options["--discovery-token-ca-cert-hash"] == f"sha256:{cluster.ca_hash}"
        control_plane = "--control-plane" in args
        if control_plane:
            key = args[args.index("--certificate-key") + 1]
            assert key in cluster.certificate_keys, key
        if node.k8s_name in cluster.members:
            raise SshCommandFailed(node.ip, "kubeadm join", 1, "", "already a member")
        self.joins[node.name] += 1
        cluster.members[node.k8s_name] = "control-plane" if control_plane else "worker"
        node.admin = node.admin or control_plane
        return "This node has joined the cluster:\n* Certificate signing request was sent"

    def _administered(self, node: FakeNode) -> FakeCluster:
        cluster = self.cluster_of(node)
        if cluster is None or not node.admin:
            raise SshCommandFailed(node.ip, "kubectl", 1, "", "admin.conf: no such file")
        return cluster

    def _kubectl(self, node: FakeNode, args: list[str]) -> str:
        assert f"--kubeconfig={rules.ADMIN_CONF}" in args, args
        args = [a for a in args if not a.startswith("--kubeconfig")]
        cluster = self._administered(node)
        verb = args[0]
        if verb == "get":
            return "\n".join(f"node/{name}" for name in cluster.members)
        if verb in ("drain", "delete"):
            return self._remove(node, cluster, args)
        if verb in ("label", "annotate"):
            name = args[2]
            if name not in cluster.members:
                raise SshCommandFailed(node.ip, "kubectl", 1, "", f"nodes {name} not found")
            for pair in args[3:]:
                if "=" in pair:
                    key, _, value = pair.partition("=")
                    cluster.labels.setdefault(name, {})[key] = value
            return f"node/{name} labeled"
        if verb == "apply":
            cluster.applied.append(args[2])
            return "applied"
        if verb == "create" and args[1] == "secret":
            if args[3] in cluster.secrets:
                raise SshCommandFailed(node.ip, "kubectl", 1, "", "secrets exists: already exists")
            source = next(a for a in args if a.startswith("--from-file=")).rsplit("=", 1)[-1]
            self._need(node, source)
            cluster.secrets.append(args[3])
            return f"secret/{args[3]} created"
        raise SshCommandFailed(node.ip, "kubectl", 1, "", f"unknown {verb}")

    def _remove(self, node: FakeNode, cluster: FakeCluster, args: list[str]) -> str:
        if args[0] == "drain":
            if args[1] not in cluster.members:
                raise SshCommandFailed(node.ip, "kubectl", 1, "", "not found")
            cluster.drained.append(args[1])
            return "drained"
        if args[1] == "node":
            if cluster.members.pop(args[2], None) is None:
                raise SshCommandFailed(node.ip, "kubectl", 1, "", "not found")
            return "deleted"
        assert args[1:] == ["all", "--all"], args
        cluster.deleted_all += 1
        return "deleted"


def matches(pattern: str, command: str) -> bool:
    """A knob's pattern: a substring, or ``worker join`` (a join without --control-plane)."""
    if pattern == "worker join":
        return "kubeadm join" in command and "--control-plane" not in command
    return pattern in command


class FakeSsh:
    """``shared.ssh.Ssh`` over a ``Farm``: keys checked, host keys trusted on first use."""

    def __init__(self, farm: Farm, host_keys: HostKeys) -> None:
        self.farm = farm
        self.host_keys = host_keys
        self.sessions = 0

    def _reach(self, address: str, private_key: str) -> FakeNode:
        node = self.farm.nodes.get(address)
        if node is None:
            raise SshUnreachable(address, "no route to host")
        if node.unreachable:
            node.unreachable -= 1
            raise SshUnreachable(address, "connection refused")
        known = self.host_keys.known(address)
        if known is not None and known != node.host_key:
            raise SshHostKeyChanged(address, "mismatch")
        if private_key != node.key:
            raise SshDenied(address, "publickey")
        if known is None:
            self.host_keys.remember(address, node.host_key)
        return node

    async def run(
        self, address: str, command: str, *, username: str, private_key: str, port: int = 22
    ) -> str:
        assert username == "cb-user"
        node = self._reach(address, private_key)
        return self.farm.answer(node, command).rstrip("\n")

    async def upload(
        self,
        address: str,
        files: Mapping[str, bytes],
        *,
        username: str,
        private_key: str,
        port: int = 22,
        mode: int = 0o755,
    ) -> None:
        node = self._reach(address, private_key)
        self.farm.log.append((address, "upload " + " ".join(p.rsplit("/", 1)[-1] for p in files)))
        node.files.update(files)

    @contextlib.asynccontextmanager
    async def session(
        self, address: str, *, username: str, private_key: str, port: int = 22
    ) -> AsyncIterator[FakeSession]:
        assert username == "cb-user"
        node = self._reach(address, private_key)
        self.farm.sessions[address] += 1
        yield FakeSession(self.farm, node)


@dataclasses.dataclass
class FakeSession:
    farm: Farm
    node: FakeNode

    def _alive(self) -> FakeNode:
        if self.farm.nodes.get(self.node.ip) is not self.node:
            raise SshUnreachable(self.node.ip, "connection lost")
        return self.node

    async def run(self, command: str) -> str:
        return self.farm.answer(self._alive(), command).rstrip("\n")

    async def upload(self, files: Mapping[str, bytes], *, mode: int = 0o755) -> None:
        node = self._alive()
        self.farm.log.append((node.ip, "upload " + " ".join(p.rsplit("/", 1)[-1] for p in files)))
        node.files.update(files)


class FakeSpider:
    """CB-Spider's anycall in memory: calls recorded, region and connection info encrypted as
    Spider sends them, a refusal per function on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
        self.refuse: dict[str, str] = {}
        self.faults: list[BaseException] = []

    async def anycall(
        self, connection: str, function: str, inputs: Sequence[tuple[str, str]] = ()
    ) -> dict[str, str]:
        if self.faults:  # did not reach Spider: not a call it saw
            raise self.faults.pop(0)
        self.calls.append((connection, function, tuple(inputs)))
        if function in self.refuse:
            reason = self.refuse[function]
            raise TumblebugRefused(f"Reason: {reason}", message=f"Reason: {reason}")
        if function == spider.GET_REGION_INFO:
            return _sealed({"Region": "ap-northeast-2", "Zone": "ap-northeast-2a"})
        if function == spider.GET_CONNECTION_INFO:
            return _sealed(OPENSTACK_INFO)
        return {"Result": "true"}

    def of(self, function: str) -> list[tuple[str, ...]]:
        return [tuple(v for _, v in i) for _, f, i in self.calls if f == function]


OPENSTACK_INFO = {
    "IdentityEndpoint": "http://keystone:5000/v3",
    "Username": "admin",
    "Password": "s3cr'et",
    "ProjectID": "p-1",
    "DomainName": "Default",
}


def _sealed(values: Mapping[str, str]) -> dict[str, str]:
    return {k: spider.conceal(v, bytes(16)) for k, v in values.items()}


# --- the rig ----------------------------------------------------------------------------------


class FinalizingKube(FakeKube):
    """Deletes as the API server does: an object with finalizers only gets a deletionTimestamp."""

    async def delete(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        stored = self.stored(kind, namespace, name)
        if stored is not None and stored["metadata"].get("finalizers"):
            self._called("delete", kind, namespace, name)
            stored["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            return copy.deepcopy(stored)
        return await super().delete(kind, namespace, name)


@dataclasses.dataclass
class Rig:
    kube: FinalizingKube
    bus: FakeBus
    tb: FakeTumblebug
    farm: Farm
    deps: Deps
    applied: int = 0
    spider: FakeSpider = dataclasses.field(default_factory=FakeSpider)

    def fresh(self) -> None:
        """A new replica: the same world, an empty memory."""
        self.deps = make_deps(self.kube, self.bus, self.tb, self.farm, self.spider)

    def obj(self, name: str = "c1") -> Json:
        found = self.kube.stored(LADYBUG_CLUSTER, K8S_NS, logic.object_name(TBNS, name))
        assert found is not None, name
        return found

    def status(self, name: str = "c1") -> Json:
        return dict(self.obj(name).get("status") or {})

    def nodes(self, name: str = "c1") -> dict[str, Json]:
        return {n["name"]: n for n in self.status(name).get("nodes") or []}

    async def once(self, name: str = "c1", *, write: bool = True) -> None:
        target = Target(LADYBUG_CLUSTER, K8S_NS, logic.object_name(TBNS, name))
        try:
            await handlers.run({target: CAUSE}, self.deps)
        finally:
            if write:
                self.write_status()

    async def settle(self, name: str = "c1", rounds: int = 4) -> None:
        """Runs as the events of each run's own reports would cause them."""
        for _ in range(rounds):
            await self.once(name)

    def write_status(self) -> None:
        """The writer's part: merge every new status patch into its object."""
        patches = self.bus.of(PatchStatus)
        for message in patches[self.applied :]:
            stored = self.kube.stored(LADYBUG_CLUSTER, K8S_NS, message.ref.name)
            if stored is None:
                continue
            status = merge(stored.get("status") or {}, dict(message.patch))
            merged = {c["type"]: c for c in status.get("conditions") or []}
            merged |= {c.type: c.model_dump() for c in message.conditions}
            if merged:
                status["conditions"] = list(merged.values())
            stored["status"] = status
        self.applied = len(patches)

    def drop_unwritten(self) -> None:
        """The writer never got to the patches published so far."""
        self.applied = len(self.bus.of(PatchStatus))

    def secret(self, name: str) -> Json | None:
        return self.kube.stored(SECRET, K8S_NS, name)


def make_deps(
    kube: FakeKube, bus: FakeBus, tb: FakeTumblebug, farm: Farm, sp: FakeSpider | None = None
) -> Deps:
    settings = ProvisionerSettings(ladybug={"ssh_retry_seconds": 0, "ssh_attempts": 3})
    return dependencies(
        settings,
        bus=bus,
        kube=kube,
        tumblebug=tb,
        spider=sp or FakeSpider(),
        connect=lambda keys: FakeSsh(farm, keys),
    )


@pytest.fixture
def rig() -> Rig:
    kube, bus, tb, farm, sp = FinalizingKube(), FakeBus(), FakeTumblebug(), Farm(), FakeSpider()
    tb.farm = farm
    return Rig(kube, bus, tb, farm, make_deps(kube, bus, tb, farm, sp), spider=sp)


def request(
    name: str = "c1",
    *,
    control_planes: int = 1,
    workers: int = 2,
    connection: str = "aws-conn",
    spec: str = "t3.medium",
    **kubernetes: Any,
) -> Json:
    return logic.with_defaults(
        {
            "name": name,
            "controlPlane": [{"connection": connection, "count": control_planes, "spec": spec}],
            "worker": [{"connection": connection, "count": workers, "spec": spec}],
            "config": {"kubernetes": kubernetes},
        }
    )


def create(rig: Rig, req: Json | None = None) -> Json:
    obj = logic.cluster_object(K8S_NS, TBNS, req or request())
    return rig.kube.put(LADYBUG_CLUSTER, obj)


def leader_cluster(rig: Rig, name: str = "c1") -> FakeCluster:
    leader = rig.status(name)["cpLeader"]
    found = rig.farm.cluster_of(rig.farm.by_name(leader))
    assert found is not None
    return found


def assert_no_private_key_on_the_bus(rig: Rig) -> None:
    for _, message in rig.bus.published:
        text = message.model_dump_json()
        assert "PRIVATE-KEY" not in text
        assert "certificate-key" not in text


# --- create -----------------------------------------------------------------------------------


async def test_create_provisions_one_control_plane_and_two_workers(rig: Rig) -> None:
    create(rig)
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned"
    assert (status["reason"], status["message"]) == ("", "")
    assert status["observedGeneration"] == 1
    assert status["k8sVersion"] == "1.23.13-00"
    assert status["mcis"] == "c1"
    assert status["createdTime"]
    spec = rig.obj()["spec"]
    cp_group = spec["controlPlane"][0]["id"]
    assert status["cpGroup"] == cp_group
    assert status["cpLeader"] == f"{cp_group}-1"
    nodes = rig.nodes()
    assert len(nodes) == 3
    assert all(n["bootstrapped"] and n["joined"] for n in nodes.values())
    assert [n["role"] for n in status["nodes"]] == ["control-plane", "worker", "worker"]
    assert all("credential" not in n for n in status["nodes"])
    worker = nodes[f"{spec['worker'][0]['id']}-1"]
    assert worker["cspLabel"] == "topology.cloud-barista.github.io/csp=aws"
    assert worker["regionLabel"] == "topology.kubernetes.io/region=ap-northeast-2"
    assert worker["zoneLabel"] == "topology.kubernetes.io/zone=ap-northeast-2a"
    assert FINALIZER in rig.obj()["metadata"]["finalizers"]

    # one MCIS with upstream's labels, one subgroup per worker, marked as ours
    assert rig.tb.count("create_mcis") == 1
    body = rig.tb.calls[[m for m, _ in rig.tb.calls].index("create_mcis")][1][1]
    assert (body["label"], body["systemLabel"]) == ("mcks", "Managed by MCKS")
    assert rules.OWNER_MARK + rig.obj()["metadata"]["uid"] in body["description"]
    assert [vm["name"] for vm in body["vm"]] == [cp_group] + [w["id"] for w in spec["worker"]]
    assert body["vm"][0]["vmUserAccount"] == "cb-user"
    # MCIR by upstream's deterministic names
    assert ("ns01", "vNet", "aws-conn-vpc") in rig.tb.resources
    assert ("ns01", "securityGroup", "aws-conn-sg") in rig.tb.resources
    assert ("ns01", "sshKey", "aws-conn-sshkey") in rig.tb.resources
    assert ("ns01", "image", "aws-conn-ubuntu1804") in rig.tb.resources
    assert ("ns01", "spec", "aws-conn-t3-medium-spec") in rig.tb.resources

    # kubeadm: one init, everyone joined once, haproxy before, labels and CNI after
    cluster = leader_cluster(rig)
    assert sum(rig.farm.inits.values()) == 1
    assert set(cluster.members) == set(nodes)
    assert all(rig.farm.joins[n] == 1 for n in nodes if n != status["cpLeader"])
    leader = rig.farm.by_name(status["cpLeader"])
    assert leader.haproxy == [
        f"{status['cpLeader']}  {nodes[status['cpLeader']]['privateIp']}:6443"
    ]
    assert cluster.endpoint.endswith(":9998")
    assert cluster.labels[worker["name"]]["kubernetes.io/cluster"] == "c1"
    assert cluster.labels[worker["name"]]["kilo.squat.ai/persistent-keepalive"] == "25"
    assert len(cluster.applied) == 3  # kilo: CRDs, kilo, flannel
    bootstrap = rig.farm.commands("/tmp/bootstrap.sh")
    assert any(
        f"/tmp/bootstrap.sh 1.23.13-00 aws {worker['name']} {worker['publicIp']} kilo multi" == c
        for _, c in bootstrap
    )

    # one SSH connection per node for the whole create
    assert rig.farm.sessions == dict.fromkeys((n["publicIp"] for n in nodes.values()), 1)

    # the Secrets: the sshKey's private key, the admin kubeconfig; nothing secret on the bus
    key = rig.secret(sshkey_secret_name(TBNS, "aws-conn"))
    assert key is not None
    assert key["data"]["privateKey"]
    kubeconfig = rig.secret(kubeconfig_secret_name(rig.obj()["metadata"]["name"]))
    assert kubeconfig is not None
    assert kubeconfig["data"]["value"]
    assert kubeconfig["metadata"]["labels"] == logic.labels(TBNS, "c1")
    assert_no_private_key_on_the_bus(rig)


async def test_a_provisioned_generation_is_not_looked_at_again(rig: Rig) -> None:
    create(rig)
    await rig.settle()
    commands, calls = len(rig.farm.log), len(rig.tb.calls)

    await rig.settle()
    rig.fresh()  # a replica with an empty memory reads the status
    await rig.settle()

    assert (len(rig.farm.log), len(rig.tb.calls)) == (commands, calls)


async def test_runs_queued_behind_the_last_report_do_nothing(rig: Rig) -> None:
    create(rig)
    await rig.once(write=False)  # the writer has not written Provisioned yet
    commands = len(rig.farm.log)
    await rig.once()
    assert len(rig.farm.log) == commands
    assert rig.status()["phase"] == "Provisioned"


async def test_external_etcd_with_three_control_planes(rig: Rig) -> None:
    create(rig, request(control_planes=3, workers=1, etcd="external"))
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned", status
    planes = [n for n in status["nodes"] if n["role"] == "control-plane"]
    assert len(planes) == 3
    assert len(rig.farm.commands("/tmp/etcd-ca.sh")) == 1
    assert len(rig.farm.commands("/tmp/etcd-conf.sh")) == 3
    assert len(rig.farm.commands("cb-user@")) == 3
    init = rig.farm.commands("./k8s-init-etcd.sh")
    assert len(init) == 1
    assert all(n["privateIp"] in init[0][1] for n in planes)
    cluster = leader_cluster(rig)
    assert sorted(cluster.members.values()) == ["control-plane"] * 3 + ["worker"]
    assert len(rig.farm.by_name(status["cpLeader"]).haproxy) == 3
    leader = rig.farm.by_name(status["cpLeader"])
    assert "/home/cb-user/.ssh/id_rsa" in leader.files
    assert "/tmp/etcd-ca.sh" in leader.files


async def test_nlb_in_front_of_the_control_plane(rig: Rig) -> None:
    create(rig, request(loadbalancer="nlb"))
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned"
    (nlb,) = rig.tb.nlbs.values()
    assert nlb["name"] == status["cpGroup"]
    assert nlb["listener"] == {"protocol": "TCP", "port": "6443"}
    assert nlb["targetGroup"]["subGroupId"] == status["cpGroup"]
    assert nlb["healthChecker"]["port"] == "22"
    assert leader_cluster(rig).endpoint.endswith(":6443")
    assert rig.farm.commands("/etc/haproxy/haproxy.cfg") == []


async def test_nodes_are_bootstrapped_at_most_bootstrap_parallel_at_a_time(rig: Rig) -> None:
    rig.deps = dataclasses.replace(
        rig.deps, tuning=dataclasses.replace(rig.deps.tuning, bootstrap_parallel=2)
    )
    create(rig, request(workers=4))
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    assert sum(rig.farm.bootstraps.values()) == 5


async def test_a_node_slow_to_accept_ssh_is_tried_again(rig: Rig) -> None:
    create(rig)
    original = rig.farm.boot

    def slow_boot(ip: str, name: str, key: str) -> None:
        original(ip, name, key)
        rig.farm.nodes[ip].unreachable = 2

    rig.farm.boot = slow_boot  # type: ignore[method-assign]
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"


async def test_tumblebug_unavailable_is_retried_and_never_makes_two_mcis(rig: Rig) -> None:
    create(rig)
    rig.tb.fail("create_mcis", TumblebugUnavailable("boom", status=None))
    with pytest.raises(TemporaryError):
        await rig.once()
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    assert len(rig.tb.mcis) == 1


# --- resuming after a crash -------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [
        "tumblebug:create_mcis",
        "ssh:/tmp/bootstrap.sh",
        "ssh:haproxy.cfg",
        "ssh:k8s-init.sh",
        "ssh:cat /etc/kubernetes/admin.conf",
        "ssh:kubeadm join",
        "ssh:label nodes",
        "ssh:apply -f",
    ],
)
@pytest.mark.parametrize("writer_lags", [False, True])
async def test_a_replica_killed_anywhere_resumes_with_one_mcis_and_one_init(
    rig: Rig, where: str, writer_lags: bool
) -> None:
    create(rig, request(control_planes=3, workers=2))
    side, _, what = where.partition(":")
    if side == "tumblebug":
        rig.tb.crash_after.add(what)
    else:
        rig.farm.crash_before[what] = 1 if what == "kubeadm join" else 0

    with pytest.raises(Crash):
        await rig.once(write=not writer_lags)
    if writer_lags:
        rig.drop_unwritten()
    rig.fresh()
    await rig.settle()

    status = rig.status()
    assert status["phase"] == "Provisioned", status
    assert rig.tb.count("create_mcis") == 1
    assert len(rig.tb.mcis) == 1
    assert sum(rig.farm.inits.values()) == 1
    assert all(count == 1 for count in rig.farm.joins.values()), rig.farm.joins
    cluster = leader_cluster(rig)
    assert set(cluster.members) == set(rig.nodes())
    assert all(n["bootstrapped"] and n["joined"] for n in rig.nodes().values())
    assert rig.secret(kubeconfig_secret_name(rig.obj()["metadata"]["name"])) is not None


async def test_a_run_that_made_the_vms_asks_nothing_about_them(rig: Rig) -> None:
    create(rig)
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    # nothing could have run on VMs this run made: no probe, no init check, no node listing
    assert rig.farm.commands("systemctl is-enabled") == []
    assert rig.farm.commands("test -f") == []
    assert rig.farm.commands("get nodes") == []


async def test_a_run_after_a_crash_asks_the_vms_it_did_not_make(rig: Rig) -> None:
    create(rig)
    rig.farm.crash_before["/tmp/bootstrap.sh"] = 1
    with pytest.raises(Crash):
        await rig.once()
    unreported = [n for n in rig.nodes().values() if not n["bootstrapped"]]
    assert unreported
    rig.fresh()
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    # the new replica did not make these VMs: each it knows nothing of is asked
    assert len(rig.farm.commands("systemctl is-enabled")) == len(unreported)
    assert len(rig.farm.commands("test -f")) == 1
    assert sum(rig.farm.bootstraps.values()) == 3
    assert sum(rig.farm.inits.values()) == 1


async def test_a_resumed_run_trusts_the_reported_progress(rig: Rig) -> None:
    create(rig)
    rig.farm.crash_before["label nodes"] = 0
    with pytest.raises(Crash):
        await rig.once()
    rig.fresh()
    probes = len(rig.farm.commands("systemctl is-enabled"))
    tests = len(rig.farm.commands("test -f"))
    listings = len(rig.farm.commands("get nodes"))
    await rig.settle()
    assert rig.status()["phase"] == "Provisioned"
    # every node was reported bootstrapped and joined: none is asked again
    assert len(rig.farm.commands("systemctl is-enabled")) == probes
    assert len(rig.farm.commands("test -f")) == tests
    assert len(rig.farm.commands("get nodes")) == listings


# --- failures ---------------------------------------------------------------------------------


async def assert_failed(rig: Rig, reason: str, *, mcis_left: int = 0) -> Json:
    status = rig.status()
    assert status["phase"] == "Failed", status
    assert status["reason"] == reason, status
    assert status["message"]
    assert status["observedGeneration"] == 1
    assert len(rig.tb.mcis) == mcis_left
    assert any(c["type"] == "MCISRemoved" and c["status"] == "True" for c in status["conditions"])
    # a failed cluster is not retried by the provisioner, and keeps its entity
    calls, commands = len(rig.tb.calls), len(rig.farm.log)
    rig.fresh()
    await rig.settle()
    assert (len(rig.tb.calls), len(rig.farm.log)) == (calls, commands)
    assert rig.status()["phase"] == "Failed"
    return status


async def test_a_missing_namespace_fails(rig: Rig) -> None:
    rig.tb.namespaces.clear()
    create(rig)
    await rig.settle()
    status = await assert_failed(rig, "NamespaceNotFoundReason")
    assert status["message"] == "Could not be found a namespace. (namespace=ns01)"


async def test_an_mcis_that_is_not_ours_fails_and_is_left_alone(rig: Rig) -> None:
    rig.tb.mcis[(TBNS, "c1")] = {"name": "c1", "description": "someone's", "vm": []}
    create(rig)
    await rig.settle()
    status = await assert_failed(rig, "AlreadyExistMCISFailedReason", mcis_left=1)
    assert status["message"] == "MCIS already exists. (namespace=ns01, mcis=c1)"
    assert rig.tb.count("control_terminate") == 0


@pytest.mark.parametrize(
    ("arrange", "message"),
    [
        (lambda tb: tb.connections.pop("aws-conn"), "Connection does not exist. (aws-conn)"),
        (
            lambda tb: tb.connections["aws-conn"].update(ProviderName="Mars"),
            "The CSP 'Mars' is not supported",
        ),
        (lambda tb: tb.regions.pop("aws-r"), "Region does not exist (aws-r)"),
        (
            lambda tb: tb.specs.pop("t3.medium"),
            "Could not be found a spec 't3.medium'. (connection=aws-conn, csp=aws)",
        ),
    ],
)
async def test_invalid_mcir(rig: Rig, arrange: Any, message: str) -> None:
    arrange(rig.tb)
    create(rig)
    await rig.settle()
    status = await assert_failed(rig, "InvalidMCIRReason")
    assert status["message"] == message
    assert rig.tb.count("create_mcis") == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("t3.small", "Kubernetes control plane node needs 2 cpu at least."),
        ("t3.nano", "kubernetes node needs 2 GiB or more of RAM."),
    ],
)
async def test_a_spec_too_small_is_invalid(rig: Rig, spec: str, message: str) -> None:
    create(rig, request(spec=spec))
    await rig.settle()
    status = await assert_failed(rig, "InvalidMCIRReason")
    assert status["message"].startswith(message)


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("create_vNet", "CreateVpcFailedReason"),
        ("create_securityGroup", "CreateSecurityGroupFailedReason"),
        ("create_sshKey", "CreateSSHKeyFailedReason"),
        ("create_image", "CreateVmImageFailedReason"),
        ("create_spec", "CreateVmSpecFailedReason"),
        ("create_mcis", "CreateMCISFailedReason"),
        ("create_nlb", "CreateNLBFailedReason"),
        ("get_mcis", "GetMCISFailedReason"),
    ],
)
@pytest.mark.parametrize("status_code", [400, 500])
async def test_tumblebug_refusals_fail_with_upstreams_reason(
    rig: Rig, method: str, reason: str, status_code: int
) -> None:
    error: Exception = (
        TumblebugRefused("refused", status=400, message="CSP said no")
        if status_code == 400
        else TumblebugUnavailable("500", status=500, message="CSP said no")
    )
    rig.tb.fail(method, error)
    create(rig, request(loadbalancer="nlb"))
    await rig.settle()
    status = await assert_failed(rig, reason)
    assert "CSP said no" in status["message"]


@pytest.mark.parametrize(
    ("knob", "message"),
    [
        ("failed", "Failed to create a vm (status=Failed, cause='quota exceeded')"),
        ("no ip", "Failed to create a vm (status=Running, cause='unbounded public-ip')"),
    ],
)
async def test_a_vm_that_cannot_be_a_node_fails_and_is_cleaned_up(
    rig: Rig, knob: str, message: str
) -> None:
    obj = create(rig)
    vm = f"{obj['spec']['worker'][1]['id']}-1"
    if knob == "failed":
        rig.tb.failed_vms[vm] = "quota exceeded"
    else:
        rig.tb.without_public_ip.add(vm)
    await rig.settle()
    status = await assert_failed(rig, "AddNodeEntityFailedReason")
    assert status["message"] == message
    assert rig.tb.count("control_terminate") == 1


@pytest.mark.parametrize(
    ("knob", "reason"),
    [
        ("/tmp/bootstrap.sh", "SetupBoostrapFailedReason"),
        ("haproxy.cfg", "SetupHaproxyFailedReason"),
        ("/tmp/etcd-ca.sh", "InitExternalEtcdFailedReason"),
        ("k8s-init-etcd.sh", "InitControlPlaneFailedReason"),
        ("--control-plane", "JoinControlPlaneFailedReason"),
        ("worker join", "JoinWorkerFailedReason"),
        ("apply -f", "SetupNetworkCNIFailedReason"),
        ("deploy_v4.0.16.sh", "SetupStorageClassFailedReason"),
    ],
)
async def test_node_failures_fail_with_upstreams_reason_and_clean_up(
    rig: Rig, knob: str, reason: str
) -> None:
    req = request(control_planes=3, workers=1, etcd="external")
    req["config"]["kubernetes"]["storageclass"] = {"nfs": {"server": "10.1.1.1", "path": "/x"}}
    create(rig, req)
    rig.farm.fail_always[knob] = 1
    await rig.settle()
    status = await assert_failed(rig, reason)
    assert all(n["publicIp"] == "" for n in status["nodes"])
    assert rig.farm.nodes == {}


async def test_init_without_the_success_sentence_fails(rig: Rig) -> None:
    create(rig)
    rig.farm.init_without_success = True
    await rig.settle()
    status = await assert_failed(rig, "InitControlPlaneFailedReason")
    assert "control plane init failed" in status["message"]


async def test_a_node_never_reachable_fails_bootstrap(rig: Rig) -> None:
    create(rig)
    original = rig.farm.boot

    def dead_boot(ip: str, name: str, key: str) -> None:
        original(ip, name, key)
        rig.farm.nodes[ip].unreachable = 100

    rig.farm.boot = dead_boot  # type: ignore[method-assign]
    await rig.settle()
    status = await assert_failed(rig, "SetupBoostrapFailedReason")
    assert "SSH connection retry count has exceeded" in status["message"]


async def test_a_node_refusing_the_key_fails_bootstrap(rig: Rig) -> None:
    create(rig)
    original = rig.farm.boot
    rig.farm.boot = lambda ip, name, key: original(ip, name, "another key")  # type: ignore[method-assign]
    await rig.settle()
    await assert_failed(rig, "SetupBoostrapFailedReason")


async def test_cleanup_refines_when_tumblebug_refuses_the_delete(rig: Rig) -> None:
    create(rig)
    rig.farm.fail_always["/tmp/bootstrap.sh"] = 100
    rig.tb.fail("delete_mcis", TumblebugUnavailable("500", status=500, message="not yet"))
    await rig.settle()
    await assert_failed(rig, "SetupBoostrapFailedReason")
    assert rig.tb.count("control_refine") == 1
    assert rig.tb.count("delete_mcis") == 2


async def test_a_cleanup_interrupted_is_finished_by_the_next_run(rig: Rig) -> None:
    create(rig)
    rig.farm.fail_always["/tmp/bootstrap.sh"] = 100
    rig.tb.fail("control_terminate", TumblebugUnavailable("down", status=None))
    with pytest.raises(TemporaryError):
        await rig.once()
    assert rig.status()["phase"] == "Failed"
    assert len(rig.tb.mcis) == 1
    rig.fresh()
    await rig.settle()
    await assert_failed(rig, "SetupBoostrapFailedReason")


# --- shared cloud resources -------------------------------------------------------------------


class RacingTumblebug(FakeTumblebug):
    """Answers after a pause, as the real one does, and refuses a taken MCIR name (500)."""

    async def get_resource(self, namespace: str, kind: str, name: str) -> Json | None:
        await asyncio.sleep(0)
        return await super().get_resource(namespace, kind, name)

    async def create_resource(self, namespace: str, kind: str, body: Json) -> Json:
        await asyncio.sleep(0)
        if (namespace, kind, body["name"]) in self.resources:
            raise TumblebugUnavailable(
                "taken", status=500, message=f"The {kind} {body['name']} already exists."
            )
        return await super().create_resource(namespace, kind, body)


@pytest.fixture
def racing() -> Rig:
    kube, bus, tb, farm = FinalizingKube(), FakeBus(), RacingTumblebug(), Farm()
    tb.farm = farm
    return Rig(kube, bus, tb, farm, make_deps(kube, bus, tb, farm))


async def test_clusters_created_together_share_one_set_of_cloud_resources(racing: Rig) -> None:
    names = ["c1", "c2", "c3"]
    for name in names:
        create(racing, request(name))
    await asyncio.gather(*(racing.once(name, write=False) for name in names))
    racing.write_status()
    for name in names:
        await racing.settle(name)
        assert racing.status(name)["phase"] == "Provisioned", racing.status(name)
    for kind in ("vNet", "securityGroup", "sshKey", "spec"):
        assert racing.tb.count(f"create_{kind}") == 1, kind


async def test_a_resource_another_replica_made_meanwhile_is_used(racing: Rig) -> None:
    create(racing, request())
    names = rules.McirNames("aws-conn", "t3.medium")
    made_elsewhere = {"name": names.security_group, "connectionName": "aws-conn"}
    original = racing.tb.get_resource
    looked = False

    async def get_then_lose_the_race(namespace: str, kind: str, name: str) -> Json | None:
        nonlocal looked
        found = await original(namespace, kind, name)
        if kind == "securityGroup" and not looked:
            looked = True  # another replica creates it right after our look
            await racing.tb.create_resource(namespace, kind, made_elsewhere)
        return found

    racing.tb.get_resource = get_then_lose_the_race  # type: ignore[method-assign]
    await racing.settle()
    assert racing.status()["phase"] == "Provisioned", racing.status()
