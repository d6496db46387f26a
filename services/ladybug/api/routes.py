"""The routes of CB-Ladybug's REST API (``src/rest-api/server.go``), upstream's codes and words.

Each handler is upstream's router function and service call in one: validate (400 with
upstream's message), verify the Tumblebug namespace (upstream's code for that route), then
read or write the LadybugCluster and, for a change, wait for its outcome (``store.Store``).
Failures are raised as ``ApiError`` (or a ``shared.errors`` type, mapped once in ``app``);
the codes per route are upstream's:

==========================================  ======================================================
route                                        failures
==========================================  ======================================================
GET  /mcir/connections/{c}/specs             404 (any)
GET  /ns/{ns}/clusters                       400 (any)
POST /ns/{ns}/clusters                       400 validation, 500 refused or failed
GET  /ns/{ns}/clusters/{c}                   404 (any)
DELETE /ns/{ns}/clusters/{c}                 200 with body code 404 when unknown, 500
GET  /ns/{ns}/clusters/{c}/nodes             400; an unknown cluster has no nodes (200)
POST /ns/{ns}/clusters/{c}/nodes             400 validation, 500 refused or failed
GET  /ns/{ns}/clusters/{c}/nodes/{n}         404 (any)
DELETE /ns/{ns}/clusters/{c}/nodes/{n}       404 Status for an unknown node, 500
==========================================  ======================================================

capibus adds: 503 when Tumblebug or the API server cannot be reached (with the reason), 504
when a blocking call outlives ``wait_timeout`` (the phase it reached; the work goes on), and
the asynchronous mode: ``?async=true`` or ``Prefer: respond-async`` answers 202 at once with a
``Location`` to poll.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from services.ladybug import logic
from services.ladybug.api.auth import authenticated
from services.ladybug.api.errors import ApiError
from services.ladybug.api.models import (
    Cluster,
    ClusterList,
    ClusterReq,
    Node,
    NodeList,
    NodeReq,
    SpecList,
    Status,
)
from services.ladybug.api.ports import Deps, Json
from services.ladybug.api.store import AlreadyExists, Store, WaitTimedOut
from shared.errors import KubeConflict, PermanentError
from shared.models.ladybug import LadybugPhase

#: how often a spec change is decided again after a concurrent change won the race
PATCH_ATTEMPTS = 5


def _deps(request: Request) -> Deps:
    deps: Deps = request.app.state.deps
    return deps


DepsDep = Annotated[Deps, Depends(_deps)]
AsyncQuery = Annotated[
    bool,
    Query(alias="async", description="Answer 202 at once (with Location) instead of waiting"),
]
PreferHeader = Annotated[str | None, Header(description="respond-async: the same as ?async=true")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Status} for code in (400, 401, 404, 500, 503, 504)
}


def build(base_path: str) -> APIRouter:
    """Every route under ``base_path`` (upstream's ``/ladybug``)."""
    router = APIRouter(prefix=base_path, responses=_ERRORS)
    router.add_api_route(
        "/healthy",
        healthy,
        operation_id="Healthy",
        methods=["GET"],
        response_class=PlainTextResponse,
        tags=["Default"],
    )
    guarded = APIRouter(dependencies=[Depends(authenticated)])
    _add_cluster_routes(guarded)
    _add_node_routes(guarded)
    guarded.add_api_route(
        "/mcir/connections/{connection}/specs",
        list_specs,
        operation_id="ListSpec",
        methods=["GET"],
        response_model=SpecList,
        tags=["Mcir"],
        summary="List Specs",
    )
    # Echo matches ``/ns//clusters`` with an empty namespace; Starlette does not, so the
    # empty namespace has its own route, answering as upstream's middleware does.
    guarded.add_api_route(
        "/ns//{rest:path}",
        no_namespace,
        methods=["GET", "POST", "DELETE"],
        include_in_schema=False,
    )
    router.include_router(guarded)
    return router


def _add_cluster_routes(router: APIRouter) -> None:
    path = "/ns/{namespace}/clusters"
    tags: list[str | Any] = ["Cluster"]
    router.add_api_route(
        path,
        list_clusters,
        operation_id="ListCluster",
        methods=["GET"],
        response_model=ClusterList,
        tags=tags,
        summary="List all Clusters",
    )
    router.add_api_route(
        path,
        create_cluster,
        operation_id="CreateCluster",
        methods=["POST"],
        response_model=Cluster,
        tags=tags,
        summary="Create Cluster",
        responses={202: {"model": Cluster, "description": "Accepted (asynchronous mode)"}},
    )
    router.add_api_route(
        path + "/{cluster}",
        get_cluster,
        operation_id="GetCluster",
        methods=["GET"],
        response_model=Cluster,
        tags=tags,
        summary="Get Cluster",
    )
    router.add_api_route(
        path + "/{cluster}",
        delete_cluster,
        operation_id="DeleteCluster",
        methods=["DELETE"],
        response_model=Status,
        tags=tags,
        summary="Delete Cluster",
        responses={
            202: {"model": Status, "description": "Accepted (asynchronous mode)"},
            409: {"model": Status, "description": "Another delete is under way"},
        },
    )


def _add_node_routes(router: APIRouter) -> None:
    path = "/ns/{namespace}/clusters/{cluster}/nodes"
    tags: list[str | Any] = ["Node"]
    router.add_api_route(
        path,
        list_nodes,
        operation_id="ListNode",
        methods=["GET"],
        response_model=NodeList,
        tags=tags,
        summary="List all Nodes in specified Cluster",
    )
    router.add_api_route(
        path,
        add_nodes,
        operation_id="AddNode",
        methods=["POST"],
        response_model=NodeList,
        tags=tags,
        summary="Add Node in specified Cluster",
        responses={202: {"model": NodeList, "description": "Accepted (asynchronous mode)"}},
    )
    router.add_api_route(
        path + "/{node}",
        get_node,
        operation_id="GetNode",
        methods=["GET"],
        response_model=Node,
        tags=tags,
        summary="Get Node in specified Cluster",
    )
    router.add_api_route(
        path + "/{node}",
        remove_node,
        operation_id="RemoveNode",
        methods=["DELETE"],
        response_model=Status,
        tags=tags,
        summary="Remove Node in specified Cluster",
        responses={202: {"model": Status, "description": "Accepted (asynchronous mode)"}},
    )


# --- shared steps ---------------------------------------------------------------------------


async def healthy() -> str:
    """Health check (open, as upstream's)."""
    return logic.HEALTHY


async def no_namespace(*, rest: str) -> None:
    raise ApiError(401, "'Namespace' is a mandatory parameter.")


async def _verify_namespace(deps: Deps, namespace: str, code: int) -> None:
    """``verifyNamespace``: the Tumblebug namespace must exist (every cluster and node call;
    one seen to exist a moment ago is not asked again, ``KnownNamespaces``)."""
    if deps.namespaces.known(namespace):
        return
    if await deps.tumblebug.get_namespace(namespace) is None:
        raise ApiError(code, f"Could not be found a namespace. (namespace={namespace})")
    deps.namespaces.seen(namespace)


def _asynchronous(async_: bool, prefer: str | None) -> bool:
    return async_ or "respond-async" in (prefer or "").lower()


def _accepted(body: Json, location: str) -> JSONResponse:
    return JSONResponse(body, status_code=202, headers={"Location": location})


async def _settle(store: Store, obj: Json, done: Any) -> Json | None:
    """``store.wait`` with a timeout answered as 504, naming the phase reached."""
    try:
        result: Json | None = await store.wait(obj, done)
    except WaitTimedOut as timed_out:
        last = timed_out.last
        reached = logic.phase(last) if last else "gone"
        detail = logic.failure_message(last, "") if last else ""
        raise ApiError(
            504,
            f"Timed out after {store.timeout:g}s waiting for cluster "
            f"'{(obj.get('spec') or {}).get('name')}' (phase={reached})"
            + (f": {detail}" if detail else "")
            + "; it goes on, ask again later.",
        ) from None
    return result


def _cluster_path(deps: Deps, namespace: str, cluster: str) -> str:
    return f"{deps.base_path}/ns/{namespace}/clusters/{cluster}"


# --- clusters -------------------------------------------------------------------------------


async def list_clusters(*, namespace: str, deps: DepsDep) -> ClusterList:
    """List all Clusters of a Tumblebug namespace."""
    await _verify_namespace(deps, namespace, 400)
    store = Store(deps)
    objects = await store.in_namespace(namespace)
    configs = await store.kubeconfigs(namespace) if objects else {}
    views = [
        logic.cluster_view(o, kubeconfig=configs.get(o["metadata"]["name"], "")) for o in objects
    ]
    return ClusterList.model_validate(logic.cluster_list(views))


async def get_cluster(*, namespace: str, cluster: str, deps: DepsDep) -> Cluster:
    """Get Cluster."""
    await _verify_namespace(deps, namespace, 404)
    store = Store(deps)
    obj = await store.find(namespace, cluster)
    if obj is None:
        raise ApiError(404, f"Could not be found a cluster '{cluster}' (namespace={namespace})")
    return await _cluster(store, obj)


async def _cluster(store: Store, obj: Json) -> Cluster:
    view = logic.cluster_view(obj, kubeconfig=await store.kubeconfig(obj))
    return Cluster.model_validate(view)


async def create_cluster(
    *,
    namespace: str,
    body: ClusterReq,
    deps: DepsDep,
    async_: AsyncQuery = False,
    prefer: PreferHeader = None,
) -> Any:
    """Create Cluster: 200 with the cluster once Provisioned (500 with the reason if it
    Failed), or 202 at once in the asynchronous mode."""
    req = logic.with_defaults(body.model_dump())
    logic.validate_cluster(req)
    await _verify_namespace(deps, namespace, 500)
    await _check_load_balancer(deps, req)
    refusal = logic.service_refusal(req)
    if refusal:
        raise ApiError(500, refusal)
    store, name = Store(deps), str(req["name"])
    await _clear_failed(store, namespace, name)
    try:
        created = await store.create(logic.cluster_object(deps.namespace, namespace, req, deps.rng))
    except AlreadyExists:
        raise ApiError(500, _exists(namespace, name)) from None
    if _asynchronous(async_, prefer):
        view = logic.cluster_view(created)
        return _accepted(view, _cluster_path(deps, namespace, name))
    generation = int(created["metadata"].get("generation") or 1)
    final = await _settle(store, created, lambda o: o is None or logic.settled(o, generation))
    if final is None:
        raise ApiError(500, f"The cluster '{name}' was deleted while it was being provisioned.")
    outcome = logic.create_outcome(final)
    if not outcome.ok:
        raise ApiError(500, outcome.message)
    return await _cluster(store, final)


def _exists(namespace: str, name: str) -> str:
    return f"The cluster '{name}' already exists. (namespace={namespace})"


async def _check_load_balancer(deps: Deps, req: Json) -> None:
    loadbalancer = req["config"]["kubernetes"]["loadbalancer"]
    if loadbalancer == logic.HAPROXY:
        return
    connection = await deps.tumblebug.get_connection_config(req["controlPlane"][0]["connection"])
    refusal = logic.nlb_refusal(loadbalancer, connection)
    if refusal:
        raise ApiError(500, refusal)


async def _clear_failed(store: Store, namespace: str, name: str) -> None:
    """Upstream's create over an existing entity: a Failed one is deleted first (and waited
    for), any other refuses the create."""
    existing = await store.find(namespace, name)
    if existing is None:
        return
    if logic.phase(existing) != LadybugPhase.FAILED.value:
        raise ApiError(500, _exists(namespace, name))
    await store.delete(existing)
    await _settle(store, existing, lambda o: o is None)


async def delete_cluster(
    *,
    namespace: str,
    cluster: str,
    deps: DepsDep,
    async_: AsyncQuery = False,
    prefer: PreferHeader = None,
) -> Any:
    """Delete Cluster: 200 Status once it is gone (its MCIS deleted by the provisioner);
    HTTP 200 with body code 404 when there is no such cluster, as upstream. A delete while
    another is under way is refused (409) rather than racing it, as upstream's did."""
    await _verify_namespace(deps, namespace, 500)
    store = Store(deps)
    obj = await store.find(namespace, cluster)
    if obj is None:
        message = f"Could not be found cluster '{cluster}'. (namespace={namespace})"
        return Status(code=404, message=message)
    if logic.deleting(obj):
        raise ApiError(409, f"The cluster '{cluster}' is already being deleted.")
    await store.delete(obj)
    if _asynchronous(async_, prefer):
        body = logic.status_body(202, f"Cluster '{cluster}' is being deleted")
        return _accepted(body, _cluster_path(deps, namespace, cluster))
    await _settle(store, obj, lambda o: o is None)
    return Status(code=200, message=f"Cluster '{cluster}' has been deleted")


# --- nodes ----------------------------------------------------------------------------------


async def list_nodes(*, namespace: str, cluster: str, deps: DepsDep) -> NodeList:
    """List all Nodes in specified Cluster (none for an unknown cluster, as upstream)."""
    await _verify_namespace(deps, namespace, 400)
    obj = await Store(deps).find(namespace, cluster)
    return NodeList.model_validate(logic.node_list(obj))


async def get_node(*, namespace: str, cluster: str, node: str, deps: DepsDep) -> Node:
    """Get Node in specified Cluster."""
    await _verify_namespace(deps, namespace, 404)
    obj = await Store(deps).find(namespace, cluster)
    found = logic.find_node(obj, node) if obj else None
    if found is None:
        raise ApiError(
            404,
            f"Could not be found a node '{node}' (namespace={namespace}, cluster={cluster})",
        )
    return Node.model_validate(found)


async def add_nodes(
    *,
    namespace: str,
    cluster: str,
    body: NodeReq,
    deps: DepsDep,
    async_: AsyncQuery = False,
    prefer: PreferHeader = None,
) -> Any:
    """Add worker nodes: 200 with **all** nodes once the new ones have joined."""
    workers = logic.validate_add_nodes(body.model_dump())
    await _verify_namespace(deps, namespace, 500)
    store = Store(deps)
    for _ in range(PATCH_ATTEMPTS):
        obj = await _provisioned(store, namespace, cluster, "add")
        refusal = logic.add_nodes_refusal(workers, obj.get("spec") or {})
        if refusal:
            raise ApiError(500, refusal)
        sets = logic.worker_sets(workers, logic.next_worker_index(obj), deps.rng)
        ops = [{"op": "add", "path": "/spec/worker/-", "value": s} for s in sets]
        try:
            patched = await store.patch(obj, ops)
            break
        except KubeConflict:
            continue
    else:
        raise ApiError(500, f"The cluster '{cluster}' keeps changing; try again.")
    if _asynchronous(async_, prefer):
        nodes_path = _cluster_path(deps, namespace, cluster) + "/nodes"
        return _accepted(logic.node_list(patched), nodes_path)
    ids = [s["id"] for s in sets]
    final = await _settle(store, patched, _settled_for(patched))
    if final is None:
        raise ApiError(500, f"The cluster '{cluster}' was deleted while nodes were added.")
    outcome = logic.add_outcome(final, ids)
    if not outcome.ok:
        raise ApiError(500, outcome.message)
    return NodeList.model_validate(logic.node_list(final))


def _settled_for(obj: Json) -> Any:
    generation = int(obj["metadata"].get("generation") or 1)
    return lambda o: o is None or logic.settled(o, generation)


async def _provisioned(store: Store, namespace: str, cluster: str, verb: str) -> Json:
    """The cluster, which must exist and be Provisioned for a node change (upstream's
    messages, which differ between add and remove)."""
    obj = await store.find(namespace, cluster)
    if obj is None:
        if verb == "add":
            message = f"Could not be found a cluster '{cluster}'. (namespace={namespace})"
        else:
            message = f"Could not be found a cluster. (namespace={namespace}, cluster={cluster})"
        raise ApiError(500, message)
    current = logic.phase(obj)
    if current != LadybugPhase.PROVISIONED.value:
        raise ApiError(500, f"Unable to {verb} a node. status is '{current}'.")
    return obj


async def remove_node(
    *,
    namespace: str,
    cluster: str,
    node: str,
    deps: DepsDep,
    async_: AsyncQuery = False,
    prefer: PreferHeader = None,
) -> Any:
    """Remove Node: drained, deleted from Kubernetes, its VM deleted. Not the leader."""
    await _verify_namespace(deps, namespace, 500)
    store = Store(deps)
    for _ in range(PATCH_ATTEMPTS):
        obj = await _provisioned(store, namespace, cluster, "remove")
        _check_removable(obj, node)
        try:
            patched = await _ask_removal(store, obj, node)
            break
        except KubeConflict:
            continue
    else:
        raise ApiError(500, f"The cluster '{cluster}' keeps changing; try again.")
    if _asynchronous(async_, prefer):
        body = logic.status_body(202, f"Node '{node}' is being deleted")
        return _accepted(body, _cluster_path(deps, namespace, cluster) + f"/nodes/{node}")
    final = await _settle(store, patched, _settled_for(patched))
    if final is None:
        raise ApiError(500, f"The cluster '{cluster}' was deleted while a node was removed.")
    outcome = logic.remove_outcome(final, node)
    if not outcome.ok:
        raise ApiError(500, outcome.message)
    return Status(code=200, message=f"Node '{node}' has been deleted")


def _check_removable(obj: Json, node: str) -> None:
    if node == (obj.get("status") or {}).get("cpLeader"):
        raise ApiError(500, "Could not be delete a control-plane leader node.")
    if node not in logic.node_names(obj):
        raise ApiError(404, f"Could not be found a node-entity '{node}'")


async def _ask_removal(store: Store, obj: Json, node: str) -> Json:
    """Append ``node`` to ``spec.removeNodes`` (once: asking again just waits again)."""
    asked = (obj.get("spec") or {}).get("removeNodes")
    if asked is not None and node in asked:
        return obj
    if asked is None:
        op = {"op": "add", "path": "/spec/removeNodes", "value": [node]}
    else:
        op = {"op": "add", "path": "/spec/removeNodes/-", "value": node}
    return await store.patch(obj, [op])


# --- specs ----------------------------------------------------------------------------------


async def list_specs(
    *,
    connection: str,
    deps: DepsDep,
    control_plane: Annotated[
        str | None, Query(alias="control-plane", description="Y or N (default N)")
    ] = None,
    cpu_min: Annotated[str | None, Query(alias="cpu-min", description="Default 1 (CP: 2)")] = None,
    cpu_max: Annotated[str | None, Query(alias="cpu-max", description="Default 99999")] = None,
    memory_min: Annotated[
        str | None, Query(alias="memory-min", description="GiB; default 1 (CP: 2)")
    ] = None,
    memory_max: Annotated[
        str | None, Query(alias="memory-max", description="GiB; default 99999")
    ] = None,
) -> SpecList:
    """List Specs of a connection, filtered by vCPUs and memory."""
    bounds = logic.spec_bounds(
        control_plane,
        cpu_min=cpu_min,
        cpu_max=cpu_max,
        memory_min=memory_min,
        memory_max=memory_max,
    )
    refusal = logic.spec_bounds_refusal(bounds)
    if refusal:
        raise ApiError(404, refusal)
    try:
        specs = await deps.tumblebug.lookup_specs(connection)
    except PermanentError as exc:
        message = f"Failed to lookup spec. (connection={connection}, cause='{exc}')"
        raise ApiError(404, message) from exc
    try:
        return SpecList.model_validate(logic.spec_list(connection, specs, bounds))
    except logic.Refused as exc:
        raise ApiError(404, str(exc)) from exc
