"""The SSH node farm with real sshd processes, driven through ``shared.ssh.SshClient``.

One farm serves the module; every test takes fresh loopback addresses (a random
``127.x.y.0/24`` per run, so parallel runs and other suites' nodes do not collide) and VM
names unique to the run, as all share the stack's one workload API server.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from itertools import count

import asyncssh
import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig
from shared.resources import NODE
from shared.ssh import (
    MemoryHostKeys,
    SshClient,
    SshCommandFailed,
    SshDenied,
    SshHostKeyChanged,
    SshUnreachable,
)
from standins.sshnodes.farm import NodeFarm
from standins.sshnodes.node import NodeKnobs
from testenv.harness import LocalStack
from tests.integration.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

KEY = asyncssh.generate_private_key("ssh-ed25519")
PRIVATE = KEY.export_private_key().decode()
PUBLIC = KEY.export_public_key().decode()
USER = "cb-user"
RUN = uuid.uuid4().hex[:5]
ADMIN = "--kubeconfig=/etc/kubernetes/admin.conf"
SUCCESS = "Your Kubernetes control-plane has initialized successfully"


def _free(address: str) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, 22))
        except OSError:
            return False
    return True


def _addresses() -> Iterator[str]:
    while True:
        prefix = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
        if _free(f"{prefix}.2"):
            break
    for last in count(2):
        yield f"{prefix}.{last}"


ADDRESSES = _addresses()


@pytest.fixture(scope="module")
async def farm(
    stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[NodeFarm]:
    nodes = NodeFarm(tmp_path_factory.mktemp("sshnodes"), stack.workload(), knobs=NodeKnobs())
    yield nodes
    await nodes.close()


@pytest.fixture(scope="module")
async def workload(stack: LocalStack) -> AsyncIterator[KubeClient]:
    client = KubeClient.from_config(KubeConfig.load(stack.workload()), qps=None)
    yield client
    await client.aclose()


@pytest.fixture
def ssh() -> SshClient:
    return SshClient(MemoryHostKeys(), connect_timeout=5)


async def vm(farm: NodeFarm, role: str = "w", **knobs: int | bool) -> tuple[str, str]:
    """A started node: (VM name, address)."""
    address = next(ADDRESSES)
    name = f"{role}-{address.rsplit('.', 1)[1]}-{RUN}-1"
    await farm.start(name, address, PUBLIC, knobs=NodeKnobs(**knobs))  # type: ignore[arg-type]
    return name, address


async def run(ssh: SshClient, address: str, command: str) -> str:
    return await ssh.run(address, command, username=USER, private_key=PRIVATE)


async def bootstrap(ssh: SshClient, name: str, address: str, *scripts: str) -> str:
    files = {f"/tmp/{s}": f"#!/bin/bash\n# {s}\n".encode() for s in ("bootstrap.sh", *scripts)}
    await ssh.upload(address, files, username=USER, private_key=PRIVATE)
    return await run(ssh, address, f"/tmp/bootstrap.sh 1.23.13-00 aws {name} {address} kilo multi")


def joins(output: str) -> tuple[str, str]:
    """Upstream's extraction: the join line, the hash line, the certificate key line."""
    join = re.search(r"kubeadm join (\S+) --token (\S+)", output)
    digest = re.search(r"--discovery-token-ca-cert-hash (\S+)", output)
    key = re.search(r"--control-plane --certificate-key (\S+)", output)
    assert join, output
    assert digest, output
    assert key, output
    worker = f"kubeadm join {join[1]} --token {join[2]} --discovery-token-ca-cert-hash {digest[1]}"
    return f"{worker} --control-plane --certificate-key {key[1]}", worker


async def node_names(workload: KubeClient) -> set[str]:
    items, _ = await workload.list(NODE)
    return {i["metadata"]["name"] for i in items if RUN in i["metadata"]["name"]}


