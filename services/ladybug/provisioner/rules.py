"""The provisioner's pure rules: names, request bodies, commands, and what answers mean.

Everything here is a function of its arguments, so the flows (``create``, ``nodes``,
``delete``) read as the steps of ``src/core/service/cluster.go`` of cloud-barista/cb-ladybug
while their details are tested on their own:

* **MCIR names** are upstream's deterministic ``<connection>-…`` names
  (``src/core/service/mcir.go``), which is what lets every run get-or-create them instead of
  remembering ids; the vNet CIDR, the firewall rules and the image per CSP follow
  ``src/core/service/csp.go`` and ``src/core/tumblebug/mcir.go``.
* **Ownership of an MCIS** is written into its ``description`` (the LadybugCluster's uid):
  a run that finds an MCIS named like its cluster resumes it only if it is ours, so a crash
  between Tumblebug's answer and our status report never yields a second MCIS, and someone
  else's MCIS is never adopted (``AlreadyExistMCISFailedReason``) nor deleted by a cleanup.
* **The leader** is the control-plane VM ``<cpGroup>-1``, not "the first VM in the answer"
  (§C.9 quirk 7 of upstream: Tumblebug's order decided it), so every run picks the same one.
* **Join commands** are parsed into their parts (endpoint, token, CA hash, certificate key)
  and rebuilt on one line, rather than concatenating upstream's regex matches with their
  trailing backslashes; the same builder serves ``kubeadm token create --print-join-command``
  on a resumed run.
"""

from __future__ import annotations

import random
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shared.tumblebug import region_zone, spec_size

Json = dict[str, Any]

USERNAME = "cb-user"
MCIS_LABEL = "mcks"
MCIS_SYSTEM_LABEL = "Managed by MCKS"
#: the mark of a capibus-made MCIS in its description; the uid says which LadybugCluster's
OWNER_MARK = "capibus-ladybug-uid="

CSPS = (
    "aws",
    "gcp",
    "azure",
    "alibaba",
    "tencent",
    "openstack",
    "ibm",
    "cloudit",
    "ncpvpc",
    "ncp",
    "nhncloud",
)

HAPROXY_PORT = 9998
API_SERVER_PORT = 6443
INIT_SUCCESS = "Your Kubernetes control-plane has initialized successfully"
JOIN_SUCCESS = "This node has joined the cluster"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
BOOTSTRAP_UNIT = "mcks-bootstrap"
REMOTE_DIR = "/tmp"

LABEL_CSP = "topology.cloud-barista.github.io/csp"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_CLUSTER = "kubernetes.io/cluster"


# --- MCIR ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class McirNames:
    """The Tumblebug resources of one connection in one namespace, by upstream's names."""

    connection: str
    spec: str

    @property
    def vnet(self) -> str:
        return f"{self.connection}-vpc"

    @property
    def subnet(self) -> str:
        return f"{self.connection}-subnet"

    @property
    def security_group(self) -> str:
        return f"{self.connection}-sg"

    @property
    def ssh_key(self) -> str:
        return f"{self.connection}-sshkey"

    @property
    def image(self) -> str:
        return f"{self.connection}-ubuntu1804"

    @property
    def vm_spec(self) -> str:
        return f"{self.connection}-{re.sub(r'[._ ]', '-', self.spec.lower())}-spec"


_CIDR_BASE = {
    "aws": 10,
    "gcp": 20,
    "azure": 30,
    "alibaba": 40,
    "tencent": 50,
    "ibm": 60,
    "openstack": 70,
    "ncpvpc": 80,
    "ncp": 90,
}


def cidr_block(csp: str, rng: random.Random | None = None) -> str:
    """The vNet CIDR upstream picks for ``csp`` (one of ten /24s per CSP)."""
    if csp == "cloudit":
        return "10.0.244.0/22"
    base = _CIDR_BASE.get(csp)
    if base is None:
        return "192.168.255.0/24"
    return f"192.168.{base + (rng or random).randrange(10)}.0/24"


def vnet_body(names: McirNames, csp: str, cidr: str) -> Json:
    subnet = f"{cidr[:-2]}28" if csp == "ncpvpc" else cidr
    return {
        "name": names.vnet,
        "connectionName": names.connection,
        "cidrBlock": cidr,
        "subnetInfoList": [{"Name": names.subnet, "IPv4_CIDR": subnet}],
    }


