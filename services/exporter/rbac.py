"""What the exporter asks of the Kubernetes API: one list per kind it exports at start-up,
and an object whose event arrived trimmed; everything later comes from the bus."""

from __future__ import annotations

from services.exporter.logic import KINDS
from shared.rbac import Rule

RULES = (
    Rule(KINDS, "get list", why="the starting state of the series; a trimmed event read back"),
)
