"""shared.helm with the real helm binary against the real API server and the peer CRDs.

The charts are the stand-ins in ``standins/charts``; their objects must carry the names and
labels of azimuth-peers section 5.2, since every capibus service selects on those.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.errors import KubeNotFound, PermanentError
from shared.helm import (
    ChartNotFound,
    ChartRef,
    ChartRenderFailed,
    Helm,
    HelmFailed,
    HelmUnavailable,
    InvalidReleaseName,
    ReleaseObjectsInvalid,
    classify,
)
from shared.kube import KubeClient, ResourceKind
from shared.resources import (
    CAPI_CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    MACHINE_DEPLOYMENT,
    MANIFESTS,
    OPENSTACK_CLUSTER,
    SECRET,
)
from testenv.harness import LocalStack, ensure_binaries
from tests.integration.support import eventually

CHARTS = Path(__file__).resolve().parents[2] / "standins" / "charts"
OPENSTACK_CLUSTER_CHART = ChartRef(str(CHARTS / "openstack-cluster"))
P = "capi.stackhpc.com"
R = "demo"

MACHINE_TEMPLATE = ResourceKind(
    "openstackmachinetemplate",
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "OpenStackMachineTemplate",
    "openstackmachinetemplates",
)
HEALTH_CHECK = ResourceKind(
    "machinehealthcheck", "cluster.x-k8s.io", "v1beta1", "MachineHealthCheck", "machinehealthchecks"
)


def cluster_values(workers: int = 2) -> dict[str, Any]:
    """Values shaped like the capi-operator's (template + cluster-values.yaml + Zenith)."""
    return {
        "kubernetesVersion": "v1.31.4",
        "machineImageId": "6a0b8f5e-3c1d-4e8a-9f2b-1d2c3e4f5a6b",
        "cloudCredentialsSecretName": f"{R}-cloud-credentials",
        "controlPlaneEndpoint": {"host": "abc123.apps.example.org", "port": 443},
        "apiServer": {"enableLoadBalancer": False, "associateFloatingIP": False},
        "controlPlane": {
            "machineFlavor": "m1.medium",
            "healthCheck": {"enabled": True},
            "kubeadmConfigSpec": {
                "useExperimentalRetryJoin": True,
                "files": [
                    {
                        "path": "/etc/kubernetes/manifests/zenith-apiserver.yaml",
                        "content": "YXBpVmVyc2lvbjogdjEK",
                        "encoding": "base64",
                        "owner": "root:root",
                        "permissions": "0600",
                    }
                ],
            },
        },
        "nodeGroupDefaults": {"healthCheck": {"enabled": True}},
        "nodeGroups": [
            {"name": "md-0", "machineFlavor": "m1.small", "machineCount": workers},
            {
                "name": "gpu",
                "machineFlavor": "g1.large",
                "autoscale": True,
                "machineCountMin": 1,
                "machineCountMax": 3,
            },
        ],
        "oidc": {
            "issuerUrl": "https://id.example.org/realms/az",
            "clientId": f"kube-{R}",
            "usernameClaim": "preferred_username",
        },
        "addons": {
            "ingress": {"enabled": True},
            "monitoring": {"enabled": True},
            "custom": {
                "oidc-default-rbac": {
                    "kind": "Manifests",
                    "spec": {"namespace": "oidc-system", "manifests": {"rbac.yaml": "kind: X\n"}},
                }
            },
        },
    }


@pytest.fixture
def helm(stack: LocalStack, tools_bin: Path | None, tmp_path: Path) -> Helm:
    bin_dir = tools_bin or ensure_binaries()
    return Helm(
        executable=bin_dir / "helm",
        kubeconfig=stack.endpoints.kubeconfig,
        timeout="5m",
        home=tmp_path / "helm",
        kill_grace=10,
    )


async def _labels(kube: KubeClient, kind: ResourceKind, namespace: str, name: str) -> Any:
    return (await kube.get(kind, namespace, name))["metadata"].get("labels", {})