def subnet_of(vnet: Json, names: McirNames) -> str:
    """The subnet name as Tumblebug answers it (upstream reads it back)."""
    subnets = vnet.get("subnetInfoList") or []
    if subnets:
        first = subnets[0]
        return str(first.get("Name") or first.get("name") or first.get("id") or names.subnet)
    return names.subnet


def security_group_body(names: McirNames, csp: str) -> Json:
    rules: list[Json] = [
        {"fromPort": "1", "toPort": "65535", "ipProtocol": proto, "direction": "inbound"}
        for proto in ("tcp", "udp")
    ]
    if csp == "tencent":
        rules.append({"ipProtocol": "icmp", "direction": "inbound", "fromPort": "ALL"})
    elif csp != "cloudit":
        rules.append(
            {"ipProtocol": "icmp", "direction": "inbound", "fromPort": "-1", "toPort": "-1"}
        )
    return {
        "name": names.security_group,
        "connectionName": names.connection,
        "vNetId": names.vnet,
        "firewallRules": rules,
    }


def ssh_key_body(names: McirNames) -> Json:
    return {"name": names.ssh_key, "connectionName": names.connection, "username": USERNAME}


# Ubuntu 18.04 images, as upstream pins them (src/core/service/csp.go).
_IMAGES = {
    "gcp": "https://www.googleapis.com/compute/v1/projects/ubuntu-os-cloud/global/images/"
    "ubuntu-1804-bionic-v20201014",
    "azure": "Canonical:UbuntuServer:18.04-LTS:latest",
    "alibaba": "ubuntu_18_04_x64_20G_alibase_20210521.vhd",
    "tencent": "img-pi0ii46r",
    "cloudit": "ac2696a8-ecf7-4aab-bfbf-9ab5f3256ca2",
    "ncpvpc": "SW.VSVR.OS.LNX64.UBNTU.SVR1804.B050",
    "ncp": "SPSW0LINUX000130",
}
_REGIONAL_IMAGES = {
    "aws": {
        "us-east-1": "ami-0817d428a6fb68645",
        "us-east-2": "ami-0e82959d4ed12de3f",
        "us-west-1": "ami-03fac5402e10ea93b",
        "us-west-2": "ami-07a29e5e945228fa1",
        "ap-south-1": "ami-03f0fd1a2ba530e75",
        "ap-northeast-1": "ami-02b658ac34935766f",
        "ap-northeast-2": "ami-064ab8637cf33f1bb",
        "ap-northeast-3": "ami-0b627457758376b52",
        "ap-southeast-1": "ami-0c8e97a27be37adfd",
        "ap-southeast-2": "ami-099c1869f33464fde",
        "ca-central-1": "ami-0c27a26eca5dc74fc",
        "eu-central-1": "ami-092391a11f8aa4b7b",
        "eu-west-1": "ami-0823c236601fef765",
        "eu-west-2": "ami-09a1e275e350acf38",
        "eu-west-3": "ami-014d8dccd70fd2632",
        "eu-north-1": "ami-0ede7f804d699ea83",
        "sa-east-1": "ami-0fd2c3d373788b726",
    },
    "ibm": {
        "us-south": "r006-9de77234-3189-42f8-982d-f2266477cfe0",
        "br-sao": "r042-92d1cd12-f014-4b9a-abf8-c5ca6494a9e5",
        "us-east": "r014-dc446598-a1b5-41c3-a1d6-add3afaf264e",
        "eu-de": "r010-1f68eb2d-f35c-4959-8f4b-2b2f9cf78102",
        "ca-tor": "r038-e92647cf-8be9-438a-b94c-251cc86bc99a",
        "eu-gb": "r018-1d7417c6-893e-49d4-b14d-9643d6b29812",
        "au-syd": "r026-a8c25ce6-0ca1-43e9-9b41-411c6217b8b8",
        "jp-osa": "r034-522c639c-52e1-4cab-8dfb-bc0fb9f6f577",
        "jp-tok": "r022-61fdadec-6b03-4bd2-bfca-62cd16f5673f",
    },
    "nhncloud": {
        "KR1": "5396655e-166a-4875-80d2-ed8613aa054f",
        "KR2": "71893505-923c-4982-b0eb-844eb520661c",
        "JP1": "ca69fad9-92f3-4c9b-a6e4-7e8b0e4d3a58",
    },
}


