"""Composition root of the Ladybug provisioner: real clients in production, fakes in tests.

``dependencies`` builds the handlers' ``Deps`` from the settings and the clients it is given
(tests hand it a fake Kubernetes API, a fake Tumblebug and a fake SSH); ``build`` binds them
into the consumer; ``run`` makes the real ones: ``shared.tumblebug.TumblebugClient`` with
basic auth, and an ``shared.ssh.SshClient`` per run over the cluster's remembered host keys.
The scripts copied to nodes ship with the package (``scripts/``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from importlib import resources

from services.ladybug.provisioner import cloud
from services.ladybug.provisioner.app import ROUTES, SERVICE
from services.ladybug.provisioner.ports import Connect, Deps, KubeApi, Tuning
from services.ladybug.provisioner.settings import ProvisionerSettings
from shared.consumer import Consumer, ConsumerBus, Leases
from shared.locks import KeyedLocks
from shared.ports import Publisher
from shared.runtime import Infrastructure, run_consumer
from shared.spider import Spider, SpiderClient
from shared.ssh import HostKeys, Ssh, SshClient
from shared.status import StatusReporter
from shared.tumblebug import Tumblebug, TumblebugClient

SCRIPTS = (
    "bootstrap.sh",
    "haproxy.sh",
    "k8s-init.sh",
    "k8s-init-etcd.sh",
    "etcd-ca.sh",
    "etcd-conf.sh",
    "deploy_v4.0.16.sh",
    *(f"addons/ccm/{csp}/{name}" for csp, names in cloud.MANIFESTS.items() for name in names),
)


def scripts() -> dict[str, bytes]:
    folder = resources.files("services.ladybug.provisioner") / "scripts"
    return {name: (folder / name).read_bytes() for name in SCRIPTS}


def ssh_connector(settings: ProvisionerSettings) -> Connect:
    timeout = settings.ladybug.ssh_timeout_seconds

    def connect(host_keys: HostKeys) -> Ssh:
        return SshClient(host_keys, command_timeout=timeout)

    return connect


def basic_auth(settings: ProvisionerSettings) -> tuple[str, str]:
    """Tumblebug's user and password; upstream uses the same pair for CB-Spider."""
    tuning = settings.ladybug
    password = tuning.tumblebug_password
    return tuning.tumblebug_username, password.get_secret_value() if password else ""


def tumblebug_client(settings: ProvisionerSettings) -> TumblebugClient:
    tuning = settings.ladybug
    return TumblebugClient(
        tuning.tumblebug_url,
        *basic_auth(settings),
        provision_timeout=tuning.tumblebug_timeout_seconds,
    )


def spider_client(settings: ProvisionerSettings) -> SpiderClient:
    return SpiderClient(settings.ladybug.spider_url, *basic_auth(settings))


def dependencies(
    settings: ProvisionerSettings,
    *,
    bus: Publisher,
    kube: KubeApi,
    tumblebug: Tumblebug,
    spider: Spider,
    connect: Connect | None = None,
    files: Mapping[str, bytes] | None = None,
) -> Deps:
    tuning = settings.ladybug
    return Deps(
        kube=kube,
        tumblebug=tumblebug,
        spider=spider,
        connect=connect or ssh_connector(settings),
        reporter=StatusReporter(
            bus, partitions=settings.partitions, source=f"{SERVICE}/{settings.replica}"
        ),
        locks=KeyedLocks(),
        scripts=dict(files) if files is not None else scripts(),
        tuning=Tuning(
            namespace=tuning.namespace,
            ssh_port=tuning.ssh_port,
            ssh_attempts=tuning.ssh_attempts,
            ssh_retry_seconds=tuning.ssh_retry_seconds,
            bootstrap_parallel=tuning.bootstrap_parallel,
        ),
    )


def build(
    settings: ProvisionerSettings, deps: Deps, *, bus: ConsumerBus, leases: Leases
) -> Consumer:
    return Consumer(
        bus=bus,
        leases=leases,
        service=SERVICE,
        subscriptions=ROUTES.bind(deps, coalesce_seconds=settings.ladybug.coalesce_seconds),
        settings=settings.consumer.build(),
        objects=deps.kube,
    )


async def run(
    settings: ProvisionerSettings, stop: asyncio.Event, *, infra: Infrastructure | None = None
) -> None:
    tumblebug, spider = tumblebug_client(settings), spider_client(settings)

    def real(infra: Infrastructure) -> Consumer:
        deps = dependencies(
            settings, bus=infra.bus, kube=infra.kube, tumblebug=tumblebug, spider=spider
        )
        return build(settings, deps, bus=infra.bus, leases=infra.leases(settings, service=SERVICE))

    try:
        await run_consumer(settings, stop, service=SERVICE, build=real, infra=infra)
    finally:
        await tumblebug.aclose()
        await spider.aclose()
