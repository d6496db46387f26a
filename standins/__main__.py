"""Run the stand-in peer controllers against ``$KUBECONFIG`` until SIGTERM or SIGINT.

    python -m standins [--only identity,schedule,zenith,capi]

All chosen stand-ins share one process and one API client; they talk to the API server only,
never to NATS. With ``zenith``, the registrar's admin API is served too and its URL is printed
(``registrar listening on http://...``) and written to ``$STANDIN_ZENITH_REGISTRAR_URL_FILE``
when set, for whoever must point capibus at it. Knobs are environment variables, listed in
``standins/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from shared.kube import KubeClient, KubeConfig
from shared.runtime import run_until_signalled
from standins import identity, schedule, zenith
from standins.base import Controller, configure_logging, run_all

STANDINS = ("identity", "schedule", "zenith", "capi")

log = logging.getLogger("standins")


def parse_only(argv: Sequence[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(
        prog="python -m standins", description="Run stand-in peer controllers."
    )
    parser.add_argument(
        "--only",
        default=",".join(STANDINS),
        help=f"comma-separated stand-ins to run (default: all of {', '.join(STANDINS)})",
    )
    names = [name.strip() for name in parser.parse_args(argv).only.split(",") if name.strip()]
    unknown = sorted(set(names) - set(STANDINS))
    if unknown or not names:
        parser.error(f"unknown stand-ins {unknown}; choose from {', '.join(STANDINS)}")
    return list(dict.fromkeys(names))


def capi_controllers(kube: KubeClient) -> list[Controller]:
    # Imported late: the CAPI stand-in is optional for everything else here.
    module = importlib.import_module("standins.capi")
    build: Callable[[KubeClient], list[Controller]] = module.controllers
    return build(kube)


def build(
    names: Sequence[str], kube: KubeClient, registrar: zenith.Registrar | None
) -> list[Controller]:
    found: list[Controller] = []
    for name in names:
        if name == "identity":
            found += identity.controllers(kube)
        elif name == "schedule":
            found += schedule.controllers(kube)
        elif name == "zenith":
            found += zenith.controllers(kube, registrar=registrar)
        elif name == "capi":
            found += capi_controllers(kube)
    return found


def announce(url: str) -> None:
    print(f"registrar listening on {url}", flush=True)
    target = os.environ.get("STANDIN_ZENITH_REGISTRAR_URL_FILE")
    if target:
        Path(target).write_text(url + "\n")


async def serve(names: Sequence[str], stop: asyncio.Event) -> None:
    kube = KubeClient.from_config(KubeConfig.load(None), qps=None, user_agent="capibus-standins")
    server: zenith.RegistrarServer | None = None
    try:
        if "zenith" in names:
            server = await zenith.start_registrar()
            announce(server.url)
        controllers = build(names, kube, server.registrar if server else None)
        log.info("stand-ins running: %s", ", ".join(names))
        await run_all(controllers, stop)
    finally:
        if server is not None:
            await server.stop()
        await kube.aclose()
        log.info("stand-ins stopped")


def main(argv: Sequence[str] | None = None) -> None:
    names = parse_only(argv)
    configure_logging()
    run_until_signalled(lambda stop: serve(names, stop))


if __name__ == "__main__":
    main()
