"""``python -m soak [--seed N] [--clusters 50] [--minutes M] [--quick] [--keep] [--tls] ...``.

Runs the fault soak (``soak/__init__.py``), writes ``soak/RESULTS.md``, prints it, and exits
1 when an invariant failed (the seed is in the message), 0 otherwise. Without ``--seed`` a
seed is drawn and printed; ``--quick`` is 10 Clusters and about 10 minutes of faults unless
those are given too. ``--tls`` runs NATS and Redis over TLS only; ``--set NAME=VALUE``
(repeatable) gives every service a setting.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

from soak.plan import Sizes, make_plan
from soak.run import RESULTS, say, soak

DEFAULT = Sizes()
QUICK = Sizes(clusters=10, minutes=10.0, quick=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="the plan's seed (default: a random one)")
    parser.add_argument("--clusters", type=int, help=f"default {DEFAULT.clusters}, quick 10")
    parser.add_argument("--minutes", type=float, help=f"default {DEFAULT.minutes:g}, quick 10")
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--keep", action="store_true", help="keep the logs even after a pass")
    parser.add_argument("--tls", action="store_true", help="NATS and Redis over TLS only")
    parser.add_argument(
        "--report", type=Path, default=RESULTS, help="where the report goes (default: %(default)s)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=setting,
        help="a setting for every service, e.g. CAPIBUS_CONSUMER__ACK_WAIT=10 (repeatable)",
    )
    return parser.parse_args(argv)


def setting(text: str) -> str:
    name, _, value = text.partition("=")
    if not name.strip() or not _:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return f"{name.strip()}={value}"


def sizes(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else DEFAULT
    return Sizes(
        clusters=args.clusters or base.clusters,
        minutes=args.minutes or base.minutes,
        quick=base.quick,
        settings=tuple(args.set),
        tls=args.tls,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(1_000_000)
    plan = make_plan(seed, sizes(args))
    say(
        f"seed {seed}: {plan.sizes.clusters} Clusters, {len(plan.steps())} steps, "
        f"{len(plan.episodes)} faults"
    )
    try:
        return asyncio.run(soak(plan, keep=args.keep, report=args.report))
    except KeyboardInterrupt:
        say(f"interrupted (seed {seed})")
        return 130


if __name__ == "__main__":
    sys.exit(main())
