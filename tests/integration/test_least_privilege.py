"""Least privilege, proven on the real API server (RBAC authorization, a service-account issuer).

Each service gets a ServiceAccount of its own, a ClusterRole made of exactly the rules the
chart ships for it (``deploy/chart/capibus/files/rbac/<service>.yaml``, generated from
``services/<svc>/rbac.py``), a binding, a token from the TokenRequest API and a kubeconfig with
that token. Then, in both directions:

* **nothing necessary is missing**: the Azimuth lifecycle (a Cluster with a Lease, OIDC and
  Zenith on, Ready, then deleted completely) runs with every service on its own token, the
  helm binary included (it inherits the helm service's kubeconfig); so do one lean scenario of
  metal-stack, OpenShift Assisted and CB-Ladybug with their providers, the watcher and the
  writer on their tokens. Any 403 in any of their logs fails the scenario, even one a service
  survived (the monitor, say, logs a forbidden read and goes on without the node's size).
  What the stand-in chart never renders is exercised on the helm service's token directly:
  upstream's cluster-autoscaler Role (RBAC's escalation check), and a hook Job.
* **nothing else is allowed**: every question of ``shared.rbac.questions`` is asked with a
  ``SubjectAccessReview`` for every service account; each answer must be the one the declared
  rules give, the ``NEVER`` questions denied to all, and ``docs/permissions.md`` must show
  exactly these answers.

The stand-ins (Cluster API, identity, schedule, Zenith, metal-api, assisted-service, Tumblebug)
keep the admin credentials: they play controllers that are not ours. One module-wide set of
identities serves every test; each scenario starts only the processes it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.__main__ import permissions
from shared import rbac
from shared.errors import KubeForbidden, KubeNotFound
from shared.helm import Helm, HelmError, HelmForbidden
from shared.kube import KubeClient, KubeConfig, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    NAMESPACE,
    OPENSHIFT_ASSISTED_CONTROL_PLANE,
)
from standins.base import run_all
from standins.capi import CapiKnobs, controllers
from standins.tumblebug import spider_url
from testenv.harness import LocalStack, free_port, write_kubeconfig
from tests.integration.lifecycle import conftest as lifecycle
from tests.integration.lifecycle.conftest import World
from tests.integration.lifecycle.test_lifecycle import deleted_without_leftovers, ready
from tests.integration.support import ROOT, ServiceProcess, eventually
from tests.integration.test_assisted import KINDS as ASSISTED_KINDS
from tests.integration.test_assisted import create as create_assisted
from tests.integration.test_assisted import delete_and_check_free, seed_hosts
from tests.integration.test_helm_adapter import OPENSTACK_CLUSTER_CHART, R, cluster_values
from tests.integration.test_ladybug import TBNS, _await_healthy, _start_tumblebug, cluster_request
from tests.integration.test_metalstack import HMAC, items, wait_ready
from tests.integration.test_metalstack import KINDS as METALSTACK_KINDS
from tests.integration.test_metalstack import create as create_metalstack

pytestmark = pytest.mark.integration

Json = dict[str, Any]
RBAC_FILES = ROOT / "deploy" / "chart" / "capibus" / "files" / "rbac"
SERVICES = {service.name: service for service in permissions()}
#: the Azimuth world of the lifecycle tests (a fixture of their conftest, not of this folder's)
world = lifecycle.world
RBAC_GROUP = "rbac.authorization.k8s.io"
SERVICE_ACCOUNT = ResourceKind("serviceaccount", "", "v1", "ServiceAccount", "serviceaccounts")
ROLE = ResourceKind("role", RBAC_GROUP, "v1", "Role", "roles")
ROLE_BINDING = ResourceKind("rolebinding", RBAC_GROUP, "v1", "RoleBinding", "rolebindings")
CLUSTER_ROLE = ResourceKind(
    "clusterrole", RBAC_GROUP, "v1", "ClusterRole", "clusterroles", namespaced=False
)
CLUSTER_ROLE_BINDING = ResourceKind(
    "clusterrolebinding",
    RBAC_GROUP,
    "v1",
    "ClusterRoleBinding",
    "clusterrolebindings",
    namespaced=False,
)
#: what a refused request leaves in a log: shared.kube's "<what>: 403 <message>", the API
#: server's "... is forbidden: ...", helm's "forbidden", the adapters' KubeForbidden
FORBIDDEN = re.compile(r": 403 |forbidden", re.IGNORECASE)
SETTINGS = {
    "CAPIBUS_LEASE_TTL": "2",
    "CAPIBUS_CONSUMER__ACK_WAIT": "5",
    "CAPIBUS_METRICS_PORT": "0",
}


@dataclass(frozen=True)
class Identities:
    """Every service's ServiceAccount (as a review subject) and the kubeconfig of its token."""

    subjects: dict[str, rbac.Subject]
    kubeconfigs: dict[str, Path]

    def env(self, service: str) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfigs[service])}


