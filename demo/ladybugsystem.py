"""The processes of the CB-Ladybug scene, wired as ``tests/integration/test_ladybug.py``
wires them (steps 0 and 2 of ``demo.__main__``):

- the **CB-Tumblebug stand-in** (``python -m standins.tumblebug``): Tumblebug v0.7.0's REST API
  with basic auth, whose every running VM is a real ``sshd`` on its own loopback address
  (``standins.sshnodes``), answering the provisioner's commands through the node emulator;
  joined nodes become Nodes of the workload API server (``--workload-kubeconfig``). It picks
  its port and writes its URL to a file, which the API and the provisioner need;
- **watcher** with the one kind the provisioner reacts to (``ladybugcluster``), **writer**,
  and the **provisioner** (``python -m services.ladybug.provisioner``), with upstream's
  ``TUMBLEBUG_URL`` and the stand-in's default basic-auth pair, retrying a node that is not
  listening yet every half second (``SSH_RETRY``) rather than the default two seconds;
- the **REST API** (``python -m services.ladybug.api``) on a free loopback port. It refuses
  to start without credentials, so the demo makes a random bearer token; the token goes to
  the API's environment and to ``<workdir>/ladybug-api.token`` (mode 0600), never to the
  screen: the printed ``curl`` lines say ``$LADYBUG_TOKEN``.

Every LadybugCluster and its Secrets live in one Kubernetes namespace (``NAMESPACE``), made
here before anything starts, as a deployment's manifests would.

The VMs' sshds bind port 22 of their loopback addresses, which the integration tests and the
benchmark use too, possibly at the same moment on the same host: the demo gives the stand-in
its own block (``STANDIN_TUMBLEBUG_ADDRESS_START``/``..._COUNT``), the first of
``ADDRESS_BLOCKS`` where nothing answers on port 22.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx

from demo.feed import DemoTimeout
from demo.processes import Service
from demo.scene import Scene
from demo.style import note
from demo.system import bus_env, list_processes, settle, until_ready
from shared.resources import LADYBUG_CLUSTER
from shared.resources import NAMESPACE as NAMESPACE_KIND
from standins.tumblebug import spider_url

#: the Kubernetes namespace of every LadybugCluster (``CAPIBUS_LADYBUG__NAMESPACE``)
NAMESPACE = "ladybug"
WATCHED = (LADYBUG_CLUSTER,)
START_TIMEOUT = 30.0
LISTENING = "tumblebug listening on "
#: candidate /24s for the VMs' addresses, away from the stand-in's default (127.0.0.2) and
#: the benchmark's (127.0.77.2)
ADDRESS_BLOCKS = tuple(f"127.0.{n}" for n in range(42, 52))
ADDRESSES = 16
SSH_RETRY = "0.5"


@dataclass(frozen=True)
class Endpoints:
    api: str
    token: str
    tumblebug: str
    token_file: Path
    #: the Tumblebug stand-in's ``--nodes-dir``: each VM's sshd files and command log
    nodes_dir: Path


async def start(scene: Scene, workload: Path) -> Endpoints:
    """Start everything and wait until each process is ready; where the two APIs listen."""
    await _namespace(scene)
    base = {**scene.env, "PYTHONUNBUFFERED": "1"}
    url_file = scene.workdir / "tumblebug.url"
    nodes_dir = scene.workdir / "tumblebug-nodes"
    tumblebug = scene.services.start(
        Service(
            "tumblebug",
            {**base, **await _address_block(), "STANDIN_TUMBLEBUG_URL_FILE": str(url_file)},
            scene.workdir,
            module="standins.tumblebug",
            args=(
                "--port",
                "0",
                "--workload-kubeconfig",
                str(workload),
                "--nodes-dir",
                str(nodes_dir),
            ),
        )
    )
    tumblebug_url = await _tumblebug_url(scene, tumblebug)
    ladybug = {
        "CAPIBUS_LADYBUG__NAMESPACE": NAMESPACE,
        "TUMBLEBUG_URL": tumblebug_url,
        "SPIDER_URL": spider_url(tumblebug_url),
    }
    started = [
        _consumer(scene, {**base, **ladybug}, name) for name in ("watcher", "writer", "ladybug")
    ]
    endpoints = _api(scene, {**base, **ladybug}, tumblebug_url, nodes_dir)
    await until_ready(scene, logs=[], consumers=started[1:], kinds=WATCHED)
    await _until_healthy(scene, endpoints.api)
    list_processes([tumblebug, *started, scene.services.started[-1]])
    note(f"Tumblebug stand-in on {tumblebug_url} (basic auth), one sshd per VM on port 22")
    note(f"Ladybug REST API on {endpoints.api}/ladybug; bearer token in {endpoints.token_file}")
    note(f"watcher kinds: {', '.join(kind.token for kind in WATCHED)}")
    await settle()
    return endpoints


async def _address_block() -> dict[str, str]:
    """The stand-in's VM addresses: the first block where no sshd listens yet."""
    for block in ADDRESS_BLOCKS:
        addresses = [f"{block}.{i}" for i in range(2, 2 + ADDRESSES)]
        taken = await asyncio.gather(*(_listening(a) for a in addresses))
        if not any(taken):
            return {
                "STANDIN_TUMBLEBUG_ADDRESS_START": addresses[0],
                "STANDIN_TUMBLEBUG_ADDRESS_COUNT": str(ADDRESSES),
            }
    raise DemoTimeout(f"port 22 is taken in every address block of {ADDRESS_BLOCKS}")