async def test_run_and_upload_over_one_session(farm: NodeFarm, ssh: SshClient) -> None:
    name, address = await vm(farm)
    assert await run(ssh, address, "/bin/hostname") == name
    async with ssh.session(address, username=USER, private_key=PRIVATE) as session:
        assert await session.run("mkdir -p /tmp/addons/kilo") == ""
        await session.upload({"/tmp/addons/kilo/kilo.yaml": b"kind: DaemonSet\n"}, mode=0o644)
        await session.upload({"/tmp/a.sh": b"#!/bin/sh\n", "/tmp/b.sh": b"\0binary\xff"})
        assert await session.run("cat /tmp/addons/kilo/kilo.yaml") == "kind: DaemonSet"
        probe = await session.result("test -f /etc/kubernetes/admin.conf")
        assert probe.exit_status == 1
    assert farm.file(address, "/tmp/b.sh") == b"\0binary\xff"
    with pytest.raises(SshCommandFailed) as caught:
        await run(ssh, address, "shutdown -h now")
    assert caught.value.exit_status == 127
    assert "command not found" in caught.value.stderr
    with pytest.raises(SshCommandFailed, match="No such file"):
        await ssh.upload(address, {"/nope/x": b"x"}, username=USER, private_key=PRIVATE)
    assert farm.commands(address)[0]["command"] == "/bin/hostname"


async def test_another_key_or_user_is_denied(farm: NodeFarm, ssh: SshClient) -> None:
    _, address = await vm(farm)
    other = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    with pytest.raises(SshDenied):
        await ssh.run(address, "/bin/hostname", username=USER, private_key=other)
    with pytest.raises(SshDenied):
        await ssh.run(address, "/bin/hostname", username="root", private_key=PRIVATE)


async def test_host_key_pinned_after_first_contact(farm: NodeFarm) -> None:
    keys = MemoryHostKeys()
    ssh = SshClient(keys, connect_timeout=5)
    name, address = await vm(farm)
    await run(ssh, address, "/bin/hostname")
    assert keys.known(address) == farm.host_key(address)
    await run(ssh, address, "/bin/hostname")
    await farm.start(name, address, PUBLIC, knobs=NodeKnobs())  # the VM rebuilt: a new key
    with pytest.raises(SshHostKeyChanged):
        await run(ssh, address, "/bin/hostname")


async def test_nobody_listening_is_unreachable(ssh: SshClient) -> None:
    with pytest.raises(SshUnreachable):
        await run(ssh, next(ADDRESSES), "/bin/hostname")