@pytest.fixture(scope="module")
async def identities(
    kube: KubeClient, stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Identities]:
    home = f"lp-{uuid.uuid4().hex[:6]}"
    folder = tmp_path_factory.mktemp("identities")
    await kube.create(NAMESPACE, {"metadata": {"name": home}})
    roles: list[str] = []
    try:
        made = Identities({}, {})
        for name in SERVICES:
            role = f"capibus-{home}-{name}"
            roles.append(role)
            made.subjects[name] = rbac.Subject(home, name)
            token = await _identity(kube, home, name, role)
            path = folder / f"{name}.kubeconfig"
            write_kubeconfig(path, stack.endpoints.api_url, stack.endpoints.ca_file, token)
            made.kubeconfigs[name] = path
        yield made
    finally:
        for role in roles:
            for kind in (CLUSTER_ROLE_BINDING, CLUSTER_ROLE):
                with contextlib.suppress(KubeNotFound):
                    await kube.delete(kind, None, role)
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NAMESPACE, None, home)


async def _identity(kube: KubeClient, namespace: str, name: str, role: str) -> str:
    """The ServiceAccount ``name`` bound to a ClusterRole of the chart's rules; its token."""
    await kube.create(SERVICE_ACCOUNT, {"metadata": {"name": name, "namespace": namespace}})
    rules = yaml.safe_load((RBAC_FILES / f"{name}.yaml").read_text())["rules"]
    await kube.create(CLUSTER_ROLE, {"metadata": {"name": role}, "rules": rules})
    binding = {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    await kube.create(CLUSTER_ROLE_BINDING, binding)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 7200},
    }
    path = SERVICE_ACCOUNT.path(namespace, name) + "/token"
    answer = await kube.request("POST", path, body=json.dumps(request).encode())
    return str(answer["status"]["token"])


def refusals(processes: Iterable[ServiceProcess]) -> dict[str, list[str]]:
    """Each process's log lines that tell of a refused request."""
    found = {
        p.log_path.name: [ln for ln in p.log().splitlines() if FORBIDDEN.search(ln)]
        for p in processes
    }
    return {name: lines for name, lines in found.items() if lines}


# --- nothing else is allowed -------------------------------------------------------------------


async def test_the_api_server_answers_every_question_as_the_declared_rules_do(
    kube: KubeClient, identities: Identities
) -> None:
    services = list(SERVICES.values())
    asked = rbac.questions(services)
    answers = {
        name: await rbac.review_all(kube, identities.subjects[name], asked) for name in SERVICES
    }
    for service in services:
        wanted = rbac.expected(service, asked)
        differ = [q for q in asked if answers[service.name][q] != wanted[q]]
        assert differ == [], f"{service.name}: the API server disagrees on {differ}"
        assert [q for q in rbac.NEVER if answers[service.name][q]] == []
    page = (ROOT / "docs" / "permissions.md").read_text()
    assert rbac.replace_generated(page, rbac.matrix(services, answers)) == page


