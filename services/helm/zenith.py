"""Zenith for one Cluster's API server: the reservation, its values, the per-cluster operator.

The reservation must happen exactly once per Cluster, even if the service dies half-way. So
the intent is persisted *before* the registrar is called: the ``<cluster>-zenith-apiserver``
Secret is created first with a fresh Ed25519 key pair and a subdomain we chose, and the
registrar is asked to reserve exactly that subdomain for exactly that key. The fqdn annotation
marks completion. After a crash between the call and the annotation, the registrar answers 409
to the repeated request (the key is already registered); with ``zenith.base_domain`` set we
know the fqdn and finish, otherwise the status says so.

A 409 for a reservation we just started is a genuine conflict: the Secret is deleted (nothing
half-made stays behind) and the status carries the registrar's message; the next attempt
starts over with a new key and subdomain.
"""

from __future__ import annotations

import logging
from typing import Any

from services.helm import logic
from services.helm.logic import Wait
from services.helm.ports import Deps
from services.helm.values import mergeconcat
from services.helm.zenith_values import (
    apiserver_chart_values,
    apiserver_values,
    client_values,
    operator_chart_values,
    tenancy_id,
)
from shared.errors import KubeConflict, KubeNotFound, PermanentError
from shared.kube import ResourceKind
from shared.resources import CLUSTER, SECRET, owner_reference
from shared.zenith import RegistrarConflict, generate_keypair, random_subdomain

log = logging.getLogger(__name__)

Json = dict[str, Any]

SUBDOMAIN = "azimuth.stackhpc.com/zenith-subdomain"
FQDN = "azimuth.stackhpc.com/zenith-fqdn"


async def apiserver_layer(*, cluster: Json, deps: Deps) -> Json | Wait:
    """The values that put the Cluster's API server behind Zenith (merged last)."""
    secret = await _reservation(cluster, deps)
    if isinstance(secret, Wait):
        return secret
    meta = cluster["metadata"]
    key, version = f"{meta['namespace']}/{meta['name']}", (meta["uid"], _version(secret))
    cached = deps.memory.zenith_layers.get(key)
    if cached and cached[0] == version:
        return cached[1]
    layer = await _render_apiserver(cluster, secret, deps)
    deps.memory.zenith_layers[key] = (version, layer)
    return layer


def _version(secret: Json) -> str:
    return str(secret["metadata"].get("resourceVersion", ""))


async def _render_apiserver(cluster: Json, secret: Json, deps: Deps) -> Json:
    settings = deps.tuning.zenith
    chart_values = apiserver_chart_values(
        defaults=settings.apiserver_defaults,
        private_key_b64=secret["data"]["id_ed25519"],
        sshd_host=str(settings.sshd_host),
        sshd_port=settings.sshd_port,
    )
    rendered = await deps.helm.template(
        logic.chart_ref(settings.apiserver_chart), "zenith-apiserver", "kube-system", chart_values
    )
    fqdn = secret["metadata"]["annotations"][FQDN]
    monitoring = bool((cluster["spec"].get("addons") or {}).get("monitoring"))
    return mergeconcat(
        apiserver_values(fqdn=fqdn, rendered=rendered),
        client_values(monitoring=monitoring, icon_url=settings.monitoring_icon_url),
    )


async def _reservation(cluster: Json, deps: Deps) -> Json | Wait:
    meta = cluster["metadata"]
    name = f"{meta['name']}-zenith-apiserver"
    fresh = False
    try:
        secret = await deps.kube.get(SECRET, meta["namespace"], name)
    except KubeNotFound:
        secret, fresh = await _intent(cluster, name, deps), True
    annotations = secret["metadata"].get("annotations") or {}
    if annotations.get(FQDN):
        return secret
    subdomain = annotations[SUBDOMAIN]
    public_key = logic.decode_secret_value(secret, "id_ed25519.pub") or ""
    assert deps.registrar is not None
    try:
        reservation = await deps.registrar.reserve(public_key, subdomain)
        subdomain, fqdn = reservation.subdomain, reservation.fqdn
    except RegistrarConflict as exc:
        base = deps.tuning.zenith.base_domain
        if fresh or not base:
            if fresh:
                await deps.kube.delete(SECRET, meta["namespace"], name)
            return Wait("ZenithReservationConflict", str(exc))
        fqdn = f"{subdomain}.{base}"  # our own reservation, made before a crash
    patch = {"metadata": {"annotations": {SUBDOMAIN: subdomain, FQDN: fqdn}}}
    log.info("%s/%s: reserved Zenith subdomain for the API server", meta["namespace"], meta["name"])
    return await deps.kube.patch_merge(SECRET, meta["namespace"], name, patch)


async def _intent(cluster: Json, name: str, deps: Deps) -> Json:
    meta = cluster["metadata"]
    pair = generate_keypair()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {**logic.MANAGED_BY, "capi.stackhpc.com/cluster": meta["name"]},
            "annotations": {SUBDOMAIN: random_subdomain()},
            "ownerReferences": [owner_reference(CLUSTER, cluster, controller=True)],
        },
        "stringData": {"id_ed25519": pair.private_openssh, "id_ed25519.pub": pair.public_openssh},
    }
    try:
        return await deps.kube.create(SECRET, secret)
    except KubeConflict:
        return await deps.kube.get(SECRET, meta["namespace"], name)


async def apply_operator(*, cluster: Json, credentials: Json, deps: Deps) -> None:
    """Render the per-cluster zenith-operator and apply it, owned by the Cluster: upstream's
    ``zenith_operator_resources``, applied right after the release in its create handler."""
    meta = cluster["metadata"]
    settings = deps.tuning.zenith
    clouds = logic.decode_secret_value(credentials, "clouds.yaml") or ""
    tenancy = tenancy_id(clouds)
    if tenancy is None:
        # The tenancy id is what limits the cluster's services to the project's members.
        raise PermanentError(
            "clouds.yaml names no clouds.openstack.auth.project_id",
            reason="CloudCredentialsWithoutProject",
        )
    chart_values = operator_chart_values(
        defaults=settings.operator_defaults,
        cluster_name=meta["name"],
        registrar_admin_url=str(settings.registrar_admin_url),
        sshd_host=str(settings.sshd_host),
        sshd_port=settings.sshd_port,
        tenancy_id=tenancy,
    )
    rendered = await deps.helm.template(
        logic.chart_ref(settings.operator_chart), meta["name"], meta["namespace"], chart_values
    )
    for obj in rendered:
        obj_meta = obj.setdefault("metadata", {})
        obj_meta.setdefault("namespace", meta["namespace"])
        obj_meta["ownerReferences"] = [owner_reference(CLUSTER, cluster, controller=True)]
        kind = await _served_kind(obj, deps)
        await deps.kube.apply(kind, obj, field_manager=deps.tuning.field_manager)


async def _served_kind(obj: Json, deps: Deps) -> ResourceKind:
    """The resource of a rendered object, its plural from discovery (no English guesswork)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    return await deps.kube.resolve(group, obj["kind"], version=version)
