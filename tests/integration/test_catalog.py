"""The catalog against a real chart repository, the real API server, NATS and Redis.

The repository is built the way a chart maintainer builds one: small chart directories
packaged by the real ``helm package`` and indexed by ``helm repo index`` (so chart URLs are
relative to the repository), served over HTTP on 127.0.0.1. The watcher, the catalog and the
writer (which writes the status the catalog reports) run as real processes; the test only
creates AppTemplates and changes the repository.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.errors import KubeNotFound
from shared.kube import KubeClient
from shared.resources import APP_TEMPLATE
from testenv.harness import ensure_binaries, free_port
from tests.integration.support import ServiceProcess, eventually

pytestmark = pytest.mark.integration
Json = dict[str, Any]
WATCH_TEMPLATES = {"CAPIBUS_WATCHER__KINDS": json.dumps(["apptemplate"])}
VALUES_SCHEMA = {"type": "object", "properties": {"replicas": {"type": "integer"}}}
UI_SCHEMA = {"controls": {"/replicas": {"type": "IntegerControl"}}}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        return


class ChartRepo:
    """A directory of packaged charts and its index, served over HTTP."""

    def __init__(self, root: Path, helm: Path) -> None:
        self.root, self.helm = root, helm
        self.served = root / "repo"
        self.served.mkdir(parents=True)
        self.server: ThreadingHTTPServer | None = None

    def serve(self, port: int = 0) -> ChartRepo:
        handler = functools.partial(_Quiet, directory=str(self.served))
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/charts"

    def add(self, name: str, version: str, *, schemas: bool = True, **meta: Any) -> None:
        source = self.root / "src" / f"{name}-{version}" / name
        (source / "templates").mkdir(parents=True)
        chart = {"apiVersion": "v2", "name": name, "version": version, **meta}
        (source / "Chart.yaml").write_text(yaml.safe_dump(chart))
        (source / "values.yaml").write_text("replicas: 1\n")
        if schemas:
            (source / "values.schema.json").write_text(json.dumps(VALUES_SCHEMA))
            (source / "azimuth-ui.schema.yaml").write_text(yaml.safe_dump(UI_SCHEMA))
        self._helm("package", str(source), "--destination", str(self.served / "charts"))
        self._helm("repo", "index", str(self.served / "charts"))

    def break_index(self) -> None:
        (self.served / "charts").mkdir(exist_ok=True)
        (self.served / "charts" / "index.yaml").write_text("entries: [this is: not, an index\n")

    def _helm(self, *args: str) -> None:
        env = {"HELM_CACHE_HOME": str(self.root / "h"), "HELM_CONFIG_HOME": str(self.root / "h")}
        subprocess.run([str(self.helm), *args], check=True, capture_output=True, env=env)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def charts(tmp_path: Path, tools_bin: Path | None) -> Iterator[Callable[..., ChartRepo]]:
    """``charts()`` serves a new repository at once; ``charts(serve=False)`` waits for ``serve``."""
    helm = (tools_bin or ensure_binaries()) / "helm"
    made: list[ChartRepo] = []

    def make(*, serve: bool = True) -> ChartRepo:
        made.append(ChartRepo(tmp_path / f"repo{len(made)}", helm))
        return made[-1].serve() if serve else made[-1]

    yield make
    for repo in made:
        repo.close()


@pytest.fixture
async def templates(kube: KubeClient, crds: list[str]) -> Any:
    """Create AppTemplates with unique names; all are deleted after the test."""
    names: list[str] = []

    async def create(repo: str, chart: str = "jupyterhub", **spec: Any) -> str:
        name = f"{chart}-{uuid.uuid4().hex[:6]}"
        body = {
            "apiVersion": APP_TEMPLATE.api_version,
            "kind": APP_TEMPLATE.kind,
            "metadata": {"name": name},
            "spec": {"chart": {"repo": repo, "name": chart}, **spec},
        }
        await kube.create(APP_TEMPLATE, body)
        names.append(name)
        return name

    yield create
    for name in names:
        with contextlib.suppress(KubeNotFound):
            await kube.delete(APP_TEMPLATE, None, name)


@pytest.fixture
def catalog(service: Callable[..., ServiceProcess]) -> ServiceProcess:
    service("watcher", **WATCH_TEMPLATES)
    service("writer")
    return service("catalog")


def status_of(kube: KubeClient, name: str) -> Callable[[], Any]:
    async def read() -> Json:
        return dict((await kube.get(APP_TEMPLATE, None, name)).get("status") or {})

    return read


def synced(status: Json) -> Json:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Synced"), {})


def versions(status: Json) -> list[str]:
    return [v["name"] for v in status.get("versions") or []]


async def test_versions_schemas_and_label_come_from_the_repository(
    kube: KubeClient, charts: Callable[..., ChartRepo], templates: Any, catalog: ServiceProcess
) -> None:
    repo = charts()
    repo.add("jupyterhub", "0.1.0", schemas=False)
    repo.add("jupyterhub", "0.2.0")
    repo.add(
        "jupyterhub",
        "1.0.0",
        icon="https://example.org/jupyter.png",
        description="Multi-user notebooks",
        annotations={"azimuth.stackhpc.com/label": "JupyterHub"},
    )
    repo.add("jupyterhub", "1.1.0-rc.1")
    repo.add("daskhub", "9.0.0")
    name = await templates(repo.url, keepVersions=2)

    status = await eventually(
        status_of(kube, name), lambda s: synced(s).get("status") == "True", timeout=60
    )

    assert versions(status) == ["1.0.0", "0.2.0"]
    assert status["versions"][0]["valuesSchema"] == VALUES_SCHEMA
    assert status["versions"][0]["uiSchema"] == UI_SCHEMA
    assert status["label"] == "JupyterHub"
    assert status["logo"] == "https://example.org/jupyter.png"
    assert status["description"] == "Multi-user notebooks"
    assert status["lastSync"].endswith("Z")
    assert status["observedGeneration"] == 1

    # A new version, and a spec change that makes room for more: it shows up, the known ones
    # are reused, the label set before stays (only a spec label overrides it).
    repo.add("jupyterhub", "1.2.0", annotations={"azimuth.stackhpc.com/label": "Renamed"})
    await kube.patch_merge(APP_TEMPLATE, None, name, {"spec": {"keepVersions": 4}})
    status = await eventually(
        status_of(kube, name), lambda s: s.get("observedGeneration") == 2, timeout=60
    )
    assert versions(status) == ["1.2.0", "1.0.0", "0.2.0", "0.1.0"]
    assert status["versions"][3]["valuesSchema"] == {}
    assert status["label"] == "JupyterHub"

    await kube.patch_merge(APP_TEMPLATE, None, name, {"spec": {"versionRange": ">=1.0.0-0"}})
    status = await eventually(
        status_of(kube, name), lambda s: s.get("observedGeneration") == 3, timeout=60
    )
    assert versions(status) == ["1.2.0", "1.1.0-rc.1", "1.0.0"]


async def test_a_short_sync_frequency_resyncs_by_itself(
    kube: KubeClient, charts: Callable[..., ChartRepo], templates: Any, catalog: ServiceProcess
) -> None:
    repo = charts()
    repo.add("jupyterhub", "0.1.0")
    name = await templates(repo.url, syncFrequency=3)
    first = await eventually(status_of(kube, name), lambda s: bool(versions(s)), timeout=60)
    assert versions(first) == ["0.1.0"]

    repo.add("jupyterhub", "0.2.0")

    status = await eventually(
        status_of(kube, name), lambda s: versions(s) == ["0.2.0", "0.1.0"], timeout=60
    )
    assert status["lastSync"] > first["lastSync"]
    assert status["observedGeneration"] == 1


async def test_broken_repositories_are_reported_and_the_service_stays_up(
    kube: KubeClient, charts: Callable[..., ChartRepo], templates: Any, catalog: ServiceProcess
) -> None:
    unreachable = await templates(f"http://127.0.0.1:{free_port()}/charts")
    broken = charts()
    broken.break_index()
    malformed = await templates(broken.url)

    down = await eventually(
        status_of(kube, unreachable),
        lambda s: synced(s).get("reason") == "RepositoryUnreachable",
        timeout=60,
    )
    bad = await eventually(
        status_of(kube, malformed),
        lambda s: synced(s).get("reason") == "RepositoryInvalid",
        timeout=60,
    )

    assert synced(down)["status"] == "False"
    assert "index.yaml" in synced(down)["message"]
    assert "lastSync" not in down
    assert "not valid YAML" in synced(bad)["message"]
    assert "lastSync" not in bad
    assert bad["observedGeneration"] == 1

    # Still serving: a good template syncs, and the repaired repository after a spec change.
    good = charts()
    good.add("jupyterhub", "1.0.0")
    fine = await templates(good.url)
    await eventually(status_of(kube, fine), lambda s: synced(s).get("status") == "True")
    broken.add("jupyterhub", "2.0.0")
    await kube.patch_merge(APP_TEMPLATE, None, malformed, {"spec": {"keepVersions": 1}})
    repaired = await eventually(
        status_of(kube, malformed), lambda s: synced(s).get("status") == "True", timeout=60
    )
    assert versions(repaired) == ["2.0.0"]
    assert catalog.proc is not None
    assert catalog.proc.poll() is None, catalog.log()


async def test_an_unreachable_repository_is_retried_until_it_answers(
    kube: KubeClient,
    charts: Callable[..., ChartRepo],
    templates: Any,
    service: Callable[..., ServiceProcess],
) -> None:
    service("watcher", **WATCH_TEMPLATES)
    service("writer")
    service(
        "catalog",
        CAPIBUS_CATALOG__RETRY_UNREACHABLE_FIRST_SECONDS="0.5",
        CAPIBUS_CATALOG__RETRY_UNREACHABLE_SECONDS="2",
    )
    port = free_port()
    name = await templates(f"http://127.0.0.1:{port}/charts")
    down = await eventually(
        status_of(kube, name),
        lambda s: synced(s).get("reason") == "RepositoryUnreachable",
        timeout=60,
    )
    assert "lastAttempt" not in down

    # The repository comes up at that address; nothing about the template changes.
    repo = charts(serve=False)
    repo.add("jupyterhub", "1.0.0")
    repo.serve(port)

    up = await eventually(
        status_of(kube, name), lambda s: synced(s).get("status") == "True", timeout=60
    )
    assert versions(up) == ["1.0.0"]
    assert up["observedGeneration"] == 1
    assert (await kube.get(APP_TEMPLATE, None, name))["metadata"]["generation"] == 1
