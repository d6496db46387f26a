"""Deleting a cluster, and removing its MCIS (which a failed create does too).

Upstream's ``DeleteCluster`` (``src/core/service/cluster.go``): phase ``Deleting``, a
best-effort ``kubectl delete all --all`` on the leader, terminate the MCIS, sleep 5 s, delete
it, and on failure refine and delete again; the entity goes last. Here the entity is the
LadybugCluster and it goes when the provisioner drops its finalizer
``ladybug.capibus.dev/cleanup``; the REST DELETE only asked the API server to delete it.

Differences that matter to users:

* No sleep: Tumblebug answers a terminate when it is done (the stand-in, synchronously), and a
  delete that is refused anyway is followed by refine and a second delete, as upstream.
* An MCIS Tumblebug does not know, or a namespace it does not know, is not an error: there is
  nothing left to delete, so deletion completes (upstream users asked for a force option).
* Only our MCIS is removed (``rules.ours``): a cluster that failed because an MCIS of its name
  already existed never deletes that MCIS, on failure or on deletion.
* Tumblebug refusing the delete twice (refine in between) leaves the object ``Deleting`` with
  ``DeleteMCISFailedReason`` and Tumblebug's message (upstream answered 500). Tumblebug
  refuses with 500, which the consumer retries with capped backoff, so the deletion completes
  by itself once Tumblebug lets it; a 4xx refusal dead-letters the run instead, and the next
  event of the object tries again. An unreachable Tumblebug is retried.
* The admin kubeconfig Secret goes with the cluster; the sshKey Secret stays, like the MCIR
  it mirrors (shared by every cluster of the namespace and connection, §C.9 quirk 8).
"""

from __future__ import annotations

import contextlib
import logging

from services.ladybug.provisioner import rules
from services.ladybug.provisioner.ports import Deps, Json
from services.ladybug.provisioner.steps import (
    Failure,
    Run,
    close_sessions,
    host_keys_secret_name,
    refused,
    ssh,
)
from shared.errors import KubeNotFound, PermanentError
from shared.messages import Message
from shared.models.ladybug import FINALIZER, LadybugPhase, kubeconfig_secret_name
from shared.owned import remove_finalizer
from shared.reconcile import get_or_none
from shared.resources import LADYBUG_CLUSTER, SECRET
from shared.ssh import SshCommandFailed, SshUnreachable
from shared.tumblebug import TumblebugError

log = logging.getLogger(__name__)

#: Tumblebug refused to delete the MCIS, even after a refine (capibus's reason)
DELETE_MCIS_FAILED = "DeleteMCISFailedReason"


async def delete(obj: Json, cause: Message, deps: Deps) -> None:
    if FINALIZER not in (obj["metadata"].get("finalizers") or []):
        return
    run = Run.of(deps, obj, cause)
    if run.status.get("phase") != LadybugPhase.DELETING.value:
        await run.report(phase=LadybugPhase.DELETING.value, reason="", message="")
    try:
        await _delete_workloads(run)
    finally:
        await close_sessions(run)
    try:
        await remove_mcis(run)
    except TumblebugError as exc:
        if refused(exc):
            message = f"Failed to delete a MCIS (cause='{exc.message}')"
            await run.report(reason=DELETE_MCIS_FAILED, message=message)
        raise
    for secret in (kubeconfig_secret_name(run.name), host_keys_secret_name(run.name)):
        with contextlib.suppress(KubeNotFound):
            await deps.kube.delete(SECRET, deps.tuning.namespace, secret)
    # read again: the writer has written our reports meanwhile, and the finalizer is removed
    # under the resourceVersion it was read at
    current = await get_or_none(
        deps.kube, LADYBUG_CLUSTER, run.obj["metadata"].get("namespace"), run.name
    )
    if current is not None:
        await remove_finalizer(deps.kube, LADYBUG_CLUSTER, current, FINALIZER)
    deps.settled.forget(run.uid)


async def _delete_workloads(run: Run) -> None:
    """``kubectl delete all --all`` on the leader, once; any failure is only logged."""
    leader = run.leader
    if leader is None or not run.nodes[leader].joined or not run.nodes[leader].public_ip:
        return
    try:
        await ssh(run, run.nodes[leader], rules.DELETE_ALL)
    except (SshCommandFailed, SshUnreachable, Failure, PermanentError) as exc:
        log.warning("%s: kubectl delete all --all failed: %s", run.name, exc)


async def remove_mcis(run: Run) -> bool:
    """Terminate and delete the cluster's MCIS if it exists and is ours; whether one went."""
    tb = run.deps.tumblebug
    if await tb.get_namespace(run.tbns) is None:
        return False
    found = await tb.get_mcis(run.tbns, run.cluster)
    if found is None:
        return False
    if not rules.ours(found, run.uid, recorded=run.status.get("mcis") == run.cluster):
        log.info("%s: MCIS %s is not this cluster's; left alone", run.name, run.cluster)
        return False
    await tb.control_mcis(run.tbns, run.cluster, "terminate")
    try:
        await tb.delete_mcis(run.tbns, run.cluster)
    except TumblebugError as exc:
        if not refused(exc):
            raise
        log.info(
            "%s: deleting MCIS %s refused (%s); refine, then again", run.name, run.cluster, exc
        )
        await tb.control_mcis(run.tbns, run.cluster, "refine")
        await tb.delete_mcis(run.tbns, run.cluster)
    return True
