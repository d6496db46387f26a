"""The identity, schedule and Zenith stand-ins against the real API server.

They must behave like the peers capibus waits on (``docs/upstream.md`` §5):
separate status writes in upstream's order, the fields upstream sets and no others, and the
failure knobs that exercise capibus's retry paths.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import signal
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import CONFIG_MAP, LEASE, OIDC_CLIENT, PLATFORM, REALM, RESERVATION, SECRET
from standins.schedule import FINALIZER
from standins.zenith import Registrar, RegistrarServer, generate_keypair, start_registrar
from tests.integration.support import ROOT, eventually

pytestmark = pytest.mark.integration

Json = dict[str, Any]
HELD = "azimuth.stackhpc.com"


def phase(obj: Json) -> str:
    return str((obj.get("status") or {}).get("phase") or "Unknown")


def getter(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> Any:
    return lambda: kube.get(kind, namespace, name)


async def until_phase(
    kube: KubeClient, kind: ResourceKind, namespace: str, name: str, wanted: str
) -> Json:
    obj: Json = await eventually(
        getter(kube, kind, namespace, name),
        lambda o: phase(o) == wanted,
        timeout=15,
        what=f"{kind.kind} {name} {wanted}",
    )
    return obj


async def gone(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> bool:
    try:
        await kube.get(kind, namespace, name)
    except KubeNotFound:
        return True
    return False


def manifest(kind: ResourceKind, namespace: str, name: str, spec: Json, **meta: Any) -> Json:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": spec,
    }


def key_fingerprint(public_key: str) -> str:
    blob = base64.b64decode(public_key.split()[1])
    return base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


# --- identity ---------------------------------------------------------------------------------


async def test_client_and_platform_wait_for_the_realm_then_become_ready(
    kube, namespace, standins, phase_log
) -> None:
    log = await phase_log(REALM, OIDC_CLIENT, PLATFORM)
    standins("identity")
    client = {"realmName": namespace, "public": True, "grantTypes": ["DeviceCode"]}
    await kube.create(OIDC_CLIENT, manifest(OIDC_CLIENT, namespace, "kube-demo", client))
    services = {"monitoring": {"subdomain": "abc123", "fqdn": "abc123.apps.example.test"}}
    platform = {"realmName": namespace, "zenithServices": services}
    await kube.create(PLATFORM, manifest(PLATFORM, namespace, "kube-demo", platform))
    await until_phase(kube, OIDC_CLIENT, namespace, "kube-demo", "Pending")
    await until_phase(kube, PLATFORM, namespace, "kube-demo", "Pending")

    await kube.create(REALM, manifest(REALM, namespace, namespace, {"tenancyId": "t-1"}))

    realm = await until_phase(kube, REALM, namespace, namespace, "Ready")
    issuer = f"https://keycloak.example.test/realms/{namespace}"
    assert realm["status"] == {
        "phase": "Ready",
        "oidcIssuerUrl": issuer,
        "adminUrl": f"https://keycloak.example.test/admin/{namespace}/console",
        "platformUsersGroup": "/platform-users",
    }
    ready_client = await until_phase(kube, OIDC_CLIENT, namespace, "kube-demo", "Ready")
    assert ready_client["status"] == {
        "phase": "Ready",
        "issuerUrl": issuer,
        "clientId": "kube-demo",
    }
    ready_platform = await until_phase(kube, PLATFORM, namespace, "kube-demo", "Ready")
    assert ready_platform["status"] == {
        "phase": "Ready",
        "rootGroup": "/kube-demo",
        "zenithServiceSubgroups": {"monitoring": "/kube-demo/monitoring"},
    }
    assert log.phases(REALM, namespace) == ["Pending", "Ready"]
    assert log.phases(OIDC_CLIENT, "kube-demo") == ["Pending", "Ready"]
    assert log.phases(PLATFORM, "kube-demo") == ["Pending", "Ready"]
    realm_ready = log.written_at(REALM, namespace, "Ready")
    assert log.written_at(OIDC_CLIENT, "kube-demo", "Ready") > realm_ready
    assert log.written_at(PLATFORM, "kube-demo", "Ready") > realm_ready
    assert await gone(kube, SECRET, namespace, "kube-demo-oidc-credentials")  # public client


async def test_spec_change_goes_updating_and_confidential_client_keeps_its_secret(
    kube, namespace, standins, phase_log
) -> None:
    log = await phase_log(OIDC_CLIENT)
    standins("identity")
    await kube.create(REALM, manifest(REALM, namespace, "plain", {}))
    spec = {"realmName": "plain", "grantTypes": ["AuthorizationCode"], "clientId": "portal"}
    await kube.create(OIDC_CLIENT, manifest(OIDC_CLIENT, namespace, "web", spec))

    realm = await until_phase(kube, REALM, namespace, "plain", "Ready")
    assert "platformUsersGroup" not in realm["status"]  # not a tenancy realm
    assert realm["status"]["oidcIssuerUrl"].endswith(f"/realms/{namespace}-plain")
    client = await until_phase(kube, OIDC_CLIENT, namespace, "web", "Ready")
    assert client["status"]["clientId"] == "portal"
    assert client["status"]["credentialsSecretName"] == "web-oidc-credentials"
    secret = await kube.get(SECRET, namespace, "web-oidc-credentials")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["client-id"] == "portal"
    assert data["issuer-url"] == realm["status"]["oidcIssuerUrl"]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == client["metadata"]["uid"]

    patch = {"spec": {"redirectUris": ["https://portal.example.test/callback"]}}
    await kube.patch_merge(OIDC_CLIENT, namespace, "web", patch)
    await eventually(
        lambda: asyncio.sleep(0, log.phases(OIDC_CLIENT, "web")),
        lambda phases: phases == ["Pending", "Ready", "Updating", "Ready"],
        what="Updating, then Ready again",
    )
    again = await kube.get(SECRET, namespace, "web-oidc-credentials")
    assert again["data"]["client-secret"] == secret["data"]["client-secret"]


async def test_never_ready_realm_holds_its_clients(kube, namespace, standins, monkeypatch) -> None:
    monkeypatch.setenv("STANDIN_IDENTITY_NEVER_READY_REALMS", f"{namespace}/stuck")
    standins("identity")
    await kube.create(REALM, manifest(REALM, namespace, "stuck", {"tenancyId": "t"}))
    await kube.create(REALM, manifest(REALM, namespace, "open", {}))
    await kube.create(OIDC_CLIENT, manifest(OIDC_CLIENT, namespace, "held", {"realmName": "stuck"}))
    await kube.create(OIDC_CLIENT, manifest(OIDC_CLIENT, namespace, "free", {"realmName": "open"}))

    await until_phase(kube, OIDC_CLIENT, namespace, "free", "Ready")
    await asyncio.sleep(0.5)
    assert (await kube.get(REALM, namespace, "stuck"))["status"] == {"phase": "Pending"}
    assert (await kube.get(OIDC_CLIENT, namespace, "held"))["status"] == {"phase": "Pending"}


async def test_withheld_client_id_and_root_group(kube, namespace, standins, monkeypatch) -> None:
    monkeypatch.setenv("STANDIN_IDENTITY_WITHHOLD_CLIENT_ID", f"{namespace}/withheld")
    monkeypatch.setenv("STANDIN_IDENTITY_WITHHOLD_ROOT_GROUP", "*")
    standins("identity")
    await kube.create(REALM, manifest(REALM, namespace, "r", {}))
    spec = {"realmName": "r", "public": True}
    await kube.create(OIDC_CLIENT, manifest(OIDC_CLIENT, namespace, "withheld", spec))
    await kube.create(OIDC_CLIENT, manifest(OIDC_CLIENT, namespace, "given", spec))
    await kube.create(PLATFORM, manifest(PLATFORM, namespace, "p", {"realmName": "r"}))

    withheld = await until_phase(kube, OIDC_CLIENT, namespace, "withheld", "Ready")
    assert withheld["status"] == {"phase": "Ready"}
    given = await until_phase(kube, OIDC_CLIENT, namespace, "given", "Ready")
    assert given["status"]["clientId"] == "given"
    platform = await until_phase(kube, PLATFORM, namespace, "p", "Ready")
    assert platform["status"] == {"phase": "Ready"}


# --- schedule ---------------------------------------------------------------------------------


async def make_lease(
    kube: KubeClient, namespace: str, name: str, machines: list[Json], **extra: Any
) -> Json:
    secret = f"{name}-cloud-credentials"
    body = {
        "metadata": {"name": secret, "namespace": namespace},
        "stringData": {"clouds.yaml": "{}"},
    }
    await kube.create(SECRET, body)
    spec = {"cloudCredentialsSecretName": secret, "resources": {"machines": machines}}
    meta = {k: extra.pop(k) for k in ("finalizers", "ownerReferences") if k in extra}
    created: Json = await kube.create(
        LEASE, manifest(LEASE, namespace, name, {**spec, **extra}, **meta)
    )
    return created


async def test_lease_becomes_active_with_identity_size_maps(
    kube, namespace, standins, phase_log
) -> None:
    log = await phase_log(LEASE)
    standins("schedule")
    machines = [
        {"sizeId": "f-small", "count": 2},
        {"sizeId": "f-large", "count": 1},
        {"sizeId": "gpu-unknown", "count": 1},
    ]
    await make_lease(kube, namespace, "kube-demo", machines)

    lease = await until_phase(kube, LEASE, namespace, "kube-demo", "Active")
    assert lease["metadata"]["finalizers"] == [FINALIZER]
    assert lease["status"] == {
        "phase": "Active",
        "sizeMap": {"f-small": "f-small", "f-large": "f-large", "gpu-unknown": "gpu-unknown"},
        "sizeNameMap": {"m1.small": "m1.small", "m1.large": "m1.large"},
    }
    assert log.phases(LEASE, "kube-demo") == ["Pending", "Active"]


async def test_blazar_lease_walks_the_transitions_to_reserved_flavors(
    kube, namespace, standins, phase_log, monkeypatch
) -> None:
    monkeypatch.setenv("STANDIN_SCHEDULE_BLAZAR", "1")
    monkeypatch.setenv("STANDIN_SCHEDULE_TRANSITIONS", "1")
    monkeypatch.setenv("STANDIN_SCHEDULE_FLAVORS", json.dumps({"f-1": "tiny", "f-2": "huge"}))
    log = await phase_log(LEASE)
    standins("schedule")
    machines = [{"sizeId": "f-1", "count": 1}, {"sizeId": "f-2", "count": 3}]
    await make_lease(kube, namespace, "kube-blazar", machines)

    lease = await until_phase(kube, LEASE, namespace, "kube-blazar", "Active")
    size_map, name_map = lease["status"]["sizeMap"], lease["status"]["sizeNameMap"]
    assert set(size_map) == {"f-1", "f-2"}
    assert size_map["f-1"] != "f-1"
    assert name_map == {
        "tiny": f"reservation:{size_map['f-1']}",
        "huge": f"reservation:{size_map['f-2']}",
    }
    assert log.phases(LEASE, "kube-blazar") == ["Creating", "Pending", "Starting", "Active"]


async def test_lease_stays_pending_until_it_starts(kube, namespace, standins, phase_log) -> None:
    log = await phase_log(LEASE)
    standins("schedule")
    starts = datetime.now(UTC) + timedelta(seconds=3)
    stamp = starts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await make_lease(kube, namespace, "later", [{"sizeId": "f-small", "count": 1}], startsAt=stamp)

    await until_phase(kube, LEASE, namespace, "later", "Active")
    assert datetime.now(UTC) >= starts
    assert log.phases(LEASE, "later") == ["Pending", "Active"]


async def test_lease_error_knob(kube, namespace, standins, monkeypatch) -> None:
    monkeypatch.setenv("STANDIN_SCHEDULE_ERROR", f"{namespace}/no-room")
    standins("schedule")
    await make_lease(kube, namespace, "no-room", [{"sizeId": "f-small", "count": 9}])

    lease = await until_phase(kube, LEASE, namespace, "no-room", "Error")
    assert lease["status"] == {"phase": "Error", "errorMessage": "Not enough hosts available"}


async def test_lease_deletion_waits_for_other_finalizers_then_deletes_credentials(
    kube, namespace, standins, phase_log
) -> None:
    log = await phase_log(LEASE)
    standins("schedule")
    await make_lease(
        kube, namespace, "held", [{"sizeId": "f-small", "count": 1}], finalizers=[HELD]
    )
    await until_phase(kube, LEASE, namespace, "held", "Active")

    await kube.delete(LEASE, namespace, "held")
    await asyncio.sleep(0.5)
    lease = await kube.get(LEASE, namespace, "held")
    assert phase(lease) == "Active"
    assert sorted(lease["metadata"]["finalizers"]) == sorted([HELD, FINALIZER])
    assert not await gone(kube, SECRET, namespace, "held-cloud-credentials")

    patch = {"metadata": {"finalizers": [FINALIZER]}}
    await kube.patch_merge(LEASE, namespace, "held", patch)
    await eventually(lambda: gone(kube, LEASE, namespace, "held"), bool, what="lease gone")
    assert await gone(kube, SECRET, namespace, "held-cloud-credentials")
    assert log.phases(LEASE, "held")[-1] == "Deleting"


async def test_lease_end_deletes_its_owners(kube, namespace, standins) -> None:
    standins("schedule")
    owner_body = {"metadata": {"name": "owner", "namespace": namespace, "finalizers": ["t/hold"]}}
    owner = await kube.create(CONFIG_MAP, owner_body)
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    ends = (datetime.now(UTC) + timedelta(seconds=2.5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    machines = [{"sizeId": "f-small", "count": 1}]
    await make_lease(
        kube, namespace, "ending", machines, endsAt=ends, gracePeriod=1, ownerReferences=[reference]
    )

    await until_phase(kube, LEASE, namespace, "ending", "Active")
    assert "deletionTimestamp" not in (await kube.get(CONFIG_MAP, namespace, "owner"))["metadata"]
    await eventually(
        getter(kube, CONFIG_MAP, namespace, "owner"),
        lambda o: "deletionTimestamp" in o["metadata"],
        timeout=10,
        what="owner deleted at the end of the lease",
    )
    await kube.patch_merge(CONFIG_MAP, namespace, "owner", {"metadata": {"finalizers": None}})


# --- zenith -----------------------------------------------------------------------------------


async def test_registrar_reserves_once_per_key_and_per_subdomain() -> None:
    server = RegistrarServer(Registrar(base_domain="apps.test"))
    await server.start()
    key, other = generate_keypair()[1], generate_keypair()[1]
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            first = await http.post("/admin/reserve", json={"public_keys": [key]})
            assert first.status_code == 200
            body = first.json()
            assert re.fullmatch(r"[a-z][a-z0-9]{19}", body["subdomain"])
            assert body == {
                "subdomain": body["subdomain"],
                "fqdn": f"{body['subdomain']}.apps.test",
                "token": None,
                "fingerprint": key_fingerprint(key),
                "fingerprints": [key_fingerprint(key)],
            }
            again = await http.post("/admin/reserve", json={"public_key": key})
            assert again.status_code == 409
            taken = {"public_key": other, "subdomain": body["subdomain"]}
            assert (await http.post("/admin/reserve", json=taken)).status_code == 409
            chosen = await http.post(
                "/admin/reserve", json={"public_key": other, "subdomain": "app1"}
            )
            assert chosen.status_code == 200
            assert chosen.json()["fqdn"] == "app1.apps.test"
            listed = (await http.get("/admin/reservations")).json()
            assert sorted(r["subdomain"] for r in listed) == sorted([body["subdomain"], "app1"])
    finally:
        await server.stop()


@pytest.mark.parametrize("status", [409, 500])
async def test_registrar_failure_knob(monkeypatch, status) -> None:
    monkeypatch.setenv("STANDIN_ZENITH_REGISTRAR_FAIL", str(status))
    server = await start_registrar()
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            for _ in range(3):
                key = generate_keypair()[1]
                response = await http.post("/admin/reserve", json={"public_keys": [key]})
                assert response.status_code == status
            assert (await http.get("/admin/reservations")).json() == []
    finally:
        await server.stop()


async def test_registrar_fails_only_the_first_requests(monkeypatch) -> None:
    monkeypatch.setenv("STANDIN_ZENITH_REGISTRAR_FAIL_TIMES", "2")
    server = await start_registrar()
    key = generate_keypair()[1]
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            codes = [
                (await http.post("/admin/reserve", json={"public_key": key})).status_code
                for _ in range(3)
            ]
    finally:
        await server.stop()
    assert codes == [500, 500, 200]


async def test_reservation_gets_a_key_pair_and_becomes_ready(
    kube, namespace, standins, phase_log
) -> None:
    registrar = Registrar(base_domain="apps.test")
    log = await phase_log(RESERVATION)
    standins("zenith", registrar=registrar)
    spec = {"credentialSecretName": "monitoring-zenith-credential"}
    await kube.create(RESERVATION, manifest(RESERVATION, namespace, "monitoring", spec))

    reservation = await until_phase(kube, RESERVATION, namespace, "monitoring", "Ready")
    secret = await kube.get(SECRET, namespace, "monitoring-zenith-credential")
    assert secret["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "zenith-operator",
        "zenith.stackhpc.com/reservation": "monitoring",
    }
    assert secret["metadata"]["ownerReferences"][0]["uid"] == reservation["metadata"]["uid"]
    private = base64.b64decode(secret["data"]["ssh-privatekey"])
    public = base64.b64decode(secret["data"]["ssh-publickey"]).decode()
    load_ssh_private_key(private, password=None)
    [entry] = registrar.reservations()
    assert reservation["status"] == {
        "phase": "Ready",
        "subdomain": entry["subdomain"],
        "fqdn": f"{entry['subdomain']}.apps.test",
        "fingerprint": key_fingerprint(public),
    }
    assert log.phases(RESERVATION, "monitoring") == ["Pending", "Ready"]


async def test_reservation_uses_an_existing_secret_and_retries_the_registrar(
    kube, namespace, standins, monkeypatch
) -> None:
    monkeypatch.setenv("STANDIN_ZENITH_RETRY_SECONDS", "0.2")
    registrar = Registrar(base_domain="apps.test", fail="500", fail_times=2)
    standins("zenith", registrar=registrar)
    private, public = generate_keypair()
    keys = {"id": private, "id.pub": public}
    body = {"metadata": {"name": "given", "namespace": namespace}, "stringData": keys}
    await kube.create(SECRET, body)
    spec = {
        "credentialSecretName": "given",
        "credentialSecretPrivateKeyName": "id",
        "credentialSecretPublicKeyName": "id.pub",
    }
    await kube.create(RESERVATION, manifest(RESERVATION, namespace, "app", spec))

    reservation = await until_phase(kube, RESERVATION, namespace, "app", "Ready")
    assert reservation["status"]["fingerprint"] == key_fingerprint(public)
    assert registrar.requests == 3
    assert len(registrar.reservations()) == 1


# --- the process --------------------------------------------------------------------------------


async def test_python_m_standins_serves_until_sigterm(kube, namespace, stack, tmp_path) -> None:
    url_file = tmp_path / "registrar-url"
    env = {
        **os.environ,
        **stack.env(),
        "STANDIN_STEP_DELAY": "0.01",
        "STANDIN_ZENITH_REGISTRAR_URL_FILE": str(url_file),
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "standins.log"
    with log_path.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "standins",
            "--only",
            "identity,schedule,zenith",
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        url = await eventually(
            lambda: asyncio.sleep(0, url_file.read_text().strip() if url_file.exists() else ""),
            bool,
            what="registrar URL file",
        )
        async with httpx.AsyncClient(base_url=url) as http:
            reserved = await http.post("/admin/reserve", json={"public_key": generate_keypair()[1]})
        assert reserved.status_code == 200
        await kube.create(REALM, manifest(REALM, namespace, namespace, {"tenancyId": "t"}))
        await until_phase(kube, REALM, namespace, namespace, "Ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 15)
    output = await asyncio.to_thread(log_path.read_text)
    assert code == 0, output
    assert f"registrar listening on {url}" in output
    assert f"realm {namespace}/{namespace}: Ready" in output
