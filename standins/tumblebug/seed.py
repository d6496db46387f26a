"""What a Tumblebug is configured with before anyone calls it: connections, regions, specs.

One connection per CSP that CB-Ladybug's code paths branch on (aws, gcp, azure, openstack,
ibm), each in one region with a region and a zone, and a small spec catalogue per connection
with enough variety for the create-time checks (reference §C.3 step 8.2: control plane needs
2 vCPUs, every node 2 GiB): each catalogue holds a spec too small for any node, one with one
vCPU (a worker but no control plane) and some that fit anything. Memory is MiB and both
numbers are strings, as CB-Spider reports them.

The JSON names are Tumblebug v0.7.0's: ``common.ConnConfig`` and ``common.Region`` have no
json tags (so ``ConfigName``, ``KeyValueInfoList[{Key, Value}]``), and ``lookupSpec`` passes
CB-Spider's ``SpiderSpecInfo`` through (``Name``, ``VCpu{Count, Clock}``, ``Mem``). CB-Ladybug
reads them through Go's case-insensitive decoder (``src/core/tumblebug/types.go``), so a
client must match names without regard to case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]


@dataclass(frozen=True)
class Spec:
    name: str
    vcpus: str
    mem_mib: str
    clock: str = "2.5"


@dataclass(frozen=True)
class Connection:
    name: str
    provider: str
    region: str
    zone: str
    specs: tuple[Spec, ...]

    @property
    def region_name(self) -> str:
        return self.name

    @property
    def csp(self) -> str:
        return self.provider.lower()


CONNECTIONS: tuple[Connection, ...] = (
    Connection(
        "aws-ap-northeast-2",
        "AWS",
        "ap-northeast-2",
        "ap-northeast-2a",
        (
            Spec("t2.nano", "1", "512"),
            Spec("t2.micro", "1", "1024"),
            Spec("t2.small", "1", "2048"),
            Spec("t3.small", "2", "2048"),
            Spec("t3.medium", "2", "4096"),
            Spec("t3.large", "2", "8192"),
            Spec("m5.xlarge", "4", "16384"),
        ),
    ),
    Connection(
        "gcp-asia-northeast3",
        "GCP",
        "asia-northeast3",
        "asia-northeast3-a",
        (
            Spec("f1-micro", "1", "614"),
            Spec("g1-small", "1", "1740"),
            Spec("n1-standard-1", "1", "3840"),
            Spec("e2-small", "2", "2048"),
            Spec("e2-medium", "2", "4096"),
            Spec("n1-standard-2", "2", "7680"),
        ),
    ),
    Connection(
        "azure-koreacentral",
        "AZURE",
        "koreacentral",
        "1",
        (
            Spec("Standard_B1ls", "1", "512"),
            Spec("Standard_B1ms", "1", "2048"),
            Spec("Standard_B2s", "2", "4096"),
            Spec("Standard_D2s_v3", "2", "8192"),
        ),
    ),
    Connection(
        "openstack-regionone",
        "OPENSTACK",
        "RegionOne",
        "nova",
        (
            Spec("m1.tiny", "1", "512"),
            Spec("m1.small", "1", "2048"),
            Spec("m1.medium", "2", "4096"),
            Spec("m1.large", "4", "8192"),
        ),
    ),
    Connection(
        "ibm-us-south",
        "IBM",
        "us-south",
        "us-south-1",
        (
            Spec("cx2-2x1", "2", "1024"),
            Spec("bx2-1x4", "1", "4096"),
            Spec("cx2-2x4", "2", "4096"),
            Spec("bx2-2x8", "2", "8192"),
            Spec("bx2-4x16", "4", "16384"),
        ),
    ),
)


def connections() -> dict[str, Connection]:
    return {c.name: c for c in CONNECTIONS}


def conn_config(connection: Connection) -> Json:
    """``common.ConnConfig`` (``GET /connConfig/{name}``)."""
    return {
        "ConfigName": connection.name,
        "ProviderName": connection.provider,
        "DriverName": f"{connection.csp}-driver-v1.0.so",
        "CredentialName": f"{connection.csp}-credential",
        "RegionName": connection.region_name,
        "Location": location(connection),
    }


def location(connection: Connection) -> Json:
    """``common.GeoLocation``: only ``nativeRegion`` and ``cloudType`` matter to anyone."""
    return {
        "latitude": "",
        "longitude": "",
        "briefAddr": "",
        "cloudType": connection.csp,
        "nativeRegion": connection.region,
    }


def region(connection: Connection) -> Json:
    """``common.Region`` (``GET /region/{name}``)."""
    return {
        "RegionName": connection.region_name,
        "ProviderName": connection.provider,
        "KeyValueInfoList": [
            {"Key": "Region", "Value": connection.region},
            {"Key": "Zone", "Value": connection.zone},
        ],
    }


def instance_metadata(
    connection: Connection, namespace: str, vm: str, private_ip: str, csp_id: str
) -> dict[str, str]:
    """What a VM's instance-metadata service answers (``curl 169.254.169.254/latest/meta-data/
    <key>``), for the CSPs that have one CB-Ladybug reads: AWS's ``local-hostname`` (derived
    from the private IP, as EC2 does) and ``instance-id``, NCP's ``serverName`` (the name
    Spider gave it, Tumblebug's ``nameInCsp``) and ``serverInstanceNo``."""
    if connection.csp == "aws":
        dashed = private_ip.replace(".", "-")
        return {
            "local-hostname": f"ip-{dashed}.{connection.region}.compute.internal",
            "instance-id": csp_id,
        }
    if connection.csp == "ncpvpc":
        return {"serverName": f"{namespace}-{vm}", "serverInstanceNo": csp_id}
    return {}


def spider_spec(connection: Connection, spec: Spec) -> Json:
    """CB-Spider's ``VMSpecInfo`` as ``lookupSpec`` and ``lookupSpecs`` pass it through."""
    return {
        "Region": connection.region,
        "Name": spec.name,
        "VCpu": {"Count": spec.vcpus, "Clock": spec.clock},
        "Mem": spec.mem_mib,
        "Gpu": [],
        "KeyValueList": [],
    }


def find_spec(connection: Connection, name: str) -> Spec | None:
    return next((s for s in connection.specs if s.name == name), None)
