"""The stand-in's state and Tumblebug v0.7.0's rules over it.

Namespaces, MCIR (vNet, securityGroup, sshKey, image, spec) per namespace, and MCIS with their
subgroups, VMs and NLBs, all in memory on one event loop. The rules, and the refusals with
their status codes and messages, are upstream's (``src/core/mcir/*.go``,
``src/core/mcis/{provisioning,manageInfo,control,nlb}.go`` and the REST handlers under
``src/api/rest/server``):

- MCIR: ``POST`` is 201 with the object (id = name), 500 when the name is taken or a required
  field is missing; ``GET`` of a missing one is 404 ``Failed to find <type> <id>``. An sshKey
  gets a real key pair; its ``privateKey`` is returned by ``POST`` and ``GET`` alike.
- MCIS create is synchronous, 201 with the VMs. Every VM request is checked first (each MCIR
  it names must exist in the namespace, on the VM's connection), so a refused create leaves
  nothing behind. A request ``name`` is a subgroup: ``subGroupSize`` VMs (empty or below 1
  counts as 1) named ``<name>-<i>`` from 1, ``subGroupId`` the lower-cased name, in request
  order (CB-Ladybug takes ``vm[0]`` as the control-plane leader).
- ``POST …/vm`` adds a subgroup, or grows an existing one with the next indices.
- Terminate stops every VM; delete is refused unless the MCIS status is Terminated, Failed or
  Undefined (not ``Partial-``); ``option=terminate`` refines and terminates first,
  ``option=force`` skips the check. A VM delete terminates that VM first. Refine drops Failed
  VMs, as upstream does.

Each running VM holds a loopback address from the pool as its ``publicIP`` and, through the
node farm, a real sshd there that accepts its sshKey; the address is freed when the VM is
terminated. Private IPs are ``10.0.<x>.<y>`` strings, unique per process, never contacted.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime
from typing import Any

from standins.sshnodes.node import NodeKnobs
from standins.tumblebug import keys, render, seed
from standins.tumblebug.farm import Farm
from standins.tumblebug.knobs import TumblebugKnobs
from standins.tumblebug.model import (
    FAILED,
    FAILED_VM,
    NO_PUBLIC_IP,
    NODE,
    RUNNING,
    TERMINATED,
    AddressPool,
    Json,
    Mcis,
    TbError,
    Vm,
    VmFault,
    VmFaults,
    check_name,
    get,
    required,
    text,
)
from standins.tumblebug.spider import SpiderStub

log = logging.getLogger("standins.tumblebug")

VNET, SECURITY_GROUP, SSH_KEY, IMAGE, SPEC = "vNet", "securityGroup", "sshKey", "image", "spec"
MCIR_TYPES = (VNET, SECURITY_GROUP, SSH_KEY, IMAGE, SPEC)
#: the request struct each MCIR POST binds, named in validator messages
REQUEST_STRUCTS = {
    VNET: "TbVNetReq",
    SECURITY_GROUP: "TbSecurityGroupReq",
    SSH_KEY: "TbSshKeyReq",
    IMAGE: "TbImageReq",
    SPEC: "TbSpecReq",
}


class World:
    def __init__(self, knobs: TumblebugKnobs, farm: Farm) -> None:
        self.knobs = knobs
        self.farm = farm
        self.connections = seed.connections()
        self.namespaces: dict[str, Json] = {}
        self.mcir: dict[str, dict[str, dict[str, Json]]] = {}
        self.mcis: dict[str, dict[str, Mcis]] = {}
        self.addresses = AddressPool(knobs.address_start, knobs.address_count)
        self.vm_faults = VmFaults()
        self.spider = SpiderStub()
        self.namespace_mode = knobs.namespace_mode
        self._private_ips = 0
        # Creates, deletes and terminations await the farm; one at a time keeps each whole.
        self.lock = asyncio.Lock()
        for name in knobs.namespaces:
            self.create_namespace({"name": name, "description": "seeded by the stand-in"})
        for pattern in knobs.failed_vms:
            self.vm_faults.arm(VmFault(FAILED_VM, pattern, -1, knobs.failed_message))
        for pattern in knobs.no_public_ip_vms:
            self.vm_faults.arm(VmFault(NO_PUBLIC_IP, pattern, -1))

    # --- namespaces and seeds --------------------------------------------------------------

    def create_namespace(self, body: Json) -> Json:
        required(body, "NsReq", "name")
        name = text(body, "name")
        check_name(name)
        if name in self.namespaces:
            raise TbError(500, f"CreateNs(); The namespace {name} already exists.")
        ns = {"id": name, "name": name, "description": text(body, "description")}
        self.namespaces[name] = ns
        self.mcir[name] = {kind: {} for kind in MCIR_TYPES}
        self.mcis[name] = {}
        return ns

    def check_namespace(self, ns: str) -> None:
        """``common.NsValidation``, the middleware in front of every ``/ns/{ns}/…`` route."""
        try:
            check_name(ns)
        except TbError as exc:
            raise TbError(404, exc.message) from exc
        if ns not in self.namespaces:
            raise TbError(404, "Not valid namespace")

    def connection(self, name: str) -> seed.Connection:
        found = self.connections.get(name)
        if found is None:
            raise TbError(500, f"Cannot retrieve ConnectionConfig {name}: not found")
        return found

    # --- MCIR ------------------------------------------------------------------------------

    def mcir_get(self, ns: str, kind: str, resource_id: str) -> Json:
        found = self.mcir[ns][kind].get(resource_id)
        if found is None:
            raise TbError(404, f"Failed to find {kind} {resource_id}")
        return found

    def mcir_create(self, ns: str, kind: str, body: Json, action: str = "") -> Json:
        required(body, REQUEST_STRUCTS[kind], "name", "connectionName")
        name, conn = text(body, "name"), text(body, "connectionName")
        check_name(name)
        if name in self.mcir[ns][kind]:
            raise TbError(500, f"The {kind} {name} already exists.")
        connection = self.connection(conn)
        build = {
            VNET: self._vnet,
            SECURITY_GROUP: self._security_group,
            SSH_KEY: self._ssh_key,
            IMAGE: self._image,
            SPEC: self._spec,
        }[kind]
        created = build(ns, name, connection, body, action)
        self.mcir[ns][kind][name] = created
        log.info("ns %s: %s %s created on %s", ns, kind, name, conn)
        return created

    def mcir_delete(self, ns: str, kind: str, resource_id: str) -> Json:
        found = self.mcir_get(ns, kind, resource_id)
        users = found.get("associatedObjectList") or []
        if users:
            raise TbError(
                500, f"The {kind} {resource_id} is in use by {', '.join(users)}; not deleted."
            )
        del self.mcir[ns][kind][resource_id]
        return {"message": f"The {kind} {resource_id} has been deleted"}

    def _vnet(self, ns: str, name: str, conn: seed.Connection, body: Json, action: str) -> Json:
        subnets = []
        for subnet in get(body, "subnetInfoList") or []:
            required(subnet, "TbSubnetReq", "Name", "IPv4_CIDR")
            subnets.append(
                {
                    "Id": text(subnet, "Name"),
                    "Name": text(subnet, "Name"),
                    "IPv4_CIDR": text(subnet, "IPv4_CIDR"),
                    "KeyValueList": None,
                    "Description": text(subnet, "Description"),
                }
            )
        return {
            "id": name,
            "name": name,
            "connectionName": conn.name,
            "cidrBlock": text(body, "cidrBlock"),
            "subnetInfoList": subnets,
            "description": text(body, "description"),
            "cspVNetId": "vpc-" + secrets.token_hex(8),
            "cspVNetName": f"{ns}-{name}",
            "status": "",
            "keyValueList": None,
            "associatedObjectList": [],
            "isAutoGenerated": False,
            "systemLabel": "",
        }

    def _security_group(
        self, ns: str, name: str, conn: seed.Connection, body: Json, action: str
    ) -> Json:
        required(body, "TbSecurityGroupReq", "vNetId")
        vnet = text(body, "vNetId")
        if vnet not in self.mcir[ns][VNET]:
            raise TbError(500, f"Failed to get the vNet {vnet} from {conn.name}")
        rules = [
            {
                "FromPort": text(rule, "fromPort"),
                "ToPort": text(rule, "toPort"),
                "IPProtocol": text(rule, "ipProtocol"),
                "Direction": text(rule, "direction"),
                "CIDR": text(rule, "cidr") or "0.0.0.0/0",
            }
            for rule in get(body, "firewallRules") or []
        ]
        return {
            "id": name,
            "name": name,
            "connectionName": conn.name,
            "vNetId": vnet,
            "description": text(body, "description"),
            "firewallRules": rules,
            "cspSecurityGroupId": "sg-" + secrets.token_hex(8),
            "cspSecurityGroupName": f"{ns}-{name}",
            "keyValueList": None,
            "associatedObjectList": [],
            "isAutoGenerated": False,
            "systemLabel": "",
        }

    def _ssh_key(self, ns: str, name: str, conn: seed.Connection, body: Json, action: str) -> Json:
        pair = keys.generate()
        username = text(body, "username")
        return _omit_empty(
            {
                "id": name,
                "name": name,
                "connectionName": conn.name,
                "description": text(body, "description"),
                "cspSshKeyId": f"{ns}-{name}",
                "cspSshKeyName": f"{ns}-{name}",
                "fingerprint": pair.fingerprint,
                "username": username,
                "verifiedUsername": text(body, "verifiedUsername"),
                "publicKey": pair.public_key,
                "privateKey": pair.private_key,
                "associatedObjectList": [],
            }
        )

    def _image(self, ns: str, name: str, conn: seed.Connection, body: Json, action: str) -> Json:
        if action not in ("registerWithInfo", "registerWithId"):
            raise TbError(500, "You must specify: action=registerWithInfo or action=registerWithId")
        required(body, "TbImageReq", "cspImageId")
        image_id = text(body, "cspImageId")
        by_info = action == "registerWithInfo"
        return _omit_empty(
            {
                "namespace": ns,
                "id": name,
                "name": name,
                "connectionName": conn.name,
                "cspImageId": image_id,
                "cspImageName": text(body, "cspImageName") if by_info else image_id,
                "description": text(body, "description"),
                "creationDate": _now(),
                "guestOS": text(body, "guestOS") if by_info else "Ubuntu",
                "status": "" if by_info else "available",
                "associatedObjectList": [],
            }
        )

    def _spec(self, ns: str, name: str, conn: seed.Connection, body: Json, action: str) -> Json:
        required(body, "TbSpecReq", "cspSpecName")
        spec_name = text(body, "cspSpecName")
        spec = seed.find_spec(conn, spec_name)
        if spec is None:
            raise TbError(500, f"Failed to find the spec {spec_name} on {conn.name}")
        scores = {f"evaluationScore{i:02d}": 0 for i in range(1, 11)}
        return {
            **_omit_empty(
                {
                    "namespace": ns,
                    "id": name,
                    "name": name,
                    "connectionName": conn.name,
                    "providerName": conn.provider,
                    "regionName": conn.region_name,
                    "cspSpecName": spec.name,
                    "numvCPU": int(spec.vcpus),
                    "memGiB": round(int(spec.mem_mib) / 1024, 3),
                    "description": text(body, "description"),
                }
            ),
            **scores,
            "rootDiskType": "",
            "rootDiskSize": "",
            "associatedObjectList": [],
        }

    # --- MCIS ------------------------------------------------------------------------------

    def mcis_get(self, ns: str, name: str, *, status: int = 404) -> Mcis:
        found = self.mcis[ns].get(name)
        if found is None:
            raise TbError(status, f"The mcis {name} does not exist.")
        return found

    async def mcis_create(self, ns: str, body: Json) -> Json:
        required(body, "TbMcisReq", "name", "vm")
        name = text(body, "name")
        check_name(name)
        if name in self.mcis[ns]:
            raise TbError(500, f"The mcis {name} already exists.")
        requests = get(body, "vm")
        if not isinstance(requests, list):
            raise TbError(400, "vm must be a list")
        planned = self._plan(ns, name, requests, existing=None)
        mcis = Mcis(name=name, namespace=ns, request=_mcis_fields(body))
        await self._launch(mcis, planned)
        self.mcis[ns][name] = mcis
        log.info(
            "ns %s: mcis %s created: %s", ns, name, render.mcis_status(list(mcis.vms.values()))
        )
        return render.mcis(mcis)

    async def vm_add(self, ns: str, mcis_name: str, body: Json) -> Json:
        mcis = self.mcis_get(ns, mcis_name, status=500)
        planned = self._plan(ns, mcis_name, [body], existing=mcis)
        await self._launch(mcis, planned)
        mcis.new_vms = [vm.name for vm in planned]
        return render.mcis(mcis, new_vms=mcis.new_vms)

    def vm_get(self, ns: str, mcis_name: str, vm_name: str, *, status: int = 404) -> Vm:
        vm = self.mcis_get(ns, mcis_name, status=status).vms.get(vm_name)
        if vm is None:
            raise TbError(status, f"The vm {vm_name} does not exist.")
        return vm

    async def vm_delete(self, ns: str, mcis_name: str, vm_name: str) -> Json:
        try:
            vm = self.vm_get(ns, mcis_name, vm_name, status=500)
        except TbError as exc:
            raise TbError(500, "Failed to delete the VM info") from exc
        mcis = self.mcis[ns][mcis_name]
        await self._terminate(vm)
        self._forget(mcis, vm)
        log.info("ns %s: vm %s of mcis %s deleted", ns, vm_name, mcis_name)
        return {"message": "Deleted the VM info"}

    async def control(self, ns: str, mcis_name: str, action: str) -> Json:
        actions = ("suspend", "resume", "reboot", "terminate", "refine")
        if action not in actions:
            raise TbError(400, "'action' should be one of these: " + ", ".join(actions))
        mcis = self.mcis_get(ns, mcis_name, status=500)
        vms = list(mcis.vms.values())
        if action == "terminate":
            if not vms:
                return {"message": "No VM to terminate in the MCIS"}
            for vm in vms:
                await self._terminate(vm)
            log.info("ns %s: mcis %s terminated", ns, mcis_name)
            return {"message": "Terminated the MCIS"}
        if action == "refine":
            if not vms:
                return {"message": "No VM in the MCIS"}
            for vm in vms:
                if vm.status in (FAILED, "Undefined"):
                    self._forget(mcis, vm)
            return {"message": "Refined the MCIS"}
        return self._power(vms, action)

    async def mcis_delete(self, ns: str, mcis_name: str, option: str = "") -> Json:
        mcis = self.mcis_get(ns, mcis_name, status=500)
        option = option.lower()
        if option == "terminate" and not deletable(mcis):
            await self.control(ns, mcis_name, "refine")
            await self.control(ns, mcis_name, "terminate")
        status = render.mcis_status(list(mcis.vms.values()))
        if not deletable(mcis) and option != "force":
            raise TbError(
                500,
                f"MCIS {mcis_name} is {status} and not Terminated/Undefined/Failed, Deletion is "
                "not allowed (use option=force for force deletion)",
            )
        done = []
        for vm in list(mcis.vms.values()):
            await self._terminate(vm)
            self._forget(mcis, vm)
            done.append(f"VM: {vm.name} [Done]")
        done += [f"SubGroup: {group} [Done]" for group in mcis.subgroups]
        done += [f"NLB: {nlb} [Done]" for nlb in mcis.nlbs]
        del self.mcis[ns][mcis_name]
        log.info("ns %s: mcis %s deleted", ns, mcis_name)
        return {"output": [*done, f"MCIS: {mcis_name} [Done]"]}

    # --- NLB -------------------------------------------------------------------------------

    def nlb_create(self, ns: str, mcis_name: str, body: Json) -> Json:
        mcis = self.mcis_get(ns, mcis_name, status=500)
        target = get(body, "targetGroup") or {}
        group = text(target, "subGroupId")
        check_name(group)
        if group in mcis.nlbs:
            raise TbError(500, f"The nlb {group} already exists.")
        members = mcis.subgroups.get(group) or []
        if not members:
            raise TbError(500, f"There is no VMs in the SubGroup {group}.")
        first = mcis.vms[members[0]]
        listener, checker = get(body, "listener") or {}, get(body, "healthChecker") or {}
        nlb: Json = {
            "id": group,
            "name": group,
            "connectionName": first.connection.name,
            "Type": text(body, "type"),
            "Scope": text(body, "scope"),
            "listener": {
                "protocol": text(listener, "protocol"),
                "ip": "",
                "port": text(listener, "port"),
                "dnsName": f"{ns}-{group}.nlb.standin.test",
                "keyValueList": None,
            },
            "targetGroup": {
                "protocol": text(target, "protocol"),
                "port": text(target, "port"),
                "subGroupId": group,
                "vms": list(members),
                "KeyValueList": None,
            },
            "healthChecker": {
                "protocol": text(checker, "protocol"),
                "port": text(checker, "port"),
                "interval": _seconds(text(checker, "interval"), 10),
                "timeout": _seconds(text(checker, "timeout"), 10),
                "threshold": _seconds(text(checker, "threshold"), 3),
                "keyValueList": None,
            },
            "CreatedTime": _now().replace(" ", "T") + "Z",
            "description": text(body, "description"),
            "cspNLBId": "nlb-" + secrets.token_hex(8),
            "cspNLBName": f"{ns}-{group}",
            "status": "Available",
            "keyValueList": None,
            "associatedObjectList": [],
            "isAutoGenerated": False,
            "location": seed.location(first.connection),
            "systemLabel": "",
        }
        mcis.nlbs[group] = nlb
        return nlb

    def nlb_get(self, ns: str, mcis_name: str, nlb_id: str) -> Json:
        mcis = self.mcis[ns].get(mcis_name)
        found = mcis.nlbs.get(nlb_id) if mcis is not None else None
        if found is None:
            raise TbError(404, f"Failed to find the NLB {nlb_id}")
        return found

    def nlb_delete(self, ns: str, mcis_name: str, nlb_id: str) -> Json:
        self.nlb_get(ns, mcis_name, nlb_id)
        del self.mcis[ns][mcis_name].nlbs[nlb_id]
        return {"message": f"The nlb {nlb_id} has been deleted"}

    # --- VMs -------------------------------------------------------------------------------

    def _plan(
        self, ns: str, mcis_name: str, requests: list[Any], existing: Mcis | None
    ) -> list[Vm]:
        """Check every VM request, then name the VMs; nothing changes until all pass."""
        planned: list[Vm] = []
        taken = set(existing.vms) if existing else set()
        for request in requests:
            if not isinstance(request, dict):
                raise TbError(400, "a vm request must be an object")
            connection = self._check_vm_request(ns, request)
            group = text(request, "name").lower()
            first = 1
            if existing and group in existing.subgroups:
                first = len(existing.subgroups[group]) + 1
            elif any(vm.subgroup == group for vm in planned):
                raise TbError(500, f"Duplicated SubGroup ID {group}")
            spec = self.mcir[ns][SPEC][text(request, "specId")]
            fields = {**_vm_fields(request), "_cspSpecName": spec["cspSpecName"]}
            for index in range(first, first + _size(text(request, "subGroupSize"))):
                name = f"{group}-{index}"
                if name in taken:
                    raise TbError(500, f"The vm {name} already exists.")
                taken.add(name)
                planned.append(
                    Vm(
                        name=name,
                        subgroup=group,
                        connection=connection,
                        request=fields,
                        created=_now(),
                        csp_id="i-" + secrets.token_hex(9)[:17],
                    )
                )
        return planned

    def _check_vm_request(self, ns: str, request: Json) -> seed.Connection:
        required(
            request,
            "TbVmReq",
            "name",
            "connectionName",
            "specId",
            "imageId",
            "vNetId",
            "subnetId",
            "securityGroupIds",
            "sshKeyId",
        )
        check_name(text(request, "name").lower())
        connection = self.connection(text(request, "connectionName"))
        refs = [
            (SPEC, "spec", text(request, "specId")),
            (IMAGE, "Image", text(request, "imageId")),
            (VNET, "vNet", text(request, "vNetId")),
            (SSH_KEY, "SshKey", text(request, "sshKeyId")),
        ]
        refs += [
            (SECURITY_GROUP, "SecurityGroup", str(g)) for g in get(request, "securityGroupIds")
        ]
        for kind, label, resource_id in refs:
            found = self.mcir[ns][kind].get(resource_id)
            if found is None:
                raise TbError(
                    500, f"Failed to get the {label} {resource_id} from {connection.name}"
                )
            if found.get("connectionName") != connection.name:
                raise TbError(
                    500,
                    f"The {kind} {resource_id} belongs to {found.get('connectionName')}, "
                    f"not to {connection.name}",
                )
        subnet = text(request, "subnetId")
        vnet = self.mcir[ns][VNET][text(request, "vNetId")]
        if subnet not in {s["Id"] for s in vnet["subnetInfoList"]}:
            raise TbError(500, f"Failed to get the subnet {subnet} in the vNet {vnet['id']}")
        return connection

    async def _launch(self, mcis: Mcis, vms: list[Vm]) -> None:
        for vm in vms:
            mcis.vms[vm.name] = vm
            mcis.subgroups.setdefault(vm.subgroup, []).append(vm.name)
            self._associate(mcis, vm, add=True)
        await asyncio.gather(*(self._boot(mcis.namespace, vm) for vm in vms))

    async def _boot(self, ns: str, vm: Vm) -> None:
        failed = self.vm_faults.take(FAILED_VM, vm.name)
        if failed is not None:
            vm.status, vm.system_message = FAILED, failed.message or self.knobs.failed_message
            log.info("ns %s: vm %s Failed (fault): %s", ns, vm.name, vm.system_message)
            return
        vm.private_ip = self._private_ip()
        if self.vm_faults.take(NO_PUBLIC_IP, vm.name) is not None:
            vm.status = RUNNING
            log.info("ns %s: vm %s Running without a public IP (fault)", ns, vm.name)
            return
        address = self.addresses.take()
        key = self.mcir[ns][SSH_KEY][str(vm.request["sshKeyId"])]
        node = self.vm_faults.take(NODE, vm.name)
        knobs = NodeKnobs.from_json(node.node or {}) if node is not None else None
        try:
            await self.farm.start(
                vm.name,
                address,
                str(key["publicKey"]),
                knobs=knobs,
                metadata=seed.instance_metadata(
                    vm.connection, ns, vm.name, vm.private_ip, vm.csp_id
                ),
            )
        except Exception as exc:  # a node that does not boot is a Failed VM, as on a CSP
            self.addresses.release(address)
            vm.status, vm.system_message = FAILED, f"stand-in: sshd did not start: {exc!r}"
            log.exception("ns %s: vm %s: sshd on %s did not start", ns, vm.name, address)
            return
        vm.public_ip = vm.address = address
        vm.status = RUNNING
        log.info("ns %s: vm %s Running at %s / %s", ns, vm.name, address, vm.private_ip)

    async def _terminate(self, vm: Vm) -> None:
        if vm.address is not None:
            address, vm.address = vm.address, None
            try:
                await self.farm.stop(address)
            finally:
                self.addresses.release(address)
        if vm.status != FAILED:
            vm.status = TERMINATED

    def _power(self, vms: list[Vm], action: str) -> Json:
        status = {"suspend": "Suspended", "resume": RUNNING, "reboot": RUNNING}[action]
        for vm in vms:
            if vm.status not in (FAILED, TERMINATED):
                vm.status = status
        verb = {"suspend": "Suspending", "resume": "Resuming", "reboot": "Rebooting"}[action]
        return {"message": f"{verb} the MCIS"}

    def _forget(self, mcis: Mcis, vm: Vm) -> None:
        self._associate(mcis, vm, add=False)
        mcis.vms.pop(vm.name, None)
        members = mcis.subgroups.get(vm.subgroup, [])
        if vm.name in members:
            members.remove(vm.name)
        if not members:
            mcis.subgroups.pop(vm.subgroup, None)

    def _associate(self, mcis: Mcis, vm: Vm, *, add: bool) -> None:
        """Keep each MCIR's ``associatedObjectList`` naming the VMs that use it."""
        key = f"/ns/{mcis.namespace}/mcis/{mcis.name}/vm/{vm.name}"
        request = vm.request
        refs = [(SPEC, "specId"), (IMAGE, "imageId"), (VNET, "vNetId"), (SSH_KEY, "sshKeyId")]
        used = [(kind, str(request[f])) for kind, f in refs]
        used += [(SECURITY_GROUP, str(g)) for g in request.get("securityGroupIds") or []]
        for kind, resource_id in used:
            found = self.mcir[mcis.namespace][kind].get(resource_id)
            if found is None:
                continue
            users = found.setdefault("associatedObjectList", [])
            if add and key not in users:
                users.append(key)
            elif not add and key in users:
                users.remove(key)

    def _private_ip(self) -> str:
        n = self._private_ips
        self._private_ips += 1
        return f"10.0.{1 + n // 250}.{2 + n % 250}"

    async def arm_node_fault(self, fault: VmFault) -> list[str]:
        """Faults for the nodes of matching VMs: running ones now, the rest when they boot.

        Returns the VMs changed now; each counts against ``fault.count``."""
        knobs = NodeKnobs.from_json(fault.node or {})
        changed: list[str] = []
        for mcis in (m for items in self.mcis.values() for m in items.values()):
            for vm in mcis.vms.values():
                if fault.count == 0:
                    return changed
                if vm.address is not None and fault.matches(vm.name):
                    await self.farm.set_knobs(vm.address, knobs)
                    changed.append(vm.name)
                    fault.count -= 1 if fault.count > 0 else 0
        if fault.count != 0:
            self.vm_faults.arm(fault)
        return changed

    # --- for tests -------------------------------------------------------------------------

    def summary(self) -> Json:
        return {
            "namespaces": sorted(self.namespaces),
            "namespaceMode": self.namespace_mode,
            "mcir": {
                ns: {kind: sorted(items) for kind, items in kinds.items()}
                for ns, kinds in self.mcir.items()
            },
            "mcis": {
                ns: [_mcis_summary(m) for m in items.values()] for ns, items in self.mcis.items()
            },
            "addressesInUse": self.addresses.in_use(),
            "vmFaults": [f.as_json() for f in self.vm_faults.armed],
            "spider": self.spider.summary(),
        }


