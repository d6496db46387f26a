"""What the services made of the Cluster, read from the API server and from Helm.

Everything here is a read: the Helm release history (the real ``helm`` binary, against the
same API server), the identity objects, the Zenith reservation recorded on the API server's
Secret, and the flavors the machines were rendered with after the Lease remapped them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from demo.scene import Scene
from demo.style import BOLD, say
from shared.errors import KubeNotFound
from shared.kube import ResourceKind
from shared.messages import ObjectRef
from shared.resources import CAPI_CLUSTER, CLUSTER, LEASE, OIDC_CLIENT, PLATFORM, SECRET

Json = dict[str, Any]

OSM_TEMPLATE = ResourceKind(
    "openstackmachinetemplate",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackMachineTemplate",
    "openstackmachinetemplates",
)
ZENITH_FQDN = "azimuth.stackhpc.com/zenith-fqdn"


async def helm_history(scene: Scene, ref: ObjectRef) -> list[Json]:
    """``helm history <cluster>``: one entry per revision of the Cluster's release."""
    proc = await asyncio.create_subprocess_exec(
        str(scene.bin_dir / "helm"),
        *("history", ref.name, "-n", str(ref.namespace), "-o", "json"),
        env=scene.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        say(f"   helm history failed: {err.decode().strip()}", BOLD)
        return []
    return list(json.loads(out))


async def show_release(scene: Scene, ref: ObjectRef) -> list[Json]:
    history = await helm_history(scene, ref)
    for entry in history:
        say(
            f"   ↳ helm release {ref.name}: revision {entry['revision']} {entry['status']}"
            f" ({entry['chart']}) {entry.get('description', '')}",
            BOLD,
        )
    return history


async def show_outcome(scene: Scene, ref: ObjectRef) -> None:
    await show_release(scene, ref)
    await _show_identity(scene, ref)
    await _show_zenith(scene, ref)
    await _show_flavors(scene, ref)


async def _show_identity(scene: Scene, ref: ObjectRef) -> None:
    for kind, key in ((OIDC_CLIENT, "issuerUrl"), (PLATFORM, "rootGroup")):
        items, _ = await scene.kube.list(kind, namespace=ref.namespace)
        for item in items:
            status = item.get("status") or {}
            say(
                f"   ↳ {kind.kind} {item['metadata']['name']}: phase {status.get('phase', '-')},"
                f" {key} {status.get(key, '-')}",
                BOLD,
            )


async def _show_zenith(scene: Scene, ref: ObjectRef) -> None:
    name = f"{ref.name}-zenith-apiserver"
    try:
        secret = await scene.kube.get(SECRET, ref.namespace, name)
    except KubeNotFound:
        say(f"   ↳ no Secret {name}: Zenith did not reserve a subdomain", BOLD)
        return
    fqdn = (secret["metadata"].get("annotations") or {}).get(ZENITH_FQDN, "-")
    capi = await scene.kube.get(CAPI_CLUSTER, ref.namespace, ref.name)
    endpoint = capi["spec"].get("controlPlaneEndpoint") or {}
    say(f"   ↳ Secret {name}: zenith-fqdn {fqdn}", BOLD)
    say(
        f"     CAPI Cluster controlPlaneEndpoint {endpoint.get('host')}:{endpoint.get('port')}",
        BOLD,
    )
    cluster = await scene.kube.get(CLUSTER, ref.namespace, ref.name)
    for key, service in ((cluster.get("status") or {}).get("services") or {}).items():
        say(f"     service {key} ({service.get('label')}): {service.get('fqdn')}", BOLD)


async def _show_flavors(scene: Scene, ref: ObjectRef) -> None:
    lease = await scene.kube.get(LEASE, ref.namespace, f"kube-{ref.name}")
    mapping = (lease.get("status") or {}).get("sizeNameMap") or {}
    say(f"   ↳ Lease kube-{ref.name}: sizeNameMap {json.dumps(mapping)}", BOLD)
    templates, _ = await scene.kube.list(OSM_TEMPLATE, namespace=ref.namespace)
    for template in templates:
        flavor = template["spec"]["template"]["spec"].get("flavor")
        say(f"     OpenStackMachineTemplate {template['metadata']['name']}: flavor {flavor}", BOLD)
