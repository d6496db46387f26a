"""The admission service's read-only view of the API: ``handlers.AdmissionApi`` over KubeClient.

Secrets are checked with a metadata-only GET: the ``Accept`` header asks the API server for a
``PartialObjectMetadata``, so a Secret's data never reaches this process (nor its memory or
logs).

Template deletion asks for at most one Cluster (``limit=1``) with the template's label, in all
namespaces: the answer is "any?", not "which".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.errors import KubeNotFound
from shared.kube import KubeClient, ResourceKind

Json = dict[str, Any]


@dataclass
class KubeLookups:
    kube: KubeClient

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        return await self.kube.get(kind, namespace, name)

    async def exists(self, kind: ResourceKind, namespace: str | None, name: str) -> bool:
        try:
            await self.kube.get_metadata(kind, namespace, name)
        except KubeNotFound:
            return False
        return True

    async def any_labelled(self, kind: ResourceKind, label_selector: str) -> bool:
        items, _ = await self.kube.list(kind, label_selector=label_selector, limit=1)
        return bool(items)

    async def aclose(self) -> None:
        await self.kube.aclose()