def test_the_chart_binds_each_service_to_its_rules_or_all_of_them_to_their_union(
    tools_bin: Path | None,
) -> None:
    """The chart's ``templates/rbac.yaml`` with every service enabled: in split mode each
    service's ServiceAccount is bound to a ClusterRole of exactly its rule file; in allinone
    mode the one ServiceAccount to their union; in both, every Deployment runs as a bound one."""
    helm = str(tools_bin / "helm") if tools_bin else "helm"
    enabled = [f"services.{name}.enabled=true" for name in SERVICES]

    def rendered(*values: str) -> dict[str, list[Json]]:
        """The chart's objects by kind, every service enabled, with ``values``."""
        args = [helm, "template", "t", str(ROOT / "deploy/chart/capibus"), "-n", "capibus"]
        for value in [*enabled, *values]:
            args += ["--set", value]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        found: dict[str, list[Json]] = {}
        for doc in yaml.safe_load_all(out):
            if doc:
                found.setdefault(doc["kind"], []).append(doc)
        return found

    def rules(name: str) -> list[Json]:
        return list(yaml.safe_load((RBAC_FILES / f"{name}.yaml").read_text())["rules"])

    def unbound(objects: dict[str, list[Json]]) -> set[str]:
        bound = {s["name"] for b in objects["ClusterRoleBinding"] for s in b["subjects"]}
        accounts = {
            d["spec"]["template"]["spec"]["serviceAccountName"] for d in objects["Deployment"]
        }
        return accounts - bound

    split = rendered("mode=split")
    roles = {d["metadata"]["name"]: d["rules"] for d in split["ClusterRole"]}
    assert roles == {f"t-capibus-{name}": rules(name) for name in SERVICES}
    bindings = split["ClusterRoleBinding"]
    assert sorted(b["roleRef"]["name"] for b in bindings) == sorted(roles)
    assert all(b["subjects"][0]["name"] == b["roleRef"]["name"] for b in bindings)
    assert unbound(split) == set()

    together = rendered("mode=allinone")
    [role] = together["ClusterRole"]
    union = [rule for name in SERVICES for rule in rules(name)]
    assert all(rule in role["rules"] for rule in union)
    assert all(rule in union for rule in role["rules"])
    assert unbound(together) == set()

    none = rendered("rbac.create=false")
    assert "ClusterRole" not in none
    assert "ClusterRoleBinding" not in none


# --- nothing necessary is missing: Azimuth -----------------------------------------------------


@pytest.mark.timeout(300)
async def test_an_azimuth_cluster_lives_and_goes_with_each_service_on_its_own_token(
    world: Callable[..., Any], identities: Identities
) -> None:
    w: World = await world(oidc=True, zenith=True, kubeconfigs=identities.kubeconfigs)
    await w.create_realm()
    cluster = await w.create_cluster("least", leaseName="kube-least")
    await w.create_lease(cluster, ["f-small", "f-medium"])
    await ready(w, "least", timeout=150)
    await deleted_without_leftovers(w, "least")
    services = [p for name, p in w.processes.items() if name != "standins"]
    assert refusals(services) == {}


# --- nothing necessary is missing: what no stand-in chart renders --------------------------------

#: the Role of upstream's cluster autoscaler (azimuth-cloud/capi-helm-charts
#: ``charts/openstack-cluster/templates/autoscaler/role.yaml``)
AUTOSCALER_RULES = [
    {
        "apiGroups": ["cluster.x-k8s.io"],
        "resources": ["machinedeployments", "machines", "machinesets", "machinepools"],
        "verbs": ["get", "list", "update", "watch"],
    },
    {
        "apiGroups": ["cluster.x-k8s.io"],
        "resources": ["machinedeployments/scale"],
        "verbs": ["get", "patch", "update"],
    },
]


async def test_helm_may_make_the_autoscalers_role_and_binding_but_no_role_granting_more(
    namespace: str, identities: Identities
) -> None:
    """The stand-in chart renders no autoscaler: its Role is made here as helm would make it,
    on the helm service's token (RBAC's escalation check runs on a create)."""
    helm = KubeClient.from_config(KubeConfig.load(identities.kubeconfigs["helm"]), qps=None)
    try:
        role = {"metadata": {"name": "autoscaler", "namespace": namespace}}
        await helm.create(ROLE, {**role, "rules": AUTOSCALER_RULES})
        binding = {
            "metadata": {"name": "autoscaler", "namespace": namespace},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "autoscaler"},
            "subjects": [{"kind": "ServiceAccount", "name": "autoscaler", "namespace": namespace}],
        }
        await helm.create(ROLE_BINDING, binding)
        more = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["watch"]}]
        with pytest.raises(KubeForbidden):
            await helm.create(
                ROLE, {"metadata": {"name": "more", "namespace": namespace}, "rules": more}
            )
        await helm.delete(ROLE_BINDING, namespace, "autoscaler")
        await helm.delete(ROLE, namespace, "autoscaler")
    finally:
        await helm.aclose()