async def test_install_is_idempotent_and_renders_upstream_names_and_labels(
    helm: Helm, kube: KubeClient, namespace: str
) -> None:
    first = await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    assert (first.revision, first.status, first.action) == (1, "deployed", "installed")

    common = {
        "helm.sh/chart": "openstack-cluster-0.27.0-standin",
        f"{P}/managed-by": "Helm",
        f"{P}/infrastructure-provider": "openstack",
        f"{P}/cluster": R,
    }
    cluster = await kube.get(CAPI_CLUSTER, namespace, R)
    assert common.items() <= cluster["metadata"]["labels"].items()
    assert cluster["spec"]["controlPlaneRef"]["name"] == f"{R}-control-plane"
    assert cluster["spec"]["infrastructureRef"]["kind"] == "OpenStackCluster"
    assert cluster["spec"]["clusterNetwork"]["pods"]["cidrBlocks"] == ["172.16.0.0/13"]
    assert cluster["spec"]["controlPlaneEndpoint"]["host"] == "abc123.apps.example.org"

    infra = await kube.get(OPENSTACK_CLUSTER, namespace, R)
    assert "helm.sh/resource-policy" not in infra["metadata"].get("annotations", {})
    identity = {"name": f"{R}-cloud-credentials", "cloudName": "openstack"}
    assert infra["spec"]["identityRef"] == identity
    assert infra["spec"]["apiServerLoadBalancer"]["enabled"] is False

    kcp = await kube.get(CONTROL_PLANE, namespace, f"{R}-control-plane")
    assert kcp["metadata"]["labels"][f"{P}/component"] == "control-plane"
    assert (kcp["spec"]["version"], kcp["spec"]["replicas"]) == ("v1.31.4", 3)
    assert kcp["spec"]["machineTemplate"]["metadata"]["labels"] == {
        f"{P}/cluster": R,
        f"{P}/component": "control-plane",
    }
    spec = kcp["spec"]["kubeadmConfigSpec"]
    assert spec["clusterConfiguration"]["apiServer"]["extraArgs"]["oidc-client-id"] == f"kube-{R}"
    assert [f["path"] for f in spec["files"]] == ["/etc/kubernetes/manifests/zenith-apiserver.yaml"]
    template = kcp["spec"]["machineTemplate"]["infrastructureRef"]["name"]
    assert template.startswith(f"{R}-control-plane-")
    osmt = await kube.get(MACHINE_TEMPLATE, namespace, template)
    assert osmt["spec"]["template"]["spec"]["flavor"] == "m1.medium"

    md = await kube.get(MACHINE_DEPLOYMENT, namespace, f"{R}-md-0")
    worker = {f"{P}/cluster": R, f"{P}/component": "worker", f"{P}/node-group": "md-0"}
    assert worker.items() <= md["metadata"]["labels"].items()
    assert md["spec"]["replicas"] == 2
    assert md["spec"]["template"]["metadata"]["labels"] == worker
    assert md["spec"]["selector"]["matchLabels"] == {**worker, "cluster.x-k8s.io/cluster-name": R}
    assert md["spec"]["template"]["spec"]["version"] == "v1.31.4"
    gpu = await kube.get(MACHINE_DEPLOYMENT, namespace, f"{R}-gpu")
    assert "replicas" not in gpu["spec"]
    annotations = gpu["metadata"]["annotations"]
    assert annotations["cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"] == "1"
    assert annotations["cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"] == "3"

    checks, _ = await kube.list(HEALTH_CHECK, namespace=namespace)
    assert sorted(c["metadata"]["name"] for c in checks) == [
        f"{R}-control-plane",
        f"{R}-gpu",
        f"{R}-md-0",
    ]

    selector = f"{P}/cluster={R}"
    releases, _ = await kube.list(HELM_RELEASE, namespace=namespace, label_selector=selector)
    manifests, _ = await kube.list(MANIFESTS, namespace=namespace, label_selector=selector)
    components = {a["metadata"]["labels"][f"{P}/component"]: a for a in releases + manifests}
    assert {
        "cni-calico",
        "cloud-config",
        "ccm-openstack",
        "csi-cinder",
        "metrics-server",
        "traefik",
        "kube-prometheus-stack",
        "loki-stack",
        "oidc-default-rbac",
    } == set(components)
    for component, addon in components.items():
        assert addon["metadata"]["name"] == f"{R}-{component}"
        assert addon["metadata"]["labels"][f"{P}/managed-by"] == "Helm"
        assert (addon["spec"]["clusterName"], addon["spec"]["bootstrap"]) == (R, True)
        config = await kube.get(SECRET, namespace, f"{R}-{component}-config")
        assert config["metadata"]["labels"]["addons.stackhpc.com/watch"] == ""
    assert components["oidc-default-rbac"]["spec"]["targetNamespace"] == "oidc-system"

    again = await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    assert (again.revision, again.action) == (1, "unchanged")

    scaled = await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values(4))
    assert (scaled.revision, scaled.status, scaled.action) == (2, "deployed", "upgraded")
    assert (await kube.get(MACHINE_DEPLOYMENT, namespace, f"{R}-md-0"))["spec"]["replicas"] == 4
    assert [r.revision for r in await helm.history(R, namespace)] == [1, 2]


