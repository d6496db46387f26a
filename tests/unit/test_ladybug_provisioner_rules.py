"""The Ladybug provisioner's pure rules: names, bodies, commands, kubeadm's output."""

from __future__ import annotations

import random

import pytest

from services.ladybug.provisioner import rules

HASH = "5f0c0a1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789ab"
KEY = "9e1c6c3fbd28c50fb6d1e0f1c3d6e9f2a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c"
INIT = f"""Your Kubernetes control-plane has initialized successfully!

You can now join any number of the control-plane node running the following command
on each as root:

  kubeadm join 3.35.1.2:9998 --token abcdef.0123456789abcdef \\
\t--discovery-token-ca-cert-hash sha256:{HASH} \\
\t--control-plane --certificate-key {KEY}

Then you can join any number of worker nodes by running the following on each
as root:

kubeadm join 3.35.1.2:9998 --token abcdef.0123456789abcdef \\
\t--discovery-token-ca-cert-hash sha256:{HASH}
"""


def test_join_commands_are_parsed_from_kubeadm_init_output() -> None:
    join = rules.parse_join(INIT)
    assert join is not None
    assert join.worker == (
        "kubeadm join 3.35.1.2:9998 --token abcdef.0123456789abcdef "
        "--discovery-token-ca-cert-hash "
        "sha256:5f0c0a1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789ab"
    )
    assert join.control_plane == (
        f"{join.worker} --control-plane --certificate-key "
        "9e1c6c3fbd28c50fb6d1e0f1c3d6e9f2a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c"
    )


def test_a_join_command_from_token_create_has_no_certificate_key() -> None:
    join = rules.parse_join(
        "kubeadm join 10.0.0.1:6443 --token a.b --discovery-token-ca-cert-hash sha256:00ff \n"
    )
    assert join == rules.Join("10.0.0.1:6443", "a.b", "00ff")
    assert rules.parse_join("[kubelet-check] Initial timeout of 40s passed.") is None


def test_the_certificate_key_is_the_last_hex_line_of_upload_certs() -> None:
    key = "ab" * 32
    output = f'[upload-certs] Storing the certificates in Secret "kubeadm-certs"\n{key}\n'
    assert rules.certificate_key(output) == key
    assert rules.certificate_key("nothing") == ""


def test_mcir_names_are_upstreams() -> None:
    names = rules.McirNames("aws-ap-northeast-2", "t3.Medium_x y")
    assert names.vnet == "aws-ap-northeast-2-vpc"
    assert names.subnet == "aws-ap-northeast-2-subnet"
    assert names.security_group == "aws-ap-northeast-2-sg"
    assert names.ssh_key == "aws-ap-northeast-2-sshkey"
    assert names.image == "aws-ap-northeast-2-ubuntu1804"
    assert names.vm_spec == "aws-ap-northeast-2-t3-medium-x-y-spec"


@pytest.mark.parametrize(
    ("csp", "low", "high"), [("aws", 10, 19), ("gcp", 20, 29), ("ncp", 90, 99)]
)
def test_vnet_cidr_per_csp(csp: str, low: int, high: int) -> None:
    rng = random.Random(1)
    for _ in range(20):
        third = int(rules.cidr_block(csp, rng).split(".")[2])
        assert low <= third <= high
    assert rules.cidr_block("cloudit") == "10.0.244.0/22"


def test_ncpvpc_subnet_is_a_28() -> None:
    body = rules.vnet_body(rules.McirNames("c", "s"), "ncpvpc", "192.168.81.0/24")
    assert body["subnetInfoList"] == [{"Name": "c-subnet", "IPv4_CIDR": "192.168.81.0/28"}]


def test_firewall_rules_per_csp() -> None:
    names = rules.McirNames("c", "s")
    protocols = [r["ipProtocol"] for r in rules.security_group_body(names, "aws")["firewallRules"]]
    assert protocols == ["tcp", "udp", "icmp"]
    assert len(rules.security_group_body(names, "cloudit")["firewallRules"]) == 2
    assert rules.security_group_body(names, "tencent")["firewallRules"][2]["fromPort"] == "ALL"


