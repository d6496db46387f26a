"""The system under the soak: a clustered stack, two replicas of every service, the peers.

It is the Azimuth lifecycle world of ``tests/integration/lifecycle/conftest.py`` and
``bench/deployment.py``, hardened the way a deployment would be:

* **The stack.** ``LocalStack(nats_cluster=3)``: three clustered nats-servers, so the
  services declare every stream with three replicas (``CAPIBUS_RETENTION__REPLICAS``, set by
  the stack's ``env()``). As in the integration tests, etcd compacts every 5 s and Azimuth
  Clusters bypass the API server's watch cache, so a watcher that falls behind meets a real
  410 from etcd rather than being served from the cache.
* **Two replicas of every consumer service** (watcher, writer, identity, lease, helm,
  monitor, discovery), each its own process named ``<service>-a``/``-b`` (its
  ``CAPIBUS_REPLICA``), with OIDC and Zenith on, the helm service on the real helm binary and
  the stand-in charts. Settings are the services' defaults (lease TTL 6 s, ack wait 30 s),
  so recovery times are those of a deployment, except: no ``/metrics`` port (14 processes
  share one host), and 20 s server-side watches, so a watcher frozen for longer resumes from
  a compacted resourceVersion.
* **The peers.** ``python -m standins --only identity,schedule,capi`` (the identity
  operator, the schedule operator, Cluster API with its addon provider) and the Zenith
  registrar as a process of its own whose registry survives restarts (``soak.registrar``).

Everything started is stopped by ``close`` (services first, then the peers, then the stack),
which ``soak.run`` calls on every exit.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.bus import Bus, Retention
from shared.kube import KubeClient, KubeConfig
from shared.resources import CLUSTER_TEMPLATE, NAMESPACE, REALM
from shared.settings import ServiceSettings
from soak import registrar
from soak.plan import REPLICAS, SERVICES, Sizes
from soak.procs import ROOT, Proc, SoakError
from testenv.crds import apply_crds
from testenv.harness import LocalStack, free_port

Json = dict[str, Any]

NAMESPACE_NAME = "soak"
BASE_DOMAIN = "apps.example.test"
CHARTS = ROOT / "standins" / "charts"
#: the template every Cluster starts on, and the newer one an upgrade moves it to
TEMPLATES = {"soak-old": "1.34.2", "soak-new": "1.35.1"}
FIRST, SECOND = TEMPLATES
START_TIMEOUT = 180.0
WATCHED_KINDS_LINE = "listed at"
OWNS = re.compile(r"(\w+): owns partition (\d+)")
PARTITIONS = int(ServiceSettings.model_fields["partitions"].default)
LEASE_TTL = float(ServiceSettings.model_fields["lease_ttl"].default)


@dataclass
class World:
    stack: LocalStack
    workdir: Path
    bin_dir: Path
    sizes: Sizes
    kube: KubeClient | None = None
    bus: Bus | None = None
    registrar_url: str = ""
    services: dict[str, Proc] = field(default_factory=dict)
    peers: dict[str, Proc] = field(default_factory=dict)

    @property
    def k(self) -> KubeClient:
        assert self.kube is not None, "the world is not started"
        return self.kube

    @property
    def b(self) -> Bus:
        assert self.bus is not None, "the world is not started"
        return self.bus

    # -- starting ------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.stack.start)
        config = KubeConfig.load(self.stack.endpoints.kubeconfig)
        self.kube = KubeClient.from_config(config, qps=None, user_agent="capibus-soak")
        endpoints = self.stack.endpoints
        self.bus = await Bus.connect(endpoints.nats_url, name="soak", tls=endpoints.bus_tls())
        await self.bus.ensure_streams(Retention(replicas=self.stack.stream_replicas))
        await apply_crds(self.k, field_manager="capibus-soak")
        await self._portal_setup()
        port = free_port()
        self.registrar_url = f"http://127.0.0.1:{port}"
        self.peers["registrar"] = self._registrar(port).start()
        self.peers["standins"] = self._standins().start()
        env = self._service_env()
        for service in SERVICES:
            for replica in REPLICAS:
                label = f"{service}-{replica}"
                own = {**env, "CAPIBUS_REPLICA": label}
                module = f"services.{service}"
                self.services[label] = Proc(label, module, own, self._log(label)).start()
        await self.ready()

    async def _portal_setup(self) -> None:
        """The namespace, its Realm (OIDC picks the one named like the namespace) and the
        two templates, as the Azimuth portal and its operator would have them."""
        await self.k.create(NAMESPACE, {"metadata": {"name": NAMESPACE_NAME}})
        realm = {
            "apiVersion": REALM.api_version,
            "kind": REALM.kind,
            "metadata": {"name": NAMESPACE_NAME, "namespace": NAMESPACE_NAME},
            "spec": {"tenancyId": "tenancy-1234"},
        }
        await self.k.create(REALM, realm)
        for name, version in TEMPLATES.items():
            await self.k.create(CLUSTER_TEMPLATE, template_manifest(name, version))

    def _log(self, label: str) -> Path:
        return self.workdir / f"{label}.log"

    def _registrar(self, port: int) -> Proc:
        state = str(self.workdir / "registrar.json")
        args = ("--port", str(port), "--state", state, "--base-domain", BASE_DOMAIN)
        env = {"STANDIN_LOG_LEVEL": "INFO"}
        return Proc("registrar", "soak.registrar", env, self._log("registrar"), args)

    def _standins(self) -> Proc:
        env = {**self.stack.env(), "STANDIN_STEP_DELAY": "0.02"}
        args = ("--only", "identity,schedule,capi")
        return Proc("standins", "standins", env, self._log("standins"), args)

    def _service_env(self) -> dict[str, str]:
        zenith = {
            "apiserver_chart": {"name": str(CHARTS / "zenith-apiserver")},
            "operator_chart": {"name": str(CHARTS / "zenith-operator")},
            "registrar_admin_url": self.registrar_url,
            "sshd_host": "sshd.example.test",
            "base_domain": BASE_DOMAIN,
        }
        return {
            **self.stack.env(),
            "CAPIBUS_METRICS_PORT": "0",
            "CAPIBUS_AZIMUTH__OIDC_ENABLED": "true",
            "CAPIBUS_AZIMUTH__ZENITH_ENABLED": "true",
            "CAPIBUS_HELM__EXECUTABLE": str(self.bin_dir / "helm"),
            "CAPIBUS_HELM__CHART": json.dumps({"name": str(CHARTS / "openstack-cluster")}),
            "CAPIBUS_HELM__ZENITH": json.dumps(zenith),
            "CAPIBUS_HELM__TIMEOUT": "60s",
            "CAPIBUS_WRITER__COALESCE_SECONDS": "0.05",
            "CAPIBUS_WATCHER__WATCH_TIMEOUT_SECONDS": str(int(self.sizes.watch_timeout)),
            **dict(setting.split("=", 1) for setting in self.sizes.settings),
        }

    async def ready(self, within: float = START_TIMEOUT) -> None:
        """Until the registrar and stand-ins serve, each watcher has listed every kind and
        each consumer service's replicas together own every partition (then one lease period
        more: a fresh claim is fenced that long before its consumers pull)."""
        deadline = time.monotonic() + within
        while problems := self.not_ready():
            if time.monotonic() > deadline:
                raise SoakError("not ready: " + "; ".join(problems))
            await asyncio.sleep(0.5)
        await asyncio.sleep(LEASE_TTL + 0.5)

    def not_ready(self) -> list[str]:
        problems = [f"{p.label} exited:\n{p.log_tail()}" for p in self.all() if not p.alive()]
        if registrar.ANNOUNCEMENT not in self.peers["registrar"].log():
            problems.append("registrar not listening")
        if "stand-ins running" not in self.peers["standins"].log():
            problems.append("stand-ins not running")
        for service in SERVICES:
            if service == "watcher":
                problems += [
                    f"{label} has not listed"
                    for label in self.replicas_of(service)
                    if WATCHED_KINDS_LINE not in self.services[label].log()
                ]
            elif len(self.owned(service)) < PARTITIONS:
                problems.append(f"{service}: {len(self.owned(service))} partitions owned")
        return problems

    def owned(self, service: str) -> set[int]:
        found: set[int] = set()
        for label in self.replicas_of(service):
            found |= {int(m[2]) for m in OWNS.finditer(self.services[label].log())}
        return found

    def replicas_of(self, service: str) -> list[str]:
        return [f"{service}-{replica}" for replica in REPLICAS]

    def all(self) -> list[Proc]:
        return [*self.services.values(), *self.peers.values()]

    # -- stopping ------------------------------------------------------------------------

    async def close(self) -> None:
        # All at once: each may take its grace period to hand its partitions over.
        await asyncio.gather(*(asyncio.to_thread(proc.stop) for proc in self.all()))
        if self.bus is not None:
            await self.bus.close()
        if self.kube is not None:
            await self.kube.aclose()
        await asyncio.to_thread(self.stack.stop)


def template_manifest(name: str, version: str) -> Json:
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
