"""metal-stack's Cluster API kinds on the real API server: the generated CRDs are served at
``infrastructure.cluster.x-k8s.io/v1alpha4`` where ``shared.resources`` addresses them, keep
upstream's field names, enforce the required fields and the instanceStatus enum, and treat
status the way the writer expects: through the status subresource for MetalStackCluster and
MetalStackMachine, on the object itself for MetalStackFirewall."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shared.errors import KubeInvalid, KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.models import azimuth
from shared.models.metalstack import (
    CONTRACT_LABEL,
    InstanceStatus,
    MetalStackCluster,
    MetalStackFirewall,
    MetalStackMachine,
    MetalStackMachineTemplate,
)
from shared.resources import (
    CUSTOM_RESOURCE_DEFINITION,
    METALSTACK_CLUSTER,
    METALSTACK_FIREWALL,
    METALSTACK_MACHINE,
    METALSTACK_MACHINE_TEMPLATE,
)

pytestmark = pytest.mark.integration

Json = dict[str, Any]
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
CONDITION = {
    "type": "NetworkAllocated",
    "status": "False",
    "severity": "Info",
    "reason": "Waiting",
    "message": "waiting for metal-api",
    "lastTransitionTime": "2026-01-02T03:04:05Z",
}
KINDS = (METALSTACK_CLUSTER, METALSTACK_MACHINE, METALSTACK_MACHINE_TEMPLATE, METALSTACK_FIREWALL)


def _object(kind: ResourceKind, namespace: str, spec: Json, **extra: Any) -> Json:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": "demo",
            "namespace": namespace,
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        },
        "spec": spec,
        **extra,
    }


CLUSTER_SPEC: Json = {
    "controlPlaneEndpoint": {"host": "", "port": 6443},
    "projectID": "00000000-0000-0000-0000-000000000000",
    "partition": "vagrant",
    "publicNetworkID": "internet-vagrant-lab",
    "firewallSpec": {"image": "firewall-ubuntu-2.0", "machineType": "v1-small-x86"},
}
MACHINE_SPEC: Json = {
    "image": "ubuntu-20.04",
    "machineType": "v1-small-x86",
    "sshKeys": ["ssh-ed25519 AAAA demo"],
    "tags": ["team=infra"],
}
FIREWALL_SPEC: Json = {"image": "firewall-ubuntu-2.0", "machineType": "v1-small-x86"}


async def _create(kube: KubeClient, kind: ResourceKind, obj: Json) -> Json:
    """Create ``obj``, waiting out the moment between Established and served."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return await kube.create(kind, obj)
        except KubeNotFound:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
async def test_crd_carries_the_cluster_api_contract_label(
    kube: KubeClient, crds: list[str], kind: ResourceKind
) -> None:
    name = f"{kind.plural}.{kind.group}"

    crd = await kube.get(CUSTOM_RESOURCE_DEFINITION, None, name)

    assert name in crds
    assert crd["metadata"]["labels"][CONTRACT_LABEL[0]] == CONTRACT_LABEL[1]
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha4"]


async def test_one_object_of_each_kind_is_stored_and_parses(
    kube: KubeClient, namespace: str
) -> None:
    template_spec = {"template": {"spec": MACHINE_SPEC}}
    cases: list[tuple[ResourceKind, type[azimuth.CustomResource], Json]] = [
        (METALSTACK_CLUSTER, MetalStackCluster, CLUSTER_SPEC),
        (METALSTACK_MACHINE, MetalStackMachine, MACHINE_SPEC),
        (METALSTACK_MACHINE_TEMPLATE, MetalStackMachineTemplate, template_spec),
        (METALSTACK_FIREWALL, MetalStackFirewall, FIREWALL_SPEC),
    ]

    for kind, model, spec in cases:
        await _create(kube, kind, _object(kind, namespace, spec))
        stored = await kube.get(kind, namespace, "demo")

        assert stored["spec"] == spec, kind.kind  # upstream's names survive pruning
        parsed = model.model_validate(stored)
        assert parsed.model_dump(mode="json", exclude_unset=True)["spec"] == spec


async def test_cluster_status_is_written_only_through_the_status_subresource(
    kube: KubeClient, namespace: str
) -> None:
    status = {"ready": True, "controlPlaneIPAllocated": True, "conditions": [CONDITION]}
    body = _object(METALSTACK_CLUSTER, namespace, CLUSTER_SPEC, status=status)

    created = await _create(kube, METALSTACK_CLUSTER, body)
    ignored = await kube.patch_merge(METALSTACK_CLUSTER, namespace, "demo", {"status": status})
    written = await kube.patch_merge(
        METALSTACK_CLUSTER, namespace, "demo", {"status": status}, subresource="status"
    )

    assert "status" not in created
    assert "status" not in ignored
    assert written["status"] == status
    cluster = MetalStackCluster.model_validate(written)
    assert cluster.status.ready is True
    assert cluster.status.conditions[0].reason == "Waiting"


async def test_firewall_status_is_written_on_the_object(kube: KubeClient, namespace: str) -> None:
    body = _object(METALSTACK_FIREWALL, namespace, FIREWALL_SPEC, status={"ready": False})

    created = await _create(kube, METALSTACK_FIREWALL, body)
    status = {"ready": True, "conditions": [CONDITION]}
    patched = await kube.patch_merge(METALSTACK_FIREWALL, namespace, "demo", {"status": status})
    with pytest.raises(KubeNotFound):
        await kube.patch_merge(
            METALSTACK_FIREWALL, namespace, "demo", {"status": status}, subresource="status"
        )

    assert created["status"] == {"ready": False}
    assert patched["status"] == status
    assert (await kube.get(METALSTACK_FIREWALL, namespace, "demo"))["status"] == status
    assert MetalStackFirewall.model_validate(patched).status.ready is True


async def test_machine_status_enum_and_state_column(kube: KubeClient, namespace: str) -> None:
    await _create(kube, METALSTACK_MACHINE, _object(METALSTACK_MACHINE, namespace, MACHINE_SPEC))
    status = {
        "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
        "instanceStatus": InstanceStatus.PROVISIONING.value,
        "conditions": [CONDITION],
    }

    written = await kube.patch_merge(
        METALSTACK_MACHINE, namespace, "demo", {"status": status}, subresource="status"
    )
    with pytest.raises(KubeInvalid, match="instanceStatus"):
        await kube.patch_merge(
            METALSTACK_MACHINE,
            namespace,
            "demo",
            {"status": {"instanceStatus": "running"}},
            subresource="status",
        )
    table = await kube.request("GET", METALSTACK_MACHINE.path(namespace, "demo"), accept=TABLE)

    assert written["status"] == status
    columns = [column["name"] for column in table["columnDefinitions"]]
    assert columns == ["Name", "Cluster", "State", "Ready", "InstanceID", "Machine", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[1:3] == ["demo", "provisioning"]


@pytest.mark.parametrize(
    ("kind", "spec", "missing"),
    [
        (METALSTACK_CLUSTER, CLUSTER_SPEC, "publicNetworkID"),
        (METALSTACK_MACHINE, MACHINE_SPEC, "machineType"),
        (METALSTACK_FIREWALL, FIREWALL_SPEC, "machineType"),
    ],
    ids=lambda v: getattr(v, "kind", ""),
)
async def test_required_spec_fields_are_enforced(
    kube: KubeClient, namespace: str, kind: ResourceKind, spec: Json, missing: str
) -> None:
    body = _object(kind, namespace, {k: v for k, v in spec.items() if k != missing})

    with pytest.raises(KubeInvalid, match=f"spec.{missing}: Required value"):
        await _create(kube, kind, body)
