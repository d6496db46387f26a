"""Single-cloud clusters: the cloud controller manager (upstream's step 24 of ``CreateCluster``
and the AWS part of ``AddNode``), converging like every other step.

* ``check`` runs before anything is made: the CSP must be one whose hostnames and CCM are known
  (aws, openstack, ncpvpc), and on AWS every NodeSet of a kind must name the same IAM role.
  Upstream found both out after the whole cluster had been provisioned (or, for the CSP, at
  bootstrap) and then tore it down.
* ``prepare`` (AWS): every node not yet ``cloudPrepared`` gets its NodeSet's IAM instance profile
  and the ``kubernetes.io/cluster/<cluster>=owned`` tag on its instance, security groups and
  subnet, through CB-Spider's ``anycall``; the flag is reported, so a resumed run does not
  associate a profile twice (AWS refuses that; a run that died between AWS's answer and the
  report meets that refusal and takes it as done).
* ``install``: the cloud config built from CB-Spider's answers (``cloud.py``), uploaded to the
  leader as a file only its owner reads, the Secret ``kube-system/cloud-config`` made from it
  (kept when a resumed run finds it), the file removed again, the CSP's manifests uploaded and
  applied (``kubectl apply`` converges). NCP's config is written for the user to complete and
  nothing is applied, as upstream.

The revealed cloud config holds OpenStack's password: it goes from Spider to the node over SSH
and nowhere else (no log line, status or message; upstream logged it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from services.ladybug.provisioner import cloud
from services.ladybug.provisioner.ports import Json
from services.ladybug.provisioner.steps import Failure, Run, place, refusal_as, ssh, upload
from shared import spider
from shared.models.ladybug import LadybugNode, LadybugReason, NodeSet
from shared.ssh import SshCommandFailed
from shared.tumblebug import TumblebugError

log = logging.getLogger(__name__)

FAILED = LadybugReason.SETUP_CCM_FAILED.value


async def check(run: Run, workers: Sequence[NodeSet] | None = None) -> None:
    """Refuse, before any VM is made, what the CCM could not be set up for. ``workers``: the
    NodeSets being added (add-node), else the whole cluster's."""
    if run.multi:
        return
    where = await place(run, run.spec.control_plane[0].connection)
    problem = cloud.unsupported(where.csp)
    if problem:
        raise Failure(FAILED, problem)
    if where.csp != cloud.AWS:
        return
    try:
        if workers is None:
            cloud.role_of(run.spec.control_plane)
            cloud.role_of(run.spec.worker)
        elif workers:
            cloud.role_of(workers)
    except ValueError as exc:
        raise Failure(FAILED, str(exc)) from exc


async def install(run: Run, vms: Sequence[Json]) -> None:
    """The whole CCM set-up of a new single-cloud cluster."""
    if run.multi:
        return
    await prepare(run, vms)
    leader = run.leader_node()
    config = await _cloud_config(run, leader, vms)
    try:
        await _deploy(run, leader, config)
    except SshCommandFailed as exc:
        raise Failure(FAILED, f"Failed to install cloud-controller-manager: {exc}") from exc


async def prepare(run: Run, vms: Iterable[Json]) -> None:
    """AWS: each node's IAM instance profile and cluster tags, once."""
    if run.multi or run.leader_node().csp != cloud.AWS:
        return
    by_name = {str(vm.get("name")): vm for vm in vms}
    todo = [n for n in run.nodes.values() if not n.cloud_prepared and n.name in by_name]
    try:
        for node in todo:
            await _prepare_one(run, node, by_name[node.name])
            run.nodes[node.name] = node.model_copy(update={"cloud_prepared": True})
    finally:
        if todo:
            await run.report_nodes()


async def _prepare_one(run: Run, node: LadybugNode, vm: Json) -> None:
    nodeset = run.nodeset(node.sub_group)
    instance = cloud.instance_id(vm)
    if nodeset is None or not instance:
        raise Failure(FAILED, f"Failed to prepare cloud-controller-manager: no VM {node.name}")
    call = run.deps.spider.anycall
    connection = nodeset.connection
    what = "Failed to prepare cloud-controller-manager"
    try:
        await refusal_as(
            FAILED,
            what,
            call(
                connection,
                spider.ASSOCIATE_IAM_INSTANCE_PROFILE,
                [("InstanceId", instance), ("Role", nodeset.role)],
            ),
        )
    except Failure as failure:
        if not cloud.already_associated(failure.message):
            raise
        # a run that died between AWS's answer and its report of cloudPrepared
        log.info("%s: %s has its instance profile already", run.name, node.name)
    for resource in cloud.tagged_ids(vm):
        await refusal_as(
            FAILED,
            f"{what}: tags of {resource}",
            call(
                connection,
                spider.CREATE_TAGS,
                [("ResourceId", resource), ("Tag", cloud.tag(run.cluster))],
            ),
        )


async def _cloud_config(run: Run, leader: LadybugNode, vms: Sequence[Json]) -> str:
    connection = run.spec.control_plane[0].connection
    what = "Failed to get cloud config"
    try:
        if leader.csp == cloud.AWS:
            info = await _revealed(what, connection, spider.GET_REGION_INFO, run)
            return cloud.aws_config(info)
        if leader.csp == cloud.OPENSTACK:
            info = await _revealed(what, connection, spider.GET_CONNECTION_INFO, run)
            vm = next((v for v in vms if v.get("name") == leader.name), {})
            return cloud.openstack_config(info, subnet=cloud.subnet_id(vm))
    except ValueError as exc:
        raise Failure(FAILED, f"{what}: {exc}") from exc
    return cloud.ncpvpc_config()


async def _revealed(what: str, connection: str, function: str, run: Run) -> dict[str, str]:
    answer = await refusal_as(FAILED, what, run.deps.spider.anycall(connection, function))
    try:
        return {key: spider.reveal(value) for key, value in answer.items()}
    except TumblebugError as exc:
        raise Failure(FAILED, f"{what}: {exc.message}") from exc


async def _deploy(run: Run, leader: LadybugNode, config: str) -> None:
    await upload(run, leader, {cloud.CLOUD_CONFIG: config.encode()}, mode=0o600)
    manifests = cloud.manifest_paths(leader.csp)
    if not manifests:
        return  # NCP: the config is there for the user, who installs the CCM (upstream's way)
    await _secret(run, leader)
    await ssh(run, leader, f"rm -f {cloud.CLOUD_CONFIG}")
    await ssh(run, leader, f"mkdir -p {cloud.CCM_DIR}/{leader.csp}")
    files = {path: run.deps.scripts[path.removeprefix("/tmp/")] for path in manifests}
    await upload(run, leader, files, mode=0o644)
    for path in manifests:
        await ssh(run, leader, cloud.kubectl_apply(path))


async def _secret(run: Run, leader: LadybugNode) -> None:
    try:
        await ssh(run, leader, cloud.create_secret())
    except SshCommandFailed as exc:
        if not cloud.already_exists((exc.stdout, exc.stderr)):
            raise
        log.info("%s: the cloud-config Secret exists already", run.name)
