"""The workload API server: a second kube-apiserver on the stack's etcd, started on demand.

It plays the API of a cluster Cluster API "provisioned": its kubeconfig is self-contained (it
is what a ``<cluster>-kubeconfig`` Secret carries), and what is written to it stays apart from
the management API server's objects.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
import yaml

from shared.errors import KubeNotFound
from shared.kube import KubeClient, KubeConfig
from shared.resources import NODE
from testenv.harness import WORKLOAD_APISERVER, LocalStack

pytestmark = pytest.mark.integration


def _node(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"capibus.io/test": "workload"}},
        "spec": {},
    }


async def test_workload_api_server_is_a_separate_cluster(
    stack: LocalStack, kube: KubeClient
) -> None:
    if not stack.managed:
        pytest.skip("on an external stack the workload API server is the management one")
    path = stack.workload()
    assert stack.workload() == path  # started once

    text = path.read_text()
    config = yaml.safe_load(text)
    cluster = config["clusters"][0]["cluster"]
    assert cluster["certificate-authority-data"]
    assert "certificate-authority" not in cluster
    assert config["users"][0]["user"]["token"]
    assert cluster["server"] != stack.endpoints.api_url

    # Read from the text alone, as a process holding only the Secret's value would.
    workload = KubeClient.from_config(KubeConfig.parse(text), qps=None)
    name = f"node-{uuid.uuid4().hex[:8]}"
    try:
        created = await workload.create(NODE, _node(name))
        assert created["metadata"]["name"] == name
        assert (await workload.get(NODE, None, name))["metadata"]["uid"]
        with pytest.raises(KubeNotFound):
            await kube.get(NODE, None, name)
        names = {n["metadata"]["name"] for n in (await kube.list(NODE))[0]}
        assert name not in names
    finally:
        with contextlib.suppress(KubeNotFound):
            await workload.delete(NODE, None, name)
        await workload.aclose()


async def test_workload_api_server_restarts_with_its_data(stack: LocalStack) -> None:
    if not stack.managed:
        pytest.skip("restarts need a stack started by the harness")
    text = stack.workload().read_text()
    name = f"node-{uuid.uuid4().hex[:8]}"
    workload = KubeClient.from_config(KubeConfig.parse(text), qps=None)
    try:
        await workload.create(NODE, _node(name))
    finally:
        await workload.aclose()

    stack.restart(WORKLOAD_APISERVER)

    # Same port, same certificate, same token: the kubeconfig stored earlier still works.
    again = KubeClient.from_config(KubeConfig.parse(stack.workload().read_text()), qps=None)
    try:
        assert (await again.get(NODE, None, name))["metadata"]["name"] == name
        await again.delete(NODE, None, name)
    finally:
        await again.aclose()