async def test_helm_on_its_token_runs_hooks_upgrades_and_uninstalls_the_chart(
    namespace: str, identities: Identities, tools_bin: Path | None, tmp_path: Path
) -> None:
    """A pre-upgrade hook Job (created, watched, deleted by its policy), revisions stored,
    superseded and pruned, the release uninstalled: all on the helm service's token. Nothing
    runs the hook's pod here, so each hooked upgrade ends at ``--timeout``, never forbidden."""
    executable = (tools_bin / "helm") if tools_bin else "helm"
    helm = Helm(
        executable=executable,
        kubeconfig=identities.kubeconfigs["helm"],
        timeout="3s",
        history_max=2,
        home=tmp_path / "helm",
    )
    await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    for workers in (3, 4):  # the second deletes the first's hook (before-hook-creation)
        hooked = {**cluster_values(workers), "standin": {"preUpgradeHookSeconds": 600}}
        with pytest.raises(HelmError) as failed:
            await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, hooked)
        assert not isinstance(failed.value, HelmForbidden), failed.value
        assert "forbidden" not in str(failed.value).lower()
    outcome = await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values(5))
    assert outcome.action.endswith("upgraded")
    assert await helm.uninstall(R, namespace) is True


# --- nothing necessary is missing: the bare-metal providers -----------------------------------


