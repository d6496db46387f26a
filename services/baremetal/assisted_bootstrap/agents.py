"""The Agent binder: a booted host's Agent, approved for the Machine that claimed the host.

Upstream (``bootstrap/internal/controller/agent_controller.go`` of
openshift-assisted/cluster-api-provider-openshift-assisted v0.2.0) walks Agent → the
BareMetalHost whose boot MAC is one of the Agent's inventory MACs (case-insensitive) → its
owner Metal3Machine → its owner Machine (here: the Machine whose ``infrastructureRef`` names
it, when this replica knows it from the Machine's events) → the Machine's bootstrap
configRef, records
``status.agentRef`` on that OpenshiftAssistedConfig and updates the Agent: ``role`` (master
for a control-plane Machine, else worker), ``approved``, ``nodeLabels`` {``metal3.io/uuid``:
the host's uid} (what CAPM3 matches Nodes by) and the Ignition override that writes Cluster
API's bootstrap sentinel file. So does this reconciler, with these differences:

- **One preconditioned patch.** The Agent is changed by one merge patch on the
  resourceVersion it was decided from (``shared.owned.patch_owned``), and only when it is not
  bound so already; assisted-service writes the same object, and a conflict is retried
  against a fresh read. The patch also labels the Agent ``cluster.x-k8s.io/cluster-name``
  (a capibus addition) so its later events partition with its cluster.
- **No role flip.** An Agent already approved for the other role is refused
  (``PermanentError``, condition ``AgentBound`` on the config) rather than re-approved.
- **No backoff loop.** No host with the Agent's MAC yet, or a host not claimed yet: the
  Agent waits for a BareMetalHost event (``handlers`` maps a host's events to the unbound
  Agents with its MAC). Hosts are listed in the Agent's namespace only: CAPM3 claims hosts in
  its Metal3Machine's namespace, the config and its InfraEnv live there too, and so does the
  Agent booted from that InfraEnv. When no host matches, the configs of the Agent's pool that
  have no Agent yet say so (``AgentBound`` False, ``NoMatchingHost``, with the Agent's MACs), so
  a host whose MAC does not match is visible rather than silent.
"""

from __future__ import annotations

import logging

from services.baremetal.assisted_bootstrap import configs, logic
from services.baremetal.assisted_bootstrap.logic import condition
from services.baremetal.assisted_bootstrap.ports import Deps, Json
from shared.errors import PermanentError, TemporaryError
from shared.messages import Message, ResourceChanged
from shared.owned import patch_owned
from shared.reconcile import Target, get_or_none, report
from shared.resources import (
    AGENT,
    BARE_METAL_HOST,
    INFRA_ENV,
    MACHINE,
    METAL3_MACHINE,
    OPENSHIFT_ASSISTED_CONFIG,
)
from shared.seen import key_of

log = logging.getLogger(__name__)

KIND = AGENT


async def reconcile(target: Target, cause: Message, deps: Deps) -> list[Target]:
    if _settled(target, cause, deps):
        return []
    agent = await deps.seen.get(deps.kube, KIND, target.namespace, target.name)
    if agent is None or logic.deleting(agent):
        deps.settled.forget(target.key)
        deps.seen.forget(target.key)
        return []
    macs = logic.macs(agent)
    if not macs:
        return []  # no inventory yet: the Agent's own event brings it
    hosts, _ = await deps.kube.list(BARE_METAL_HOST, namespace=target.namespace)
    host = logic.host_for(macs, hosts)
    if host is None:
        await _unmatched(agent, macs, cause, deps)
        return []
    owner = await _owner_chain(host, deps)
    if owner is None:
        return []
    await _bind(agent, host, owner, cause, deps)
    deps.settled.note(target.key, str(logic.meta(agent).get("uid")))
    return []


def _settled(target: Target, cause: Message, deps: Deps) -> bool:
    """This very Agent (same uid) was bound and recorded by this replica: its later events
    (its install progressing) need nothing from us."""
    if not (isinstance(cause, ResourceChanged) and target.named_by(cause)):
        return False
    if cause.event == "DELETED":
        deps.settled.forget(target.key)
        return True
    uid = str(cause.object.get("metadata", {}).get("uid"))
    return deps.settled.knows(target.key, uid)


