"""A Helm chart repository as a process of its own, so an outage can stop it.

    python -m soak.chartrepo --port P --dir DIR

The soak's Clusters take their charts from local paths (``standins/charts``), which never go
away. For the outage run (``soak.outage``) the helm service takes them from a repository
instead, as a deployment does (``services/helm/settings.py``: the openstack-cluster and
Zenith charts come from chart repositories by URL): ``package`` makes the repository
(``helm package`` of each stand-in chart and ``helm repo index``, so chart URLs are relative
to it, as in ``tests/integration/test_catalog.py``) and this process serves ``DIR`` over
HTTP until it is stopped.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
from collections.abc import Sequence
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ANNOUNCEMENT = "chart repository listening on"


def package(charts: Sequence[Path], helm: Path, into: Path) -> dict[str, str]:
    """Package ``charts`` into ``into`` and index it; each chart's name and version."""
    into.mkdir(parents=True, exist_ok=True)
    versions = {}
    for chart in charts:
        run = [str(helm), "package", str(chart), "--destination", str(into)]
        subprocess.run(run, check=True, capture_output=True, timeout=60)
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        versions[str(meta["name"])] = str(meta["version"])
    index = [str(helm), "repo", "index", str(into)]
    subprocess.run(index, check=True, capture_output=True, timeout=60)
    return versions


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m soak.chartrepo", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    handler = functools.partial(_Quiet, directory=str(args.dir))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"{ANNOUNCEMENT} http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