async def test_render_failure_is_permanent_and_carries_the_charts_message(
    helm: Helm, namespace: str
) -> None:
    values = {**cluster_values(), "standin": {"failRender": "node group md-0 is broken"}}
    with pytest.raises(ChartRenderFailed) as caught:
        await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, values)
    assert isinstance(caught.value, PermanentError)
    assert caught.value.reason == "ChartRenderFailed"
    assert "node group md-0 is broken" in str(caught.value)
    assert await helm.status(R, namespace) is None


async def test_upgrade_killed_midway_is_rolled_back_then_upgraded(
    helm: Helm, kube: KubeClient, namespace: str
) -> None:
    await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    hanging = {**cluster_values(3), "standin": {"preUpgradeHookSeconds": 600}}
    upgrade = asyncio.create_task(
        helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, hanging)
    )
    await eventually(
        lambda: helm.status(R, namespace),
        lambda r: r is not None and r.status == "pending-upgrade",
        what="the upgrade to wait on its hook",
    )
    _kill_helm_children()  # as when the service's process group is SIGKILLed
    with pytest.raises(HelmFailed, match="killed by signal 9"):
        await upgrade
    stuck = await helm.status(R, namespace)
    assert stuck is not None
    assert (stuck.revision, stuck.status) == (2, "pending-upgrade")

    outcome = await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values(5))
    assert (outcome.revision, outcome.action) == (4, "recovered+upgraded")
    history = await helm.history(R, namespace)
    assert "Rollback to 1" in history[2].description
    assert (await kube.get(MACHINE_DEPLOYMENT, namespace, f"{R}-md-0"))["spec"]["replicas"] == 5


async def test_cancelled_upgrade_stops_helm_which_records_a_failure(
    helm: Helm, namespace: str
) -> None:
    await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    hanging = {**cluster_values(3), "standin": {"preUpgradeHookSeconds": 600}}
    upgrade = asyncio.create_task(
        helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, hanging)
    )
    await eventually(
        lambda: helm.status(R, namespace),
        lambda r: r is not None and r.status == "pending-upgrade",
        what="the upgrade to wait on its hook",
    )
    upgrade.cancel()
    with pytest.raises(asyncio.CancelledError):
        await upgrade
    assert _helm_children() == []
    failed = await helm.status(R, namespace)
    assert failed is not None
    assert (failed.revision, failed.status) == (2, "failed")

    outcome = await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    assert (outcome.revision, outcome.action) == (3, "upgraded")


async def test_uninstall_removes_the_objects(helm: Helm, kube: KubeClient, namespace: str) -> None:
    await helm.ensure_release(R, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())
    assert await helm.uninstall(R, namespace) is True

    async def cluster_gone() -> bool:
        with contextlib.suppress(KubeNotFound):
            await kube.get(CAPI_CLUSTER, namespace, R)
            return False
        return True

    await eventually(cluster_gone, bool, what="the CAPI Cluster to be deleted")
    for kind in (OPENSTACK_CLUSTER, CONTROL_PLANE, MACHINE_DEPLOYMENT, HELM_RELEASE, MANIFESTS):
        items, _ = await kube.list(kind, namespace=namespace, label_selector=f"{P}/cluster={R}")
        assert items == [], kind.kind
    assert await helm.status(R, namespace) is None
    assert await helm.uninstall(R, namespace) is False


async def test_template_renders_the_zenith_charts_locally(helm: Helm) -> None:
    client = {"sshPrivateKeyData": "c2VjcmV0", "server": {"host": "sshd", "port": 22}}
    docs = await helm.template(
        ChartRef(str(CHARTS / "zenith-apiserver")),
        "zenith-apiserver",
        "kube-system",
        {"zenithClient": client},
    )
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", "zenith-apiserver"),
        ("Pod", "zenith-apiserver"),
    ]
    client = yaml.safe_load(docs[0]["data"]["client-apiserver.yaml"])
    assert (client["server_address"], client["server_port"]) == ("sshd", 22)
    assert client["ssh_private_key_data"] == "c2VjcmV0"

    operator = await helm.template(
        ChartRef(str(CHARTS / "zenith-operator")),
        R,
        "ns",
        {
            "kubeconfigSecret": {"name": f"{R}-kubeconfig", "key": "value"},
            "config": {"registrarAdminUrl": "http://registrar", "sshdHost": "sshd", "sshdPort": 22},
        },
    )
    assert sorted((d["kind"], d["metadata"]["name"]) for d in operator) == [
        ("Deployment", f"{R}-zenith-operator"),
        ("Secret", f"{R}-zenith-operator"),
        ("ServiceAccount", f"{R}-zenith-operator"),
    ]


