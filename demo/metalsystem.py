"""Start the metal-stack scene's processes: the metal-api stand-in, the Cluster API stand-in,
and capibus's watcher, writer and metal-stack provider, as ``tests/integration/
test_metalstack.py`` wires them, each in its own process group like the Azimuth scene's.

- **metal-api** (``python -m standins.metalapi``): HMAC on, so every request the provider
  makes is signed as against a real installation; a small pool (``POOL_SIZE``) so the end of
  the story can show every machine back in it; provisioning and reboots a second long, so a
  machine's wait for its Node is long enough to see. Its node registrar writes a Node into the
  workload API server when a machine phones home, as a booted machine's kubelet would. It
  listens on a port of its choosing and logs its URL, which the provider needs.
- **Cluster API** (``python -m standins --only capi``): CAPI core and kubeadm for a Cluster
  whose infrastructure is a MetalStackCluster; the ``<cluster>-kubeconfig`` it writes is the
  workload API server's (``STANDIN_CAPI_KUBECONFIG``), which the provider reads to find Nodes.
- **watcher** with the six kinds the provider reacts to, **writer**, and the provider
  (``python -m services.baremetal.metalstack``) with upstream's ``METALCTL_URL`` and
  ``METALCTL_HMAC``.
"""

from __future__ import annotations

import json
from pathlib import Path

from demo.feed import DemoTimeout
from demo.processes import Service
from demo.scene import Scene
from demo.style import note
from demo.system import STEP_DELAY, bus_env, list_processes, settle, until_ready
from shared.resources import (
    CAPI_CLUSTER,
    MACHINE,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    SECRET,
)

HMAC = "capibus-demo-hmac"
POOL_SIZE = 10
MACHINE_DELAY = "1.0"
#: what the provider's one subscription needs from the watcher (docs/metalstack.md §2)
WATCHED = (
    METALSTACK_CLUSTER,
    METALSTACK_MACHINE,
    METALSTACK_FIREWALL,
    CAPI_CLUSTER,
    MACHINE,
    SECRET,
)
URL_TIMEOUT = 20.0
LISTENING = "metal-api listening on "
SEEDED_NETWORKS = ("internet-vagrant-lab", "tenant-super-network-vagrant")


async def start(scene: Scene, workload: Path) -> str:
    """Start everything, wait until each process is ready; the metal-api stand-in's URL."""
    base = {**scene.env, "PYTHONUNBUFFERED": "1"}
    metalapi = scene.services.start(
        Service(
            "metal-api",
            {**base, **_metalapi_env(workload)},
            scene.workdir,
            module="standins.metalapi",
        )
    )
    capi_env = {**base, "STANDIN_STEP_DELAY": STEP_DELAY, "STANDIN_CAPI_KUBECONFIG": str(workload)}
    capi = scene.services.start(
        Service("standins", capi_env, scene.workdir, module="standins", args=("--only", "capi"))
    )
    url = await _url(scene, metalapi)
    started = [_service(scene, base, name, url) for name in ("watcher", "writer", "metalstack")]
    await until_ready(
        scene, logs=[(capi, "stand-ins running")], consumers=started[1:], kinds=WATCHED
    )
    list_processes([metalapi, capi, *started])
    note(f"metal-api stand-in on {url}: {POOL_SIZE} machines Waiting, HMAC on")
    note(f"watcher kinds: {', '.join(kind.token for kind in WATCHED)}")
    await settle()
    return url


def _metalapi_env(workload: Path) -> dict[str, str]:
    return {
        "STANDIN_METALAPI_HMAC": HMAC,
        "STANDIN_METALAPI_WORKLOAD_KUBECONFIG": str(workload),
        "STANDIN_METALAPI_POOL_SIZE": str(POOL_SIZE),
        "STANDIN_METALAPI_PROVISIONING_DELAY": MACHINE_DELAY,
        "STANDIN_METALAPI_REBOOT_DELAY": MACHINE_DELAY,
    }


def _service(scene: Scene, base: dict[str, str], name: str, url: str) -> Service:
    env = {**base, **bus_env(), "CAPIBUS_REPLICA": f"{name}-1"}
    if name == "watcher":
        env["CAPIBUS_WATCHER__KINDS"] = json.dumps([kind.token for kind in WATCHED])
    module = ""
    if name == "metalstack":
        env |= {"METALCTL_URL": url, "METALCTL_HMAC": HMAC}
        module = "services.baremetal.metalstack"
    return scene.services.start(Service(name, env, scene.workdir, module=module))


async def _url(scene: Scene, metalapi: Service) -> str:
    """The stand-in picks its port: its URL is known once it says where it listens."""
    try:
        await scene.guarded(
            metalapi.wait_for_log(LISTENING),
            "the metal-api stand-in listening",
            seconds=URL_TIMEOUT,
        )
    except DemoTimeout as exc:
        raise DemoTimeout(f"{exc}; see {scene.logs()}") from None
    line = next(line for line in metalapi.log().splitlines() if LISTENING in line)
    return line.split(LISTENING, 1)[1].strip()