@contextlib.asynccontextmanager
async def capi_standin(kube: KubeClient, namespace: str, workload: Path) -> AsyncIterator[None]:
    """The Cluster API stand-in for ``namespace``, in this process, as the admin."""
    stop = asyncio.Event()
    knobs = CapiKnobs(kubeconfig_path=str(workload))
    task = asyncio.create_task(run_all(controllers(kube, namespace=namespace, knobs=knobs), stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@contextlib.contextmanager
def standin(log: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[None]:
    """A stand-in process (``python -m <args>``), as the admin; stopped afterwards."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(30)


class Processes:
    """Services started on their own tokens; all stopped at the end."""

    def __init__(self, stack: LocalStack, identities: Identities, log_dir: Path) -> None:
        self.stack, self.identities, self.log_dir = stack, identities, log_dir
        self.started: list[ServiceProcess] = []

    def start(self, identity: str, module: str, **env: str) -> ServiceProcess:
        settings = {**self.stack.env(), **SETTINGS, **env, **self.identities.env(identity)}
        name = module.rpartition(".")[2]
        proc = ServiceProcess(name, settings, self.log_dir, identity, module).start()
        self.started.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.started:
            proc.stop()


@contextlib.contextmanager
def processes(stack: LocalStack, identities: Identities, log_dir: Path) -> Iterator[Processes]:
    started = Processes(stack, identities, log_dir)
    try:
        yield started
    finally:
        started.stop()


async def gone(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> bool:
    try:
        await kube.get(kind, namespace, name)
    except KubeNotFound:
        return True
    return False


@pytest.mark.timeout(300)
async def test_a_metal_stack_cluster_comes_up_and_goes_on_the_providers_tokens(
    kube: KubeClient, namespace: str, stack: LocalStack, identities: Identities, tmp_path: Path
) -> None:
    workload = stack.workload()
    url_file = tmp_path / "metal-api.url"
    env = {
        "STANDIN_METALAPI_HMAC": HMAC,
        "STANDIN_METALAPI_URL_FILE": str(url_file),
        "STANDIN_METALAPI_PROVISIONING_DELAY": "0.3",
        "STANDIN_METALAPI_REBOOT_DELAY": "0.3",
    }
    metalapi = ("standins.metalapi", "--workload-kubeconfig", str(workload))
    with (
        standin(tmp_path / "metal-api.log", *metalapi, env=env),
        processes(stack, identities, tmp_path) as started,
    ):
        started.start("watcher", "services.watcher", CAPIBUS_WATCHER__KINDS=METALSTACK_KINDS)
        started.start("writer", "services.writer")
        url = await eventually(lambda: _read(url_file), bool, what="the metal-api's URL")
        metal = {"METALCTL_URL": url, "METALCTL_HMAC": HMAC}
        started.start("metalstack", "services.baremetal.metalstack", **metal)
        async with capi_standin(kube, namespace, workload):
            await create_metalstack(kube, namespace, "lp", workers=1)
            await wait_ready(kube, namespace, "lp", 2)
            await eventually(
                lambda: kube.get(METALSTACK_FIREWALL, namespace, "lp"),
                lambda f: bool((f.get("status") or {}).get("ready")),
                timeout=60,
                what="the firewall to run",
            )
            await kube.delete(CAPI_CLUSTER, namespace, "lp")
            await eventually(
                lambda: gone(kube, METALSTACK_CLUSTER, namespace, "lp"),
                bool,
                timeout=120,
                interval=0.5,
                what="the MetalStackCluster to go",
            )
        assert await items(kube, METALSTACK_FIREWALL, namespace, "lp") == []
        assert refusals(started.started) == {}


@pytest.mark.timeout(300)
async def test_an_openshift_assisted_cluster_installs_and_goes_on_the_providers_tokens(
    kube: KubeClient, namespace: str, stack: LocalStack, identities: Identities, tmp_path: Path
) -> None:
    workload = stack.workload()
    assisted = ("standins.assisted", "--workload-kubeconfig", str(workload))
    env = {**stack.env(), "STANDIN_ASSISTED_DELAY": "0.1"}
    with (
        standin(tmp_path / "standins.log", *assisted, env=env),
        processes(stack, identities, tmp_path) as started,
    ):
        started.start("watcher", "services.watcher", CAPIBUS_WATCHER__KINDS=ASSISTED_KINDS)
        started.start("writer", "services.writer")
        started.start("assisted-bootstrap", "services.baremetal.assisted_bootstrap")
        started.start("assisted-controlplane", "services.baremetal.assisted_controlplane")
        async with capi_standin(kube, namespace, workload):
            await seed_hosts(kube, namespace, 2, "lp")
            await create_assisted(kube, namespace, "lp", control_planes=1, workers=1)
            await eventually(
                lambda: kube.get(OPENSHIFT_ASSISTED_CONTROL_PLANE, namespace, "lp-control-plane"),
                lambda acp: bool((acp.get("status") or {}).get("ready")),
                timeout=180,
                interval=0.5,
                what="the control plane ready",
            )
            await delete_and_check_free(kube, namespace, "lp")
        assert refusals(started.started) == {}


@pytest.mark.timeout(300)
async def test_a_ladybug_cluster_is_made_and_deleted_through_the_api_on_its_tokens(
    kube: KubeClient, stack: LocalStack, identities: Identities, crds: list[str], tmp_path: Path
) -> None:
    home = f"lb-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACE, {"metadata": {"name": home}})
    tumblebug, url = _start_tumblebug(tmp_path, tmp_path / "nodes", stack.workload())
    port, token = free_port(), "lp-token"
    ladybug = {"CAPIBUS_LADYBUG__NAMESPACE": home, "TUMBLEBUG_URL": url}
    try:
        with processes(stack, identities, tmp_path) as started:
            started.start(
                "watcher", "services.watcher", CAPIBUS_WATCHER__KINDS='["ladybugcluster"]'
            )
            started.start("writer", "services.writer")
            api = started.start(
                "ladybug-api",
                "services.ladybug.api",
                **ladybug,
                CAPIBUS_LADYBUG__API_HOST="127.0.0.1",
                CAPIBUS_LADYBUG__API_PORT=str(port),
                CAPIBUS_LADYBUG__API_TOKEN=token,
                CAPIBUS_LADYBUG__WAIT_TIMEOUT_SECONDS="120",
            )
            started.start(
                "ladybug-provisioner",
                "services.ladybug.provisioner",
                **ladybug,
                CAPIBUS_LADYBUG__SSH_RETRY_SECONDS="0.5",
                SPIDER_URL=spider_url(url),
            )
            base = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(_await_healthy, base, api)
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=base, timeout=120, headers=headers) as client:
                path = f"/ladybug/ns/{TBNS}/clusters"
                made = await client.post(path, json=cluster_request("lp", workers=1))
                assert made.status_code == 200, made.text
                assert made.json()["status"]["phase"] == "Provisioned"
                assert made.json()["clusterConfig"].startswith("apiVersion")
                deleted = await client.delete(f"{path}/lp")
                assert deleted.status_code == 200, deleted.text
            assert refusals(started.started) == {}
    finally:
        tumblebug.terminate()
        tumblebug.wait(30)
        with contextlib.suppress(KubeNotFound):
            await kube.delete(NAMESPACE, None, home)


async def _read(path: Path) -> str:
    """What a stand-in wrote into ``path`` (its URL), "" until it has."""
    return await asyncio.to_thread(lambda: path.read_text().strip() if path.exists() else "")
