"""Single-cloud clusters: the pure rules (no I/O) of cloud hostnames and the cloud controller
manager, after ``src/core/service/cloud_provider.go``, ``src/core/provision/cloud_provider.go``
and ``src/core/provision/machine.go`` of cloud-barista/cb-ladybug v0.7.2 (`docs/ladybug.md`
section 7 has the facts).

A single-cloud cluster lives in one CSP and runs that CSP's cloud controller manager, so
Kubernetes must know each node by the name the cloud gives it: AWS's ``local-hostname`` from
the instance metadata, OpenStack's server name (Tumblebug's ``nameInCsp``), NCP's
``serverName`` from its metadata. Upstream supports exactly these three; a single-cloud cluster
on any other CSP failed at bootstrap with "no CSP" after its VMs were made. Here
``unsupported`` refuses it before anything is made.

The cloud config is rendered like upstream's Go template (``[Global]`` then ``key=value`` in
the keys' sorted order, as Go ranges over a map), but it travels differently: upstream passed
it, OpenStack password included, as a quoted shell argument to ``gen-cloud-config.sh`` (a
quote in the password broke it; the password showed in the node's process list and in
Ladybug's log). Here it is uploaded as a file readable by its owner only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence

from services.ladybug.provisioner.rules import kubectl
from shared.models.ladybug import NodeSet

AWS, OPENSTACK, NCPVPC = "aws", "openstack", "ncpvpc"
SUPPORTED = (AWS, OPENSTACK, NCPVPC)

METADATA = "http://169.254.169.254/latest/meta-data"
#: the instance-metadata key of the cloud hostname, for CSPs that tell it that way
METADATA_KEY = {AWS: "local-hostname", NCPVPC: "serverName"}

#: where the cloud config goes on the leader (upstream's ``CCM_CLOUD_CONFIG_FILE``)
CLOUD_CONFIG = "/tmp/cloud-config"
CCM_DIR = "/tmp/addons/ccm"
#: the manifests applied per CSP, in order (NCP's are left to the user, as upstream does:
#: its CCM needs a load-balancer subnet that cannot be made through CB-Spider)
MANIFESTS: Mapping[str, tuple[str, ...]] = {
    AWS: ("clusterrole-service-account.yaml", "aws-cloud-controller-manager-daemonset.yaml"),
    OPENSTACK: (
        "cloud-controller-manager-roles.yaml",
        "cloud-controller-manager-role-bindings.yaml",
        "openstack-cloud-controller-manager-ds.yaml",
    ),
}
SECRET = "cloud-config"

#: AWS's tag of resources a cluster owns (``kubernetes.io/cluster/<cluster>=owned``, the
#: cloud-provider-aws convention upstream imports)
TAG_PREFIX = "kubernetes.io/cluster/"
OWNED = "owned"

#: OpenStack connection info (decrypted) → cloud config ``[Global]`` keys
OPENSTACK_GLOBAL = {
    "auth-url": "IdentityEndpoint",
    "username": "Username",
    "password": "Password",
    "tenant-id": "ProjectID",
    "domain-name": "DomainName",
}
NCPVPC_GLOBAL = ("cluster-name", "access-key", "secret-key", "subnet-no", "lb-subnet-no")

_HOSTNAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

ROLE_MISSING = "Failed to prepare cloud-controller-manager: role should be assigned"


def unsupported(csp: str) -> str | None:
    """Why a single-cloud cluster cannot run on ``csp``, or None."""
    if csp in SUPPORTED:
        return None
    return (
        f"Single-Cloud type supports only {', '.join(SUPPORTED)} "
        f"(csp={csp}: its nodes' cloud hostnames cannot be known)"
    )


def role_of(nodesets: Sequence[NodeSet]) -> str:
    """The one AWS IAM role of ``nodesets`` (the control plane's, or the workers'): set, and
    the same in each (upstream's rule); ``ValueError(ROLE_MISSING)`` otherwise."""
    named = {ns.role for ns in nodesets}
    if len(named) != 1 or "" in named:
        raise ValueError(ROLE_MISSING)
    return named.pop()


def metadata_command(csp: str) -> str | None:
    """The command that prints the node's cloud hostname, or None when Tumblebug tells it."""
    key = METADATA_KEY.get(csp)
    return f"curl -sf {METADATA}/{key}" if key else None


def hostname(answer: str) -> str | None:
    """A cloud hostname as a Kubernetes Node name (kubelet lower-cases it), or None when
    ``answer`` is not one (an error page, nothing at all)."""
    name = answer.strip().lower()
    return name if _HOSTNAME.match(name) else None


# --- AWS ------------------------------------------------------------------------------------


def already_associated(message: str) -> bool:
    """Whether AWS refused an instance-profile association because the instance has one
    (``IncorrectState``): the association a crashed run made before it could say so."""
    return "IncorrectState" in message or "existing association" in message


def tag(cluster: str) -> str:
    """The tag CB-Spider's ``createTags`` is given: a JSON ``{key, value}``."""
    return json.dumps({"key": f"{TAG_PREFIX}{cluster}", "value": OWNED}, separators=(",", ":"))


def instance_id(vm: Mapping[str, object]) -> str:
    return _iid(_detail(vm).get("IId"))


def tagged_ids(vm: Mapping[str, object]) -> list[str]:
    """What a VM's cluster tag goes on: the instance, its security groups, its subnet."""
    detail = _detail(vm)
    groups = detail.get("SecurityGroupIIds")
    listed = groups if isinstance(groups, list) else []
    ids = [instance_id(vm), *(_iid(g) for g in listed)]
    ids.append(subnet_id(vm))
    return [i for i in ids if i]


def subnet_id(vm: Mapping[str, object]) -> str:
    return _iid(_detail(vm).get("SubnetIID"))


def _detail(vm: Mapping[str, object]) -> Mapping[str, object]:
    detail = vm.get("cspViewVmDetail") or {}
    return detail if isinstance(detail, Mapping) else {}


def _iid(iid: object) -> str:
    return str(iid.get("SystemId") or "") if isinstance(iid, Mapping) else ""


# --- the cloud config -----------------------------------------------------------------------


def section(name: str, values: Mapping[str, str]) -> str:
    """One INI section, keys sorted as Go's template ranges over a map."""
    return "\n".join([f"[{name}]", *(f"{k}={values[k]}" for k in sorted(values))])


def aws_config(region_info: Mapping[str, str]) -> str:
    zone = region_info.get("Zone")
    if zone is None:
        raise ValueError("Zone is missing")
    return section("Global", {"Zone": zone}) + "\n"


def openstack_config(info: Mapping[str, str], *, subnet: str) -> str:
    values = {}
    for key, source in OPENSTACK_GLOBAL.items():
        if source not in info:
            raise ValueError(f"{source} is missing")
        values[key] = info[source]
    text = section("Global", values)
    if subnet:
        text += "\n\n" + section("LoadBalancer", {"subnet-id": subnet})
    return text + "\n"


def ncpvpc_config() -> str:
    """NCP's cloud config: its keys, empty, for the user to fill in (as upstream)."""
    return section("Global", dict.fromkeys(NCPVPC_GLOBAL, "")) + "\n"


def manifest_paths(csp: str) -> list[str]:
    return [f"{CCM_DIR}/{csp}/{name}" for name in MANIFESTS.get(csp, ())]


def create_secret() -> str:
    return kubectl(
        f"create secret generic {SECRET} -n kube-system --from-file=cloud.conf={CLOUD_CONFIG}"
    )


def kubectl_apply(path: str) -> str:
    return kubectl(f"apply -f {path}")


def already_exists(output: Iterable[str]) -> bool:
    """Whether kubectl's words say the Secret is there already (a resumed run)."""
    return any("already exists" in text for text in output)