async def _owner_chain(host: Json, deps: Deps) -> tuple[Json, Json] | None:
    """The host's Machine and its config, or None when the host is not (or no longer) a
    Cluster API host of ours."""
    namespace = logic.meta(host)["namespace"]
    infra_name = logic.owner_name(host, METAL3_MACHINE.kind)
    if infra_name is None:
        return None  # not claimed yet: the claim is a BareMetalHost event
    machine = configs.machine_of(namespace, infra_name, deps)
    if machine is None:
        machine = await _machine_of(namespace, infra_name, deps)
    ref = logic.config_ref(machine) if machine else None
    if machine is None or ref is None:
        return None  # gone, or not bootstrapped by us: not a host of ours
    oac = await deps.seen.get(deps.kube, OPENSHIFT_ASSISTED_CONFIG, namespace, ref["name"])
    return (machine, oac) if oac is not None else None


async def _machine_of(namespace: str, infra_name: str, deps: Deps) -> Json | None:
    """The Machine that owns the Metal3Machine, through the Metal3Machine (when the Machine is
    not known already by its ``infrastructureRef``)."""
    infra = await get_or_none(deps.kube, METAL3_MACHINE, namespace, infra_name)
    if infra is None:
        return None  # released: the host's next event tells
    owner = logic.owner_ref(infra, MACHINE.kind, logic.CAPI_GROUP)
    if owner is None:
        # Cluster API sets it right after creating the Metal3Machine; nothing we watch
        # announces it, so the consumer retries (upstream's backoff).
        raise TemporaryError(
            f"Metal3Machine {namespace}/{infra_name} has no owner Machine yet", delay=1.0
        )
    return deps.seen.recall(owner.get("uid")) or await get_or_none(
        deps.kube, MACHINE, namespace, str(owner["name"])
    )


async def _bind(
    agent: Json, host: Json, owner: tuple[Json, Json], cause: Message, deps: Deps
) -> None:
    machine, oac = owner
    cluster = logic.cluster_of(machine) or ""
    try:
        patch = logic.agent_patch(
            agent,
            role=logic.role_for(machine),
            host_uid=str(logic.meta(host)["uid"]),
            cluster=cluster,
        )
    except PermanentError as exc:
        refused = condition(logic.AGENT_BOUND, False, exc.reason, str(exc))
        if not logic.holds(oac, {}, [refused]):
            await report(deps, OPENSHIFT_ASSISTED_CONFIG, oac, cause, conditions=[refused])
        raise
    if patch is not None:
        key = key_of(KIND, logic.meta(agent)["namespace"], logic.meta(agent)["name"])
        deps.seen.note(key, await patch_owned(deps.kube, KIND, agent, patch))
        log.info(
            "%s: bound to %s as %s (host %s)",
            logic.object_key(agent),
            logic.object_key(oac),
            logic.role_for(machine),
            logic.meta(host)["name"],
        )
    fields: Json = {}
    if not logic.agent_ref_name(oac):
        fields["agentRef"] = {"name": logic.meta(agent)["name"]}
    bound = condition(logic.AGENT_BOUND, True, logic.BOUND, f"Agent {logic.meta(agent)['name']}")
    if not logic.holds(oac, fields, [bound]):
        await report(deps, OPENSHIFT_ASSISTED_CONFIG, oac, cause, conditions=[bound], **fields)


async def _unmatched(agent: Json, macs: list[str], cause: Message, deps: Deps) -> None:
    """Say on the configs of the Agent's pool still without an Agent that this one matches no
    host (a capibus addition: upstream retried in silence)."""
    namespace = logic.meta(agent)["namespace"]
    pool = logic.labels(agent).get(logic.INFRAENV_LABEL)
    infra = await get_or_none(deps.kube, INFRA_ENV, namespace, pool) if pool else None
    cluster = logic.labels(infra).get(logic.CLUSTER_NAME_LABEL) if infra else None
    if pool is None or cluster is None:
        return
    log.warning("%s: no BareMetalHost has boot MAC %s", logic.object_key(agent), ", ".join(macs))
    configs, _ = await deps.kube.list(
        OPENSHIFT_ASSISTED_CONFIG,
        namespace=namespace,
        label_selector=f"{logic.CLUSTER_NAME_LABEL}={cluster}",
    )
    message = f"Agent {logic.meta(agent)['name']} (MAC {', '.join(macs)}) matches no BareMetalHost"
    unmatched = condition(logic.AGENT_BOUND, False, logic.NO_MATCHING_HOST, message)
    for oac in configs:
        if logic.infra_env_ref_name(oac) != pool or logic.agent_ref_name(oac):
            continue
        if not logic.holds(oac, {}, [unmatched]):
            await report(deps, OPENSHIFT_ASSISTED_CONFIG, oac, cause, conditions=[unmatched])
