"""The lifecycle scenarios again, with the services in one all-in-one process.

Nothing here is a new scenario: the point is that the same stories converge exactly as with a
process per service (``services.allinone`` composes the same roots on shared clients), that a
SIGKILL of the whole set mid-work and a restart lose nothing (what was in flight was not acked,
and the restarted process takes the partitions back), and that SIGTERM then stops it cleanly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.integration.lifecycle import test_bad_input as bad_input
from tests.integration.lifecycle import test_lifecycle as lifecycle
from tests.integration.lifecycle.conftest import SERVICES, World


class OneProcess:
    """``world`` with ``together=True``, remembering the worlds it made."""

    def __init__(self, world: Callable[..., Any]) -> None:
        self.world = world
        self.made: list[World] = []

    async def __call__(self, **options: Any) -> World:
        made: World = await self.world(together=True, **options)
        self.made.append(made)
        return made

    def stops_gracefully(self) -> None:
        """SIGTERM ends the process, every service in it, with status 0."""
        (made,) = self.made
        process = made.processes[SERVICES[0]]
        assert process.stop() == 0, process.log()[-3000:]
        assert f"running {', '.join(SERVICES)} in one process" in process.log()


async def test_oidc_lease_and_zenith_converge_in_one_process(world: Callable[..., Any]) -> None:
    together = OneProcess(world)
    await lifecycle.test_oidc_lease_and_zenith_together(together)
    together.stops_gracefully()


async def test_a_sigkill_mid_upgrade_and_a_restart_lose_nothing(
    world: Callable[..., Any],
) -> None:
    together = OneProcess(world)
    await bad_input.test_helm_killed_mid_upgrade_recovers_with_the_new_values(together)
    together.stops_gracefully()
