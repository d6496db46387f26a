"""The node emulator's rule table, in-process (no sshd, no workload API server).

Each test makes node directories the way the farm does and feeds commands to
``emulator.answer`` as sshd would through ``SSH_ORIGINAL_COMMAND``.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from standins.sshnodes import cluster, emulator, node
from standins.sshnodes.node import Node, NodeKnobs
from standins.sshnodes.outcome import Outcome

INIT = "cd /tmp;./k8s-init.sh 10.244.0.0/16 10.96.0.0/12 cluster.local {ip} {ip} 9998 multi"
ADMIN = "--kubeconfig=/etc/kubernetes/admin.conf"
# upstream extracts the join commands line by line (src/core/service/provisioner.go)
JOIN_LINE = re.compile(r"kubeadm join (\S+) --token (\S+)")
HASH_LINE = re.compile(r"--discovery-token-ca-cert-hash (sha256:[0-9a-f]+)")
KEY_LINE = re.compile(r"--control-plane --certificate-key ([0-9a-f]+)")


def make(tmp_path: Path, vm: str, address: str, knobs: NodeKnobs | None = None) -> Node:
    directory = tmp_path / "nodes" / address
    node.create(
        directory,
        vm=vm,
        address=address,
        hostname=None,
        root=tmp_path,
        kubeconfig=None,
        knobs=knobs or NodeKnobs(),
    )
    return Node(directory)


def say(target: Node, command: str, stdin: bytes = b"") -> Outcome:
    out = io.BytesIO()
    return emulator.answer(target, command, io.BytesIO(stdin), out)


def upload(target: Node, *names: str) -> None:
    for name in names:
        path = target.local(f"/tmp/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/bash\n# {name}\n")


def bootstrapped(tmp_path: Path, vm: str, address: str, *files: str) -> Node:
    target = make(tmp_path, vm, address)
    upload(target, "bootstrap.sh", *files)
    assert say(target, f"/tmp/bootstrap.sh 1.23.13-00 aws {vm} {address} kilo multi").status == 0
    return target


def joins(output: str) -> tuple[str, str]:
    """The control-plane and worker join commands, extracted as upstream does."""
    endpoint, token = JOIN_LINE.findall(output)[0]
    digest = HASH_LINE.findall(output)[0]
    key = KEY_LINE.findall(output)[0]
    worker = f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {digest}"
    return f"{worker} --control-plane --certificate-key {key}", worker


@pytest.fixture
def leader(tmp_path: Path) -> tuple[Node, str]:
    lead = bootstrapped(tmp_path, "c-1-abcde-1", "127.0.0.2", "k8s-init.sh")
    result = say(lead, INIT.format(ip="127.0.0.2"))
    assert result.status == 0, result
    return lead, result.stdout


def test_hostname_mkdir_and_unknown_commands(tmp_path: Path) -> None:
    target = make(tmp_path, "w-1-abcde-1", "127.0.0.3")
    assert say(target, "/bin/hostname").stdout == "w-1-abcde-1\n"
    assert say(target, "mkdir -p /tmp/addons/kilo /tmp/addons/nfs").status == 0
    assert target.local("/tmp/addons/kilo").is_dir()
    assert say(target, "mkdir -p /tmp/../../etc").status == 0
    assert (target.fs / "etc").is_dir()  # normalised inside the node, never above it
    unknown = say(target, "shutdown -h now")
    assert (unknown.status, unknown.stderr) == (127, "bash: line 1: shutdown: command not found\n")
    assert say(target, "").status == 1


def test_instance_metadata_and_rm(tmp_path: Path) -> None:
    directory = tmp_path / "nodes" / "127.0.0.4"
    meta = {"local-hostname": "ip-10-0-1-2.ap-northeast-2.compute.internal", "instance-id": "i-9"}
    node.create(
        directory,
        vm="c-1-abcde-1",
        address="127.0.0.4",
        hostname=None,
        root=tmp_path,
        kubeconfig=None,
        knobs=NodeKnobs(),
        metadata=meta,
    )
    target = Node(directory)
    url = "http://169.254.169.254/latest/meta-data"
    assert say(target, f"curl -sf {url}/local-hostname").stdout == meta["local-hostname"]
    assert say(target, f"curl {url}/instance-id").stdout == "i-9"
    assert say(target, f"curl -sf {url}/serverName").status == 22  # -f: a 404 fails
    assert "404" in say(target, f"curl {url}/serverName").stdout  # without: the error page
    assert say(target, "curl https://example.test/x").status == 6
    upload(target, "cloud-config")
    assert say(target, "rm -f /tmp/cloud-config").status == 0
    assert not target.local("/tmp/cloud-config").exists()
    assert say(target, "rm -f /tmp/cloud-config").status == 0
    assert say(target, "rm /tmp/cloud-config").status == 1
    assert "dangerous" in say(target, "rm -rf /").stderr


def test_bootstrap_needs_the_file_and_six_arguments(tmp_path: Path) -> None:
    target = make(tmp_path, "w-1-abcde-1", "127.0.0.3")
    args = "1.23.13-00 aws w-1-abcde-1 127.0.0.3 kilo multi"
    assert say(target, f"/tmp/bootstrap.sh {args}").status == 127
    upload(target, "bootstrap.sh")
    assert say(target, "/tmp/bootstrap.sh 1.23.13-00 aws").status == 1
    assert say(target, "systemctl is-enabled mcks-bootstrap").status == 1
    assert say(target, "sudo systemctl restart mcks-bootstrap").status == 5
    assert say(target, f"/tmp/bootstrap.sh {args}").status == 0
    assert say(target, "systemctl is-enabled mcks-bootstrap").stdout == "enabled\n"
    assert say(target, "sudo systemctl restart mcks-bootstrap").status == 0
    assert target.state()["bootstrapArgs"] == args.split()


def test_bootstrap_sets_the_hostname(tmp_path: Path) -> None:
    target = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    upload(target, "bootstrap.sh")
    say(target, "/tmp/bootstrap.sh 1.23.13-00 aws ip-10-0-0-3 127.0.0.3 calico single")
    assert say(target, "/bin/hostname").stdout == "ip-10-0-0-3\n"


def test_bootstrap_failure_knob(tmp_path: Path) -> None:
    target = make(tmp_path, "w-1-abcde-1", "127.0.0.3", NodeKnobs(bootstrap_fail=True))
    upload(target, "bootstrap.sh")
    result = say(target, "/tmp/bootstrap.sh 1.23.13-00 aws w 127.0.0.3 kilo multi")
    assert result.status == 100
    assert "kubeadm" in result.stderr
    assert not target.state().get("bootstrapped")


def test_haproxy_sed_then_run(tmp_path: Path) -> None:
    target = bootstrapped(tmp_path, "c-1-abcde-1", "127.0.0.2")
    script = (
        "#!/bin/bash\ncat << EOF > /etc/haproxy/haproxy.cfg\nbackend apiserver\n"
        "# {{SERVERS}} here\n{{SERVERS}}\nEOF\n"
    )
    target.local("/tmp/haproxy.sh").write_text(script)
    servers = (
        r"  server  c-1-abcde-1  10.0.0.2:6443  check\n"
        r"  server  c-1-abcde-2  10.0.0.3:6443  check\n"
    )
    rendered = say(target, f"sudo sed 's/^{{{{SERVERS}}}}/{servers}/g' /tmp/haproxy.sh")
    assert rendered.status == 0
    assert "# {{SERVERS}} here" in rendered.stdout  # only the anchored line is replaced
    assert "  server  c-1-abcde-2  10.0.0.3:6443  check\n" in rendered.stdout
    assert say(target, script).status == 1  # never rendered: haproxy refuses
    assert say(target, rendered.stdout).status == 0
    assert target.state()["haproxy"] == ["c-1-abcde-1 10.0.0.2:6443", "c-1-abcde-2 10.0.0.3:6443"]


def test_init_prints_the_success_sentence_and_both_join_commands(
    leader: tuple[Node, str],
) -> None:
    lead, output = leader
    assert "Your Kubernetes control-plane has initialized successfully" in output
    cp_join, _ = joins(output)
    assert " 127.0.0.2:9998 " in cp_join
    assert say(lead, "test -f /etc/kubernetes/admin.conf").status == 0
    assert "apiVersion: v1" in say(lead, "sudo cat /etc/kubernetes/admin.conf").stdout
    again = say(lead, INIT.format(ip="127.0.0.2"))
    assert again.status == 1
    assert "Port 6443 is in use" in again.stderr


def test_init_needs_the_script_and_bootstrap(tmp_path: Path) -> None:
    target = make(tmp_path, "c-1-abcde-1", "127.0.0.2")
    assert say(target, INIT.format(ip="127.0.0.2")).status == 127
    upload(target, "k8s-init.sh")
    assert say(target, INIT.format(ip="127.0.0.2")).status == 127  # kubeadm not installed
    assert say(target, "test -f /etc/kubernetes/admin.conf").status == 1
    assert say(target, "sudo cat /etc/kubernetes/admin.conf").status == 1


def test_init_without_success_knob(tmp_path: Path) -> None:
    target = bootstrapped(tmp_path, "c-1-abcde-1", "127.0.0.2", "k8s-init.sh")
    node.write_knobs(target.dir, NodeKnobs(init_without_success=True))
    result = say(target, INIT.format(ip="127.0.0.2"))
    assert result.status == 0
    assert "initialized successfully" not in result.stdout
    assert "kubelet-check" in result.stdout
    assert cluster.read(tmp_path)["clusters"] == {}


def test_join_checks_token_hash_and_certificate_key(
    tmp_path: Path, leader: tuple[Node, str]
) -> None:
    _, output = leader
    cp_join, worker_join = joins(output)
    worker = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    bad_token = re.sub(r"--token \S+", "--token aaaaaa.bbbbbbbbbbbbbbbb", worker_join)
    assert "JWS signature" in say(worker, f"sudo {bad_token}").stderr
    bad_hash = re.sub(r"sha256:\w+", "sha256:" + "0" * 64, worker_join)
    assert "are pinned" in say(worker, f"sudo {bad_hash}").stderr
    elsewhere = worker_join.replace("127.0.0.2:9998", "127.0.0.9:9998")
    assert "connection refused" in say(worker, f"sudo {elsewhere}").stderr
    joined = say(worker, f"sudo {worker_join}")
    assert joined.status == 0
    assert "This node has joined the cluster" in joined.stdout
    assert say(worker, f"sudo {worker_join}").status == 1  # kubelet.conf already exists
    assert say(worker, "test -f /etc/kubernetes/admin.conf").status == 1

    second = bootstrapped(tmp_path, "c-1-abcde-2", "127.0.0.4")
    wrong_key = re.sub(r"--certificate-key \w+", "--certificate-key " + "1" * 64, cp_join)
    assert say(second, f"sudo {wrong_key}").status == 1
    assert say(second, f"sudo {cp_join}").status == 0
    assert say(second, "test -f /etc/kubernetes/admin.conf").status == 0
    nodes = cluster.read(tmp_path)["clusters"]["127.0.0.2:9998"]["nodes"]
    assert {n: v["role"] for n, v in nodes.items()} == {
        "c-1-abcde-1": "control-plane",
        "w-1-abcde-1": "worker",
        "c-1-abcde-2": "control-plane",
    }


def test_join_with_continuation_lines(tmp_path: Path, leader: tuple[Node, str]) -> None:
    _, output = leader
    block = output[output.rindex("kubeadm join") :]
    worker = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    assert say(worker, f"sudo {block}").status == 0


def test_join_failure_knob(tmp_path: Path, leader: tuple[Node, str]) -> None:
    _, worker_join = joins(leader[1])
    worker = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    node.write_knobs(worker.dir, NodeKnobs(join_fail=True))
    assert say(worker, f"sudo {worker_join}").status == 1
    node.write_knobs(worker.dir, NodeKnobs())
    assert say(worker, f"sudo {worker_join}").status == 0


def test_token_create_gives_a_fresh_working_join(tmp_path: Path, leader: tuple[Node, str]) -> None:
    lead, output = leader
    printed = say(lead, "sudo kubeadm token create --print-join-command")
    assert printed.status == 0
    assert printed.stdout.endswith(" \n")
    _, first = joins(output)
    assert printed.stdout.strip() != first
    worker = bootstrapped(tmp_path, "w-2-fghij-1", "127.0.0.5")
    assert say(worker, "sudo kubeadm token create --print-join-command").status == 1
    assert say(worker, f"sudo {printed.stdout.strip()}").status == 0


def test_upload_certs_gives_the_key_later_control_plane_joins_need(
    tmp_path: Path, leader: tuple[Node, str]
) -> None:
    lead, output = leader
    printed = say(lead, "sudo kubeadm init phase upload-certs --upload-certs")
    assert printed.status == 0
    key = printed.stdout.split("Using certificate key:\n", 1)[1].strip()
    cp_join, _ = joins(output)
    fresh = re.sub(r"--certificate-key \w+", f"--certificate-key {key}", cp_join)
    second = bootstrapped(tmp_path, "c-1-abcde-2", "127.0.0.4")
    assert say(second, f"sudo {cp_join}").status == 1  # the init's key was replaced
    assert say(second, f"sudo {fresh}").status == 0
    worker = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    assert say(worker, "sudo kubeadm init phase upload-certs --upload-certs").status == 1


def test_kubectl_on_the_leader(tmp_path: Path, leader: tuple[Node, str]) -> None:
    lead, output = leader
    worker = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    assert say(worker, f"sudo {joins(output)[1]}").status == 0
    assert say(worker, f"sudo kubectl get nodes {ADMIN}").status == 1  # not on a worker
    assert "localhost:8080" in say(lead, "sudo kubectl get nodes").stderr

    labelled = say(
        lead, f"sudo kubectl label nodes w-1-abcde-1 topology.kubernetes.io/zone=z1 {ADMIN}"
    )
    assert labelled.stdout == "node/w-1-abcde-1 labeled\n"
    clash = say(
        lead, f"sudo kubectl label nodes w-1-abcde-1 topology.kubernetes.io/zone=z2 {ADMIN}"
    )
    assert "--overwrite is false" in clash.stderr
    assert (
        say(
            lead, f"sudo kubectl annotate nodes w-1-abcde-1 kilo.squat.ai/location=w {ADMIN}"
        ).status
        == 0
    )
    missing = say(lead, f"sudo kubectl label nodes nobody a=b {ADMIN}")
    assert missing.stderr == 'Error from server (NotFound): nodes "nobody" not found\n'

    upload(lead, "kilo-crds.yaml")
    lead.local("/tmp/kilo-crds.yaml").write_text(
        "kind: CustomResourceDefinition\nmetadata:\n  name: peers.kilo.squat.ai\n"
    )
    applied = say(lead, f"sudo kubectl apply -f /tmp/kilo-crds.yaml {ADMIN}")
    assert applied.stdout == "customresourcedefinition/peers.kilo.squat.ai created\n"
    assert say(lead, f"sudo kubectl apply -f /tmp/missing.yaml {ADMIN}").status == 1
    names = say(lead, f"sudo kubectl get nodes -o name {ADMIN}")
    assert names.stdout == "node/c-1-abcde-1\nnode/w-1-abcde-1\n"

    drained = say(
        lead,
        f"sudo kubectl drain w-1-abcde-1 --ignore-daemonsets --force --delete-local-data {ADMIN}",
    )
    assert drained.stdout.endswith("drained\n")
    assert say(lead, f"sudo kubectl delete node w-1-abcde-1 {ADMIN}").status == 0
    assert say(lead, f"sudo kubectl drain w-1-abcde-1 {ADMIN}").status == 1
    assert say(lead, f"sudo kubectl delete node w-1-abcde-1 {ADMIN}").status == 1
    assert say(lead, f"sudo kubectl delete all --all {ADMIN}").status == 0
    assert say(lead, f"sudo kubectl frobnicate {ADMIN}").status == 1


def test_create_secret_once(tmp_path: Path, leader: tuple[Node, str]) -> None:
    lead, _ = leader
    upload(lead, "cloud-config")
    command = (
        "sudo kubectl create secret -n kube-system generic cloud-config "
        f"--from-file=cloud.conf=/tmp/cloud-config {ADMIN}"
    )
    assert say(lead, command).stdout == "secret/cloud-config created\n"
    assert say(lead, command).status == 1


def test_scp_sink_stores_files_under_the_node(tmp_path: Path) -> None:
    target = make(tmp_path, "w-1-abcde-1", "127.0.0.3")
    stream = b"C0755 5 a.sh\nhello\0C0644 0 empty\n\0"
    out = io.BytesIO()
    result = emulator.answer(target, "scp -t /tmp", io.BytesIO(stream), out)
    assert result.status == 0
    assert out.getvalue() == b"\0" * 5
    assert target.local("/tmp/a.sh").read_bytes() == b"hello"
    assert target.local("/tmp/a.sh").stat().st_mode & 0o777 == 0o755
    assert target.state()["received"] == ["/tmp/a.sh", "/tmp/empty"]


def test_scp_sink_refuses_a_missing_directory_and_bad_names(tmp_path: Path) -> None:
    target = make(tmp_path, "w-1-abcde-1", "127.0.0.3")
    out = io.BytesIO()
    refused = emulator.answer(target, "scp -t /nope/dir", io.BytesIO(b"C0755 1 a\nx\0"), out)
    assert refused.status == 1
    assert out.getvalue().startswith(b"\0\x02scp: ")
    out = io.BytesIO()
    refused = emulator.answer(target, "scp -d -t /nope", io.BytesIO(b"C0755 1 a\nx\0"), out)
    assert refused.status == 1
    assert out.getvalue() == b"\x01scp: /nope: No such file or directory\n"
    assert not target.local("/nope").exists()
    escape = emulator.answer(target, "scp -t /tmp", io.BytesIO(b"C0755 1 ../a\nx\0"), io.BytesIO())
    assert escape.status == 1


def test_helper_scripts_and_the_etcd_copy(tmp_path: Path) -> None:
    target = bootstrapped(tmp_path, "c-1-abcde-1", "127.0.0.2", "etcd-ca.sh")
    assert say(target, "/tmp/etcd-ca.sh 10.0.0.1 10.0.0.2 10.0.0.3").status == 0
    assert say(target, "/tmp/etcd-conf.sh c-1 10.0.0.1").status == 127
    copy = (
        "scp -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -r /tmp/ca/* "
        "cb-user@10.0.0.2:"
    )
    assert say(target, copy).status == 0


def test_stopped_vms_take_their_cluster_away(tmp_path: Path, leader: tuple[Node, str]) -> None:
    worker = bootstrapped(tmp_path, "w-1-abcde-1", "127.0.0.3")
    assert say(worker, f"sudo {joins(leader[1])[1]}").status == 0
    with cluster.locked(tmp_path) as state:
        assert cluster.forget_address(state, "127.0.0.2") == []
    with cluster.locked(tmp_path) as state:
        assert sorted(cluster.forget_address(state, "127.0.0.3")) == ["c-1-abcde-1", "w-1-abcde-1"]
    assert cluster.read(tmp_path)["clusters"] == {}


def test_knobs_from_the_environment() -> None:
    env = {"STANDIN_SSHNODES_JOIN_FAIL": "1", "STANDIN_SSHNODES_UNREACHABLE": "3"}
    assert NodeKnobs.from_env(env) == NodeKnobs(join_fail=True, unreachable=3)
