"""metal-api's HTTP face (aiohttp): routes, HMAC, fault knobs, request counts.

Each route has a short name (``machine-allocate``, ``ip-free``, ...) that the fault knobs
and the request counts use. A request passes, in order: the count; an injected fault, if
one is armed for its route (a fault plays a failing server or proxy, so it comes before
authentication); the HMAC check when a key is set; then the rule. A ``MetalError`` becomes
metal-api's error body ``{"statuscode", "message"}``; a body that is not a JSON object is a
422, as go-restful's ``ReadEntity`` failure is in metal-api.

``/_standin/*`` is for tests and benchmarks and needs no HMAC: ``POST /_standin/faults``
arms ``{"route", "status" (500), "count" (1; negative: until cleared), "message",
"retry_after"}``, ``DELETE /_standin/faults`` clears them, ``GET /_standin/state`` summarises
machines, IPs and networks, ``GET /_standin/requests`` counts requests per route.
"""

from __future__ import annotations

import json
import logging
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from standins.metalapi import machines, render
from standins.metalapi.auth import AuthError, verify
from standins.metalapi.knobs import MetalApiKnobs
from standins.metalapi.lifecycle import Lifecycle
from standins.metalapi.model import Json, MetalError

log = logging.getLogger("standins.metalapi")

Answer = tuple[int, Any]
Rule = Callable[[web.Request, Json], Awaitable[Answer]]


@dataclass
class Fault:
    status: int = 500
    count: int = 1
    message: str = "injected fault"
    retry_after: int | None = None


