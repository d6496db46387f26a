"""Pure rules of the app Platforms (upstream: ``on_kubernetes_app_event`` in
azimuth-cloud/azimuth-capi-operator ``azimuth_capi/operator.py``).

An Azimuth "Kubernetes app" is an addon HelmRelease the portal creates with the labels
``azimuth.stackhpc.com/app-template`` and ``addons.stackhpc.com/cluster``. Each gets Platform
``kubeapp-<release>`` in its namespace: the Cluster's Realm (the same choice as the Cluster's
own Platform, ``logic.usable_realm``), and ``zenithServices`` from the release's
``azimuth.stackhpc.com/services`` annotation (the monitor of services writes it; a JSON map
name → service status, of which the Platform keeps ``subdomain`` and ``fqdn``). A controller
ownerReference to the HelmRelease lets garbage collection delete the Platform with the app.

**The Platform carries its Cluster's label.** ``addons.stackhpc.com/cluster=<cluster>``, as
the release has it: ``shared.resources.cluster_key`` routes a labelled object to its Cluster's
partition, so the Platform's events meet its release's and its Cluster's on one replica, which
serialises every run of one app. Without it the Platform's events hashed by its own name to
another partition, and two replicas could converge one app at once. A Platform written before
the label existed gets it on its next run (its ``metadata`` is not current without it).

**Paused Clusters keep their apps' Platforms.** Upstream never looks at ``paused`` here, and an
app's Platform is what its Zenith services authenticate through: a user who installs an app on
a paused Cluster (the addon provider still deploys it) expects to reach it. Only a deleting
Cluster or release is left to garbage collection.

**Waiting is quiet.** Upstream retries a missing Realm immediately and forever (a ``while True``
without a delay: a busy loop). Here no Realm is a verdict that is logged, not an error: a
Realm's event nudges the Clusters of its namespace, and a nudged Cluster looks at its apps
again.

**A bad annotation is no services.** Malformed JSON, or entries without a string subdomain and
fqdn, are left out with a warning rather than failing the event: the annotation is written by
another program, and retrying would not repair it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.identity import logic
from shared.messages import ResourceChanged
from shared.resources import HELM_RELEASE, PLATFORM, owner_reference

Json = dict[str, Any]

APP_TEMPLATE_LABEL = "azimuth.stackhpc.com/app-template"
CLUSTER_LABEL = "addons.stackhpc.com/cluster"
SERVICES_ANNOTATION = "azimuth.stackhpc.com/services"
#: The selector of a Cluster's apps; ``addons.stackhpc.com/cluster=<name>`` completes it.
APP_SELECTOR = APP_TEMPLATE_LABEL


def app_cluster(release: Json) -> str | None:
    """The Cluster an app HelmRelease belongs to; None for any other HelmRelease."""
    labels = (release.get("metadata") or {}).get("labels") or {}
    if not labels.get(APP_TEMPLATE_LABEL):
        return None
    return labels.get(CLUSTER_LABEL) or None


def app_selector(cluster_name: str) -> str:
    return f"{APP_SELECTOR},{CLUSTER_LABEL}={cluster_name}"


def owning_release(obj: Json) -> str | None:
    """The name of the addon HelmRelease that controls ``obj`` (an app Platform), if any."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if (
            owner.get("controller")
            and owner.get("kind") == HELM_RELEASE.kind
            and str(owner.get("apiVersion", "")).startswith(f"{HELM_RELEASE.group}/")
        ):
            return str(owner["name"])
    return None


def releases_touched(messages: Sequence[ResourceChanged]) -> list[tuple[str, str]]:
    """(namespace, name) of each app HelmRelease these events concern, once each, in order.

    An app HelmRelease's event concerns itself, an app Platform's the release that controls it
    (so a Platform deleted or edited by hand is put back). Anything else is not an app.
    """
    found: dict[tuple[str, str], None] = {}
    for message in messages:
        ref = message.ref
        if ref.kind == HELM_RELEASE.kind and app_cluster(message.object):
            name: str | None = ref.name
        elif ref.kind == PLATFORM.kind:
            name = owning_release(message.object)
        else:
            name = None
        if ref.namespace and name:
            found[(ref.namespace, name)] = None
    return list(found)


@dataclass(frozen=True)
class Services:
    """The Platform's ``zenithServices`` from an annotation, and what was wrong with it."""

    services: Json
    problem: str | None = None


def zenith_services(release: Json) -> Services:
    text = ((release.get("metadata") or {}).get("annotations") or {}).get(SERVICES_ANNOTATION)
    if not text:
        return Services({})
    try:
        found = json.loads(text)
    except ValueError as exc:
        return Services({}, f"{SERVICES_ANNOTATION} is not JSON: {exc}")
    if not isinstance(found, dict):
        return Services({}, f"{SERVICES_ANNOTATION} is not a JSON object")
    services: Json = {}
    skipped: list[str] = []
    for key, service in sorted(found.items()):
        if _usable(service):
            services[key] = {"subdomain": service["subdomain"], "fqdn": service["fqdn"]}
        else:
            skipped.append(key)
    problem = f"{SERVICES_ANNOTATION}: no subdomain or fqdn for {skipped}" if skipped else None
    return Services(services, problem)


def _usable(service: Any) -> bool:
    return isinstance(service, dict) and all(
        isinstance(service.get(key), str) and service[key] for key in ("subdomain", "fqdn")
    )


def release_owner(release: Json) -> Json:
    """What makes the app's HelmRelease the controller of its Platform."""
    return owner_reference(HELM_RELEASE, release, controller=True)


def is_active(release: Json) -> bool:
    return not (release.get("metadata") or {}).get("deletionTimestamp")


def desired_platform(
    release: Json, *, cluster_name: str, realm_name: str, name: str, services: Json
) -> Json:
    return logic.document(
        PLATFORM,
        owner=release_owner(release),
        namespace=release["metadata"]["namespace"],
        name=name,
        spec=logic.platform_spec(realm_name, services),
        labels={CLUSTER_LABEL: cluster_name},
    )


def next_step(
    release: Json,
    *,
    cluster: Json,
    realms: list[Json],
    platform: Json | None,
    name: str,
    services: Json,
) -> logic.Apply | logic.Verdict:
    """Apply the app's Platform, or say why not or that it is current (module docstring)."""
    realm = logic.usable_realm(cluster, realms)
    if isinstance(realm, logic.Verdict):
        return realm
    desired = desired_platform(
        release,
        cluster_name=str(cluster["metadata"]["name"]),
        realm_name=str(realm["metadata"]["name"]),
        name=name,
        services=services,
    )
    if not logic.is_current(platform, desired):
        return logic.Apply(PLATFORM, desired)
    return logic.Verdict(True, logic.Reason.READY, f"Platform {name} is current")
