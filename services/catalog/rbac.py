"""What the catalog asks of the Kubernetes API: the AppTemplates it syncs (their status goes
through the writer)."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import APP_TEMPLATE

RULES = (
    Rule(
        APP_TEMPLATE,
        "get list",
        why="the AppTemplate to sync; all of them to re-arm the sync timers of a claim",
    ),
)
