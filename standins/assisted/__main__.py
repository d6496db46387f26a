"""Run the assisted-service, hive and metal3 host stand-ins against ``$KUBECONFIG``.

    python -m standins.assisted --workload-kubeconfig PATH [--namespace NS]

The management API server is ``$KUBECONFIG``'s, as for the other stand-ins; the workload
kubeconfig (flag, or ``$STANDIN_ASSISTED_WORKLOAD_KUBECONFIG``) is what installed clusters'
admin kubeconfig Secrets hold and where installed hosts' Nodes appear. ``--namespace`` confines
every controller to one namespace (one process per test namespace). Runs until SIGTERM or
SIGINT; knobs are in ``standins/assisted/knobs.py`` and ``standins/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Sequence

from shared.kube import KubeClient, KubeConfig
from shared.runtime import run_until_signalled
from standins.assisted import AssistedKnobs, Workload, controllers
from standins.base import configure_logging, run_all

log = logging.getLogger("standins.assisted")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m standins.assisted",
        description="Run the assisted-service, hive and metal3 host stand-ins.",
    )
    default = os.environ.get("STANDIN_ASSISTED_WORKLOAD_KUBECONFIG")
    parser.add_argument(
        "--workload-kubeconfig",
        default=default,
        required=default is None,
        help="the workload API server: admin kubeconfig Secrets hold it, Nodes appear there",
    )
    parser.add_argument("--namespace", default=None, help="act in this namespace only")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    kube = KubeClient.from_config(
        KubeConfig.load(None), qps=None, user_agent="capibus-standin-assisted"
    )
    workload = Workload.open(args.workload_kubeconfig)
    try:
        found = controllers(
            kube, workload=workload, knobs=AssistedKnobs(), namespace=args.namespace
        )
        log.info(
            "assisted stand-ins running (%d controllers, namespace %s)",
            len(found),
            args.namespace or "all",
        )
        await run_all(found, stop)
    finally:
        await workload.aclose()
        await kube.aclose()
        log.info("assisted stand-ins stopped")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    configure_logging()
    run_until_signalled(lambda stop: serve(args, stop))


if __name__ == "__main__":
    main()
