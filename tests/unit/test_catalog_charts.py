"""shared.charts against ``httpx.MockTransport`` and archives built in memory (no network)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable

import httpx
import pytest
import yaml

from shared.charts import (
    ChartEntry,
    ChartRepositories,
    RepositoryInvalid,
    RepositoryUnavailable,
    index_url,
    parse_index,
    read_schemas,
)

REPO = "http://charts.example/stable"
Handler = Callable[[httpx.Request], httpx.Response]


def archive(files: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


INDEX = {
    "apiVersion": "v1",
    "entries": {
        "jupyterhub": [
            {
                "name": "jupyterhub",
                "version": "1.0.0",
                "urls": ["jupyterhub-1.0.0.tgz"],
                "icon": "https://example/icon.png",
                "description": "Notebooks",
                "annotations": {"azimuth.stackhpc.com/label": "JupyterHub"},
            },
            {"name": "jupyterhub", "version": "0.9.0", "urls": ["https://cdn.example/jh.tgz"]},
            {"name": "jupyterhub", "version": "0.8.0"},
            "garbage",
        ]
    },
}


def repositories(handler: Handler) -> ChartRepositories:
    return ChartRepositories(transport=httpx.MockTransport(handler), max_chart_bytes=1 << 16)


def test_index_url_tolerates_a_trailing_slash() -> None:
    assert index_url(REPO) == index_url(REPO + "/") == f"{REPO}/index.yaml"


def test_parse_index_keeps_usable_entries() -> None:
    entries = parse_index(yaml.safe_dump(INDEX).encode(), "jupyterhub", url="u")

    assert entries is not None
    assert [e.version for e in entries] == ["1.0.0", "0.9.0"]
    assert entries[0].label == "JupyterHub"
    assert entries[1].label == "jupyterhub"
    assert entries[0].icon == "https://example/icon.png"
    assert parse_index(yaml.safe_dump(INDEX).encode(), "daskhub", url="u") is None


@pytest.mark.parametrize(
    "body", [b"entries: [unclosed", b"- a list\n", b"apiVersion: v1\n", b"entries: 3\n"]
)
def test_parse_index_refuses_what_is_not_an_index(body: bytes) -> None:
    with pytest.raises(RepositoryInvalid) as caught:
        parse_index(body, "jupyterhub", url="http://x/index.yaml")
    assert caught.value.reason == "RepositoryInvalid"
    assert "http://x/index.yaml" in str(caught.value)


def test_read_schemas_reads_only_the_charts_own_files() -> None:
    data = archive(
        {
            "jupyterhub/Chart.yaml": "name: jupyterhub\n",
            "jupyterhub/values.schema.json": json.dumps({"type": "object"}),
            "jupyterhub/azimuth-ui.schema.yaml": "controls:\n  /x: {type: TextControl}\n",
            "jupyterhub/charts/sub/values.schema.json": json.dumps({"type": "string"}),
        }
    )

    schemas = read_schemas(data, "jupyterhub", url="u", max_file_bytes=1000)

    assert schemas.values_schema == {"type": "object"}
    assert schemas.ui_schema == {"controls": {"/x": {"type": "TextControl"}}}


def test_read_schemas_defaults_to_empty() -> None:
    data = archive({"jupyterhub/Chart.yaml": "name: jupyterhub\n"})
    schemas = read_schemas(data, "jupyterhub", url="u", max_file_bytes=1000)
    assert (schemas.values_schema, schemas.ui_schema) == ({}, {})

    empty_ui = archive({"jupyterhub/azimuth-ui.schema.yaml": ""})
    assert read_schemas(empty_ui, "jupyterhub", url="u", max_file_bytes=10).ui_schema == {}


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"c/values.schema.json": "{not json"}, "not valid JSON"),
        ({"c/values.schema.json": "[1, 2]"}, "not an object"),
        ({"c/azimuth-ui.schema.yaml": "a: [b"}, "not valid YAML"),
        ({"c/values.schema.json": "{" + " " * 2000 + "}"}, "larger than"),
    ],
)
def test_read_schemas_refuses_bad_files(files: dict[str, str | bytes], match: str) -> None:
    with pytest.raises(RepositoryInvalid, match=match) as caught:
        read_schemas(archive(files), "c", url="u", max_file_bytes=1000)
    assert caught.value.reason == "ChartInvalid"


def test_read_schemas_refuses_what_is_not_an_archive() -> None:
    with pytest.raises(RepositoryInvalid, match="not a chart archive") as caught:
        read_schemas(b"<html>oops</html>", "c", url="u", max_file_bytes=1000)
    assert caught.value.reason == "ChartInvalid"


async def test_versions_and_schemas_over_http() -> None:
    seen: list[str] = []
    tgz = archive({"jupyterhub/values.schema.json": '{"title": "jh"}'})

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path == "/stable/index.yaml":
            return httpx.Response(200, content=yaml.safe_dump(INDEX).encode())
        return httpx.Response(200, content=tgz)

    repos = repositories(handler)
    entries = await repos.versions(REPO + "/", "jupyterhub")
    assert entries is not None
    relative = await repos.schemas(REPO, entries[0])
    absolute = await repos.schemas(REPO, entries[1])
    await repos.aclose()

    assert relative.values_schema == absolute.values_schema == {"title": "jh"}
    assert seen == [
        f"{REPO}/index.yaml",
        f"{REPO}/jupyterhub-1.0.0.tgz",
        "https://cdn.example/jh.tgz",
    ]


@pytest.mark.parametrize(
    ("response", "error", "reason"),
    [
        (httpx.Response(500), RepositoryUnavailable, None),
        (httpx.Response(503, headers={"Retry-After": "7"}), RepositoryUnavailable, None),
        (httpx.Response(429), RepositoryUnavailable, None),
        (httpx.Response(408), RepositoryUnavailable, None),
        (httpx.Response(404), RepositoryInvalid, "RepositoryInvalid"),
        (httpx.Response(403), RepositoryInvalid, "RepositoryInvalid"),
    ],
)
async def test_index_http_errors(
    response: httpx.Response, error: type[Exception], reason: str | None
) -> None:
    repos = repositories(lambda _: response)
    with pytest.raises(error) as caught:
        await repos.versions(REPO, "jupyterhub")
    await repos.aclose()
    assert getattr(caught.value, "reason", None) == reason
    if response.status_code == 503:
        assert getattr(caught.value, "delay", None) == 7


async def test_unreachable_repository_is_temporary() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    repos = repositories(refuse)
    with pytest.raises(RepositoryUnavailable, match="connection refused"):
        await repos.versions(REPO, "jupyterhub")
    await repos.aclose()


async def test_missing_or_oversized_chart_is_invalid() -> None:
    entry = ChartEntry(name="c", version="1.0.0", urls=("c-1.0.0.tgz",))
    missing = repositories(lambda _: httpx.Response(404))
    huge = repositories(lambda _: httpx.Response(200, content=b"x" * (1 << 17)))

    with pytest.raises(RepositoryInvalid, match="HTTP 404") as not_found:
        await missing.schemas(REPO, entry)
    with pytest.raises(RepositoryInvalid, match="larger than") as too_big:
        await huge.schemas(REPO, entry)
    await missing.aclose()
    await huge.aclose()

    assert not_found.value.reason == too_big.value.reason == "ChartInvalid"
