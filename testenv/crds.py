"""Install capibus's CRDs and the stand-ins' peer CRDs into a stack (tests, demo, bench).

Server-side apply makes it idempotent, so a session reusing an external stack re-applies
harmlessly. Readiness is the ``Established`` condition, awaited by list-then-watch on the CRDs
themselves: the API server tells us the moment each one is served.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from shared.kube import KubeClient
from shared.resources import CUSTOM_RESOURCE_DEFINITION as CRD

ROOT = Path(__file__).resolve().parents[1]
OURS = ROOT / "deploy" / "crds"
PEERS = ROOT / "standins" / "crds"

Json = dict[str, Any]


def documents(directories: Iterable[Path]) -> list[Json]:
    files = [f for d in directories for f in sorted(d.glob("*.yaml"))]
    return [doc for f in files for doc in yaml.safe_load_all(f.read_text()) if doc]


async def apply_crds(
    kube: KubeClient,
    directories: Iterable[Path] = (OURS, PEERS),
    *,
    field_manager: str = "capibus-testenv",
    deadline_seconds: float = 60.0,
) -> list[str]:
    """Apply every CRD under ``directories`` and return their names once all are Established."""
    docs = documents(directories)
    for doc in docs:
        await kube.apply(CRD, doc, field_manager=field_manager)
    names = [doc["metadata"]["name"] for doc in docs]
    async with asyncio.timeout(deadline_seconds):
        await _established(kube, set(names))
    return names


async def _established(kube: KubeClient, names: set[str]) -> None:
    items, version = await kube.list(CRD)
    pending = names - {item["metadata"]["name"] for item in items if _is_established(item)}
    while pending:
        # aclosing: returning mid-stream must close the watch's connection now, not at GC.
        watch = kube.watch(CRD, resource_version=version, timeout_seconds=30)
        async with contextlib.aclosing(watch) as events:
            async for event in events:
                if event.type != "BOOKMARK" and _is_established(event.object):
                    pending.discard(event.object["metadata"]["name"])
                version = event.resource_version or version
                if not pending:
                    return


def _is_established(crd: Json) -> bool:
    # A fresh CRD has "conditions": null, not an empty list.
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