async def _listening(address: str) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(address, 22), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def _namespace(scene: Scene) -> None:
    await scene.kube.create(NAMESPACE_KIND, {"metadata": {"name": NAMESPACE}})
    note(f"Namespace {NAMESPACE}: every LadybugCluster and its Secrets live there")


def _consumer(scene: Scene, base: dict[str, str], name: str) -> Service:
    env = {**base, **bus_env(), "CAPIBUS_REPLICA": f"{name}-1"}
    module = ""
    if name == "watcher":
        env["CAPIBUS_WATCHER__KINDS"] = json.dumps([kind.token for kind in WATCHED])
    if name == "ladybug":
        module = "services.ladybug.provisioner"
        env["CAPIBUS_LADYBUG__SSH_RETRY_SECONDS"] = SSH_RETRY
    return scene.services.start(Service(name, env, scene.workdir, module=module))


def _api(scene: Scene, base: dict[str, str], tumblebug_url: str, nodes_dir: Path) -> Endpoints:
    token = secrets.token_urlsafe(24)
    token_file = scene.workdir / "ladybug-api.token"
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    port = _free_port()
    env = {
        **base,
        "CAPIBUS_REPLICA": "ladybug-api-1",
        "CAPIBUS_METRICS_PORT": "0",
        "CAPIBUS_LADYBUG__API_HOST": "127.0.0.1",
        "CAPIBUS_LADYBUG__API_PORT": str(port),
        "CAPIBUS_LADYBUG__API_TOKEN": token,
        "CAPIBUS_LADYBUG__WAIT_TIMEOUT_SECONDS": "60",
    }
    scene.services.start(Service("ladybug-api", env, scene.workdir, module="services.ladybug.api"))
    return Endpoints(f"http://127.0.0.1:{port}", token, tumblebug_url, token_file, nodes_dir)


async def _tumblebug_url(scene: Scene, tumblebug: Service) -> str:
    """The stand-in picks its port: its URL is known once it says where it listens."""
    try:
        await scene.guarded(
            tumblebug.wait_for_log(LISTENING), "the Tumblebug stand-in listening", seconds=20
        )
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; see {scene.logs()}") from None
    line = next(line for line in tumblebug.log().splitlines() if LISTENING in line)
    return line.split(LISTENING, 1)[1].strip()


async def _until_healthy(scene: Scene, api: str) -> None:
    async def healthy() -> None:
        async with httpx.AsyncClient(base_url=api, timeout=2) as client:
            while True:
                try:
                    if (await client.get("/ladybug/healthy")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)

    try:
        await scene.guarded(healthy(), "the Ladybug REST API answering", seconds=START_TIMEOUT)
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; see {scene.logs()}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
