"""The processes of the OpenShift Assisted scene, wired as ``tests/integration/test_assisted.py``
wires them (steps 0 and 2 of ``demo.__main__``):

- the **assisted stand-ins** (``python -m standins.assisted --workload-kubeconfig PATH``): the
  InfraEnv reactor (assisted-service's image service), the install reactor (assisted-service
  and hive: the AgentClusterInstall's state walk, each Agent's install, the workload Node of
  every installed host) and the metal3 host stand-in (BareMetal Operator and CAPM3: a
  Metal3Machine claims a BareMetalHost, which boots the discovery ISO as an Agent), paced by
  ``STANDIN_ASSISTED_DELAY`` so a reader can follow the walk;
- the **Cluster API stand-in** (``python -m standins --only capi``): CAPI core, which links
  the control plane, makes the workers' Machines, MachineSets and configs, and deletes in
  CAPI's order; its ``<cluster>-kubeconfig`` default points at the workload API server;
- **watcher** with the ten kinds both providers react to, **writer**, and the two providers
  (``python -m services.baremetal.assisted_bootstrap`` and ``...assisted_controlplane``).
"""

from __future__ import annotations

import json
from pathlib import Path

from demo.processes import Service
from demo.scene import Scene
from demo.style import note
from demo.system import STEP_DELAY, bus_env, list_processes, settle, until_ready
from shared.resources import (
    AGENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    CLUSTER_DEPLOYMENT,
    INFRA_ENV,
    MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    SECRET,
)

#: seconds between the assisted stand-ins' steps: slow enough to read the walk, and the whole
#: scene stays well under two minutes
ASSISTED_DELAY = "0.25"
#: what the two providers' subscriptions need from the watcher (the integration test's list)
WATCHED = (
    OPENSHIFT_ASSISTED_CONFIG,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
    INFRA_ENV,
    AGENT,
    CLUSTER_DEPLOYMENT,
    AGENT_CLUSTER_INSTALL,
    BARE_METAL_HOST,
    CAPI_CLUSTER,
    MACHINE,
    SECRET,
)
PROVIDERS = {
    "assistedbootstrap": "services.baremetal.assisted_bootstrap",
    "assistedcontrolplane": "services.baremetal.assisted_controlplane",
}


async def start(scene: Scene, workload: Path) -> None:
    """Start everything and wait until each process is ready."""
    base = {**scene.env, "PYTHONUNBUFFERED": "1"}
    assisted = scene.services.start(
        Service(
            "assisted-standins",
            {**base, "STANDIN_ASSISTED_DELAY": ASSISTED_DELAY},
            scene.workdir,
            module="standins.assisted",
            args=("--workload-kubeconfig", str(workload)),
        )
    )
    capi_env = {**base, "STANDIN_STEP_DELAY": STEP_DELAY, "STANDIN_CAPI_KUBECONFIG": str(workload)}
    capi = scene.services.start(
        Service("standins", capi_env, scene.workdir, module="standins", args=("--only", "capi"))
    )
    started = [_service(scene, base, name) for name in ("watcher", "writer", *PROVIDERS)]
    await until_ready(
        scene,
        logs=[(assisted, "assisted stand-ins running"), (capi, "stand-ins running")],
        consumers=started[1:],
        kinds=WATCHED,
    )
    list_processes([assisted, capi, *started])
    note(f"assisted stand-ins step every {ASSISTED_DELAY}s; workload API server: {workload}")
    note(f"watcher kinds: {', '.join(kind.token for kind in WATCHED)}")
    await settle()


def _service(scene: Scene, base: dict[str, str], name: str) -> Service:
    env = {**base, **bus_env(), "CAPIBUS_REPLICA": f"{name}-1"}
    if name == "watcher":
        env["CAPIBUS_WATCHER__KINDS"] = json.dumps([kind.token for kind in WATCHED])
    return scene.services.start(Service(name, env, scene.workdir, module=PROVIDERS.get(name, "")))
