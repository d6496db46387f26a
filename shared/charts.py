"""The Helm chart repository adapter: a repository's index, and the schemas inside a chart.

Upstream ran ``helm pull`` into a temporary directory for every new chart version. None of that
is needed: a chart repository is plain HTTP (``<repo>/index.yaml`` lists every chart version
with the URLs of its ``.tgz``), and the two files the catalog reads sit at fixed paths inside
the archive (``<chart>/values.schema.json`` and ``<chart>/azimuth-ui.schema.yaml``). So this
module fetches with httpx and reads the archive in memory; nothing touches the disk and no
process is started.

Errors are translated at this boundary, so the catalog only speaks ``shared.errors``:

==========================================  ==================================================
what happened                               raised
==========================================  ==================================================
connection failure, timeout, 408, 429, 5xx  ``RepositoryUnavailable`` (``TemporaryError``)
404 and other 4xx, malformed ``index.yaml``  ``RepositoryInvalid`` (``PermanentError``),
                                             ``reason="RepositoryInvalid"``
chart archive missing, not a tarball, bad    ``RepositoryInvalid``, ``reason="ChartInvalid"``
schema file, or larger than allowed
==========================================  ==================================================

Parsing is CPU work that can take seconds for a large public index (tens of megabytes of
YAML), so it runs in a worker thread: the event loop must keep renewing partition leases.
Bodies are read with a size cap for the same reason a status must fit into etcd: an index or
archive far larger than any sane one is refused rather than held in memory.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import httpx
import yaml

from shared.errors import PermanentError, TemporaryError, retry_after, transient_http_status
from shared.transport import http_transport

Json = dict[str, Any]

VALUES_SCHEMA = "values.schema.json"
UI_SCHEMA = "azimuth-ui.schema.yaml"
LABEL_ANNOTATION = "azimuth.stackhpc.com/label"

# libyaml's loader is an order of magnitude faster on big indexes; fall back when absent.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RepositoryUnavailable(TemporaryError):
    """The repository could not be reached or failed (408, 429, 5xx): try again later."""


class RepositoryInvalid(PermanentError):
    """The repository or a chart in it is malformed or missing: retrying will not help."""

    def __init__(self, message: str, *, reason: str = "RepositoryInvalid") -> None:
        super().__init__(message, reason=reason)


@dataclass(frozen=True)
class ChartEntry:
    """One version of one chart, as the repository index lists it."""

    name: str
    version: str
    urls: tuple[str, ...]
    icon: str = ""
    description: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.annotations.get(LABEL_ANNOTATION) or self.name


@dataclass(frozen=True)
class ChartSchemas:
    values_schema: Json
    ui_schema: Json


def index_url(repo: str) -> str:
    return urljoin(repo.rstrip("/") + "/", "index.yaml")


def parse_index(data: bytes, chart: str, *, url: str) -> list[ChartEntry] | None:
    """The entries of ``chart`` in an ``index.yaml``, or None when the index does not list it.

    Entries without a version or a download URL are skipped, as Helm skips them; anything
    that is not an index at all is ``RepositoryInvalid``.
    """
    try:
        document = yaml.load(data, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise RepositoryInvalid(f"{url} is not valid YAML: {_first_line(exc)}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
        raise RepositoryInvalid(f"{url} is not a Helm repository index (no 'entries' map)")
    raw = document["entries"].get(chart)
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RepositoryInvalid(f"{url}: the entries of chart {chart!r} are not a list")
    return [entry for item in raw if (entry := _entry(chart, item)) is not None]


def _entry(chart: str, item: object) -> ChartEntry | None:
    if not isinstance(item, dict) or item.get("version") in (None, ""):
        return None
    urls = item.get("urls")
    if not isinstance(urls, list) or not urls:
        return None
    annotations = item.get("annotations")
    return ChartEntry(
        name=str(item.get("name") or chart),
        version=str(item["version"]),
        urls=tuple(str(u) for u in urls),
        icon=str(item.get("icon") or ""),
        description=str(item.get("description") or ""),
        annotations={str(k): str(v) for k, v in annotations.items()}
        if isinstance(annotations, dict)
        else {},
    )


def read_schemas(archive: bytes, chart: str, *, url: str, max_file_bytes: int) -> ChartSchemas:
    """``values.schema.json`` and ``azimuth-ui.schema.yaml`` of a packaged chart; ``{}`` if absent.

    Only the chart's own files count (``<chart>/<file>``), never a subchart's.
    """
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            for member in tar:
                parts = member.name.split("/")
                if len(parts) != 2 or parts[1] not in (VALUES_SCHEMA, UI_SCHEMA):
                    continue
                if parts[0] != chart or not member.isfile():
                    continue
                if member.size > max_file_bytes:
                    raise RepositoryInvalid(
                        f"{url}: {member.name} is larger than {max_file_bytes} bytes",
                        reason="ChartInvalid",
                    )
                handle = tar.extractfile(member)
                found[parts[1]] = handle.read() if handle else b""
                if len(found) == 2:
                    break
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RepositoryInvalid(
            f"{url} is not a chart archive: {exc}", reason="ChartInvalid"
        ) from exc
    return ChartSchemas(
        values_schema=_json_schema(found.get(VALUES_SCHEMA), f"{url}: {VALUES_SCHEMA}"),
        ui_schema=_yaml_schema(found.get(UI_SCHEMA), f"{url}: {UI_SCHEMA}"),
    )


def _json_schema(data: bytes | None, what: str) -> Json:
    if not data or not data.strip():
        return {}
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise RepositoryInvalid(f"{what} is not valid JSON: {exc}", reason="ChartInvalid") from exc
    return _mapping(value, what)


def _yaml_schema(data: bytes | None, what: str) -> Json:
    if not data:
        return {}
    try:
        value = yaml.load(data, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise RepositoryInvalid(
            f"{what} is not valid YAML: {_first_line(exc)}", reason="ChartInvalid"
        ) from exc
    return {} if value is None else _mapping(value, what)


def _mapping(value: object, what: str) -> Json:
    if not isinstance(value, dict):
        raise RepositoryInvalid(f"{what} is not an object", reason="ChartInvalid")
    return value


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class ChartRepositories:
    """Reads chart repositories over HTTP(S); one connection pool for all of them."""

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        max_index_bytes: int = 64 << 20,
        max_chart_bytes: int = 16 << 20,
        max_schema_bytes: int = 1 << 20,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.max_index_bytes = max_index_bytes
        self.max_chart_bytes = max_chart_bytes
        self.max_schema_bytes = max_schema_bytes
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            follow_redirects=True,
            transport=transport or http_transport(),
            headers={"User-Agent": "capibus-catalog"},
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def versions(self, repo: str, chart: str) -> list[ChartEntry] | None:
        """Every listed version of ``chart`` (index order), or None if the index lacks it."""
        url = index_url(repo)
        data = await self._get(url, self.max_index_bytes, reason="RepositoryInvalid")
        return await asyncio.to_thread(parse_index, data, chart, url=url)

    async def schemas(self, repo: str, entry: ChartEntry) -> ChartSchemas:
        """The schemas packaged in ``entry``; its URL may be relative to the repository."""
        url = urljoin(index_url(repo), entry.urls[0])
        data = await self._get(url, self.max_chart_bytes, reason="ChartInvalid")
        return await asyncio.to_thread(
            read_schemas, data, entry.name, url=url, max_file_bytes=self.max_schema_bytes
        )

    async def _get(self, url: str, limit: int, *, reason: str) -> bytes:
        try:
            async with self.http.stream("GET", url) as response:
                _check(response, url, reason)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise RepositoryInvalid(
                            f"{url} is larger than {limit} bytes", reason=reason
                        )
                return bytes(body)
        except httpx.HTTPError as exc:
            raise RepositoryUnavailable(f"GET {url}: {exc!r}") from exc
        except httpx.InvalidURL as exc:
            raise RepositoryInvalid(f"{url} is not a valid URL: {exc}", reason=reason) from exc


def _check(response: httpx.Response, url: str, reason: str) -> None:
    status = response.status_code
    if transient_http_status(status):
        delay = retry_after(response.headers.get("Retry-After"))
        raise RepositoryUnavailable(f"GET {url}: HTTP {status}", delay=delay)
    if status >= 400:
        raise RepositoryInvalid(f"GET {url}: HTTP {status}", reason=reason)
