"""An Azimuth world on the real stack: every capibus service, every stand-in, the portal's objects.

``world(...)`` starts the services and stand-ins as processes configured like a deployment
(OIDC and Zenith switched per test), points the helm service at the stand-in charts installed
by the real helm binary, and offers the objects the Azimuth portal would create.
``world(together=True)`` runs the same services as one all-in-one process
(``services.allinone``) instead; ``processes`` then names that one process under every
service's name, so a scenario that kills "helm" kills them all.
``world(kubeconfigs={"helm": path, ...})`` runs each named service on its own credentials
(``tests/integration/test_least_privilege.py``: a service account token each); the others,
and the stand-ins, keep the admin's.
``world(services=False)`` starts the stand-ins only, so a test can prepare a world as another
operator left it (``test_dropin.py``: the upstream operator's); ``World.start_services()``
then starts the services as ``world(...)`` would have.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.resources import CLUSTER, CLUSTER_TEMPLATE, LEASE, REALM, SECRET
from testenv.examples import cluster_manifest
from testenv.harness import free_port
from tests.integration.support import ROOT, ServiceProcess

CHARTS = ROOT / "standins" / "charts"
SERVICES = ("watcher", "writer", "identity", "lease", "helm", "monitor", "discovery")
BASE_DOMAIN = "apps.example.test"
CLOUDS_YAML = """clouds:
  openstack:
    auth:
      auth_url: https://keystone.example.test/v3
      application_credential_id: app-cred-id
      application_credential_secret: app-cred-secret
      project_id: tenancy-1234
    region_name: RegionOne
