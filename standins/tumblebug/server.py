"""CB-Tumblebug's HTTP face (aiohttp): routes under ``/tumblebug``, basic auth, knobs, counts.

Each route has a short name (``mcis-create``, ``sshkey-get``, ...) that route faults and the
request counts use. A request passes, in order: the count; an injected route fault, if one is
armed (it plays a failing server, so it comes before authentication); HTTP basic auth (Echo's
``middleware.BasicAuth``: 401 ``{"message":"Unauthorized"}`` with ``WWW-Authenticate``);
for ``/ns/{ns}/…`` routes, ``NsValidation`` (404 ``Not valid namespace``); then the rule. A
``TbError`` becomes Tumblebug's ``{"message"}`` body. Requests that change state run one at a
time (``World.lock``), so an MCIS create that waits for its sshds is never interleaved with a
delete of the same MCIS.

``GET /ns/{ns}`` is the one namespace route without the middleware's answer: ``strict`` mode
answers 404 ``Not valid namespace`` for an unknown namespace, ``compat`` mode 200
``{"message":"Failed to find the namespace <ns>"}`` (``RestGetNs``'s answer, which
CB-Ladybug takes for "exists": reference quirk).

``POST /spider/anycall`` is CB-Spider's ``anycall`` for single-cloud CCM preparation
(``spider.py``): region and OpenStack connection info encrypted as Spider sends them, IAM
instance profiles (refused a second time, as AWS does) and tags recorded.

``/_standin/*`` (also under ``/tumblebug/_standin/*``) is for tests, without auth:
``POST /_standin/faults`` arms one of ``{"route", "status" (500), "count" (1; negative: until
cleared), "message"}``, ``{"vm": <glob>, "fault": "failed"|"no-public-ip", "count" (-1),
"message"}`` or ``{"namespaceMode": "strict"|"compat"}``; ``GET`` lists what is armed,
``DELETE`` clears route and VM faults. ``GET /_standin/state`` summarises namespaces, MCIR ids,
MCIS with their VMs and status, addresses in use; ``GET /_standin/requests`` counts requests
per route.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import json
import logging
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from standins.sshnodes.node import NodeKnobs
from standins.tumblebug import render, seed
from standins.tumblebug.knobs import COMPAT, STRICT, TumblebugKnobs
from standins.tumblebug.model import (
    FAILED_VM,
    NO_PUBLIC_IP,
    NODE,
    Json,
    TbError,
    VmFault,
    get,
    text,
)
from standins.tumblebug.world import MCIR_TYPES, World

log = logging.getLogger("standins.tumblebug")

BASE = "/tumblebug"
Answer = tuple[int, Any]
Rule = Callable[[web.Request, Json], Awaitable[Answer]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    rule: Rule
    #: under ``/ns/{ns}/``: the namespace must exist
    scoped: bool = False


@dataclass
class Fault:
    status: int = 500
    count: int = 1
    message: str = "injected fault"


class TumblebugServer:
    def __init__(self, world: World, knobs: TumblebugKnobs) -> None:
        self.world = world
        self.knobs = knobs
        self.faults: dict[str, Fault] = {}
        if knobs.mcis_delete_fails:
            self.faults["mcis-delete"] = Fault(
                500, knobs.mcis_delete_fails, "injected fault on mcis-delete"
            )
        self.requests: Counter[str] = Counter()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def routes(self) -> list[Route]:
        ns, mcis = BASE + "/ns/{ns}", BASE + "/ns/{ns}/mcis/{mcis}"
        found = [
            Route("GET", BASE + "/health", "health", self._health),
            Route("POST", BASE + "/ns", "ns-create", self._ns_create),
            Route("GET", BASE + "/ns", "ns-list", self._ns_list),
            Route("GET", ns, "ns-get", self._ns_get),
            Route("GET", BASE + "/connConfig", "connconfig-list", self._conn_list),
            Route("GET", BASE + "/connConfig/{name}", "connconfig-get", self._conn_get),
            Route("GET", BASE + "/region/{name}", "region-get", self._region_get),
            Route("POST", BASE + "/lookupSpec", "lookup-spec", self._lookup_spec),
            Route("POST", BASE + "/lookupSpecs", "lookup-specs", self._lookup_specs),
            Route("POST", BASE + "/lookupImages", "lookup-images", self._lookup_images),
        ]
        for kind in MCIR_TYPES:
            short, path = kind.lower(), f"{ns}/resources/{kind}"
            found += [
                Route("POST", path, f"{short}-create", self._mcir_create, True),
                Route("GET", path, f"{short}-list", self._mcir_list, True),
                Route("GET", path + "/{id}", f"{short}-get", self._mcir_get, True),
                Route("DELETE", path + "/{id}", f"{short}-delete", self._mcir_delete, True),
            ]
        found += [
            Route("POST", ns + "/mcis", "mcis-create", self._mcis_create, True),
            Route("GET", ns + "/mcis", "mcis-list", self._mcis_list, True),
            Route("GET", mcis, "mcis-get", self._mcis_get, True),
            Route("DELETE", mcis, "mcis-delete", self._mcis_delete, True),
            Route("GET", ns + "/control/mcis/{mcis}", "mcis-control", self._control, True),
            Route("POST", mcis + "/vm", "vm-create", self._vm_create, True),
            Route("GET", mcis + "/vm/{vm}", "vm-get", self._vm_get, True),
            Route("DELETE", mcis + "/vm/{vm}", "vm-delete", self._vm_delete, True),
            Route("POST", mcis + "/nlb", "nlb-create", self._nlb_create, True),
            Route("GET", mcis + "/nlb/{nlb}", "nlb-get", self._nlb_get, True),
            Route("DELETE", mcis + "/nlb/{nlb}", "nlb-delete", self._nlb_delete, True),
            Route("POST", "/spider/anycall", "spider-anycall", self._anycall),
        ]
        return found

    def app(self) -> web.Application:
        app = web.Application()
        for route in self.routes():
            app.router.add_route(route.method, route.path, self._handler(route))
        for prefix in ("", BASE):
            app.router.add_post(prefix + "/_standin/faults", self._arm_fault)
            app.router.add_get(prefix + "/_standin/faults", self._list_faults)
            app.router.add_delete(prefix + "/_standin/faults", self._clear_faults)
            app.router.add_get(prefix + "/_standin/state", self._state)
            app.router.add_get(prefix + "/_standin/requests", self._requests)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        # Binding our own socket is how port 0 reveals the port it got.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.knobs.host, self.knobs.port))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://{self.knobs.host}:{sock.getsockname()[1]}{BASE}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the pipeline ----------------------------------------------------------------------

    def _handler(self, route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
        changes = route.method != "GET" or route.name == "mcis-control"

        async def handle(request: web.Request) -> web.Response:
            self.requests[route.name] += 1
            try:
                self._maybe_fail(route.name)
                self._authenticate(request)
                if route.scoped:
                    self.world.check_namespace(request.match_info["ns"])
                body = await _body(request) if route.method == "POST" else {}
                if changes:
                    async with self.world.lock:
                        status, answer = await route.rule(request, body)
                else:
                    status, answer = await route.rule(request, body)
            except TbError as exc:
                log.info("%s %s -> %s %s", request.method, request.path, exc.status, exc.message)
                return _error(exc)
            except Exception as exc:  # a stand-in bug still answers in Tumblebug's shape
                log.exception("%s %s failed", request.method, request.path)
                return _error(TbError(500, f"stand-in failure: {exc!r}"))
            return web.json_response(answer, status=status)

        return handle

    def _maybe_fail(self, name: str) -> None:
        fault = self.faults.get(name)
        if fault is None:
            return
        fault.count -= 1
        if fault.count == 0:
            del self.faults[name]
        raise TbError(fault.status, fault.message)

    def _authenticate(self, request: web.Request) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() == "basic" and encoded:
            try:
                user, _, password = base64.b64decode(encoded).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise TbError(400, "Bad Request") from exc
            if hmac.compare_digest(user, self.knobs.username) and hmac.compare_digest(
                password, self.knobs.password
            ):
                return
        raise Unauthorized()

    # --- seeds -----------------------------------------------------------------------------

    async def _health(self, request: web.Request, body: Json) -> Answer:
        return 200, {"message": "CB-Tumblebug is running"}

    async def _conn_list(self, request: web.Request, body: Json) -> Answer:
        items = [seed.conn_config(c) for c in self.world.connections.values()]
        return 200, {"connectionconfig": items}

    async def _conn_get(self, request: web.Request, body: Json) -> Answer:
        name = request.match_info["name"]
        connection = self.world.connections.get(name)
        if connection is None:
            raise TbError(404, f"Failed to find the connection config {name}")
        return 200, seed.conn_config(connection)

    async def _region_get(self, request: web.Request, body: Json) -> Answer:
        name = request.match_info["name"]
        found = next((c for c in self.world.connections.values() if c.region_name == name), None)
        if found is None:
            raise TbError(404, f"Failed to find the region {name}")
        return 200, seed.region(found)

    async def _lookup_spec(self, request: web.Request, body: Json) -> Answer:
        connection = self._lookup_connection(body)
        name = text(body, "cspSpecName")
        spec = seed.find_spec(connection, name)
        if spec is None:
            raise TbError(404, f"{name} spec not found in {connection.name}")
        return 200, seed.spider_spec(connection, spec)

    async def _lookup_specs(self, request: web.Request, body: Json) -> Answer:
        connection = self._lookup_connection(body)
        return 200, {"vmspec": [seed.spider_spec(connection, s) for s in connection.specs]}

    async def _lookup_images(self, request: web.Request, body: Json) -> Answer:
        connection = self._lookup_connection(body)
        images = [
            {
                "IId": {"NameId": name, "SystemId": f"{connection.csp}-{i:04d}"},
                "GuestOS": name,
                "Status": "available",
                "KeyValueList": [],
            }
            for i, name in enumerate(("Ubuntu 18.04", "Ubuntu 20.04", "CirrOS 0.5"), start=1)
        ]
        return 200, {"image": images}

    def _lookup_connection(self, body: Json) -> seed.Connection:
        name = text(body, "connectionName")
        connection = self.world.connections.get(name)
        if connection is None:
            raise TbError(404, f"{name} connection config not found")
        return connection

    # --- namespaces ------------------------------------------------------------------------

    async def _ns_create(self, request: web.Request, body: Json) -> Answer:
        return 201, self.world.create_namespace(body)

    async def _ns_list(self, request: web.Request, body: Json) -> Answer:
        return 200, {"ns": list(self.world.namespaces.values())}

    async def _ns_get(self, request: web.Request, body: Json) -> Answer:
        name = request.match_info["ns"]
        found = self.world.namespaces.get(name)
        if found is not None:
            return 200, found
        if self.world.namespace_mode == COMPAT:
            return 200, {"message": f"Failed to find the namespace {name}"}
        self.world.check_namespace(name)
        raise AssertionError("unreachable: the namespace check refuses")

    # --- MCIR ------------------------------------------------------------------------------

    def _kind(self, request: web.Request) -> str:
        return request.path.split("/")[5]

    async def _mcir_create(self, request: web.Request, body: Json) -> Answer:
        ns, kind = request.match_info["ns"], self._kind(request)
        return 201, self.world.mcir_create(ns, kind, body, request.query.get("action", ""))

    async def _mcir_list(self, request: web.Request, body: Json) -> Answer:
        ns, kind = request.match_info["ns"], self._kind(request)
        return 200, {kind: list(self.world.mcir[ns][kind].values())}

    async def _mcir_get(self, request: web.Request, body: Json) -> Answer:
        ns, kind = request.match_info["ns"], self._kind(request)
        return 200, self.world.mcir_get(ns, kind, request.match_info["id"])

    async def _mcir_delete(self, request: web.Request, body: Json) -> Answer:
        ns, kind = request.match_info["ns"], self._kind(request)
        return 200, self.world.mcir_delete(ns, kind, request.match_info["id"])

    # --- MCIS, VMs, NLBs -------------------------------------------------------------------

    async def _mcis_create(self, request: web.Request, body: Json) -> Answer:
        return 201, await self.world.mcis_create(request.match_info["ns"], body)

    async def _mcis_list(self, request: web.Request, body: Json) -> Answer:
        items = self.world.mcis[request.match_info["ns"]].values()
        return 200, {"mcis": [render.mcis(m) for m in items]}

    async def _mcis_get(self, request: web.Request, body: Json) -> Answer:
        found = self.world.mcis_get(request.match_info["ns"], request.match_info["mcis"])
        return 200, render.mcis(found)

    async def _mcis_delete(self, request: web.Request, body: Json) -> Answer:
        ns, name = request.match_info["ns"], request.match_info["mcis"]
        return 200, await self.world.mcis_delete(ns, name, request.query.get("option", ""))

    async def _control(self, request: web.Request, body: Json) -> Answer:
        ns, name = request.match_info["ns"], request.match_info["mcis"]
        return 200, await self.world.control(ns, name, request.query.get("action", ""))

    async def _vm_create(self, request: web.Request, body: Json) -> Answer:
        ns, name = request.match_info["ns"], request.match_info["mcis"]
        return 201, await self.world.vm_add(ns, name, body)

    async def _vm_get(self, request: web.Request, body: Json) -> Answer:
        ns, mcis, vm = (request.match_info[k] for k in ("ns", "mcis", "vm"))
        option = request.query.get("option", "")
        if option == "idsInDetail":
            return 200, render.ids_in_detail(ns, self.world.vm_get(ns, mcis, vm, status=500))
        if option == "status":
            return 200, render.vm_status(ns, self.world.vm_get(ns, mcis, vm, status=500))
        return 200, render.vm(ns, self.world.vm_get(ns, mcis, vm))

    async def _vm_delete(self, request: web.Request, body: Json) -> Answer:
        ns, mcis, vm = (request.match_info[k] for k in ("ns", "mcis", "vm"))
        return 200, await self.world.vm_delete(ns, mcis, vm)

    async def _nlb_create(self, request: web.Request, body: Json) -> Answer:
        ns, name = request.match_info["ns"], request.match_info["mcis"]
        return 201, self.world.nlb_create(ns, name, body)

    async def _nlb_get(self, request: web.Request, body: Json) -> Answer:
        ns, mcis, nlb = (request.match_info[k] for k in ("ns", "mcis", "nlb"))
        return 200, self.world.nlb_get(ns, mcis, nlb)

    async def _nlb_delete(self, request: web.Request, body: Json) -> Answer:
        ns, mcis, nlb = (request.match_info[k] for k in ("ns", "mcis", "nlb"))
        return 200, self.world.nlb_delete(ns, mcis, nlb)

    async def _anycall(self, request: web.Request, body: Json) -> Answer:
        connection = self._lookup_connection(body)
        info = get(body, "reqInfo") or {}
        fid = text(info, "fId")
        given = get(info, "iKeyValueList") or []
        out = self.world.spider.anycall(connection, fid, given)
        return 200, {"FID": fid, "IKeyValueList": given, "OKeyValueList": out}

    # --- /_standin -------------------------------------------------------------------------

    async def _arm_fault(self, request: web.Request) -> web.Response:
        try:
            body = await _body(request)
            async with self.world.lock:
                changed = await self._arm(body)
        except (TbError, KeyError, TypeError, ValueError) as exc:
            return web.json_response({"message": repr(exc)}, status=422)
        listed = await self._list_faults(request)
        return web.json_response({**json.loads(listed.text or "{}"), "changedNow": changed})

    async def _arm(self, body: Json) -> list[str]:
        armed, changed = False, list[str]()
        if "namespaceMode" in body:
            mode = str(body["namespaceMode"])
            if mode not in (STRICT, COMPAT):
                raise ValueError(f"namespaceMode must be {STRICT} or {COMPAT}")
            self.world.namespace_mode, armed = mode, True
        if "route" in body:
            route = str(body["route"])
            if route not in {r.name for r in self.routes()}:
                raise ValueError(f"no route {route}")
            self.faults[route] = Fault(
                status=int(body.get("status") or 500),
                count=int(body.get("count") or 1),
                message=str(body.get("message") or f"injected fault on {route}"),
            )
            armed = True
        if "vm" in body and "node" in body:
            node = body["node"]
            known = {f.name for f in dataclasses.fields(NodeKnobs)}
            if not isinstance(node, dict) or not node or not set(node) <= known:
                raise ValueError(f"node must be an object of NodeKnobs fields: {sorted(known)}")
            count = int(body.get("count") or -1)
            fault = VmFault(NODE, str(body["vm"]), count, node=node)
            changed, armed = await self.world.arm_node_fault(fault), True
        elif "vm" in body:
            kind = str(body.get("fault") or FAILED_VM)
            if kind not in (FAILED_VM, NO_PUBLIC_IP):
                raise ValueError(f"fault must be {FAILED_VM} or {NO_PUBLIC_IP}")
            count = int(body.get("count") or -1)
            message = str(body.get("message") or "")
            self.world.vm_faults.arm(VmFault(kind, str(body["vm"]), count, message))
            armed = True
        if not armed:
            raise ValueError("give route, vm or namespaceMode")
        return changed

    async def _list_faults(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "routes": {name: asdict(f) for name, f in self.faults.items()},
                "vmFaults": [f.as_json() for f in self.world.vm_faults.armed],
                "namespaceMode": self.world.namespace_mode,
            }
        )

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        self.world.vm_faults.clear()
        return await self._list_faults(request)

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.world.summary())

    async def _requests(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.requests))


class Unauthorized(TbError):
    def __init__(self) -> None:
        super().__init__(401, "Unauthorized")


async def _body(request: web.Request) -> Json:
    if not request.can_read_body:
        return {}
    raw = await request.text()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TbError(400, f"Syntax error: offset={exc.pos}, error={exc.msg}") from exc
    if not isinstance(body, dict):
        raise TbError(400, "Unmarshal type error: expected=object")
    return body


def _error(exc: TbError) -> web.Response:
    response = web.json_response({"message": exc.message}, status=exc.status)
    if isinstance(exc, Unauthorized):
        response.headers["WWW-Authenticate"] = "basic realm=Restricted"
    return response