def image_id(csp: str, region: str, connection: str) -> str | None:
    """The CSP's Ubuntu 18.04 image id, or None when upstream has none for this region
    (openstack images are looked up instead: ``openstack_image``)."""
    if csp in _IMAGES:
        return _IMAGES[csp]
    return _REGIONAL_IMAGES.get(csp, {}).get(region) or None


def openstack_image(images: Iterable[Json]) -> str | None:
    """The first image whose id or guest OS names Ubuntu 18.04 (upstream's search)."""
    for image in images:
        ident = str((image.get("iid") or image.get("IId") or {}).get("nameId") or "")
        guest = str(image.get("guestOS") or image.get("GuestOS") or "")
        for text in (ident, guest):
            plain = re.sub(r"[^a-z0-9]", "", text.lower())
            if "ubuntu" in plain and "1804" in plain:
                return ident
    return None


def image_body(names: McirNames, image: str) -> Json:
    return {
        "name": names.image,
        "connectionName": names.connection,
        "cspImageId": image,
        "cspImageName": "Ubuntu, 18.04",
        "description": "Canonical, Ubuntu, 18.04 LTS, amd64 bionic",
        "guestOS": "ubuntu",
    }


def spec_body(names: McirNames) -> Json:
    return {"name": names.vm_spec, "connectionName": names.connection, "cspSpecName": names.spec}


def spec_problem(spec: Json, *, csp: str, name: str, control_plane: bool) -> str | None:
    """Why ``spec`` (a ``lookupSpec`` answer) cannot run a node, in upstream's words."""
    cpus, mib = spec_size(spec)
    if control_plane and cpus < 2:
        return (
            "Kubernetes control plane node needs 2 cpu at least. "
            f"(csp={csp}, spec={name}, cpu={cpus})"
        )
    if mib // 1024 < 2:
        return (
            "kubernetes node needs 2 GiB or more of RAM. "
            f"(csp={csp}, spec={name}, memory={mib // 1024}GB)"
        )
    return None


def region_and_zone(region: Json) -> tuple[str, str]:
    return region_zone(region)


# --- MCIS ------------------------------------------------------------------------------------


def owner_description(uid: str) -> str:
    return f"Managed by capibus ladybug ({OWNER_MARK}{uid})"


def ours(mcis: Json, uid: str, *, recorded: bool) -> bool:
    """Whether ``mcis`` was made for the LadybugCluster ``uid``: marked with its uid, or
    unmarked while the cluster's status already names it (``recorded``)."""
    description = str(mcis.get("description") or "")
    if OWNER_MARK in description:
        return f"{OWNER_MARK}{uid}" in description
    return recorded


def vm_request(
    names: McirNames,
    *,
    name: str,
    count: int,
    subnet: str,
    disk_type: str,
    disk_size: str,
    description: str,
) -> Json:
    return {
        "name": name,
        "subGroupSize": str(count),
        "connectionName": names.connection,
        "vNetId": names.vnet,
        "subnetId": subnet,
        "securityGroupIds": [names.security_group],
        "sshKeyId": names.ssh_key,
        "imageId": names.image,
        "specId": names.vm_spec,
        "vmUserAccount": USERNAME,
        "vmUserPassword": "",
        "description": description,
        "rootDiskType": disk_type,
        "rootDiskSize": disk_size,
    }


def mcis_body(name: str, *, uid: str, install_mon_agent: str, vms: list[Json]) -> Json:
    return {
        "name": name,
        "description": owner_description(uid),
        "label": MCIS_LABEL,
        "systemLabel": MCIS_SYSTEM_LABEL,
        "installMonAgent": install_mon_agent,
        "vm": vms,
    }


def nlb_body(*, mcis: str, group: str, connection: str, vnet: str, csp: str) -> Json:
    """The NLB in front of the control-plane subgroup (API server 6443, health on SSH)."""
    timeout = "-1" if csp in ("ncpvpc", "azure") else "default"
    checker = {"protocol": "TCP", "port": "22"}
    if csp == "gcp":
        checker = {"protocol": "HTTP", "port": "80"}
    return {
        "name": group,
        "connectionName": connection,
        "vNetId": vnet,
        "type": "PUBLIC",
        "scope": "REGION",
        "listener": {"protocol": "TCP", "port": str(API_SERVER_PORT)},
        "targetGroup": {
            "protocol": "TCP",
            "port": str(API_SERVER_PORT),
            "mcis": mcis,
            "subGroupId": group,
        },
        "healthChecker": {
            **checker,
            "interval": "default",
            "threshold": "default",
            "timeout": timeout,
        },
    }


