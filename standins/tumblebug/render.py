"""Tumblebug v0.7.0's JSON for MCIS, VMs, their status and NLBs.

Field names and order follow ``src/core/mcis``'s ``TbMcisInfo``, ``TbVmInfo``,
``StatusCountInfo``, ``TbIdNameInDetailInfo`` and ``TbNLBInfo``. Structs without json tags
keep Go's field names: the VM's ``region`` is ``{Region, Zone}``, ``cspViewVmDetail`` is
CB-Spider's ``VMInfo`` (``VMSpecName``, ``IId{NameId, SystemId}``, ...).

The MCIS status is ``GetMcisStatus``'s summary string: the most common VM status with
``:<count> (R:<running>/<total>)``, ``Partial-`` when not every VM shares it, and any
``Failed`` VM taking precedence. Deletion reads it (``world.deletable``).
"""

from __future__ import annotations

from standins.tumblebug import seed
from standins.tumblebug.model import FAILED, RUNNING, Json, Mcis, Vm

#: ``GetMcisStatus``'s order: on a tie the first one wins
STATUSES = (
    "Failed",
    "Suspended",
    "Running",
    "Terminated",
    "Creating",
    "Suspending",
    "Resuming",
    "Rebooting",
    "Terminating",
    "Undefined",
)


def mcis_status(vms: list[Vm]) -> str:
    counts = [0] * len(STATUSES)
    for vm in vms:
        counts[STATUSES.index(vm.status) if vm.status in STATUSES else 9] += 1
    top, top_index = 0, 0
    for index, count in enumerate(counts):
        if count > top:
            top, top_index = count, index
    total, running = len(vms), counts[2]
    status = STATUSES[top_index] + f":{top} (R:{running}/{total})"
    if top < total:
        status = "Partial-" + status
    failed = counts[0]
    if failed:
        prefix = FAILED if failed == total else "Partial-" + FAILED
        status = prefix + f":{failed} (R:{running}/{total})"
    return status


def status_count(vms: list[Vm]) -> Json:
    def count(status: str) -> int:
        return sum(1 for vm in vms if vm.status == status)

    return {
        "countTotal": len(vms),
        "countCreating": count("Creating"),
        "countRunning": count(RUNNING),
        "countFailed": count(FAILED),
        "countSuspended": count("Suspended"),
        "countRebooting": count("Rebooting"),
        "countTerminated": count("Terminated"),
        "countSuspending": count("Suspending"),
        "countResuming": count("Resuming"),
        "countTerminating": count("Terminating"),
        "countUndefined": sum(1 for vm in vms if vm.status not in STATUSES),
    }


def mcis(m: Mcis, *, new_vms: list[str] | None = None) -> Json:
    vms = list(m.vms.values())
    request = m.request
    return {
        "id": m.name,
        "name": m.name,
        "status": mcis_status(vms),
        "statusCount": status_count(vms),
        "targetStatus": "None",
        "targetAction": "None",
        "installMonAgent": str(request.get("installMonAgent") or "no"),
        "configureCloudAdaptiveNetwork": "no",
        "label": str(request.get("label") or ""),
        "systemLabel": str(request.get("systemLabel") or ""),
        "systemMessage": "",
        "description": str(request.get("description") or ""),
        "vm": [vm(m.namespace, v) for v in vms],
        "newVmList": new_vms,
    }


def vm(namespace: str, v: Vm) -> Json:
    request, connection = v.request, v.connection
    spider_name = f"{namespace}-{v.name}"
    spec_name = str(request.get("_cspSpecName") or "")
    body: Json = {
        "id": v.name,
        "name": v.name,
        "idByCSP": v.csp_id if v.status != FAILED else "",
        "subGroupId": v.subgroup,
        "location": seed.location(connection),
        "status": v.status,
        "targetStatus": "None",
        "targetAction": "None",
        "monAgentStatus": "notInstalled",
        "networkAgentStatus": "notInstalled",
        "systemMessage": v.system_message,
        "createdTime": v.created,
        "label": str(request.get("label") or ""),
        "description": str(request.get("description") or ""),
        "region": {"Region": connection.region, "Zone": connection.zone},
        "publicIP": v.public_ip,
        "sshPort": "22",
        "publicDNS": "",
        "privateIP": v.private_ip,
        "privateDNS": "",
        "rootDiskType": str(request.get("rootDiskType") or ""),
        "rootDiskSize": str(request.get("rootDiskSize") or ""),
        "rootDeviceName": "/dev/sda1",
        "connectionName": connection.name,
        "connectionConfig": seed.conn_config(connection),
        "specId": str(request.get("specId") or ""),
        "imageId": str(request.get("imageId") or ""),
        "vNetId": str(request.get("vNetId") or ""),
        "subnetId": str(request.get("subnetId") or ""),
        "securityGroupIds": list(request.get("securityGroupIds") or []),
        "dataDiskIds": [],
        "sshKeyId": str(request.get("sshKeyId") or ""),
        "vmUserAccount": str(request.get("vmUserAccount") or ""),
    }
    if request.get("vmUserPassword"):
        body["vmUserPassword"] = str(request["vmUserPassword"])
    body["cspViewVmDetail"] = _spider_vm(v, spider_name, spec_name)
    return body


