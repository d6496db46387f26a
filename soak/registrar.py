"""The Zenith registrar stand-in as a process of its own whose registry outlives it.

    python -m soak.registrar --port P --state FILE [--base-domain D]

``standins.zenith`` keeps its registry in memory, which is right for tests that start it once.
The soak stops and starts the registrar to play an outage, and a real registrar keeps its
reservations in a database across restarts; with an in-memory registry every restart would
forget every reservation, so the count the checker compares (one per Cluster) would mean
nothing. Here each reservation is written to ``FILE`` (a JSON list, replaced atomically)
before the answer is sent, and read back at start: a registrar killed between storing and
answering has the reservation, and the caller's retry meets the 409 that
``services/helm/zenith.py`` recognises as its own. Only the registrar's HTTP API is served;
the soak's Clusters create no tenant-side Reservation objects.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.runtime import run_until_signalled
from standins.base import configure_logging
from standins.zenith import Registrar, RegistrarServer

Json = dict[str, Any]
ANNOUNCEMENT = "registrar listening on"


@dataclass
class DurableRegistrar(Registrar):
    """``standins.zenith.Registrar`` whose every reservation is kept in ``state``."""

    state: Path | None = field(default=None, kw_only=True)

    def reserve(self, body: Json) -> Json:
        entry = super().reserve(body)
        self._save()
        return entry

    def restore(self) -> int:
        """Read the reservations kept by an earlier run; how many there were."""
        if self.state is None or not self.state.exists():
            return 0
        entries: list[Json] = json.loads(self.state.read_text())
        for entry in entries:
            self._by_subdomain[entry["subdomain"]] = entry
            self._by_fingerprint.update(dict.fromkeys(entry["fingerprints"], entry["subdomain"]))
        return len(entries)

    def _save(self) -> None:
        if self.state is None:
            return
        partial = self.state.with_suffix(".partial")
        partial.write_text(json.dumps(self.reservations()))
        os.replace(partial, self.state)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m soak.registrar", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--base-domain", default="apps.example.test")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    registrar = DurableRegistrar(base_domain=args.base_domain, state=args.state)
    restored = registrar.restore()
    server = RegistrarServer(registrar, host=args.host, port=args.port)
    url = await server.start()
    print(f"{ANNOUNCEMENT} {url} ({restored} reservations restored)", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    configure_logging()
    run_until_signalled(lambda stop: serve(args, stop))


if __name__ == "__main__":
    main()
