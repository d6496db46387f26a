"""From an event to the LadybugCluster it concerns, and which flow converges it.

One kind, one subscription: every event of a LadybugCluster (a create, a spec change from
add-node or remove-node, a deletion, and the status the writer wrote for us) names the object,
and the object names the flow by what it is:

* being deleted → ``delete`` (while the finalizer is ours);
* ``Failed`` → only the cleanup of ``create``, if it did not finish (the REST API replaces a
  failed cluster; the provisioner never retries one by itself, as upstream);
* ``Provisioned`` with a new generation → ``nodes`` (add and remove);
* otherwise → ``create`` (which resumes whatever an earlier run got to).

A generation that was fully handled is not looked at again: the status says so
(``observedGeneration``), and until the writer has written it, this replica's memory does
(``Settled``), so the events of our own progress reports cost a read, not a round of SSH.
"""

from __future__ import annotations

import contextlib
import logging

from services.ladybug.provisioner import create, delete, nodes
from services.ladybug.provisioner.ports import Deps, Json
from services.ladybug.provisioner.steps import Run, close_sessions, save_host_keys, status
from shared import reconcile
from shared.consumer import Batch
from shared.errors import CapibusError
from shared.kube import ResourceKind
from shared.messages import Message, ResourceChanged
from shared.models.ladybug import FINALIZER, LadybugPhase
from shared.owned import add_finalizer
from shared.ports import KubeReader
from shared.reconcile import Mapper, Reconciler, Target, gather, get_or_none
from shared.resources import LADYBUG_CLUSTER

log = logging.getLogger(__name__)


async def on_changes(batch: Batch[ResourceChanged], deps: Deps) -> None:
    await run(await gather(batch.messages, deps.kube, _MAPPERS), deps)


async def run(targets: dict[Target, Message], deps: Deps) -> None:
    await reconcile.run(targets, deps, reconcilers=RECONCILERS, locks=deps.locks)


async def _own(message: ResourceChanged, kube: KubeReader) -> list[Target]:
    return [Target(LADYBUG_CLUSTER, message.ref.namespace or "", message.ref.name)]


async def converge(target: Target, cause: Message, deps: Deps) -> list[Target]:
    obj = await get_or_none(deps.kube, LADYBUG_CLUSTER, target.namespace, target.name)
    if obj is None:
        return []
    if obj["metadata"].get("deletionTimestamp"):
        await delete.delete(obj, cause, deps)
        return []
    if _settled(obj, deps):
        return []
    obj = await add_finalizer(deps.kube, LADYBUG_CLUSTER, obj, FINALIZER)
    current = Run.of(deps, obj, cause)
    try:
        await _flow(current)
    finally:
        await close_sessions(current)
        # keys first seen in a run that then failed are still the nodes' keys
        with contextlib.suppress(CapibusError):
            await save_host_keys(current)
    deps.settled.note(current.uid, _generation(obj))
    return []


async def _flow(run: Run) -> None:
    phase = run.status.get("phase")
    if phase == LadybugPhase.FAILED.value or run.deps.settled.knows(run.uid, create.FAILED):
        await create.clean_up(run)
    elif phase == LadybugPhase.PROVISIONED.value:
        await nodes.converge(run)
    else:
        await create.provision(run)


def _settled(obj: Json, deps: Deps) -> bool:
    """Whether there is nothing left to do for this generation."""
    uid = str(obj["metadata"].get("uid") or "")
    if deps.settled.knows(uid, _generation(obj)):
        return True
    current = status(obj)
    phase = current.get("phase")
    if phase == LadybugPhase.FAILED.value:
        return create.cleaned_up(obj)
    observed = current.get("observedGeneration")
    return phase == LadybugPhase.PROVISIONED.value and observed == obj["metadata"].get("generation")


def _generation(obj: Json) -> str:
    return f"generation:{obj['metadata'].get('generation')}"


RECONCILERS: dict[ResourceKind, Reconciler[Deps]] = {LADYBUG_CLUSTER: converge}
_MAPPERS: dict[ResourceKind, Mapper] = {LADYBUG_CLUSTER: _own}