def _spider_vm(v: Vm, spider_name: str, spec_name: str) -> Json:
    """CB-Spider's ``VMInfo``, empty for a VM the CSP never made."""
    made = v.status != FAILED
    request, connection = v.request, v.connection

    def iid(name: str) -> Json:
        return {"NameId": name if made else "", "SystemId": name if made else ""}

    return {
        "Name": spider_name if made else "",
        "ImageName": "",
        "VPCName": "",
        "SubnetName": "",
        "SecurityGroupNames": None,
        "KeyPairName": "",
        "CSPid": "",
        "DataDiskNames": None,
        "VMSpecName": spec_name if made else "",
        "VMUserId": str(request.get("vmUserAccount") or "") if made else "",
        "VMUserPasswd": "",
        "RootDiskType": str(request.get("rootDiskType") or "") if made else "",
        "RootDiskSize": str(request.get("rootDiskSize") or "") if made else "",
        "ImageType": "",
        "IId": {"NameId": spider_name if made else "", "SystemId": v.csp_id if made else ""},
        "ImageIId": iid(str(request.get("imageId") or "")),
        "VpcIID": iid(str(request.get("vNetId") or "")),
        "SubnetIID": iid(str(request.get("subnetId") or "")),
        "SecurityGroupIIds": [iid(str(g)) for g in request.get("securityGroupIds") or []]
        if made
        else None,
        "KeyPairIId": iid(str(request.get("sshKeyId") or "")),
        "DataDiskIIDs": None,
        "StartTime": _go_time(v.created) if made else "0001-01-01T00:00:00Z",
        "Region": {"Region": connection.region, "Zone": connection.zone}
        if made
        else {"Region": "", "Zone": ""},
        "NetworkInterface": "eth0" if made else "",
        "PublicIP": v.public_ip,
        "PublicDNS": "",
        "PrivateIP": v.private_ip,
        "PrivateDNS": "",
        "RootDeviceName": "/dev/sda1" if made else "",
        "SSHAccessPoint": f"{v.public_ip}:22" if v.public_ip else "",
        "KeyValueList": None,
    }


def ids_in_detail(namespace: str, v: Vm) -> Json:
    """``GET …/vm/{vm}?option=idsInDetail``; ``nameInCsp`` is what the CSP calls the VM."""
    spider_name = f"{namespace}-{v.name}"
    return {
        "idInTb": v.name,
        "idInSp": spider_name,
        "idInCsp": v.csp_id,
        "nameInCsp": spider_name,
    }


def vm_status(namespace: str, v: Vm) -> Json:
    """``GET …/vm/{vm}?option=status`` (``TbVmStatusInfo``)."""
    return {
        "id": v.name,
        "name": v.name,
        "csp_vm_id": f"{namespace}-{v.name}",
        "status": v.status,
        "targetStatus": "None",
        "targetAction": "None",
        "nativeStatus": v.status,
        "monAgentStatus": "notInstalled",
        "systemMessage": v.system_message,
        "createdTime": v.created,
        "publicIp": v.public_ip,
        "privateIp": v.private_ip,
        "sshPort": "22",
        "location": seed.location(v.connection),
    }


def _go_time(created: str) -> str:
    """``2006-01-02 15:04:05`` as RFC 3339 UTC, the form Go gives a ``time.Time``."""
    return created.replace(" ", "T") + "Z"
