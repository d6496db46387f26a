"""Run the CB-Tumblebug stand-in until SIGTERM or SIGINT.

    python -m standins.tumblebug [--host 127.0.0.1] [--port 0] [--workload-kubeconfig PATH]
                                 [--nodes-dir DIR] [--no-ssh]

Prints ``tumblebug listening on http://<host>:<port>/tumblebug`` (the value for CB-Ladybug's
``TUMBLEBUG_URL``) and writes that URL to ``$STANDIN_TUMBLEBUG_URL_FILE`` when set. Unless
``--no-ssh``, every running VM gets a real sshd from ``standins.sshnodes.farm.NodeFarm``, whose
files live under ``--nodes-dir`` (default: a temporary directory removed at exit) and whose
joined nodes become Nodes of the ``--workload-kubeconfig`` cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from shared.runtime import run_until_signalled
from standins.base import configure_logging
from standins.tumblebug.farm import Farm, NullFarm, node_farm
from standins.tumblebug.knobs import TumblebugKnobs
from standins.tumblebug.server import TumblebugServer
from standins.tumblebug.world import World

log = logging.getLogger("standins.tumblebug")


def parse(argv: Sequence[str] | None = None) -> TumblebugKnobs:
    knobs = TumblebugKnobs.from_env()
    parser = argparse.ArgumentParser(
        prog="python -m standins.tumblebug", description="Serve a stand-in CB-Tumblebug."
    )
    parser.add_argument("--host", default=knobs.host)
    parser.add_argument("--port", type=int, default=knobs.port, help="0 picks a free port")
    parser.add_argument(
        "--workload-kubeconfig",
        default=knobs.workload_kubeconfig,
        help="the cluster the nodes' kubeadm join registers Nodes in",
    )
    parser.add_argument(
        "--nodes-dir", default=knobs.nodes_dir, help="where the node farm keeps its files"
    )
    parser.add_argument(
        "--no-ssh",
        dest="ssh",
        action="store_false",
        default=knobs.ssh,
        help="VMs without sshd (records only)",
    )
    args = parser.parse_args(argv)
    return dataclasses.replace(
        knobs,
        host=args.host,
        port=args.port,
        workload_kubeconfig=args.workload_kubeconfig,
        nodes_dir=args.nodes_dir,
        ssh=args.ssh,
    )


def announce(url: str, knobs: TumblebugKnobs) -> None:
    print(f"tumblebug listening on {url}", flush=True)
    if knobs.url_file:
        Path(knobs.url_file).write_text(url + "\n")


def nodes_root(knobs: TumblebugKnobs) -> tuple[Path, Path | None]:
    """The farm's directory, and the same again when it is ours to remove at exit."""
    if knobs.nodes_dir:
        root = Path(knobs.nodes_dir)
        root.mkdir(parents=True, exist_ok=True)
        return root, None
    scratch = Path(tempfile.mkdtemp(prefix="tumblebug-nodes-"))
    return scratch, scratch


async def serve(knobs: TumblebugKnobs, stop: asyncio.Event) -> None:
    scratch: Path | None = None
    farm: Farm = NullFarm()
    if knobs.ssh:
        root, scratch = await asyncio.to_thread(nodes_root, knobs)
        farm = node_farm(root, knobs.workload_kubeconfig)
    server = TumblebugServer(World(knobs, farm), knobs)
    try:
        announce(await server.start(), knobs)
        log.info(
            "namespaces %s; sshd per VM %s; namespace mode %s",
            ",".join(knobs.namespaces),
            "on" if knobs.ssh else "off",
            knobs.namespace_mode,
        )
        await stop.wait()
    finally:
        await server.stop()
        await farm.close()
        if scratch is not None:
            await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
        log.info("tumblebug stand-in stopped")


def main(argv: Sequence[str] | None = None) -> None:
    knobs = parse(argv)
    configure_logging()
    run_until_signalled(lambda stop: serve(knobs, stop))


if __name__ == "__main__":
    main()
