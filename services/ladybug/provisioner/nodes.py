"""Adding and removing nodes of a ``Provisioned`` cluster (upstream's ``AddNode`` and
``RemoveNode``, ``src/core/service/node.go``), as one convergence of the spec.

The REST API appends worker NodeSets (add-node) or names (``removeNodes``, remove-node) to the
spec; the new generation is the level this run converges to:

* **remove**: every node named in ``removeNodes`` that still exists, except the leader, is
  drained and deleted in Kubernetes (``kubectl`` on the leader) if it is there, then its VM is
  deleted in Tumblebug (which terminates it first), then it leaves the status;
* **add**: every worker NodeSet without a VM in the MCIS gets one (``POST …/vm`` with its
  subgroup id, after its MCIR get-or-create); then all VMs are bound, and every node not yet
  bootstrapped and joined is bootstrapped and joined with a fresh ``kubeadm token create``
  join command, and labelled; on a single-cloud AWS cluster each gets its IAM instance
  profile and cluster tags (``ccm.prepare``).

The phase stays ``Provisioned`` whatever happens, as upstream's. Success reports
``observedGeneration`` with an empty reason. A failure (upstream answered 500) reports the
step's reason and message with ``observedGeneration``, after cleaning up what the run added
and could not finish — unlike upstream, VMs made before the failure are deleted too (§C.9
quirk 5) — and drops the failed NodeSets from ``spec.worker`` (a field this service owns once
it decided: ``shared.owned``), so the next change does not try them again. Workers of the
same request that did join stay: they are healthy nodes of the cluster.
"""

from __future__ import annotations

import contextlib
import logging

from services.ladybug.provisioner import ccm, rules
from services.ladybug.provisioner.ports import Json
from services.ladybug.provisioner.steps import (
    Failure,
    Run,
    bind,
    bootstrap,
    in_cluster,
    join_all,
    kube_name,
    label,
    refusal_as,
    refused,
    ssh,
    verify_namespace,
    vm_requests,
)
from shared.models.ladybug import LadybugPhase, LadybugReason, NodeSet
from shared.owned import patch_owned
from shared.resources import LADYBUG_CLUSTER
from shared.ssh import SshCommandFailed, SshUnreachable
from shared.tumblebug import TumblebugError

log = logging.getLogger(__name__)

#: draining or deleting a node failed (capibus's reason; upstream answered 500 with it)
REMOVE_NODE_FAILED = "RemoveNodeFailedReason"


def wanted_workers(run: Run) -> list[NodeSet]:
    """The worker NodeSets whose VMs are not all to be removed."""
    removed = set(run.spec.remove_nodes)
    return [
        ns
        for ns in run.spec.worker
        if any(f"{ns.id}-{i}" not in removed for i in range(1, ns.count + 1))
    ]


async def converge(run: Run) -> None:
    try:
        await _converge(run)
    except Failure as failure:
        await _failed(run, failure)


async def _converge(run: Run) -> None:
    await verify_namespace(run)
    mcis = await _mcis(run)
    await _remove(run, mcis)
    have = {rules.subgroup(vm) for vm in rules.vms_of(mcis)}
    await ccm.check(run, workers=[ns for ns in wanted_workers(run) if ns.id not in have])
    mcis = await add_missing_vms(run, mcis)
    await bind(run, rules.vms_of(mcis))
    await run.report_nodes()
    pending = [n for n, node in run.nodes.items() if not (node.bootstrapped and node.joined)]
    await bootstrap(run, pending)
    joined = await join_all(run, None, pending)
    await label(run, joined)
    await ccm.prepare(run, rules.vms_of(mcis))
    await run.report(
        phase=LadybugPhase.PROVISIONED.value,
        reason="",
        message="",
        observedGeneration=run.generation,
        nodes=run.node_list(),
    )


async def _mcis(run: Run) -> Json:
    try:
        found = await run.deps.tumblebug.get_mcis(run.tbns, run.cluster)
    except TumblebugError as exc:
        if not refused(exc):
            raise
        raise Failure(LadybugReason.GET_MCIS_FAILED.value, exc.message) from exc
    if found is None:
        raise Failure(
            LadybugReason.GET_MCIS_FAILED.value,
            f"Could not be found a MCIS. (namespace={run.tbns}, mcis={run.cluster})",
        )
    return found


