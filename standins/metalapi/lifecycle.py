"""Time in the stand-in: provisioning after an allocation, the reboot after a free.

The rules (``machines``) are pure; this module owns the event loop's timers and tells a
listener (the node registrar) about the two moments a workload cluster can see: a machine
(not a firewall) phoned home, and an allocated machine was freed.

- **Allocate**: ``Installing``, ``Booting New Kernel`` and ``Phoned Home`` are recorded at a
  third, two thirds and all of the provisioning delay. A delay of 0 records all three before
  the allocation is answered.
- **Free**: ``Planned Reboot`` at once; ``Waiting`` (allocatable again) after the reboot
  delay, or at once with a delay of 0.

Every timer names the allocation or reboot it belongs to, so a free during provisioning, or
a new allocation during a reboot, turns the older timers into no-ops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Protocol

from standins.metalapi import machines
from standins.metalapi.knobs import MetalApiKnobs
from standins.metalapi.model import Json, Machine
from standins.metalapi.world import World

log = logging.getLogger("standins.metalapi")


class MachineListener(Protocol):
    def phoned_home(self, machine: Machine) -> None: ...

    def freed(self, machine_id: str, hostname: str) -> None: ...


class Lifecycle:
    def __init__(
        self, world: World, knobs: MetalApiKnobs, *, listener: MachineListener | None = None
    ) -> None:
        self.world = world
        self.knobs = knobs
        self.listener = listener
        self._timers: set[asyncio.TimerHandle] = set()

    def allocate(self, body: Json, *, firewall: bool = False) -> Machine:
        machine = machines.allocate(self.world, body, firewall=firewall)
        assert machine.allocation is not None
        allocation_id = machine.allocation.id
        kind = "firewall" if firewall else "machine"
        log.info("%s %s allocated as %s", kind, machine.id, machine.allocation.hostname)
        delay = self.knobs.provisioning_delay
        for index, event in enumerate(machines.PROVISIONING, start=1):
            at = delay * index / len(machines.PROVISIONING)
            self._at(at, self._step, machine.id, allocation_id, event)
        return machine

    def free(self, machine_id: str) -> Machine:
        machine = self.world.machine(machine_id)
        allocation, firewall = machine.allocation, self.world.is_firewall(machine)
        reboot = str(uuid.uuid4())
        machines.free(self.world, machine_id, reboot)
        log.info("machine %s freed", machine_id)
        if allocation is not None and not firewall and self.listener is not None:
            self.listener.freed(machine_id, allocation.hostname)
        self._at(self.knobs.reboot_delay, self._rebooted, machine_id, reboot)
        return machine

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def _step(self, machine_id: str, allocation_id: str, event: str) -> None:
        succeeded = self.knobs.succeeded_on_phoned_home
        machine = machines.step(self.world, machine_id, allocation_id, event, succeeded=succeeded)
        if machine is None or event != machines.PHONED_HOME:
            return
        log.info("machine %s: %s", machine_id, event)
        if self.listener is not None and not self.world.is_firewall(machine):
            self.listener.phoned_home(machine)

    def _rebooted(self, machine_id: str, reboot: str) -> None:
        if machines.rebooted(self.world, machine_id, reboot) is not None:
            log.info("machine %s: Waiting", machine_id)

    def _at(self, delay: float, callback: Callable[..., None], *args: str) -> None:
        if delay <= 0:
            callback(*args)
            return

        def fire() -> None:
            self._timers.discard(handle)
            callback(*args)

        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(handle)
