"""Stand-in for assisted-service's InfraEnv controller: the discovery ISO of an InfraEnv.

assisted-service (``internal/controller/controllers/infraenv_controller.go``) registers the
InfraEnv, generates its discovery image and publishes ``status.isoDownloadURL``, the events
URL, and the ``ImageCreated`` condition. Here the image is a URL only: an InfraEnv whose
``spec.clusterRef`` names an existing ClusterDeployment and whose ``spec.pullSecretRef`` names
a Secret holding a ``.dockerconfigjson`` with ``auths`` gets, one step delay later, all three
in one status write. Otherwise ``ImageCreated`` is False with a message naming what is wrong,
and the InfraEnv is looked at again (``AssistedKnobs.retry``): the missing piece may come, as
upstream's requeue would find it. A ClusterDeployment appearing nudges its InfraEnvs at once
(``nudge_for``).

The ids are stable per InfraEnv (derived from its uid), so a restarted stand-in publishes the
same URL. Fault: a CAPI Cluster annotated ``iso-never`` (``knobs``) keeps its InfraEnvs
(label ``cluster.x-k8s.io/cluster-name``) without an ISO, and nothing is written at all:
capibus must wait, not fail.
"""

from __future__ import annotations

import asyncio
import logging

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import CAPI_CLUSTER, CLUSTER_DEPLOYMENT, INFRA_ENV, SECRET
from standins.assisted.knobs import ASSISTED_FAULT, ISO_NEVER, AssistedKnobs
from standins.assisted.shapes import (
    Json,
    cluster_name,
    fault_of,
    image_condition,
    image_created,
    image_status,
    is_deleting,
    meta,
    pull_secret_problem,
    same_image_condition,
    spec,
)
from standins.base import Controller, fresh, key_of, write_status

log = logging.getLogger("standins.assisted.infraenv")


async def get_or_none(
    kube: KubeClient, kind: ResourceKind, namespace: str | None, name: str
) -> Json | None:
    try:
        return await kube.get(kind, namespace, name)
    except KubeNotFound:
        return None


async def cluster_fault(kube: KubeClient, obj: Json) -> str:
    """The fault named on the CAPI Cluster ``obj`` belongs to (label cluster-name)."""
    name = cluster_name(obj)
    if not name:
        return ""
    cluster = await get_or_none(kube, CAPI_CLUSTER, meta(obj)["namespace"], name)
    return fault_of(cluster, ASSISTED_FAULT)


class InfraEnvReactor:
    def __init__(self, kube: KubeClient, knobs: AssistedKnobs, namespace: str | None) -> None:
        self.kube = kube
        self.knobs = knobs
        self.controller = Controller(
            kube, INFRA_ENV, self.reconcile, namespace=namespace, name="assisted.infraenvs"
        )
        self._held: set[str] = set()  # InfraEnvs held by iso-never, logged once each
        self._retry_at: dict[str, float] = {}

    def nudge_for(self, cd: Json) -> None:
        """Look again at the InfraEnvs that name ``cd``: it may be what they waited for."""
        for infraenv in self.controller.known():
            ref = spec(infraenv).get("clusterRef") or {}
            namespace = ref.get("namespace") or meta(infraenv)["namespace"]
            if ref.get("name") == meta(cd)["name"] and namespace == meta(cd)["namespace"]:
                self.controller.offer(infraenv)

    async def reconcile(self, infraenv: Json) -> None:
        infraenv = await fresh(self.kube, INFRA_ENV, infraenv)
        if is_deleting(infraenv) or image_created(infraenv):
            return
        key = key_of(infraenv)
        if await cluster_fault(self.kube, infraenv) == ISO_NEVER:
            if key not in self._held:
                self._held.add(key)
                log.info("infraenv %s: fault %s, no image ever", key, ISO_NEVER)
            return
        problem = await self.problem(infraenv)
        if problem is not None:
            await self.refuse(infraenv, problem)
            return
        await self.knobs.step()
        infraenv = await fresh(self.kube, INFRA_ENV, infraenv)
        written = await write_status(self.kube, INFRA_ENV, infraenv, image_status(infraenv))
        log.info("infraenv %s: image created, %s", key, written["status"]["isoDownloadURL"])

    async def problem(self, infraenv: Json) -> str | None:
        """What keeps this InfraEnv from an image, in upstream's words where it has them."""
        namespace = meta(infraenv)["namespace"]
        ref = spec(infraenv).get("clusterRef") or {}
        if not ref.get("name"):
            return "spec.clusterRef is not set"
        cd_namespace = ref.get("namespace") or namespace
        if await get_or_none(self.kube, CLUSTER_DEPLOYMENT, cd_namespace, ref["name"]) is None:
            return f"failed to get clusterDeployment {cd_namespace}/{ref['name']}: not found"
        secret_name = (spec(infraenv).get("pullSecretRef") or {}).get("name")
        if not secret_name:
            return "spec.pullSecretRef is not set"
        secret = await get_or_none(self.kube, SECRET, namespace, secret_name)
        return pull_secret_problem(secret, f"{namespace}/{secret_name}")

    async def refuse(self, infraenv: Json, problem: str) -> None:
        wanted = image_condition(False, problem)
        if not same_image_condition(infraenv, wanted):
            await self.knobs.step()
            await write_status(self.kube, INFRA_ENV, infraenv, {"conditions": [wanted]})
            log.info("infraenv %s: ImageCreated False: %s", key_of(infraenv), problem)
        self.retry_later(infraenv)

    def retry_later(self, infraenv: Json) -> None:
        # One pending retry per InfraEnv: a run on an event in between must not start a
        # second chain of retries that would live as long as the InfraEnv stays wrong.
        key, clock = key_of(infraenv), asyncio.get_running_loop().time()
        if self._retry_at.get(key, 0.0) > clock:
            return
        self._retry_at[key] = clock + self.knobs.retry
        self.controller.requeue(infraenv, self.knobs.retry)