def deletable(mcis: Mcis) -> bool:
    status = render.mcis_status(list(mcis.vms.values()))
    return "Partial-" not in status and any(
        word in status for word in (TERMINATED, "Undefined", FAILED)
    )


def _mcis_summary(mcis: Mcis) -> Json:
    return {
        "name": mcis.name,
        "status": render.mcis_status(list(mcis.vms.values())),
        "subGroups": {group: list(vms) for group, vms in mcis.subgroups.items()},
        "nlbs": sorted(mcis.nlbs),
        "vms": [
            {
                "name": vm.name,
                "subGroupId": vm.subgroup,
                "status": vm.status,
                "systemMessage": vm.system_message,
                "connectionName": vm.connection.name,
                "publicIP": vm.public_ip,
                "privateIP": vm.private_ip,
                "sshd": vm.address is not None,
            }
            for vm in mcis.vms.values()
        ],
    }


def _mcis_fields(body: Json) -> Json:
    names = ("name", "description", "label", "systemLabel", "installMonAgent")
    return {name: text(body, name) for name in names}


def _vm_fields(request: Json) -> Json:
    names = (
        "name",
        "subGroupSize",
        "label",
        "description",
        "connectionName",
        "specId",
        "imageId",
        "vNetId",
        "subnetId",
        "sshKeyId",
        "vmUserAccount",
        "vmUserPassword",
        "rootDiskType",
        "rootDiskSize",
    )
    fields: Json = {name: text(request, name) for name in names}
    fields["securityGroupIds"] = [str(g) for g in get(request, "securityGroupIds") or []]
    return fields


def _size(value: str) -> int:
    """``subGroupSize``: empty, unparsable or below 1 counts as 1."""
    try:
        return max(1, int(value))
    except ValueError:
        return 1


def _seconds(value: str, default: int) -> int:
    """A health-checker number: ``default`` (or empty) is the CSP's default."""
    try:
        return int(value)
    except ValueError:
        return default


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _omit_empty(body: Json) -> Json:
    """Go's ``omitempty``: empty strings and lists are left out."""
    return {k: v for k, v in body.items() if v not in ("", None)}