async def test_bootstrap_init_join_make_ready_nodes(
    farm: NodeFarm, ssh: SshClient, workload: KubeClient, stack: LocalStack
) -> None:
    (lead, lead_ip), (cp2, cp2_ip), (w1, w1_ip), (w2, w2_ip) = [
        await vm(farm, "c"),
        await vm(farm, "c"),
        await vm(farm),
        await vm(farm),
    ]
    await asyncio.gather(
        bootstrap(ssh, lead, lead_ip, "k8s-init.sh", "haproxy.sh"),
        bootstrap(ssh, cp2, cp2_ip),
        bootstrap(ssh, w1, w1_ip),
        bootstrap(ssh, w2, w2_ip),
    )
    output = await run(
        ssh,
        lead_ip,
        f"cd /tmp;./k8s-init.sh 10.244.0.0/16 10.96.0.0/12 cluster.local {lead_ip} {lead_ip} "
        "9998 multi",
    )
    assert SUCCESS in output
    admin = await run(ssh, lead_ip, "sudo cat /etc/kubernetes/admin.conf")
    assert admin == stack.workload().read_text().rstrip("\n")  # the workload API server's
    cp_join, worker_join = joins(output)
    assert "This node has joined the cluster" in await run(ssh, cp2_ip, f"sudo {cp_join}")
    assert "This node has joined the cluster" in await run(ssh, w1_ip, f"sudo {worker_join}")
    fresh = await run(ssh, lead_ip, "sudo kubeadm token create --print-join-command")
    assert "This node has joined the cluster" in await run(ssh, w2_ip, f"sudo {fresh}")
    for address in (cp2_ip, w1_ip, w2_ip):
        await run(ssh, address, "sudo systemctl restart mcks-bootstrap")

    nodes = {n["metadata"]["name"]: n for n in (await workload.list(NODE))[0]}
    for name in (lead, cp2, w1, w2):
        ready = [c for c in nodes[name]["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
    assert "node-role.kubernetes.io/control-plane" in nodes[cp2]["metadata"]["labels"]
    assert "node-role.kubernetes.io/control-plane" not in nodes[w1]["metadata"]["labels"]

    listed = await run(ssh, lead_ip, f"sudo kubectl get nodes -o name {ADMIN}")
    assert set(listed.splitlines()) == {f"node/{n}" for n in (lead, cp2, w1, w2)}
    await run(ssh, lead_ip, f"sudo kubectl label nodes {w1} kubernetes.io/cluster=k1 {ADMIN}")
    await run(ssh, lead_ip, f"sudo kubectl annotate nodes {w1} kilo.squat.ai/location={w1} {ADMIN}")
    labelled = await workload.get(NODE, None, w1)
    assert labelled["metadata"]["labels"]["kubernetes.io/cluster"] == "k1"
    assert labelled["metadata"]["annotations"]["kilo.squat.ai/location"] == w1

    await run(ssh, lead_ip, f"sudo kubectl drain {w2} --ignore-daemonsets --force {ADMIN}")
    assert (await workload.get(NODE, None, w2))["spec"]["unschedulable"] is True
    await run(ssh, lead_ip, f"sudo kubectl delete node {w2} {ADMIN}")
    with pytest.raises(KubeNotFound):
        await workload.get(NODE, None, w2)
    with pytest.raises(SshCommandFailed, match="NotFound"):
        await run(ssh, lead_ip, f"sudo kubectl delete node {w2} {ADMIN}")
    await run(ssh, lead_ip, f"sudo kubectl delete all --all {ADMIN}")

    for address in (lead_ip, cp2_ip, w1_ip, w2_ip):  # the MCIS terminated
        await farm.stop(address)
    remaining = await node_names(workload)
    assert not remaining & {lead, cp2, w1, w2}


async def test_bootstrap_failure_knob(farm: NodeFarm, ssh: SshClient) -> None:
    name, address = await vm(farm, bootstrap_fail=True)
    with pytest.raises(SshCommandFailed) as caught:
        await bootstrap(ssh, name, address)
    assert caught.value.exit_status == 100
    await farm.set_knobs(address, NodeKnobs())
    assert "installed" in await bootstrap(ssh, name, address)


async def test_init_without_success_knob(farm: NodeFarm, ssh: SshClient) -> None:
    name, address = await vm(farm, "c", init_without_success=True)
    await bootstrap(ssh, name, address, "k8s-init.sh")
    output = await run(ssh, address, f"cd /tmp;./k8s-init.sh a b c {address} {address} 9998 multi")
    assert SUCCESS not in output
    with pytest.raises(SshCommandFailed):
        await run(ssh, address, "sudo cat /etc/kubernetes/admin.conf")


async def test_join_failure_knob(farm: NodeFarm, ssh: SshClient, workload: KubeClient) -> None:
    lead, lead_ip = await vm(farm, "c")
    name, address = await vm(farm, join_fail=True)
    await bootstrap(ssh, lead, lead_ip, "k8s-init.sh")
    await bootstrap(ssh, name, address)
    output = await run(ssh, lead_ip, f"cd /tmp;./k8s-init.sh a b c {lead_ip} {lead_ip} 6443 multi")
    with pytest.raises(SshCommandFailed) as caught:
        await run(ssh, address, f"sudo {joins(output)[1]}")
    assert caught.value.exit_status == 1
    assert name not in await node_names(workload)


async def test_unreachable_knob_drops_the_first_connections(farm: NodeFarm, ssh: SshClient) -> None:
    name, address = await vm(farm, unreachable=2)
    for _ in range(2):
        with pytest.raises(SshUnreachable):
            await run(ssh, address, "/bin/hostname")
    hostname: str = await eventually(
        lambda: _attempt(ssh, address), bool, timeout=10, interval=0.05, what="sshd after the gate"
    )
    assert hostname == name
    await farm.set_knobs(address, NodeKnobs(unreachable=1))
    with pytest.raises(SshUnreachable):
        await run(ssh, address, "/bin/hostname")
    assert await eventually(lambda: _attempt(ssh, address), bool, timeout=10, interval=0.05)


async def _attempt(ssh: SshClient, address: str) -> str:
    try:
        return await run(ssh, address, "/bin/hostname")
    except SshUnreachable:
        return ""


async def test_farm_state_is_json(farm: NodeFarm) -> None:
    await vm(farm)
    state = json.loads(json.dumps(farm.state()))
    assert all(node["sshd"] for node in state["nodes"].values())