async def test_missing_chart_and_unreachable_cluster_are_temporary(
    helm: Helm, stack: LocalStack, tmp_path: Path, tools_bin: Path | None
) -> None:
    with pytest.raises(ChartNotFound):
        await helm.ensure_release(R, "default", ChartRef(str(tmp_path / "nope")), {})

    dead = tmp_path / "dead-kubeconfig"
    config = yaml.safe_load(stack.endpoints.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    dead.write_text(yaml.safe_dump(config))
    offline = Helm(
        executable=(tools_bin or ensure_binaries()) / "helm", kubeconfig=dead, home=tmp_path / "h"
    )
    with pytest.raises(HelmUnavailable, match="unreachable"):
        await offline.status(R, "default")


async def test_a_release_name_helm_refuses_is_no_release_and_permanent_to_install(
    helm: Helm, stack: LocalStack, namespace: str, tools_bin: Path | None, tmp_path: Path
) -> None:
    name = "a" * 60
    assert await helm.uninstall(name, namespace) is False
    assert await helm.status(name, namespace) is None
    assert await helm.history(name, namespace) == []
    with pytest.raises(InvalidReleaseName, match="60 characters; helm allows at most 53"):
        await helm.ensure_release(name, namespace, OPENSTACK_CLUSTER_CHART, cluster_values())

    # Should the adapter's check ever miss, helm's own refusal maps to the same class.
    binary = str((tools_bin or ensure_binaries()) / "helm")
    env = {**os.environ, **{f"HELM_{h}_HOME": str(tmp_path / h) for h in ("CACHE", "CONFIG")}}
    kube_args = ["-n", namespace, "--kubeconfig", str(stack.endpoints.kubeconfig)]
    for args in (
        ["uninstall", name],
        ["get", "metadata", name],
        ["history", name],
        ["upgrade", "--install", name, OPENSTACK_CLUSTER_CHART.name],
    ):
        proc = await asyncio.create_subprocess_exec(
            binary, *args, *kube_args, stdout=PIPE, stderr=PIPE, env=env
        )
        _, err = await proc.communicate()
        assert proc.returncode == 1, err
        assert type(classify(err.decode())) is InvalidReleaseName, err


async def test_an_object_the_api_server_rejects_is_permanent(
    helm: Helm, namespace: str, tmp_path: Path
) -> None:
    chart = _configmap_chart(tmp_path, "rejected", "metadata:\n  name: Not_A_Name\n")
    with pytest.raises(ReleaseObjectsInvalid, match="is invalid") as caught:
        await helm.ensure_release("rejected", namespace, chart, {})
    assert caught.value.reason == "ReleaseObjectsInvalid"


async def test_the_api_server_still_refuses_an_unknown_field(
    helm: Helm, namespace: str, tmp_path: Path
) -> None:
    """helm's own OpenAPI validation is off; Helm v4 applies with fieldValidation=Strict,
    so a field no schema knows is refused all the same (the same message as with helm's check
    on, which against this server validates nothing itself), and permanently."""
    chart = _configmap_chart(tmp_path, "unknown", "metadata:\n  name: cm\nspex: {}\n")
    with pytest.raises(ReleaseObjectsInvalid, match="spex: field not declared") as caught:
        await helm.ensure_release("unknown", namespace, chart, {}, absent=True)
    assert caught.value.reason == "ReleaseObjectsInvalid"


def _configmap_chart(tmp_path: Path, name: str, rest: str) -> ChartRef:
    """A chart of one ConfigMap whose manifest goes on with ``rest``."""
    chart = tmp_path / name
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(f"apiVersion: v1\nkind: ConfigMap\n{rest}")
    return ChartRef(str(chart))


def _helm_children() -> list[int]:
    """Pids of helm processes this test process started (from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            pid, rest = stat.read_text().split(" (", 1)
            comm, fields = rest.rsplit(") ", 1)
            if comm == "helm" and int(fields.split()[1]) == os.getpid():
                pids.append(int(pid))
    return pids


def _kill_helm_children() -> None:
    pids = _helm_children()
    assert pids, "no helm process to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
