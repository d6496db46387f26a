"""Run the metal-api stand-in until SIGTERM or SIGINT.

    python -m standins.metalapi [--host 127.0.0.1] [--port 0] [--workload-kubeconfig PATH]

Prints ``metal-api listening on http://<host>:<port>`` and writes the URL to
``$STANDIN_METALAPI_URL_FILE`` when set. With a workload kubeconfig (flag, or
``$STANDIN_METALAPI_WORKLOAD_KUBECONFIG``), machines that phone home register a Node there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from shared.kube import KubeClient, KubeConfig
from shared.runtime import run_until_signalled
from standins.base import configure_logging
from standins.metalapi.knobs import MetalApiKnobs
from standins.metalapi.lifecycle import Lifecycle
from standins.metalapi.registrar import NodeRegistrar
from standins.metalapi.server import MetalApiServer
from standins.metalapi.world import World

log = logging.getLogger("standins.metalapi")


def parse(argv: Sequence[str] | None = None) -> MetalApiKnobs:
    knobs = MetalApiKnobs.from_env()
    parser = argparse.ArgumentParser(
        prog="python -m standins.metalapi", description="Serve a stand-in metal-api."
    )
    parser.add_argument("--host", default=knobs.host)
    parser.add_argument("--port", type=int, default=knobs.port, help="0 picks a free port")
    parser.add_argument(
        "--workload-kubeconfig",
        default=knobs.workload_kubeconfig,
        help="register a Node there for every machine that phones home",
    )
    args = parser.parse_args(argv)
    return dataclasses.replace(
        knobs, host=args.host, port=args.port, workload_kubeconfig=args.workload_kubeconfig
    )


def announce(url: str, knobs: MetalApiKnobs) -> None:
    print(f"metal-api listening on {url}", flush=True)
    if knobs.url_file:
        Path(knobs.url_file).write_text(url + "\n")


async def serve(knobs: MetalApiKnobs, stop: asyncio.Event) -> None:
    kube: KubeClient | None = None
    registrar: NodeRegistrar | None = None
    if knobs.workload_kubeconfig:
        config = KubeConfig.load(knobs.workload_kubeconfig)
        kube = KubeClient.from_config(config, qps=None, user_agent="capibus-standin-metalapi")
        registrar = NodeRegistrar(kube)
    server = MetalApiServer(Lifecycle(World.seeded(knobs), knobs, listener=registrar), knobs)
    registering = asyncio.create_task(registrar.run(stop)) if registrar else None
    try:
        announce(await server.start(), knobs)
        log.info("%d machines waiting; hmac %s", knobs.pool_size, "on" if knobs.hmac else "off")
        await stop.wait()
    finally:
        if registering is not None:
            registering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await registering
        await server.stop()
        if kube is not None:
            await kube.aclose()
        log.info("metal-api stand-in stopped")


def main(argv: Sequence[str] | None = None) -> None:
    knobs = parse(argv)
    configure_logging()
    run_until_signalled(lambda stop: serve(knobs, stop))


if __name__ == "__main__":
    main()
