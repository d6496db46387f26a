"""Stand-in for assisted-service's install controllers and hive: ClusterDeployment, ACI, Agents.

assisted-service (``internal/controller/controllers/clusterdeployments_controller.go``,
``agent_controller.go``) registers a cluster for every ClusterDeployment whose
``spec.clusterInstallRef`` names an AgentClusterInstall, and reports the install through the
ACI's ``status.debugInfo.state``. Here the state machine is a level-triggered walk, one state
per step, each step one status write a step delay (``STANDIN_ASSISTED_DELAY``) after the last:

- before installing, the state follows the inputs: ``pending-for-input`` (platform BareMetal
  without both VIP lists), ``insufficient`` (fewer approved Agents with a role, bound to the
  ClusterDeployment, than ``provisionRequirements`` asks), else ``ready``; a ready cluster
  without ``spec.holdInstallation`` goes on;
- ``preparing-for-installation`` → ``installing``: the admin kubeconfig Secret (the workload
  API server's kubeconfig, hive's labels, owned by the ClusterDeployment) and the ACI's
  ``spec.clusterMetadata`` are written first, then the bound ready Agents go ``installing``,
  then the ACI state: every side effect precedes the write that records it, so a stand-in
  restarted mid-step redoes it (idempotently) instead of skipping it;
- ``finalizing`` → ``installed``: the admin password Secret, ClusterDeployment
  ``spec.installed`` and ``spec.clusterMetadata``, the installing Agents ``installed``;
- ``adding-hosts`` for good. From then on an Agent approved with a role goes ``installing``
  then ``added-to-existing-cluster`` on its own (day 2), driven by the Agent controller.

Agents that reach ``installed`` or ``added-to-existing-cluster`` get their workload Node
(``nodes``). Every Agent event nudges the ACI of its ClusterDeployment (its count may have
changed); a ClusterDeployment event nudges its ACI and its InfraEnvs.

Deletion is upstream's: both objects carry assisted-service's ``ai-deprovision`` finalizers.
Deleting the ClusterDeployment deletes its ACI and waits for it to go; deleting the ACI
unbinds its Agents (``spec.clusterDeploymentName`` cleared, state ``known-unbound``) before
its finalizer goes.

Faults, read from the CAPI Cluster the ClusterDeployment is labelled with: ``aci-insufficient``
keeps the ACI ``insufficient``; ``install-error`` ends the install in ``error`` after
``installing``, with ``stateInfo`` naming a host, as a failed disk write would.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable

from shared.errors import KubeConflict, KubeNotFound
from shared.kube import KubeClient
from shared.owned import add_finalizer, remove_finalizer
from shared.resources import AGENT, AGENT_CLUSTER_INSTALL, CLUSTER_DEPLOYMENT, SECRET
from standins.assisted.infraenv import cluster_fault, get_or_none
from standins.assisted.knobs import AssistedKnobs
from standins.assisted.nodes import Nodes
from standins.assisted.shapes import (
    ACI_FINALIZER,
    ADDING_HOSTS,
    CD_FINALIZER,
    ERROR,
    HOST_DONE,
    HOST_INSTALLED,
    HOST_INSTALLING,
    HOST_KNOWN_UNBOUND,
    INSTALLED,
    INSTALLING,
    Json,
    admin_secret,
    cluster_metadata,
    cluster_status,
    debug_state,
    host_status,
    install_error_info,
    is_bound_to,
    is_deleting,
    is_ready_agent,
    meta,
    next_cluster_state,
    next_day2_state,
    spec,
)
from standins.base import Controller, fresh, key_of, write_status

log = logging.getLogger("standins.assisted.install")


def ref_to(namespace: str, name: str) -> Json:
    """Enough of an object for ``Controller.requeue``, which looks the newest copy up by key."""
    return {"metadata": {"namespace": namespace, "name": name}}


class InstallReactor:
    def __init__(
        self,
        kube: KubeClient,
        knobs: AssistedKnobs,
        *,
        workload_kubeconfig: str,
        nodes: Nodes | None,
        on_cluster_deployment: Callable[[Json], None],
        namespace: str | None,
    ) -> None:
        self.kube = kube
        self.knobs = knobs
        self.kubeconfig = workload_kubeconfig
        self.nodes = nodes
        self.on_cluster_deployment = on_cluster_deployment
        self.cds = Controller(
            kube,
            CLUSTER_DEPLOYMENT,
            self.reconcile_cd,
            namespace=namespace,
            name="assisted.clusterdeployments",
        )
        self.acis = Controller(
            kube,
            AGENT_CLUSTER_INSTALL,
            self.reconcile_aci,
            on_delete=self.aci_gone,
            namespace=namespace,
            name="assisted.agentclusterinstalls",
        )
        self.agents = Controller(
            kube,
            AGENT,
            self.reconcile_agent,
            on_delete=self.agent_gone,
            namespace=namespace,
            name="assisted.agents",
        )

    def controllers(self) -> list[Controller]:
        return [self.cds, self.acis, self.agents]

    # --- ClusterDeployment --------------------------------------------------------------------

    async def reconcile_cd(self, cd: Json) -> None:
        cd = await fresh(self.kube, CLUSTER_DEPLOYMENT, cd)
        if is_deleting(cd):
            await self.deprovision(cd)
            return
        self.on_cluster_deployment(cd)
        aci_name = (spec(cd).get("clusterInstallRef") or {}).get("name")
        if not aci_name:
            return
        await add_finalizer(self.kube, CLUSTER_DEPLOYMENT, cd, CD_FINALIZER)
        self.acis.requeue(ref_to(meta(cd)["namespace"], aci_name), 0)

    async def deprovision(self, cd: Json) -> None:
        """Its ACI goes first (its own finalizer unbinds the Agents), then this finalizer."""
        if CD_FINALIZER not in (meta(cd).get("finalizers") or []):
            return
        namespace, key = meta(cd)["namespace"], key_of(cd)
        aci_name = (spec(cd).get("clusterInstallRef") or {}).get("name")
        aci = await get_or_none(self.kube, AGENT_CLUSTER_INSTALL, namespace, aci_name or "")
        if aci_name and aci is not None:
            if not is_deleting(aci):
                await self.knobs.step()
                with contextlib.suppress(KubeNotFound):
                    await self.kube.delete(AGENT_CLUSTER_INSTALL, namespace, aci_name)
                log.info("clusterdeployment %s: deleting its install %s", key, aci_name)
            return  # the ACI's DELETED event brings us back
        await self.knobs.step()
        await remove_finalizer(self.kube, CLUSTER_DEPLOYMENT, cd, CD_FINALIZER)
        log.info("clusterdeployment %s: deregistered, finalizer removed", key)

    # --- AgentClusterInstall ------------------------------------------------------------------

    async def aci_gone(self, aci: Json) -> None:
        name = (spec(aci).get("clusterDeploymentRef") or {}).get("name")
        if name:
            self.cds.requeue(ref_to(meta(aci)["namespace"], name), 0)

    async def cluster_deployment_of(self, aci: Json) -> Json | None:
        """The ClusterDeployment that names this ACI as its install; None until it does."""
        name = (spec(aci).get("clusterDeploymentRef") or {}).get("name")
        if not name:
            return None
        cd = await get_or_none(self.kube, CLUSTER_DEPLOYMENT, meta(aci)["namespace"], name)
        if cd is None or (spec(cd).get("clusterInstallRef") or {}).get("name") != meta(aci)["name"]:
            return None
        return cd

    async def bound_agents(self, cd: Json) -> list[Json]:
        agents, _ = await self.kube.list(AGENT, namespace=meta(cd)["namespace"])
        return [agent for agent in agents if is_bound_to(agent, cd)]

    async def reconcile_aci(self, aci: Json) -> None:
        aci = await fresh(self.kube, AGENT_CLUSTER_INSTALL, aci)
        if is_deleting(aci):
            await self.release(aci)
            return
        cd = await self.cluster_deployment_of(aci)
        if cd is None or is_deleting(cd):
            return
        aci = await add_finalizer(self.kube, AGENT_CLUSTER_INSTALL, aci, ACI_FINALIZER)
        if await self.decide(aci, cd) is None:
            return
        await self.knobs.step()
        # Decide again on what is there after the pause (holdInstallation may have been set).
        aci = await fresh(self.kube, AGENT_CLUSTER_INSTALL, aci)
        cd = await fresh(self.kube, CLUSTER_DEPLOYMENT, cd)
        state = await self.decide(aci, cd)
        if state is not None:
            await self.enter(state, aci, cd)

    async def decide(self, aci: Json, cd: Json) -> str | None:
        agents = await self.bound_agents(cd)
        ready = sum(1 for agent in agents if is_ready_agent(agent))
        return next_cluster_state(aci, ready_agents=ready, fault=await cluster_fault(self.kube, cd))

    async def enter(self, state: str, aci: Json, cd: Json) -> None:
        info = ""
        if state == INSTALLING:
            await self.start_install(aci, cd)
        elif state == INSTALLED:
            await self.finish_install(cd)
        elif state == ERROR:
            info = install_error_info(await self.bound_agents(cd))
        await write_status(self.kube, AGENT_CLUSTER_INSTALL, aci, cluster_status(state, info))
        log.info("agentclusterinstall %s: %s %s", key_of(aci), state, info)
        if state != ADDING_HOSTS:
            return
        # Agents approved while the install ran are day-2 hosts now: nothing else wakes them.
        for agent in await self.bound_agents(cd):
            self.agents.offer(agent)

    async def start_install(self, aci: Json, cd: Json) -> None:
        secret = admin_secret(
            cd,
            suffix="admin-kubeconfig",
            secret_type="kubeconfig",
            data={"kubeconfig": self.kubeconfig},
        )
        with contextlib.suppress(KubeConflict):  # written before a restart: keep it
            await self.kube.create(SECRET, secret)
        patch = {"spec": {"clusterMetadata": cluster_metadata(cd)}}
        await self.kube.patch_merge(
            AGENT_CLUSTER_INSTALL, meta(aci)["namespace"], meta(aci)["name"], patch
        )
        for agent in await self.bound_agents(cd):
            if is_ready_agent(agent) and debug_state(agent) not in HOST_DONE:
                await self.set_host_state(agent, HOST_INSTALLING)

    async def finish_install(self, cd: Json) -> None:
        password = secrets.token_urlsafe(18)
        secret = admin_secret(
            cd,
            suffix="admin-password",
            secret_type="kubeadminpassword",
            data={"username": "kubeadmin", "password": password},
        )
        with contextlib.suppress(KubeConflict):
            await self.kube.create(SECRET, secret)
        metadata = {
            **cluster_metadata(cd),
            "adminPasswordSecretRef": {"name": secret["metadata"]["name"]},
        }
        patch = {"spec": {"installed": True, "clusterMetadata": metadata}}
        await self.kube.patch_merge(
            CLUSTER_DEPLOYMENT, meta(cd)["namespace"], meta(cd)["name"], patch
        )
        for agent in await self.bound_agents(cd):
            if debug_state(agent) == HOST_INSTALLING:
                await self.set_host_state(agent, HOST_INSTALLED)

    async def release(self, aci: Json) -> None:
        """Unbind the ACI's Agents, then let it go."""
        if ACI_FINALIZER not in (meta(aci).get("finalizers") or []):
            return
        name = (spec(aci).get("clusterDeploymentRef") or {}).get("name") or ""
        namespace = meta(aci)["namespace"]
        stand_in = {"metadata": {"name": name, "namespace": namespace}}
        for agent in await self.bound_agents(stand_in):
            await self.knobs.step()
            agent_ns, agent_name = meta(agent)["namespace"], meta(agent)["name"]
            unbind = {"spec": {"clusterDeploymentName": None}}
            with contextlib.suppress(KubeNotFound):  # its host went meanwhile: nothing to unbind
                written = await self.kube.patch_merge(AGENT, agent_ns, agent_name, unbind)
                await self.set_host_state(written, HOST_KNOWN_UNBOUND)
        await self.knobs.step()
        await remove_finalizer(self.kube, AGENT_CLUSTER_INSTALL, aci, ACI_FINALIZER)
        log.info("agentclusterinstall %s: agents unbound, finalizer removed", key_of(aci))

    # --- Agents -------------------------------------------------------------------------------

    async def set_host_state(self, agent: Json, state: str) -> Json:
        written = await write_status(self.kube, AGENT, agent, host_status(state))
        log.info("agent %s: %s", key_of(agent), state)
        return written

    async def agent_gone(self, agent: Json) -> None:
        self.nudge_install(agent)
        if self.nodes is not None:
            await self.nodes.drop(agent)

    def nudge_install(self, agent: Json) -> None:
        """The install of the ClusterDeployment this Agent names may count it now."""
        ref = spec(agent).get("clusterDeploymentName") or {}
        if not ref.get("name"):
            return
        namespace = ref.get("namespace") or meta(agent)["namespace"]
        cd = next(
            (
                c
                for c in self.cds.known()
                if meta(c)["namespace"] == namespace and meta(c)["name"] == ref["name"]
            ),
            None,
        )
        aci_name = (spec(cd).get("clusterInstallRef") or {}).get("name") if cd else None
        if aci_name:
            self.acis.requeue(ref_to(namespace, aci_name), 0)

    async def reconcile_agent(self, agent: Json) -> None:
        agent = await fresh(self.kube, AGENT, agent)
        self.nudge_install(agent)
        if debug_state(agent) in HOST_DONE:
            if self.nodes is not None:
                await self.nodes.ensure(agent)
            return
        if await self.day2_state(agent) is None:
            return
        await self.knobs.step()
        agent = await fresh(self.kube, AGENT, agent)
        state = await self.day2_state(agent)
        if state is not None:
            await self.set_host_state(agent, state)

    async def day2_state(self, agent: Json) -> str | None:
        ref = spec(agent).get("clusterDeploymentName") or {}
        if not ref.get("name"):
            return None
        namespace = ref.get("namespace") or meta(agent)["namespace"]
        cd = await get_or_none(self.kube, CLUSTER_DEPLOYMENT, namespace, ref["name"])
        aci_name = (spec(cd).get("clusterInstallRef") or {}).get("name") if cd else None
        if not aci_name:
            return None
        aci = await get_or_none(self.kube, AGENT_CLUSTER_INSTALL, namespace, aci_name)
        return next_day2_state(agent, debug_state(aci) if aci else "")