def test_images_per_csp_and_region() -> None:
    assert rules.image_id("aws", "ap-northeast-2", "c") == "ami-064ab8637cf33f1bb"
    assert rules.image_id("aws", "mars-1", "c") is None
    assert rules.image_id("azure", "", "c") == "Canonical:UbuntuServer:18.04-LTS:latest"
    images = [{"iid": {"nameId": "centos-7"}}, {"iid": {"nameId": "Ubuntu-18.04-x"}}]
    assert rules.openstack_image(images) == "Ubuntu-18.04-x"


@pytest.mark.parametrize(
    ("spec", "control_plane", "problem"),
    [
        ({"mem": "4096", "vcpu": {"count": "2"}}, True, None),
        ({"mem": "4096", "vcpu": {"count": "1"}}, False, None),
        ({"mem": "4096", "vcpu": {"count": "1"}}, True, "needs 2 cpu at least"),
        ({"mem": "1024", "vcpu": {"count": "4"}}, False, "needs 2 GiB or more of RAM"),
    ],
)
def test_spec_problems(spec: dict[str, object], control_plane: bool, problem: str | None) -> None:
    found = rules.spec_problem(spec, csp="aws", name="x", control_plane=control_plane)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_ownership_of_an_mcis() -> None:
    mine = {"description": rules.owner_description("u1")}
    assert rules.ours(mine, "u1", recorded=False)
    assert not rules.ours(mine, "u2", recorded=True)
    assert not rules.ours({"description": ""}, "u1", recorded=False)
    assert rules.ours({"description": ""}, "u1", recorded=True)


def test_the_leader_is_the_first_of_the_control_plane_subgroup() -> None:
    names = ["w-1-aaaaa-1", "c-1-bbbbb-3", "c-1-bbbbb-1", "c-1-bbbbb-2"]
    assert rules.leader_of("c-1-bbbbb", names) == "c-1-bbbbb-1"
    assert rules.leader_of("c-1-zzzzz", names) is None


def test_vm_problems() -> None:
    failed = {"status": "Failed", "systemMessage": "quota"}
    assert rules.vm_problem(failed, service_type="multi") == (
        "Failed to create a vm (status=Failed, cause='quota')"
    )
    no_ip = {"status": "Running", "privateIP": "10.0.0.1"}
    assert "unbounded public-ip" in (rules.vm_problem(no_ip, service_type="multi") or "")
    assert rules.vm_problem(no_ip, service_type="single") is None


def test_haproxy_backends_render_with_seds_newlines() -> None:
    command = rules.haproxy_render([("c-1", "10.0.0.1"), ("c-2", "10.0.0.2")])
    assert command == (
        "sudo sed 's/^{{SERVERS}}/  server  c-1  10.0.0.1:6443  check\\n"
        "  server  c-2  10.0.0.2:6443  check\\n/g' /tmp/haproxy.sh"
    )


def test_commands_are_upstreams_shapes() -> None:
    assert rules.bootstrap_command(
        version="1.23.13-00",
        csp="aws",
        hostname="w-1-a-1",
        public_ip="1.2.3.4",
        cni="kilo",
        service_type="multi",
    ) == ("/tmp/bootstrap.sh 1.23.13-00 aws w-1-a-1 1.2.3.4 kilo multi")
    assert rules.init_command(
        script="k8s-init.sh",
        pod_cidr="10.244.0.0/16",
        service_cidr="10.96.0.0/12",
        dns_domain="cluster.local",
        public_ip="1.2.3.4",
        private_ip="10.0.0.1",
        port=9998,
        service_type="multi",
    ) == (
        "cd /tmp;./k8s-init.sh 10.244.0.0/16 10.96.0.0/12 cluster.local 1.2.3.4 10.0.0.1 9998 multi"
    )
    assert rules.drain_command("w") == (
        "sudo kubectl drain w --ignore-daemonsets --force --delete-local-data "
        "--kubeconfig=/etc/kubernetes/admin.conf"
    )
    assert rules.node_names("node/a\nnode/b\n") == {"a", "b"}
    assert len(rules.cni_commands("kilo")) == 3
    assert len(rules.cni_commands("canal")) == 1
