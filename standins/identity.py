"""Stand-in for the azimuth-identity-operator: Realms, OIDCClients and Platforms become Ready.

No Keycloak, no Dex: only what capibus can observe (``docs/upstream.md`` §5).
Every step is its own status write, ``Knobs.step()`` apart.

- **Spec changes.** Upstream's kopf keys "create" versus "update" off its diff-base
  annotation; here the generation last brought to Ready is recorded in
  ``standins.capibus.io/handled-generation``. An object without it is new (``Pending``, and
  only when it has no phase yet, so a restarted stand-in does not flap Ready objects); a
  generation above it is a spec update (``Updating`` for clients and platforms).
- **Waiting for the realm** is no timer: the Realm controller re-offers the clients and
  platforms that name a Realm whenever that Realm is Ready, so they move on its event.
- **No finalizers.** There is nothing outside the API server to clean up, and test
  namespaces then delete without the stand-in running.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
from dataclasses import dataclass, field

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import OIDC_CLIENT, PLATFORM, REALM, SECRET
from standins.base import (
    Controller,
    Json,
    Knobs,
    env_set,
    fresh,
    key_of,
    phase_of,
    selected,
    write_status,
)

log = logging.getLogger("standins.identity")

HANDLED = "standins.capibus.io/handled-generation"
MANAGER = "azimuth-identity-operator"
PLATFORM_USERS_GROUP = "/platform-users"


@dataclass
class IdentityKnobs(Knobs):
    never_ready_realms: set[str] = field(
        default_factory=lambda: env_set("STANDIN_IDENTITY_NEVER_READY_REALMS")
    )
    withhold_client_id: set[str] = field(
        default_factory=lambda: env_set("STANDIN_IDENTITY_WITHHOLD_CLIENT_ID")
    )
    withhold_root_group: set[str] = field(
        default_factory=lambda: env_set("STANDIN_IDENTITY_WITHHOLD_ROOT_GROUP")
    )
    keycloak_url: str = field(
        default_factory=lambda: os.environ.get(
            "STANDIN_IDENTITY_KEYCLOAK_URL", "https://keycloak.example.test"
        ).rstrip("/")
    )


def handled_generation(obj: Json) -> int | None:
    value = (obj["metadata"].get("annotations") or {}).get(HANDLED)
    return int(value) if value and value.isdigit() else None


def is_handled(obj: Json) -> bool:
    generation = obj["metadata"].get("generation")
    return generation is not None and handled_generation(obj) == int(generation)


def realm_status(realm: Json, keycloak_url: str) -> Json:
    meta = realm["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    kc_realm = name if name == namespace else f"{namespace}-{name}"
    tenancy = (realm.get("spec") or {}).get("tenancyId")
    return {
        "phase": "Ready",
        "oidcIssuerUrl": f"{keycloak_url}/realms/{kc_realm}",
        "adminUrl": f"{keycloak_url}/admin/{kc_realm}/console",
        # Only tenancy realms get the platform-users group; None removes a stale value.
        "platformUsersGroup": PLATFORM_USERS_GROUP if tenancy else None,
    }


def client_credentials_name(client: Json) -> str:
    spec = client.get("spec") or {}
    return str(
        spec.get("credentialsSecretName") or f"{client['metadata']['name']}-oidc-credentials"
    )


def client_status(client: Json, realm: Json, *, secret_name: str | None, withhold: bool) -> Json:
    spec = client.get("spec") or {}
    issuer = (realm.get("status") or {}).get("oidcIssuerUrl")
    client_id = spec.get("clientId") or client["metadata"]["name"]
    return {
        "phase": "Ready",
        "issuerUrl": None if withhold else issuer,
        "clientId": None if withhold else client_id,
        "credentialsSecretName": secret_name,
    }


def platform_status(platform: Json, *, withhold: bool) -> Json:
    name = platform["metadata"]["name"]
    services = (platform.get("spec") or {}).get("zenithServices") or {}
    subgroups: dict[str, str | None] = {svc: f"/{name}/{svc}" for svc in services}
    # A merge patch keeps map keys it does not name: drop the subgroups of removed services.
    previous = (platform.get("status") or {}).get("zenithServiceSubgroups") or {}
    removed: dict[str, str | None] = {svc: None for svc in previous if svc not in services}
    return {
        "phase": "Ready",
        "rootGroup": None if withhold else f"/{name}",
        "zenithServiceSubgroups": {**removed, **subgroups} if subgroups else None,
    }


def owner_ref(kind: ResourceKind, obj: Json) -> Json:
    meta = obj["metadata"]
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class Identity:
    """The three identity controllers, sharing knobs and the realm → dependents fan-out."""

    def __init__(
        self, kube: KubeClient, *, knobs: IdentityKnobs | None = None, namespace: str | None = None
    ) -> None:
        self.kube = kube
        self.knobs = knobs or IdentityKnobs()
        self._waiting: set[str] = set()
        self.realms = Controller(
            kube, REALM, self.reconcile_realm, namespace=namespace, name="identity.realms"
        )
        self.clients = Controller(
            kube, OIDC_CLIENT, self.reconcile_client, namespace=namespace, name="identity.clients"
        )
        self.platforms = Controller(
            kube, PLATFORM, self.reconcile_platform, namespace=namespace, name="identity.platforms"
        )

    def controllers(self) -> list[Controller]:
        return [self.realms, self.clients, self.platforms]

    async def reconcile_realm(self, seen: Json) -> None:
        realm = await fresh(self.kube, REALM, seen)
        if realm["metadata"].get("deletionTimestamp"):
            return
        if not is_handled(realm):
            realm = await self._ready_realm(realm)
        if phase_of(realm) == "Ready":
            self._offer_dependents(realm)

    async def _ready_realm(self, realm: Json) -> Json:
        key = key_of(realm)
        if phase_of(realm) == "Unknown":
            realm = await write_status(self.kube, REALM, realm, {"phase": "Pending"})
            log.info("realm %s: Pending", key)
            if selected(self.knobs.never_ready_realms, realm):
                log.info("realm %s: held Pending (STANDIN_IDENTITY_NEVER_READY_REALMS)", key)
        if selected(self.knobs.never_ready_realms, realm):
            return realm
        await self.knobs.step()
        status = realm_status(realm, self.knobs.keycloak_url)
        realm = await write_status(self.kube, REALM, realm, status)
        await self._mark_handled(REALM, realm)
        log.info("realm %s: Ready, issuer %s", key, status["oidcIssuerUrl"])
        return realm

    def _offer_dependents(self, realm: Json) -> None:
        namespace, name = realm["metadata"]["namespace"], realm["metadata"]["name"]
        for controller in (self.clients, self.platforms):
            for obj in controller.known():
                same_realm = (obj.get("spec") or {}).get("realmName") == name
                if same_realm and obj["metadata"]["namespace"] == namespace and not is_handled(obj):
                    controller.offer(obj)

    async def reconcile_client(self, seen: Json) -> None:
        client = await fresh(self.kube, OIDC_CLIENT, seen)
        if client["metadata"].get("deletionTimestamp") or is_handled(client):
            return
        client = await self._enter(OIDC_CLIENT, client)
        realm = await self._ready_realm_of(client)
        if realm is None:
            return
        await self.knobs.step()
        issuer = (realm.get("status") or {}).get("oidcIssuerUrl")
        secret_name = await self._credentials(client, str(issuer))
        withhold = selected(self.knobs.withhold_client_id, client)
        status = client_status(client, realm, secret_name=secret_name, withhold=withhold)
        client = await write_status(self.kube, OIDC_CLIENT, client, status)
        await self._mark_handled(OIDC_CLIENT, client)
        if withhold:
            log.info("oidcclient %s: Ready without issuerUrl/clientId (knob)", key_of(client))
        else:
            log.info("oidcclient %s: Ready, clientId %s", key_of(client), status["clientId"])

    async def reconcile_platform(self, seen: Json) -> None:
        platform = await fresh(self.kube, PLATFORM, seen)
        if platform["metadata"].get("deletionTimestamp") or is_handled(platform):
            return
        platform = await self._enter(PLATFORM, platform)
        if await self._ready_realm_of(platform) is None:
            return
        await self.knobs.step()
        withhold = selected(self.knobs.withhold_root_group, platform)
        status = platform_status(platform, withhold=withhold)
        platform = await write_status(self.kube, PLATFORM, platform, status)
        await self._mark_handled(PLATFORM, platform)
        if withhold:
            log.info("platform %s: Ready without rootGroup (knob)", key_of(platform))
        else:
            log.info("platform %s: Ready, rootGroup %s", key_of(platform), status["rootGroup"])

    async def _enter(self, kind: ResourceKind, obj: Json) -> Json:
        """``Pending`` for a new object without a phase, ``Updating`` after a spec change."""
        target = "Updating" if handled_generation(obj) is not None else "Pending"
        if target == "Pending" and phase_of(obj) != "Unknown":
            return obj
        if phase_of(obj) == target:
            return obj
        obj = await write_status(self.kube, kind, obj, {"phase": target})
        log.info("%s %s: %s", kind.kind.lower(), key_of(obj), target)
        return obj

    async def _ready_realm_of(self, obj: Json) -> Json | None:
        """The Ready realm ``obj`` names, or None (logged once) while it is missing or not Ready."""
        namespace = obj["metadata"]["namespace"]
        name = (obj.get("spec") or {}).get("realmName", "")
        try:
            realm = await self.kube.get(REALM, namespace, name)
        except KubeNotFound:
            realm = None
        key = f"{obj['kind']} {key_of(obj)}"
        if realm is not None and phase_of(realm) == "Ready":
            self._waiting.discard(key)
            return realm
        if key not in self._waiting:
            self._waiting.add(key)
            state = "missing" if realm is None else phase_of(realm)
            log.info(
                "%s %s: waiting for realm %s (%s)", obj["kind"].lower(), key_of(obj), name, state
            )
        return None

    async def _credentials(self, client: Json, issuer: str) -> str | None:
        """A confidential client's credentials Secret; a public client has none."""
        meta = client["metadata"]
        name = client_credentials_name(client)
        if (client.get("spec") or {}).get("public"):
            await self._drop_credentials(meta["namespace"], name)
            return None
        secret_value = await self._existing_client_secret(meta["namespace"], name)
        spec = client.get("spec") or {}
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {"app.kubernetes.io/managed-by": MANAGER},
                "ownerReferences": [owner_ref(OIDC_CLIENT, client)],
            },
            "stringData": {
                "issuer-url": issuer,
                "client-id": spec.get("clientId") or meta["name"],
                "client-secret": secret_value or secrets.token_urlsafe(24),
            },
        }
        await self.kube.apply(SECRET, secret, field_manager=MANAGER)
        return name

    async def _existing_client_secret(self, namespace: str, name: str) -> str | None:
        """Keep the secret across spec updates, as Keycloak keeps a client's secret."""
        try:
            secret = await self.kube.get(SECRET, namespace, name)
        except KubeNotFound:
            return None
        value = (secret.get("data") or {}).get("client-secret")
        return base64.b64decode(value).decode() if value else None

    async def _drop_credentials(self, namespace: str, name: str) -> None:
        try:
            secret = await self.kube.get(SECRET, namespace, name)
        except KubeNotFound:
            return
        if (secret["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == MANAGER:
            await self.kube.delete(SECRET, namespace, name)

    async def _mark_handled(self, kind: ResourceKind, obj: Json) -> None:
        meta = obj["metadata"]
        patch = {"metadata": {"annotations": {HANDLED: str(meta["generation"])}}}
        await self.kube.patch_merge(kind, meta["namespace"], meta["name"], patch)


def controllers(kube: KubeClient, *, namespace: str | None = None) -> list[Controller]:
    """Realm, OIDCClient and Platform controllers; knobs are read from the environment now."""
    return Identity(kube, namespace=namespace).controllers()