async def add_missing_vms(run: Run, mcis: Json) -> Json:
    """A VM for every wanted NodeSet that has none in ``mcis``; the MCIS as it is after."""
    have = {rules.subgroup(vm) for vm in rules.vms_of(mcis)}
    planes = [ns for ns in run.spec.control_plane if ns.id not in have]
    workers = [ns for ns in wanted_workers(run) if ns.id not in have]
    if not planes and not workers:
        return mcis
    tb = run.deps.tumblebug
    requests = await vm_requests(run, planes, control_plane=True)
    requests += await vm_requests(run, workers, control_plane=False)
    for request in requests:
        await refusal_as(
            LadybugReason.CREATE_MCIS_FAILED.value,
            f"Failed to add a VM '{request['name']}' to the MCIS.",
            tb.add_vm(run.tbns, run.cluster, request),
        )
    after = await _mcis(run)
    groups = {str(request["name"]).lower() for request in requests}
    run.fresh.update(str(vm["name"]) for vm in rules.vms_of(after) if rules.subgroup(vm) in groups)
    return after


def forget(run: Run, name: str) -> None:
    """``name`` is gone: its node, and its host key (a later VM may get its address)."""
    node = run.nodes.pop(name, None)
    if node is not None and run.host_keys is not None:
        run.host_keys.forget(node.public_ip)


# --- remove -----------------------------------------------------------------------------------


async def _remove(run: Run, mcis: Json) -> None:
    vms = {str(vm.get("name")) for vm in rules.vms_of(mcis)}
    leader = run.leader
    targets = [
        name
        for name in run.spec.remove_nodes
        if name != leader and (name in run.nodes or name in vms)
    ]
    if leader in run.spec.remove_nodes:
        log.warning("%s: the control-plane leader %s is never removed", run.name, leader)
    if not targets:
        return
    inside = await in_cluster(run)
    for name in targets:
        if _kube_name(run, name) in inside:
            await _drain(run, name)
        if name in vms:
            await refusal_as(
                REMOVE_NODE_FAILED,
                f"Failed to remove a VM ({name})",
                run.deps.tumblebug.delete_vm(run.tbns, run.cluster, name),
            )
        forget(run, name)
    await run.report_nodes()


def _kube_name(run: Run, name: str) -> str:
    node = run.nodes.get(name)
    return kube_name(node) if node is not None else name


async def _drain(run: Run, name: str) -> None:
    leader = run.leader_node()
    kname = _kube_name(run, name)
    for command, what in (
        (rules.drain_command(kname), "drain"),
        (rules.delete_node_command(kname), "delete"),
    ):
        try:
            await ssh(run, leader, command)
        except SshCommandFailed as exc:
            raise Failure(
                REMOVE_NODE_FAILED,
                f"Failed to {what} a node (node={name}, output='{exc.stdout or exc}')",
            ) from exc


# --- failure ----------------------------------------------------------------------------------


async def _failed(run: Run, failure: Failure) -> None:
    """Undo what this change added and could not finish; report why; forget those NodeSets."""
    log.warning("%s: node change failed: %s: %s", run.name, failure.reason, failure.message)
    dropped = {
        ns.id
        for ns in wanted_workers(run)
        if not any(n.sub_group == ns.id and n.joined for n in run.nodes.values())
    }
    await _clean_up(run, dropped)
    obj = run.obj
    if dropped:
        # read again: our own progress reports changed it since the run began
        obj = await run.deps.kube.get(LADYBUG_CLUSTER, obj["metadata"].get("namespace"), run.name)
        kept = [
            ns.model_dump(mode="json", exclude_none=True)
            for ns in run.spec.worker
            if ns.id not in dropped
        ]
        obj = await patch_owned(run.deps.kube, LADYBUG_CLUSTER, obj, {"spec": {"worker": kept}})
    generation = int(obj["metadata"].get("generation") or run.generation)
    run.deps.settled.note(run.uid, f"generation:{generation}")
    await run.report(
        reason=failure.reason,
        message=failure.message,
        observedGeneration=generation,
        nodes=run.node_list(),
    )


async def _clean_up(run: Run, groups: set[str]) -> None:
    """Delete the VMs (and Kubernetes nodes) of ``groups``; best effort, each logged."""
    if not groups:
        return
    tb = run.deps.tumblebug
    try:
        mcis = await tb.get_mcis(run.tbns, run.cluster)
    except TumblebugError as exc:
        log.warning("%s: cannot read the MCIS to clean up: %s", run.name, exc)
        return
    names = [str(vm.get("name")) for vm in rules.vms_of(mcis or {}) if rules.subgroup(vm) in groups]
    names += [n for n, node in run.nodes.items() if node.sub_group in groups and n not in names]
    for name in names:
        node = run.nodes.get(name)
        if node is not None and node.joined:
            with contextlib.suppress(Failure, SshCommandFailed, SshUnreachable):
                await _drain(run, name)
        if mcis is not None and any(str(vm.get("name")) == name for vm in rules.vms_of(mcis)):
            try:
                await tb.delete_vm(run.tbns, run.cluster, name)
            except TumblebugError as exc:
                log.warning("%s: deleting VM %s failed: %s", run.name, name, exc)
        forget(run, name)
