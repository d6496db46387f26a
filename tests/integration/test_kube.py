"""The Kubernetes adapter against the real kube-apiserver: what its answers mean.

The unit tests replay these answers; here the API server gives them. A JSON Patch whose
``test`` fails gets the same bare 422 as any patch the server cannot apply, so only the
adapter's second look tells a lost race (``KubeConflict``) from a wrong patch
(``KubeInvalid``). Discovery finds plurals, preferred versions and scopes of built-in kinds
and of CRDs, and says ``KubeNotFound`` for what is not served.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import KubeConflict, KubeInvalid, KubeNotFound
from shared.kube import KubeClient, ResourceKind
from shared.resources import CONFIG_MAP

pytestmark = pytest.mark.integration

Json = dict[str, Any]


async def config_map(kube: KubeClient, namespace: str) -> Json:
    return await kube.create(
        CONFIG_MAP,
        {"metadata": {"name": "guarded", "namespace": namespace}, "data": {"a": "1"}},
    )


def guarded(obj: Json, *ops: Json) -> list[Json]:
    version = obj["metadata"]["resourceVersion"]
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


async def test_a_json_patch_whose_test_fails_is_a_conflict(
    kube: KubeClient, namespace: str
) -> None:
    stale = await config_map(kube, namespace)
    await kube.patch_merge(CONFIG_MAP, namespace, "guarded", {"data": {"b": "2"}})
    add = {"op": "add", "path": "/data/c", "value": "3"}
    with pytest.raises(KubeConflict):
        await kube.patch_json(CONFIG_MAP, namespace, "guarded", guarded(stale, add))
    current = await kube.get(CONFIG_MAP, namespace, "guarded")
    patched = await kube.patch_json(CONFIG_MAP, namespace, "guarded", guarded(current, add))
    assert patched["data"] == {"a": "1", "b": "2", "c": "3"}


async def test_a_json_patch_that_cannot_apply_is_invalid(kube: KubeClient, namespace: str) -> None:
    obj = await config_map(kube, namespace)
    remove_missing = {"op": "remove", "path": "/data/missing"}
    with pytest.raises(KubeInvalid, match="422 the server rejected our request"):
        await kube.patch_json(CONFIG_MAP, namespace, "guarded", guarded(obj, remove_missing))


@pytest.mark.parametrize(
    ("group", "kind", "expected"),
    [
        ("", "ConfigMap", ResourceKind("configmap", "", "v1", "ConfigMap", "configmaps")),
        (
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            ResourceKind(
                "customresourcedefinition",
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
                namespaced=False,
            ),
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "OpenStackMachine",
            ResourceKind(
                "openstackmachine",
                "infrastructure.cluster.x-k8s.io",
                "v1beta1",
                "OpenStackMachine",
                "openstackmachines",
            ),
        ),
        (
            "azimuth.stackhpc.com",
            "ClusterTemplate",
            ResourceKind(
                "clustertemplate",
                "azimuth.stackhpc.com",
                "v1alpha1",
                "ClusterTemplate",
                "clustertemplates",
                namespaced=False,
            ),
        ),
    ],
)
async def test_resolve_finds_what_the_server_serves(
    kube: KubeClient, crds: list[str], group: str, kind: str, expected: ResourceKind
) -> None:
    resolved = await kube.resolve(group, kind)
    assert resolved == expected
    await kube.list(resolved, limit=1)  # the path it names is served


@pytest.mark.parametrize(
    ("group", "kind", "version"),
    [
        ("nothing.example", "Thing", None),
        ("azimuth.stackhpc.com", "Nothing", None),
        ("azimuth.stackhpc.com", "Cluster", "v9"),
        ("", "Nothing", None),
    ],
)
async def test_resolve_says_what_is_not_served(
    kube: KubeClient, crds: list[str], group: str, kind: str, version: str | None
) -> None:
    with pytest.raises(KubeNotFound):
        await kube.resolve(group, kind, version=version)
