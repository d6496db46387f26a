"""Creating a cluster: upstream's ``CreateCluster`` (§C.3 of ``src/core/service/cluster.go``),
level-triggered.

Every run starts from the top and skips what exists, so a replica killed anywhere resumes:

1. the Tumblebug namespace must exist; phase ``Provisioning``;
2. the MCIS: absent → MCIR for every NodeSet, then one MCIS with a control-plane subgroup and
   a subgroup per worker; present and ours (``rules.ours``) → resume it; present and not ours
   → ``AlreadyExistMCISFailedReason``. ``status.mcis`` is reported *before* the create, and
   the MCIS's description carries the cluster's uid, so a crash between Tumblebug's answer and
   anything after it still finds the MCIS ours: never a second MCIS;
3. the NLB when asked (get, then create);
4. bind the VMs into nodes (a failed VM or one without its address fails the cluster);
5. bootstrap every node in parallel (skipping bootstrapped ones);
6. unless the leader has ``admin.conf``: haproxy, external etcd, ``kubeadm init`` — so init
   never runs twice — and the admin kubeconfig into its Secret;
7. join the other control planes, then the workers; label; CNI; storage class;
8. single-cloud: the cloud controller manager (``ccm.py``; whether it can be set up at all is
   checked before step 2, so nothing is made for a cluster that would fail there);
9. ``Provisioned``, with ``createdTime`` and ``observedGeneration``.

A ``Failure`` on the way is upstream's ``FailReason`` plus ``cleanUpCluster``: phase ``Failed``
with the step's reason and message, the nodes' public IPs blanked, the MCIS terminated and
deleted (refine and retry on refusal). The LadybugCluster stays, ``Failed``, until the user
deletes it (or the REST API replaces it with a new create). Unlike upstream, the cleanup
itself is resumable: the condition ``MCISRemoved`` says whether it finished, and a run that
finds a ``Failed`` cluster without it finishes the cleanup.
"""

from __future__ import annotations

import logging

from services.ladybug.provisioner import ccm, nodes, rules
from services.ladybug.provisioner.delete import remove_mcis
from services.ladybug.provisioner.ports import Json
from services.ladybug.provisioner.steps import (
    Failure,
    Run,
    bind,
    bootstrap,
    ensure_mcir,
    external_etcd,
    haproxy,
    init,
    initialized,
    join_all,
    keep_kubeconfig,
    label,
    network_cni,
    place,
    refusal_as,
    refused,
    storage_class,
    verify_namespace,
    vm_requests,
)
from shared.messages import Condition
from shared.models.ladybug import LadybugPhase, LadybugReason
from shared.tumblebug import TumblebugError

log = logging.getLogger(__name__)

#: whether a failed cluster's MCIS is gone (capibus's condition; upstream had no such record)
MCIS_REMOVED = "MCISRemoved"
FAILED = "failed"


async def provision(run: Run) -> None:
    try:
        await _create(run)
    except Failure as failure:
        await fail(run, failure)


async def _create(run: Run) -> None:
    await verify_namespace(run)
    if run.status.get("phase") != LadybugPhase.PROVISIONING.value:
        await run.report(
            phase=LadybugPhase.PROVISIONING.value,
            reason="",
            message="",
            k8sVersion=run.k8s_version,
            cpGroup=run.cp_group,
        )
    await ccm.check(run)
    mcis = await _existing(run) or await _create_mcis(run)
    mcis = await nodes.add_missing_vms(run, mcis)
    await _nlb(run)
    await bind(run, rules.vms_of(mcis))
    await run.report(**_identity(run), nodes=run.node_list())
    everyone = list(run.nodes)
    await bootstrap(run, everyone)
    join = await _control_plane(run)
    await join_all(run, join, everyone)
    await label(run, everyone)
    await network_cni(run)
    await storage_class(run)
    await ccm.install(run, rules.vms_of(mcis))
    await run.report(
        phase=LadybugPhase.PROVISIONED.value,
        reason="",
        message="",
        createdTime=run.status.get("createdTime") or run.deps.clock().isoformat(),
        observedGeneration=run.generation,
        **_identity(run),
        nodes=run.node_list(),
    )


