"""Install capibus's CRDs and the stand-ins' peer CRDs into a stack (tests, demo, bench).

Server-side apply makes it idempotent, so a session reusing an external stack re-applies
harmlessly; waiting for ``Established`` is an event the API server reports on the CRD, read
here with a deadline because this is tooling observing a server, not a controller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from shared.kube import KubeClient
from shared.resources import CUSTOM_RESOURCE_DEFINITION as CRD

ROOT = Path(__file__).resolve().parents[1]
OURS = ROOT / "deploy" / "crds"
PEERS = ROOT / "standins" / "crds"


def documents(directories: Iterable[Path]) -> list[dict[str, Any]]:
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
    names = []
    for doc in documents(directories):
        await kube.apply(CRD, doc, field_manager=field_manager)
        names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + deadline_seconds
    for name in names:
        while not await _established(kube, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {deadline_seconds}s")
            await asyncio.sleep(0.1)
    return names


async def _established(kube: KubeClient, name: str) -> bool:
    conditions = (await kube.get(CRD, None, name)).get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