class MetalApiServer:
    def __init__(self, lifecycle: Lifecycle, knobs: MetalApiKnobs) -> None:
        self.lifecycle = lifecycle
        self.world = lifecycle.world
        self.knobs = knobs
        self.faults: dict[str, Fault] = {}
        self.requests: Counter[str] = Counter()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def routes(self) -> list[tuple[str, str, str, Rule]]:
        return [
            ("POST", "/v1/network/allocate", "network-allocate", self._network_allocate),
            ("POST", "/v1/network/find", "network-find", self._network_find),
            ("POST", "/v1/network/free/{id}", "network-free", self._network_free),
            ("DELETE", "/v1/network/free/{id}", "network-free", self._network_free),
            ("GET", "/v1/network/{id}", "network-get", self._network_get),
            ("POST", "/v1/ip/allocate", "ip-allocate", self._ip_allocate),
            ("POST", "/v1/ip/allocate/{ip}", "ip-allocate", self._ip_allocate),
            ("POST", "/v1/ip/find", "ip-find", self._ip_find),
            ("POST", "/v1/ip/free/{ip}", "ip-free", self._ip_free),
            ("DELETE", "/v1/ip/free/{ip}", "ip-free", self._ip_free),
            ("GET", "/v1/ip/{ip}", "ip-get", self._ip_get),
            ("POST", "/v1/machine/allocate", "machine-allocate", self._machine_allocate),
            ("POST", "/v1/machine/find", "machine-find", self._machine_find),
            ("DELETE", "/v1/machine/{id}/free", "machine-free", self._machine_free),
            ("GET", "/v1/machine", "machine-list", self._machine_list),
            ("GET", "/v1/machine/{id}", "machine-get", self._machine_get),
            ("POST", "/v1/firewall/allocate", "firewall-allocate", self._firewall_allocate),
            ("POST", "/v1/firewall/find", "firewall-find", self._firewall_find),
            ("GET", "/v1/firewall/{id}", "firewall-get", self._firewall_get),
        ]

    def app(self) -> web.Application:
        app = web.Application()
        for method, path, name, rule in self.routes():
            app.router.add_route(method, path, self._handler(name, rule))
        app.router.add_post("/_standin/faults", self._arm_fault)
        app.router.add_delete("/_standin/faults", self._clear_faults)
        app.router.add_get("/_standin/state", self._state)
        app.router.add_get("/_standin/requests", self._requests)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        # Binding our own socket is how port 0 reveals the port it got.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.knobs.host, self.knobs.port))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://{self.knobs.host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        self.lifecycle.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the pipeline ------------------------------------------------------------------------

    def _handler(self, name: str, rule: Rule) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            self.requests[name] += 1
            try:
                self._maybe_fail(name)
                self._authenticate(request)
                status, body = await rule(request, await _body(request))
            except MetalError as exc:
                log.info("%s %s -> %s %s", request.method, request.path, exc.status, exc.message)
                return _error(exc)
            except Exception as exc:  # a stand-in bug still answers in metal-api's shape
                log.exception("%s %s failed", request.method, request.path)
                return _error(MetalError(500, f"stand-in failure: {exc!r}"))
            return web.json_response(body, status=status)

        return handle

    def _maybe_fail(self, name: str) -> None:
        fault = self.faults.get(name)
        if fault is None:
            return
        fault.count -= 1
        if fault.count == 0:
            del self.faults[name]
        raise MetalError(fault.status, fault.message, retry_after=fault.retry_after)

    def _authenticate(self, request: web.Request) -> None:
        if not self.knobs.hmac:
            return
        try:
            lifetime = self.knobs.hmac_lifetime
            verify(self.knobs.hmac, request.method, request.headers, lifetime=lifetime)
        except AuthError as exc:
            raise MetalError(401, str(exc)) from exc

    # --- networks and IPs ------------------------------------------------------------------

    async def _network_allocate(self, request: web.Request, body: Json) -> Answer:
        return 201, render.network(self.world, self.world.allocate_network(body))

    async def _network_find(self, request: web.Request, body: Json) -> Answer:
        return 200, [render.network(self.world, n) for n in self.world.find_networks(body)]

    async def _network_free(self, request: web.Request, body: Json) -> Answer:
        return 200, render.network(self.world, self.world.free_network(request.match_info["id"]))

    async def _network_get(self, request: web.Request, body: Json) -> Answer:
        return 200, render.network(self.world, self.world.network(request.match_info["id"]))

    async def _ip_allocate(self, request: web.Request, body: Json) -> Answer:
        return 201, render.ip(self.world.allocate_ip(body, request.match_info.get("ip")))

    async def _ip_find(self, request: web.Request, body: Json) -> Answer:
        return 200, [render.ip(ip) for ip in self.world.find_ips(body)]

    async def _ip_free(self, request: web.Request, body: Json) -> Answer:
        return 200, render.ip(self.world.free_ip(request.match_info["ip"]))

    async def _ip_get(self, request: web.Request, body: Json) -> Answer:
        return 200, render.ip(self.world.ip(request.match_info["ip"]))

    # --- machines and firewalls --------------------------------------------------------------

    async def _machine_allocate(self, request: web.Request, body: Json) -> Answer:
        return 200, render.machine(self.world, self.lifecycle.allocate(body))

    async def _machine_find(self, request: web.Request, body: Json) -> Answer:
        return 200, [render.machine(self.world, m) for m in machines.find(self.world, body)]

    async def _machine_free(self, request: web.Request, body: Json) -> Answer:
        return 200, render.machine(self.world, self.lifecycle.free(request.match_info["id"]))

    async def _machine_list(self, request: web.Request, body: Json) -> Answer:
        return 200, [render.machine(self.world, m) for m in self.world.machines.values()]

    async def _machine_get(self, request: web.Request, body: Json) -> Answer:
        return 200, render.machine(self.world, self.world.machine(request.match_info["id"]))

    async def _firewall_allocate(self, request: web.Request, body: Json) -> Answer:
        return 200, render.machine(self.world, self.lifecycle.allocate(body, firewall=True))

    async def _firewall_find(self, request: web.Request, body: Json) -> Answer:
        found = machines.find(self.world, body, firewalls=True)
        return 200, [render.machine(self.world, m) for m in found]

    async def _firewall_get(self, request: web.Request, body: Json) -> Answer:
        machine = self.world.machine(request.match_info["id"])
        if not self.world.is_firewall(machine):
            raise MetalError(404, "machine is not a firewall")
        return 200, render.machine(self.world, machine)

    # --- /_standin -------------------------------------------------------------------------

    async def _arm_fault(self, request: web.Request) -> web.Response:
        try:
            body = await _body(request)
            route = str(body["route"])
            fault = Fault(
                status=int(body.get("status") or 500),
                count=int(body.get("count") or 1),
                message=str(body.get("message") or f"injected fault on {route}"),
                retry_after=int(body["retry_after"]) if body.get("retry_after") else None,
            )
        except (MetalError, KeyError, TypeError, ValueError) as exc:
            return web.json_response({"statuscode": 422, "message": repr(exc)}, status=422)
        if route not in {name for _, _, name, _ in self.routes()}:
            return web.json_response(
                {"statuscode": 422, "message": f"no route {route}"}, status=422
            )
        self.faults[route] = fault
        return web.json_response({"route": route, **fault.__dict__})

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return web.json_response({})

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(render.summary(self.world))

    async def _requests(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.requests))


async def _body(request: web.Request) -> Json:
    if not request.can_read_body:
        return {}
    text = await request.text()
    if not text.strip():
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MetalError(422, f"unable to parse the request body: {exc}") from exc
    if not isinstance(body, dict):
        raise MetalError(422, "the request body must be a JSON object")
    return body


def _error(exc: MetalError) -> web.Response:
    body = {"statuscode": exc.status, "message": exc.message}
    response = web.json_response(body, status=exc.status)
    if exc.retry_after is not None:
        response.headers["Retry-After"] = str(exc.retry_after)
    return response