def _identity(run: Run) -> Json:
    """What a status says about the cluster as a whole; every report that may be the last
    one a lagging writer applies carries it."""
    return {
        "mcis": run.cluster,
        "k8sVersion": run.k8s_version,
        "cpGroup": run.cp_group,
        "cpLeader": run.leader or "",
    }


async def _existing(run: Run) -> Json | None:
    """The MCIS named like the cluster if it is ours (a resumed create)."""
    try:
        found = await run.deps.tumblebug.get_mcis(run.tbns, run.cluster)
    except TumblebugError as exc:
        if not refused(exc):
            raise
        raise Failure(LadybugReason.GET_MCIS_FAILED.value, exc.message) from exc
    if found is None:
        return None
    if not rules.ours(found, run.uid, recorded=run.status.get("mcis") == run.cluster):
        raise Failure(
            LadybugReason.ALREADY_EXIST_MCIS_FAILED.value,
            f"MCIS already exists. (namespace={run.tbns}, mcis={run.cluster})",
        )
    return found


async def _create_mcis(run: Run) -> Json:
    vms = await vm_requests(run, run.spec.control_plane, control_plane=True)
    vms += await vm_requests(run, nodes.wanted_workers(run), control_plane=False)
    body = rules.mcis_body(
        run.cluster,
        uid=run.uid,
        install_mon_agent=run.spec.config.install_mon_agent,
        vms=vms,
    )
    # recorded before Tumblebug makes it: a crash after its answer still finds it ours
    await run.report(mcis=run.cluster)
    made = await refusal_as(
        LadybugReason.CREATE_MCIS_FAILED.value,
        "Failed to create a MCIS.",
        run.deps.tumblebug.create_mcis(run.tbns, body),
    )
    run.fresh.update(str(vm.get("name")) for vm in rules.vms_of(made))
    return made


async def _nlb(run: Run) -> None:
    if run.spec.config.kubernetes.loadbalancer.value != "nlb":
        return
    plane = run.spec.control_plane[0]
    mcir = await ensure_mcir(run, plane, control_plane=True)
    where = await place(run, plane.connection)
    tb, reason = run.deps.tumblebug, LadybugReason.CREATE_NLB_FAILED.value
    what = "Failed to create a NLB."
    if await refusal_as(reason, what, tb.get_nlb(run.tbns, run.cluster, run.cp_group)):
        return
    body = rules.nlb_body(
        mcis=run.cluster,
        group=run.cp_group,
        connection=plane.connection,
        vnet=mcir.names.vnet,
        csp=where.csp,
    )
    await refusal_as(reason, what, tb.create_nlb(run.tbns, run.cluster, body))


async def _control_plane(run: Run) -> rules.Join | None:
    """haproxy, external etcd and kubeadm init, unless init already ran; the joins it printed."""
    if await initialized(run):
        run.mark(run.leader_node().name, joined=True)
        await keep_kubeconfig(run, fresh=False)
        return None
    k8s = run.spec.config.kubernetes
    if k8s.loadbalancer.value == "haproxy":
        await haproxy(run)
    if k8s.etcd.value == "external":
        await external_etcd(run)
    join = await init(run)
    await keep_kubeconfig(run, fresh=True)
    await run.report(nodes=run.node_list())
    return join


# --- failure ----------------------------------------------------------------------------------


async def fail(run: Run, failure: Failure) -> None:
    """Failed with ``failure``'s reason, then the MCIS removed (upstream's cleanUpCluster)."""
    log.warning("%s failed: %s: %s", run.name, failure.reason, failure.message)
    for name in run.nodes:
        run.nodes[name] = run.nodes[name].model_copy(update={"public_ip": ""})
    await run.report(
        phase=LadybugPhase.FAILED.value,
        reason=failure.reason,
        message=failure.message,
        observedGeneration=run.generation,
        nodes=run.node_list(),
    )
    run.deps.settled.note(run.uid, FAILED)
    await clean_up(run)


async def clean_up(run: Run) -> None:
    """Remove the MCIS of a failed cluster, and say so."""
    removed = await remove_mcis(run)
    await run.report(
        conditions=[
            Condition(
                type=MCIS_REMOVED,
                status="True",
                reason="Removed" if removed else "NothingToRemove",
                message=f"MCIS {run.cluster} terminated and deleted" if removed else "",
            )
        ]
    )


def cleaned_up(obj: Json) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == MCIS_REMOVED and c.get("status") == "True" for c in conditions)