"""


@dataclass
class World:
    kube: KubeClient
    namespace: str
    template: str
    registrar_url: str | None
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    #: starts the services ``world(services=False)`` held back; None once they run
    held_back: Callable[[], None] | None = None

    def start_services(self) -> None:
        if self.held_back is None:
            raise RuntimeError("the services already run")
        start, self.held_back = self.held_back, None
        start()

    async def create_cluster(self, name: str, **spec: Any) -> dict[str, Any]:
        defaults: dict[str, Any] = {
            "templateName": self.template,
            "cloudCredentialsSecretName": f"{name}-cloud-credentials",
            "controlPlaneMachineSize": "m1.small",
            "nodeGroups": [{"name": "md-0", "machineSize": "m1.medium", "count": 2}],
        }
        manifest = cluster_manifest(self.namespace, name, **(defaults | spec))
        await self.create_credentials(f"{name}-cloud-credentials")
        return await self.kube.create(CLUSTER, manifest)

    async def create_credentials(self, name: str) -> None:
        secret = {
            "metadata": {"name": name, "namespace": self.namespace},
            "data": {"clouds.yaml": base64.b64encode(CLOUDS_YAML.encode()).decode()},
        }
        await self.kube.create(SECRET, secret)

    async def create_realm(self, name: str | None = None) -> None:
        realm = {
            "apiVersion": REALM.api_version,
            "kind": REALM.kind,
            "metadata": {"name": name or self.namespace, "namespace": self.namespace},
            "spec": {"tenancyId": "tenancy-1234"},
        }
        await self.kube.create(REALM, realm)

    async def create_lease(self, cluster: dict[str, Any], flavors: list[str]) -> str:
        """The Lease the portal makes for a Cluster: ``kube-<name>``, owned by the Cluster."""
        meta = cluster["metadata"]
        lease: dict[str, Any] = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {
                "name": f"kube-{meta['name']}",
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "azimuth"},
                "ownerReferences": [
                    {
                        "apiVersion": CLUSTER.api_version,
                        "kind": CLUSTER.kind,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "cloudCredentialsSecretName": f"{meta['name']}-cloud-credentials",
                "resources": {"machines": [{"sizeId": f, "count": 1} for f in flavors]},
            },
        }
        await self.kube.create(LEASE, lease)
        return str(lease["metadata"]["name"])

    async def cluster(self, name: str) -> dict[str, Any]:
        return await self.kube.get(CLUSTER, self.namespace, name)

    async def gone(self, kind: Any, name: str, namespace: str | None = "") -> bool:
        try:
            await self.kube.get(kind, self.namespace if namespace == "" else namespace, name)
        except KubeNotFound:
            return True
        return False


def template_manifest(name: str, version: str = "1.34.2") -> dict[str, Any]:
    return {
        "apiVersion": CLUSTER_TEMPLATE.api_version,
        "kind": CLUSTER_TEMPLATE.kind,
        "metadata": {"name": name},
        "spec": {
            "label": f"Kubernetes {version}",
            "description": "stand-in template",
            "values": {"kubernetesVersion": version, "machineImageId": "image-1234"},
        },
    }


@pytest.fixture
async def world(
    kube: KubeClient,
    namespace: str,
    service: Callable[..., ServiceProcess],
    tools_bin: Path | None,
) -> AsyncIterator[Callable[..., Any]]:
    templates: list[str] = []

    async def start(
        *,
        oidc: bool = False,
        zenith: bool = False,
        standin_env: dict[str, str] | None = None,
        service_env: dict[str, str] | None = None,
        only: tuple[str, ...] = SERVICES,
        together: bool = False,
        kubeconfigs: Mapping[str, Path] | None = None,
        services: bool = True,
    ) -> World:
        if together and kubeconfigs:
            raise ValueError("one all-in-one process has one identity: no kubeconfigs per service")
        template = f"tpl-{uuid.uuid4().hex[:6]}"
        await kube.create(CLUSTER_TEMPLATE, template_manifest(template))
        templates.append(template)
        port = free_port()
        registrar = f"http://127.0.0.1:{port}" if zenith else None
        env = deployment_env(tools_bin, oidc=oidc, registrar=registrar)
        env.update(service_env or {})
        world = World(kube=kube, namespace=namespace, template=template, registrar_url=registrar)
        world.processes["standins"] = service(
            "standins",
            module="standins",
            STANDIN_STEP_DELAY="0.02",
            STANDIN_ZENITH_REGISTRAR_PORT=str(port),
            STANDIN_ZENITH_BASE_DOMAIN=BASE_DOMAIN,
            **(standin_env or {}),
        )

        def start_services() -> None:
            if together:
                one = service(
                    "allinone", module="services.allinone", CAPIBUS_SERVICES=",".join(only), **env
                )
                world.processes.update(dict.fromkeys(only, one))
                return
            for name in only:
                path = (kubeconfigs or {}).get(name)
                own = {"KUBECONFIG": str(path)} if path else {}
                world.processes[name] = service(name, **env, **own)

        if services:
            start_services()
        else:
            world.held_back = start_services
        return world

    yield start
    for name in templates:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(CLUSTER_TEMPLATE, None, name)


def deployment_env(tools_bin: Path | None, *, oidc: bool, registrar: str | None) -> dict[str, str]:
    helm = str(tools_bin / "helm") if tools_bin else "helm"
    zenith: dict[str, Any] = {
        "apiserver_chart": {"name": str(CHARTS / "zenith-apiserver")},
        "operator_chart": {"name": str(CHARTS / "zenith-operator")},
    }
    if registrar:
        zenith |= {
            "registrar_admin_url": registrar,
            "sshd_host": "sshd.example.test",
            "base_domain": BASE_DOMAIN,
        }
    return {
        "CAPIBUS_AZIMUTH__OIDC_ENABLED": str(oidc).lower(),
        "CAPIBUS_AZIMUTH__ZENITH_ENABLED": str(bool(registrar)).lower(),
        "CAPIBUS_HELM__EXECUTABLE": helm,
        "CAPIBUS_HELM__CHART": json.dumps({"name": str(CHARTS / "openstack-cluster")}),
        "CAPIBUS_HELM__ZENITH": json.dumps(zenith),
        "CAPIBUS_HELM__TIMEOUT": "30s",
        "CAPIBUS_WRITER__COALESCE_SECONDS": "0.05",
    }