def vms_of(mcis: Json) -> list[Json]:
    return list(mcis.get("vm") or [])


def subgroup(vm: Json) -> str:
    """The subgroup of a VM: Tumblebug's ``subGroupId``, or its name without ``-<n>``."""
    return str(vm.get("subGroupId") or re.sub(r"-\d+$", "", str(vm.get("name") or "")))


def vm_index(name: str) -> int:
    match = re.search(r"-(\d+)$", name)
    return int(match.group(1)) if match else 0


def leader_of(cp_group: str, vm_names: Iterable[str]) -> str | None:
    """The control-plane VM that inits the cluster: the lowest-numbered of ``cp_group``."""
    members = [n for n in vm_names if subgroup({"name": n}) == cp_group]
    return min(members, key=vm_index) if members else None


def vm_problem(vm: Json, *, service_type: str) -> str | None:
    """Why a VM cannot become a node, in upstream's words (``BindVM``)."""
    status = str(vm.get("status") or "")
    if status == "Failed":
        return f"Failed to create a vm (status={status}, cause='{vm.get('systemMessage') or ''}')"
    if service_type == "multi" and not vm.get("publicIP"):
        return f"Failed to create a vm (status={status}, cause='unbounded public-ip')"
    if service_type == "single" and not vm.get("privateIP"):
        return f"Failed to create a vm (status={status}, cause='unbounded private-ip')"
    return None


def vm_region(vm: Json) -> tuple[str, str]:
    region = vm.get("region") or {}
    return str(region.get("region") or region.get("Region") or ""), str(
        region.get("zone") or region.get("Zone") or ""
    )


def vm_spec(vm: Json) -> str:
    detail = vm.get("cspViewVmDetail") or {}
    return str(detail.get("vmspecName") or detail.get("VMSpecName") or "")


# --- commands --------------------------------------------------------------------------------


def kubectl(args: str) -> str:
    return f"sudo kubectl {args} --kubeconfig={ADMIN_CONF}"


IS_BOOTSTRAPPED = f"systemctl is-enabled {BOOTSTRAP_UNIT}"
HAS_ADMIN_CONF = f"test -f {ADMIN_CONF}"
CAT_ADMIN_CONF = f"sudo cat {ADMIN_CONF}"
LIST_NODES = kubectl("get nodes -o name")
TOKEN_CREATE = "sudo kubeadm token create --print-join-command"
UPLOAD_CERTS = "sudo kubeadm init phase upload-certs --upload-certs"
RESTART_BOOTSTRAP = f"sudo systemctl restart {BOOTSTRAP_UNIT}"
DELETE_ALL = kubectl("delete all --all")


def bootstrap_command(
    *, version: str, csp: str, hostname: str, public_ip: str, cni: str, service_type: str
) -> str:
    args = " ".join(shlex.quote(a) for a in (version, csp, hostname, public_ip, cni, service_type))
    return f"{REMOTE_DIR}/bootstrap.sh {args}"


def haproxy_render(servers: Iterable[tuple[str, str]]) -> str:
    """``sed`` that renders the haproxy script with one backend per control plane."""
    lines = "".join(f"  server  {name}  {ip}:{API_SERVER_PORT}  check\\n" for name, ip in servers)
    return f"sudo sed 's/^{{{{SERVERS}}}}/{lines}/g' {REMOTE_DIR}/haproxy.sh"


def init_command(
    *,
    script: str,
    pod_cidr: str,
    service_cidr: str,
    dns_domain: str,
    public_ip: str,
    private_ip: str,
    port: int,
    service_type: str,
    etcd_ips: Iterable[str] = (),
) -> str:
    args = [pod_cidr, service_cidr, dns_domain, public_ip, private_ip, str(port), service_type]
    return f"cd {REMOTE_DIR};./{script} " + " ".join([*args, *etcd_ips])


def etcd_conf_command(members: Iterable[tuple[str, str]]) -> str:
    return f"{REMOTE_DIR}/etcd-conf.sh " + " ".join(f"{n} {ip}" for n, ip in members)


def copy_ca_command(public_ip: str) -> str:
    return (
        "scp -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        f"-r /tmp/ca/* {USERNAME}@{public_ip}:"
    )


def label_command(node: str, labels: dict[str, str]) -> str:
    pairs = " ".join(f"{k}={v}" for k, v in labels.items())
    return kubectl(f"label nodes {node} {pairs} --overwrite")


def annotate_command(node: str, annotations: dict[str, str]) -> str:
    pairs = " ".join(f"{k}={v}" for k, v in annotations.items())
    return kubectl(f"annotate nodes {node} {pairs} --overwrite")


def drain_command(node: str) -> str:
    return kubectl(f"drain {node} --ignore-daemonsets --force --delete-local-data")


def delete_node_command(node: str) -> str:
    return kubectl(f"delete node {node}")


# CNI manifests by the upstream projects' own URLs, at the versions upstream ships
# (src/scripts/addons/cni): applied from the leader, not copied to every control plane.
_CNI = {
    "kilo": (
        "https://raw.githubusercontent.com/squat/kilo/0.3.0/manifests/crds.yaml",
        "https://raw.githubusercontent.com/squat/kilo/0.3.0/manifests/kilo-kubeadm-flannel.yaml",
        "https://raw.githubusercontent.com/flannel-io/flannel/v0.14.0/Documentation/kube-flannel.yml",
    ),
    "canal": (
        "https://raw.githubusercontent.com/projectcalico/calico/v3.20.0/manifests/canal.yaml",
    ),
    "flannel": (
        "https://raw.githubusercontent.com/flannel-io/flannel/v0.19.0/Documentation/kube-flannel.yml",
    ),
    "calico": (
        "https://raw.githubusercontent.com/projectcalico/calico/v3.24.1/manifests/calico.yaml",
    ),
}


def cni_commands(cni: str) -> list[str]:
    return [kubectl(f"apply -f {url}") for url in _CNI.get(cni, ())]


NFS_DIR = f"{REMOTE_DIR}/addons/nfs"
NFS_SCRIPT = "deploy_v4.0.16.sh"


def nfs_command(server: str, path: str) -> str:
    """The NFS subdir provisioner (upstream's ``addons/nfs``), pointed at ``server:path``."""
    return f"cd {REMOTE_DIR};./addons/nfs/{NFS_SCRIPT} {shlex.quote(path)} {shlex.quote(server)}"


def node_names(listing: str) -> set[str]:
    """Node names from ``kubectl get nodes -o name`` (``node/<name>`` per line)."""
    return {line.strip().removeprefix("node/") for line in listing.splitlines() if line.strip()}


# --- join commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Join:
    """What ``kubeadm join`` needs; ``certificate_key`` only for control planes."""

    endpoint: str
    token: str
    ca_hash: str
    certificate_key: str = ""

    @property
    def worker(self) -> str:
        return (
            f"kubeadm join {self.endpoint} --token {self.token} "
            f"--discovery-token-ca-cert-hash sha256:{self.ca_hash}"
        )

    @property
    def control_plane(self) -> str:
        return f"{self.worker} --control-plane --certificate-key {self.certificate_key}"


_JOIN = re.compile(r"kubeadm\s+join\s+(\S+)\s+(?:\\\s*)?--token\s+(\S+)")
_HASH = re.compile(r"--discovery-token-ca-cert-hash\s+sha256:([0-9a-fA-F]+)")
_CERT_KEY = re.compile(r"--control-plane\s+(?:\\\s*)?--certificate-key\s+([0-9a-fA-F]+)")


def parse_join(output: str) -> Join | None:
    """The join parts of ``kubeadm init``'s or ``token create``'s output, if it has them."""
    join, ca_hash = _JOIN.search(output), _HASH.search(output)
    if join is None or ca_hash is None:
        return None
    key = _CERT_KEY.search(output)
    return Join(
        endpoint=join.group(1),
        token=join.group(2),
        ca_hash=ca_hash.group(1),
        certificate_key=key.group(1) if key else "",
    )


def certificate_key(output: str) -> str:
    """The key ``kubeadm init phase upload-certs --upload-certs`` prints on its last line."""
    for line in reversed(output.splitlines()):
        word = line.strip()
        if re.fullmatch(r"[0-9a-fA-F]{32,}", word):
            return word
    return ""
